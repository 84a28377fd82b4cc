"""Signed commit-then-reveal xMK-CKKS key sets (flwr_fedeval.rlwe.keyset), without Flower."""

import numpy as np
import pytest

from flwr_fedeval import rlwe
from flwr_fedeval.identity import IdentityError, NodeIdentity, Roster
from flwr_fedeval.rlwe import keyset, masking
from flwr_fedeval.rlwe.params import DEFAULT_PARAMETER_SET as P

IDS = [NodeIdentity.generate(f"node-{i}") for i in range(4)]
ROSTER = Roster.from_identities(IDS)
SEED = bytes(range(32))
KID = keyset.key_set_id(P, SEED)


def _member(ident, round_=5):
    _, pk = rlwe.keygen(P, rlwe.expand_a(P, SEED))
    _, mask_key = masking.new_mask_keypair()
    share = pk.to_bytes()
    h = keyset.commitment(KID, share, mask_key)
    sig = keyset.sign_commitment(ident, key_id=KID, round_=round_, commitment_=h)
    return ident.name, share, mask_key, h, sig


@pytest.fixture(scope="module")
def members():
    return [_member(i) for i in IDS[:3]]


def _check(entries, own=0, floor=2, round_=5, own_h=None):
    name = IDS[own].name
    h = own_h if own_h is not None else next(e[1] for e in entries if e[0] == name)
    return keyset.check_commitments(ROSTER, entries, key_id=KID, round_=round_, own_name=name, own_commitment=h,
                                    floor=floor)


def test_key_set_id_binds_parameter_set_and_seed():
    assert len(KID) == 32 and keyset.key_set_id(P, SEED) == KID
    assert keyset.key_set_id(P, bytes(32)) != KID
    other = "xmk-n4096-q93" if P.name != "xmk-n4096-q93" else "xmk-n4096-q108"
    assert keyset.key_set_id(rlwe.get_parameter_set(other), SEED) != KID
    with pytest.raises(keyset.KeySetError, match="32 bytes"):
        keyset.key_set_id(P, b"short")


def test_valid_commitments_are_returned_sorted(members):
    entries = [(n, h, s) for n, _, _, h, s in reversed(members)]
    checked = _check(entries)
    assert [n for n, _ in checked] == ["node-0", "node-1", "node-2"]


def test_commitment_checks(members):
    entries = [(n, h, s) for n, _, _, h, s in members]
    with pytest.raises(IdentityError, match="does not verify"):
        _check(entries, round_=6)  # signed for round 5
    swapped = [entries[0], (entries[1][0], entries[2][1], entries[1][2]), entries[2]]
    with pytest.raises(IdentityError, match="node-1"):
        _check(swapped)
    with pytest.raises(keyset.KeySetError, match="twice"):
        _check(entries + [entries[1]])
    with pytest.raises(keyset.KeySetError, match="does not list this member"):
        _check(entries[1:], own_h=entries[0][1])
    with pytest.raises(keyset.KeySetError, match="another commitment"):
        _check(entries, own_h=b"\x00" * 32)
    with pytest.raises(keyset.KeySetError, match="requires at least 4"):
        _check(entries, floor=4)
    with pytest.raises(keyset.KeySetError, match="32 bytes"):
        _check([(entries[0][0], b"short", entries[0][2])] + entries[1:])
    outsider = NodeIdentity.generate("node-7")
    with pytest.raises(IdentityError, match="node-7"):
        _check(entries + [("node-7", bytes(32), keyset.sign_commitment(outsider, key_id=KID, round_=5,
                                                                         commitment_=bytes(32)))])


def test_a_member_relaying_another_members_commitment_is_refused():
    # node-3 signs node-0's commitment as its own (a copy of another member's keys)
    name, share, mask_key, h, sig = _member(IDS[0])
    copy_sig = keyset.sign_commitment(IDS[3], key_id=KID, round_=5, commitment_=h)
    with pytest.raises(keyset.KeySetError, match="another member's commitment"):
        _check([(name, h, sig), ("node-3", h, copy_sig)])


def test_transcript_digest_is_order_free_and_binds_everything(members):
    pairs = [(n, h) for n, _, _, h, _ in members]
    t = keyset.transcript_digest(P, key_id=KID, seed_a=SEED, round_=5, members=pairs)
    assert t == keyset.transcript_digest(P, key_id=KID, seed_a=SEED, round_=5, members=pairs[::-1])
    assert t != keyset.transcript_digest(P, key_id=KID, seed_a=SEED, round_=5, members=pairs[:2])
    assert t != keyset.transcript_digest(P, key_id=KID, seed_a=SEED, round_=6, members=pairs)
    assert t != keyset.transcript_digest(P, key_id=KID, seed_a=bytes(32), round_=5, members=pairs)
    sigs = {ident.name: keyset.sign_transcript(ident, key_id=KID, round_=5, digest=t) for ident in IDS[:3]}
    names = [n for n, _ in pairs]
    keyset.check_transcript_signatures(ROSTER, sigs, members=names, key_id=KID, round_=5, digest=t)
    other = keyset.transcript_digest(P, key_id=KID, seed_a=SEED, round_=5, members=pairs[:2])
    with pytest.raises(IdentityError, match="did not confirm"):
        keyset.check_transcript_signatures(ROSTER, sigs, members=names, key_id=KID, round_=5, digest=other)
    with pytest.raises(keyset.KeySetError, match="has not confirmed"):
        keyset.check_transcript_signatures(ROSTER, {k: sigs[k] for k in names[:2]}, members=names, key_id=KID,
                                           round_=5, digest=t)
    with pytest.raises(keyset.KeySetError, match="non-members"):
        keyset.check_transcript_signatures(ROSTER, {**sigs, "node-3": b"x"}, members=names, key_id=KID,
                                           round_=5, digest=t)


def test_open_key_set_sums_checked_shares(members):
    pairs = [(n, h) for n, _, _, h, _ in members]
    openings = {n: (share, mk) for n, share, mk, _, _ in members}
    joint, mask_keys = keyset.open_key_set(P, key_id=KID, members=pairs, openings=openings)
    expected = rlwe.aggregate_public_keys([rlwe.PublicKey.from_bytes(o[0], P) for o in openings.values()])
    assert np.array_equal(joint.b, expected.b) and joint.num_shares == 3
    assert mask_keys == {n: o[1] for n, o in openings.items()}


def test_open_key_set_refusals(members):
    pairs = [(n, h) for n, _, _, h, _ in members]
    openings = {n: (share, mk) for n, share, mk, _, _ in members}
    with pytest.raises(keyset.KeySetError, match="missing"):
        keyset.open_key_set(P, key_id=KID, members=pairs, openings={k: openings[k] for k in list(openings)[:2]})
    with pytest.raises(keyset.KeySetError, match="not members"):
        keyset.open_key_set(P, key_id=KID, members=pairs[:2], openings=openings)
    rogue = dict(openings)
    share, mk = rogue["node-1"]
    rogue["node-1"] = (share, masking.new_mask_keypair()[1])
    with pytest.raises(keyset.KeySetError, match="node-1.*does not match its signed commitment"):
        keyset.open_key_set(P, key_id=KID, members=pairs, openings=rogue)
    # an aggregate (num_shares = 2) committed to as if it were one share
    pk = rlwe.PublicKey.from_bytes(share, P)
    double = rlwe.PublicKey(P, pk.b, 2).to_bytes()
    h = keyset.commitment(KID, double, mk)
    with pytest.raises(keyset.KeySetError, match="claims 2 shares"):
        keyset.open_key_set(P, key_id=KID, members=[("node-1", h)], openings={"node-1": (double, mk)})
    bad = b"junk"
    h = keyset.commitment(KID, bad, mk)
    with pytest.raises(keyset.KeySetError, match="malformed"):
        keyset.open_key_set(P, key_id=KID, members=[("node-1", h)], openings={"node-1": (bad, mk)})
