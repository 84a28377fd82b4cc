"""The key-set pieces of issue 21 without Flower: sealed share boxes, the transcript's public parameters and the
signed contributor set (flwr_fedeval.rlwe.keyset)."""

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from flwr_fedeval.identity import IdentityError, NodeIdentity, Roster
from flwr_fedeval.rlwe import keyset, masking
from flwr_fedeval.rlwe.params import DEFAULT_PARAMETER_SET as P

IDS = [NodeIdentity.generate(f"node-{i}") for i in range(4)]
ROSTER = Roster.from_identities(IDS)
KID = keyset.key_set_id(P, bytes(range(32)))
T = b"\x07" * 32
KEYS = {ident.name: masking.new_mask_keypair() for ident in IDS}  # name -> (private, public)
HASH = b"\x01" * 32


def _seal(parts, sender="node-0", recipient="node-1", round_=3, transcript=T, key_id=KID):
    return keyset.seal_shares(parts, key_id=key_id, round_=round_, transcript=transcript, sender=sender,
                              own_private=KEYS[sender][0], recipient=recipient, recipient_public=KEYS[recipient][1])


def _open(box, sender="node-0", recipient="node-1", round_=3, transcript=T, key_id=KID, count=3):
    return keyset.open_shares(box, key_id=key_id, round_=round_, transcript=transcript, sender=sender,
                              sender_public=KEYS[sender][1], recipient=recipient, own_private=KEYS[recipient][0],
                              count=count)


def test_a_sealed_box_opens_for_its_recipient_only():
    parts = [b"ring share", b"\x00" * 66, b"\xff" * 66]
    box = _seal(parts)
    assert _open(box) == parts
    assert parts[0] not in box  # encrypted
    for wrong in ({"recipient": "node-2"}, {"round_": 4}, {"key_id": "f" * 32}, {"transcript": b"\x08" * 32},
                  {"sender": "node-3"}):
        with pytest.raises(keyset.KeySetError, match="do not open"):
            _open(box, **wrong)
    altered = bytearray(box)
    altered[-1] ^= 1
    with pytest.raises(keyset.KeySetError, match="do not open"):
        _open(bytes(altered))
    with pytest.raises(keyset.KeySetError, match="holds 3 shares, expected 2"):
        _open(box, count=2)
    with pytest.raises(keyset.KeySetError, match="not a sealed box"):
        _open(b"short")


def test_box_key_is_not_the_pairwise_mask_key():
    """The HKDF info label of the boxes is their own: a box key never equals the mask key of the same pair."""
    context = masking.mask_context(T, 3)
    mask_key = masking.pairwise_mask_key(KEYS["node-0"][0], KEYS["node-1"][1], own_name="node-0",
                                         peer_name="node-1", context=context)
    box = _seal([b"x"])
    aad = keyset._seal_aad(KID, 3, "node-0", "node-1")
    assert _open(box, count=1) == [b"x"]  # the right key and AAD open it
    with pytest.raises(InvalidTag):  # the same nonce and AAD under the mask key do not
        AESGCM(mask_key).decrypt(box[:12], box[12:], aad)


def test_transcript_binds_every_public_parameter():
    members = [(ident.name, bytes([i]) * 32) for i, ident in enumerate(IDS)]
    base = dict(key_id=KID, seed_a=bytes(32), round_=3, members=members, mask_degree=4, scale_bits=40,
                max_abs_value=1e4, threshold=3, limbs=2)
    t0 = keyset.transcript_digest(P, **base)
    for change in ({"scale_bits": 41}, {"max_abs_value": 1e4 + 1}, {"threshold": 4}, {"mask_degree": 3},
                   {"round_": 4}, {"limbs": 3}):
        assert keyset.transcript_digest(P, **{**base, **change}) != t0, change
    with pytest.raises(keyset.KeySetError, match="finite"):
        keyset.transcript_digest(P, **{**base, "max_abs_value": float("inf")})


def _sign(ident, contributors, round_=3, model=HASH):
    return keyset.sign_contributors(ident, key_id=KID, round_=round_, model_hash=model, contributors=contributors)


def test_contributor_signatures_need_t_distinct_members_over_the_same_set():
    names = [i.name for i in IDS]
    c = names[:3]
    sigs = {i.name: _sign(i, c) for i in IDS[:3]}
    check = dict(members=names, key_id=KID, round_=3, model_hash=HASH, contributors=c, threshold=3)
    keyset.check_contributor_signatures(ROSTER, sigs, **check)
    keyset.check_contributor_signatures(ROSTER, sigs, **{**check, "contributors": list(reversed(c))})  # a set
    with pytest.raises(keyset.KeySetError, match="2 members signed"):
        keyset.check_contributor_signatures(ROSTER, dict(list(sigs.items())[:2]), **check)
    with pytest.raises(IdentityError, match="did not sign this contributor set"):
        keyset.check_contributor_signatures(ROSTER, sigs, **{**check, "contributors": names})
    with pytest.raises(IdentityError, match="did not sign this contributor set"):
        keyset.check_contributor_signatures(ROSTER, sigs, **{**check, "model_hash": b"\x02" * 32})
    with pytest.raises(IdentityError, match="did not sign this contributor set"):
        keyset.check_contributor_signatures(ROSTER, sigs, **{**check, "round_": 4})
    stranger = NodeIdentity.generate("node-9")
    with pytest.raises(keyset.KeySetError, match="non-members"):
        keyset.check_contributor_signatures(ROSTER, {**sigs, "node-9": _sign(stranger, c)}, **check)
