"""End-to-end key relay: the server forwards bytes it cannot open."""

from __future__ import annotations

import pytest

pytest.importorskip("cryptography")

from flwr_fedeval import keyshare as k


def test_recipient_opens_what_the_key_holder_sealed():
    holder, alice, bob = k.generate_keypair(), k.generate_keypair(), k.generate_keypair()
    sealed = k.seal_bundle(b"secret-context", b"s" * 32, sender=holder,
                           recipients={"alice": alice.public, "bob": bob.public})
    got = k.open_bundle(sealed["bob"], recipient=bob, sender_public=holder.public)
    assert got == k.SharedSecrets(secret_context=b"secret-context", seed=b"s" * 32)
    assert sealed["alice"] != sealed["bob"]


def test_server_cannot_open_the_relayed_bytes():
    holder, alice, server = k.generate_keypair(), k.generate_keypair(), k.generate_keypair()
    sealed = k.seal_for(b"secret", sender=holder, recipient_public=alice.public)
    assert b"secret" not in sealed
    with pytest.raises(k.KeyShareError, match="another recipient"):
        k.open_from(sealed, recipient=server, sender_public=holder.public)
    # Even pretending to be the recipient (header rewritten) fails authentication.
    forged = sealed[:37] + server.public + sealed[69:]
    with pytest.raises(k.KeyShareError, match="authentication"):
        k.open_from(forged, recipient=server, sender_public=holder.public)


def test_tampered_or_misattributed_share_is_rejected():
    holder, alice, mallory = k.generate_keypair(), k.generate_keypair(), k.generate_keypair()
    sealed = bytearray(k.seal_for(b"secret", sender=holder, recipient_public=alice.public))
    sealed[-1] ^= 1
    with pytest.raises(k.KeyShareError, match="authentication"):
        k.open_from(bytes(sealed), recipient=alice, sender_public=holder.public)
    other = k.seal_for(b"evil", sender=mallory, recipient_public=alice.public)
    with pytest.raises(k.KeyShareError, match="unexpected sender"):
        k.open_from(other, recipient=alice, sender_public=holder.public)
    with pytest.raises(k.KeyShareError, match="truncated"):
        k.open_from(b"FFKS", recipient=alice, sender_public=holder.public)


def test_fingerprint_is_stable_and_key_specific():
    a, b = k.generate_keypair(), k.generate_keypair()
    assert k.fingerprint(a.public) == k.fingerprint(a.public) != k.fingerprint(b.public)


def test_fhe_secret_context_travels_through_the_relay(keysets):
    from flwr_fedeval.fhe.backend import load_context

    ks = keysets()
    holder, alice = k.generate_keypair(), k.generate_keypair()
    seed = b"\x01" * 32
    sealed = k.seal_bundle(ks.secret_bytes, seed, sender=holder, recipients={1: alice.public})[1]
    got = k.open_bundle(sealed, recipient=alice, sender_public=holder.public)
    ctx = load_context(got.secret_context)
    assert ctx.is_private and got.seed == seed
    ct = ks.holder.encrypt([0.25])
    got = ctx.decrypt(ctx.deserialize_ciphertext(ks.holder.serialize_ciphertext(ct)))[0]
    assert got == pytest.approx(0.25, abs=1e-7)
