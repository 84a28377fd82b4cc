"""t-out-of-N threshold decryption and Shamir sharing (Mouchet et al. 2021; Bonawitz et al. 2017, §4)."""

import itertools
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe import serialization as ser
from flwr_fedeval.rlwe import threshold as th
from flwr_fedeval.rlwe.params import get_parameter_set
from flwr_fedeval.rlwe.sampling import uniform_mod_q

P = get_parameter_set("xmk-n4096-q93")
LENGTH = 1000


def _key_set(num_members):
    """Real keygen for N members; every member splits s_i; each aggregates what it received."""
    a = rlwe.expand_a(P, rlwe.new_public_seed())
    keys = [rlwe.keygen(P, a) for _ in range(num_members)]
    pk = rlwe.aggregate_public_keys([b for _, b in keys])
    points = rlwe.member_points(num_members)
    t = rlwe.min_threshold(num_members)
    dealt = [rlwe.split_secret(P, sk, threshold=t, points=points) for sk, _ in keys]
    shares = {x: rlwe.aggregate_shares(P, [d[x] for d in dealt]) for x in points}
    return a, keys, pk, points, t, shares


def _decrypt(shares, subset, total, num_clients, k):
    ds = [
        rlwe.threshold_partial_decrypt(P, shares[x], subset, total.c1, num_clients=num_clients)
        for x in subset
    ]
    return rlwe.combine_and_decode(P, total.c0, ds, LENGTH, scale_bits=k)


@pytest.mark.parametrize("num_members", [3, 4, 5, 7])
def test_any_t_subset_decrypts_the_sum_and_t_minus_1_do_not(num_members):
    a, keys, pk, points, t, shares = _key_set(num_members)
    N = num_members
    k = rlwe.max_scale_bits(P, num_clients=N, max_abs_value=1.0)
    gen = np.random.default_rng(N)  # test data, not key material
    contributors = range(N - 1)  # a member lost before its upload: the others contribute
    xs = [gen.uniform(-1.0, 1.0, LENGTH) for _ in contributors]
    total = rlwe.add_ciphertexts([rlwe.encrypt_vector(P, pk, a, x, scale_bits=k, num_clients=N) for x in xs])
    fixed = np.sum([np.rint(x * 2.0**k) for x in xs], axis=0) / 2.0**k
    bound = rlwe.total_noise_bound(P, N) / 2.0**k
    for subset in itertools.combinations(points, t):
        got = _decrypt(shares, subset, total, N, k)
        assert np.max(np.abs(got - fixed)) <= bound, subset
    assert bound < 1e-6  # the bound itself is tight enough to mean "exact"
    # too few shares: interpolating through t - 1 points misses s, the result is uniform mod q
    # (threshold_partial_decrypt refuses such a set, so build lambda_j F(x_j) C1 directly, unsmudged)
    products = {x: P.ring.mul(total.c1, shares[x].value[None]) for x in points}  # F(x_j) C1
    for subset in itertools.combinations(points, t - 1):
        lam = rlwe.lagrange_at_zero(P, subset)
        ds = [rlwe.DecryptionShare(P, products[x] * lam[x][:, None] % P.ring.q_col) for x in subset]
        got = rlwe.combine_and_decode(P, total.c0, ds, LENGTH, scale_bits=k)
        assert np.mean(np.abs(got - fixed) > 0.01) > 0.99, subset


def test_threshold_shares_sum_to_the_n_out_of_n_decryption_without_smudging():
    a, keys, pk, points, t, shares = _key_set(5)
    c1 = uniform_mod_q(P.primes, P.n, (2,))
    full = P.ring.mul_small(sum(sk.s.astype(np.int64) for sk, _ in keys), c1)  # s C1, s = sum_i s_i
    lam = rlwe.lagrange_at_zero(P, (2, 4, 5))
    got = P.ring.sum(np.stack([P.ring.mul(c1, (shares[x].value * lam[x][:, None] % P.ring.q_col)[None]) for x in lam]))
    assert np.array_equal(got, full)
    # with smudging the difference is small: |sum D_j - s C1| <= t B_smudge
    ds = [rlwe.threshold_partial_decrypt(P, shares[x], (2, 4, 5), c1, num_clients=5) for x in (2, 4, 5)]
    diff = P.ring.to_int(P.ring.sub(rlwe.combine(P, P.ring.zeros((2,)), ds), full))
    assert max(abs(int(v)) for v in diff.ravel()) <= 3 * rlwe.smudging_bound(P, 5)
    assert max(abs(int(v)) for v in diff.ravel()) > rlwe.smudging_bound(P, 5) // 2  # the noise is there


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_lagrange_interpolation_recovers_the_secret_from_any_subset_of_at_least_t(data):
    N = data.draw(st.integers(1, 9), label="N")
    t = data.draw(st.integers(1, N), label="t")
    points = rlwe.member_points(N)
    subset = data.draw(st.lists(st.sampled_from(points), min_size=t, max_size=N, unique=True), label="subset")
    sk = rlwe.SecretKey(P, rlwe.sampling.ternary((P.n,)))
    shares = rlwe.split_secret(P, sk, threshold=t, points=points)
    lam = rlwe.lagrange_at_zero(P, subset)
    assert set(lam) == set(subset)
    assert all(v.shape == (P.limbs,) and v.dtype == np.uint64 for v in lam.values())
    acc = P.ring.sum(np.stack([shares[x].value * lam[x][:, None] % P.ring.q_col for x in subset]))
    assert np.array_equal(acc, P.ring.from_signed(sk.s))
    # the Lagrange coefficients at 0 of any set sum to 1 (interpolating the constant 1)
    assert np.array_equal(sum(lam.values()) % np.array(P.primes, dtype=np.uint64), np.ones(P.limbs, np.uint64))


def test_t_minus_1_shares_of_a_secret_do_not_interpolate_it():
    sk = rlwe.SecretKey(P, rlwe.sampling.ternary((P.n,)))
    shares = rlwe.split_secret(P, sk, threshold=3, points=(1, 2, 3, 4))
    lam = rlwe.lagrange_at_zero(P, (1, 4))
    acc = P.ring.sum(np.stack([shares[x].value * lam[x][:, None] % P.ring.q_col for x in (1, 4)]))
    assert np.mean(acc == P.ring.from_signed(sk.s)) < 0.01


def test_split_secret_shares_are_fresh_and_uniform_looking():
    sk = rlwe.SecretKey(P, rlwe.sampling.ternary((P.n,)))
    one = rlwe.split_secret(P, sk, threshold=2, points=(1, 2))
    two = rlwe.split_secret(P, sk, threshold=2, points=(1, 2))
    assert not np.array_equal(one[1].value, two[1].value)  # fresh randomness
    # a share of a ternary secret is not small: its centred residues spread over the whole of [0, q_l)
    assert np.mean(one[1].value[0] > 2**20) > 0.99


def test_threshold_one_is_the_secret_itself():
    sk = rlwe.SecretKey(P, rlwe.sampling.ternary((P.n,)))
    shares = rlwe.split_secret(P, sk, threshold=1, points=(1, 2, 3))
    for sh in shares.values():
        assert np.array_equal(sh.value, P.ring.from_signed(sk.s))


def test_member_points_and_min_threshold():
    assert rlwe.member_points(1) == (1,)
    assert rlwe.member_points(7) == (1, 2, 3, 4, 5, 6, 7)
    assert [rlwe.min_threshold(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [1, 2, 2, 3, 3, 4, 4]
    assert all(2 * rlwe.min_threshold(n) > n >= 2 * (rlwe.min_threshold(n) - 1) for n in range(1, 50))
    for bad in (0, -1, True, 2.0):
        with pytest.raises(rlwe.ThresholdError, match="num_members"):
            rlwe.member_points(bad)
    with pytest.raises(rlwe.ThresholdError, match="num_members"):
        rlwe.member_points(min(P.primes), params=P)
    with pytest.raises(rlwe.ThresholdError, match="num_members"):
        rlwe.min_threshold(0)


def test_split_secret_refuses_bad_thresholds_and_points():
    sk = rlwe.SecretKey(P, rlwe.sampling.ternary((P.n,)))
    with pytest.raises(rlwe.ThresholdError, match="threshold"):
        rlwe.split_secret(P, sk, threshold=4, points=(1, 2, 3))
    with pytest.raises(rlwe.ThresholdError, match="threshold"):
        rlwe.split_secret(P, sk, threshold=0, points=(1, 2, 3))
    with pytest.raises(rlwe.ThresholdError, match="duplicate"):
        rlwe.split_secret(P, sk, threshold=2, points=(1, 2, 2))
    for bad in [(0, 1), (1, min(P.primes)), (1, -3)]:
        with pytest.raises(rlwe.ThresholdError, match="points"):
            rlwe.split_secret(P, sk, threshold=2, points=bad)
    with pytest.raises(rlwe.ThresholdError, match="points"):
        rlwe.split_secret(P, sk, threshold=1, points=())
    other = get_parameter_set("xmk-n4096-q108")
    with pytest.raises(ValueError, match="parameter set"):
        rlwe.split_secret(other, sk, threshold=1, points=(1,))


def test_aggregate_shares_refuses_mixed_points_thresholds_and_params():
    sk = rlwe.SecretKey(P, rlwe.sampling.ternary((P.n,)))
    a = rlwe.split_secret(P, sk, threshold=2, points=(1, 2, 3))
    b = rlwe.split_secret(P, sk, threshold=3, points=(1, 2, 3))
    both = rlwe.aggregate_shares(P, [a[1], a[1]])
    assert both.point == 1 and both.threshold == 2
    assert np.array_equal(both.value, P.ring.add(a[1].value, a[1].value))
    with pytest.raises(rlwe.ThresholdError, match="mixed points"):
        rlwe.aggregate_shares(P, [a[1], a[2]])
    with pytest.raises(rlwe.ThresholdError, match="threshold"):
        rlwe.aggregate_shares(P, [a[1], b[1]])
    with pytest.raises(rlwe.ThresholdError, match="empty"):
        rlwe.aggregate_shares(P, [])
    with pytest.raises(ValueError, match="parameter set"):
        rlwe.aggregate_shares(get_parameter_set("xmk-n4096-q108"), [a[1]])


def test_threshold_partial_decrypt_refuses_bad_active_sets():
    sk = rlwe.SecretKey(P, rlwe.sampling.ternary((P.n,)))
    shares = rlwe.split_secret(P, sk, threshold=3, points=(1, 2, 3, 4, 5))
    c1 = uniform_mod_q(P.primes, P.n, (1,))
    with pytest.raises(rlwe.ThresholdError, match="does not contain"):
        rlwe.threshold_partial_decrypt(P, shares[1], (2, 3, 4), c1, num_clients=5)
    with pytest.raises(rlwe.ThresholdError, match="fewer than the threshold"):
        rlwe.threshold_partial_decrypt(P, shares[1], (1, 2), c1, num_clients=5)
    with pytest.raises(rlwe.ThresholdError, match="duplicate"):
        rlwe.threshold_partial_decrypt(P, shares[1], (1, 2, 2, 3), c1, num_clients=5)
    with pytest.raises(rlwe.ThresholdError, match="noise budget"):
        rlwe.threshold_partial_decrypt(P, shares[1], (1, 2, 3, 4), c1, num_clients=3)
    with pytest.raises(rlwe.ThresholdError, match="active"):
        rlwe.threshold_partial_decrypt(P, shares[1], (1, 2, 0), c1, num_clients=5)
    with pytest.raises(ValueError, match="c1_sum"):
        rlwe.threshold_partial_decrypt(P, shares[1], (1, 2, 3), c1[0], num_clients=5)
    with pytest.raises(ValueError, match="c1_sum"):
        rlwe.threshold_partial_decrypt(P, shares[1], (1, 2, 3), c1 + P.ring.q_col, num_clients=5)
    with pytest.raises(rlwe.ThresholdError, match="duplicate"):
        rlwe.lagrange_at_zero(P, (3, 3))


# --------------------------------------------------------------------------- serialization
def test_secret_share_round_trip_and_repr_hides_the_value():
    sk = rlwe.SecretKey(P, rlwe.sampling.ternary((P.n,)))
    share = rlwe.split_secret(P, sk, threshold=2, points=(1, 2, 3))[3]
    data = share.to_bytes()
    assert len(data) == ser.HEADER_SIZE + ser.packed_size(P, 1, 1)
    back = rlwe.SecretShare.from_bytes(data, P)
    assert back.point == 3 and back.threshold == 2 and back.params == P
    assert np.array_equal(back.value, share.value)
    assert rlwe.SecretShare.from_bytes(data).params == P  # params looked up by id
    assert str(int(share.value[0, 0])) not in repr(share) and "point=3" in repr(share)


def _field(data, offset, fmt, value):
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_secret_share_parsing_is_strict():
    sk = rlwe.SecretKey(P, rlwe.sampling.ternary((P.n,)))
    good = rlwe.split_secret(P, sk, threshold=2, points=(1, 2, 3))[2].to_bytes()
    assert th._SHARE_HEADER.size == ser.HEADER_SIZE  # the payload reader skips exactly this header
    cases = {
        "magic": _field(good, 0, "4s", b"FXMK"),
        "version": _field(good, 4, "<B", 2),
        "reserved": _field(good, 5, "<B", 1),
        "limbs": _field(good, 6, "<H", 4),
        "n is": _field(good, 8, "<I", 8192),
        "point": _field(good, 12, "<I", 0),
        "threshold": _field(good, 16, "<I", 0),
        "params_id": _field(good, 20, "32s", b"xmk-n4096-q108"),
        "payload length": good + b"\0",
        "too short": good[:20],
    }
    for match, data in cases.items():
        with pytest.raises(rlwe.ThresholdError, match=match):
            rlwe.SecretShare.from_bytes(data, P)
    with pytest.raises(rlwe.ThresholdError, match="payload length"):
        rlwe.SecretShare.from_bytes(good[:-1], P)
    with pytest.raises(rlwe.ThresholdError, match="params_id"):
        rlwe.SecretShare.from_bytes(_field(good, 20, "32s", b"no-such-set"))
    # a residue >= q_0 (the first packed value set to all ones): not canonical
    bad = bytearray(good)
    bad[ser.HEADER_SIZE] = 0xFF
    bad[ser.HEADER_SIZE + 1] = 0xFF
    bad[ser.HEADER_SIZE + 2] = 0xFF
    bad[ser.HEADER_SIZE + 3] |= 0x7F
    with pytest.raises(rlwe.ThresholdError, match="values >= q_0"):
        rlwe.SecretShare.from_bytes(bytes(bad), P)
    with pytest.raises(rlwe.ThresholdError, match="bytes"):
        rlwe.SecretShare.from_bytes("text", P)
    # a ciphertext is not a share and a share is not a secret key
    with pytest.raises(ValueError, match="magic"):
        rlwe.SecretKey.from_bytes(good, P)


# --------------------------------------------------------------------------- byte secrets
@settings(max_examples=30, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), data=st.data())
def test_split_and_combine_bytes_round_trip_for_any_t_subset(secret, data):
    N = data.draw(st.integers(1, 8), label="N")
    t = data.draw(st.integers(1, N), label="t")
    shares = rlwe.split_bytes(secret, threshold=t, points=rlwe.member_points(N))
    assert set(shares) == set(range(1, N + 1))
    assert all(len(v) == th.BYTES_SHARE_SIZE == 66 for v in shares.values())
    subset = data.draw(st.lists(st.sampled_from(sorted(shares)), min_size=t, max_size=N, unique=True))
    assert rlwe.combine_bytes({x: shares[x] for x in subset}, threshold=t) == secret


def test_fewer_than_t_byte_shares_are_refused_and_do_not_determine_the_secret():
    secret = bytes(range(32))
    shares = rlwe.split_bytes(secret, threshold=3, points=(1, 2, 3, 4))
    with pytest.raises(rlwe.ThresholdError, match="threshold is 3"):
        rlwe.combine_bytes({1: shares[1], 4: shares[4]}, threshold=3)
    # interpolating two shares as if t were 2 gives a field element unrelated to the secret
    with pytest.raises(rlwe.ThresholdError, match="32-byte secret"):
        rlwe.combine_bytes({1: shares[1], 4: shares[4]}, threshold=2)


def test_malformed_byte_shares_are_refused():
    secret = bytes(32)
    shares = rlwe.split_bytes(secret, threshold=2, points=(1, 2, 3))
    p_bytes = th.BYTES_FIELD_PRIME.to_bytes(66, "big")
    bad_cases = {
        "66 bytes": {1: shares[1][:-1], 2: shares[2]},
        "canonical": {1: p_bytes, 2: shares[2]},
        "inconsistent": {1: shares[1], 2: shares[2], 3: bytes(66)},
        "points": {0: shares[1], 2: shares[2]},
    }
    for match, case in bad_cases.items():
        with pytest.raises(rlwe.ThresholdError, match=match):
            rlwe.combine_bytes(case, threshold=2)
    with pytest.raises(rlwe.ThresholdError, match="32 bytes"):
        rlwe.split_bytes(bytes(31), threshold=1, points=(1,))
    with pytest.raises(rlwe.ThresholdError, match="duplicate"):
        rlwe.split_bytes(secret, threshold=1, points=(1, 1))
    with pytest.raises(rlwe.ThresholdError, match="threshold"):
        rlwe.split_bytes(secret, threshold=3, points=(1, 2))
    with pytest.raises(rlwe.ThresholdError, match="mapping"):
        rlwe.combine_bytes([shares[1], shares[2]], threshold=2)


def test_byte_shares_are_fresh_per_split():
    secret = bytes(range(32))
    one = rlwe.split_bytes(secret, threshold=2, points=(1, 2))
    two = rlwe.split_bytes(secret, threshold=2, points=(1, 2))
    assert one[1] != two[1]


# --------------------------------------------------------------------------- self-masks
def test_self_mask_is_deterministic_uniform_and_removable():
    seed = rlwe.new_self_mask_seed()
    u = rlwe.self_mask(P, seed, 2)
    assert u.shape == (2, P.limbs, P.n) and u.dtype == np.uint64
    assert np.all(u < P.ring.q_col)
    assert np.array_equal(u, rlwe.self_mask(P, seed, 2))
    assert not np.array_equal(u, rlwe.self_mask(P, rlwe.new_self_mask_seed(), 2))
    # domain-separated from a pairwise mask under the same 32 bytes
    assert not np.array_equal(u, rlwe.masking.expand_mask(P, seed, 2))
    # the seed recovered from t shares removes the mask exactly
    m = uniform_mod_q(P.primes, P.n, (2,))
    masked = rlwe.masking.apply_mask(P, m, u)
    shares = rlwe.split_bytes(seed, threshold=2, points=(1, 2, 3))
    back = rlwe.combine_bytes({1: shares[1], 3: shares[3]}, threshold=2)
    assert np.array_equal(P.ring.sub(masked, rlwe.self_mask(P, back, 2)), m)
    with pytest.raises(ValueError, match="32 bytes"):
        rlwe.self_mask(P, seed[:31], 1)


# ---------------------------------------------------------------------------------------------
# Masked decryption shares (issue 21: a decryptor lost during the partial decryption)
# ---------------------------------------------------------------------------------------------
def test_pdec_masks_cancel_exactly_mod_q_prime_over_the_active_set_only():
    """Σ_{j∈A} (D_j + Σ_k ±PRG(K_jk)) = Σ_{j∈A} D_j mod q' (at L' = 2 limbs); any strict subset keeps a mask
    that is uniform mod q', and the masks of another A (or round) are others."""
    from flwr_fedeval.rlwe import compact, masking

    level = compact.level_parameter_set(P, 2)
    names = ["node-0", "node-1", "node-3"]
    keys = {name: masking.new_mask_keypair() for name in names}
    shares = {name: rlwe.DecryptionShare(level, uniform_mod_q(level.primes, level.n, (3,))) for name in names}
    transcript, model = bytes(range(32)), bytes(32)

    def masked(active, round_=1):
        context = th.pdec_mask_context(transcript, round_, model, active, attempt=1)
        return {j: th.mask_decryption_share(shares[j], own_name=j, own_private=keys[j][0],
                                            peers={k: keys[k][1] for k in active if k != j}, context=context).d
                for j in active}

    ring = level.ring
    out = masked(names)
    assert np.array_equal(ring.sum(np.stack(list(out.values()))), ring.sum(np.stack([shares[j].d for j in names])))
    for j in names:
        assert not np.array_equal(out[j], shares[j].d)  # each share is masked
    partial = ring.sub(ring.sum(np.stack([out[j] for j in names[:2]])),
                       ring.sum(np.stack([shares[j].d for j in names[:2]])))  # what is left of the masks
    p0 = level.primes[0]
    limb = partial[:, 0, :].astype(np.float64).ravel()
    frac = np.where(limb > p0 / 2, limb - p0, limb) / (p0 / 2)
    assert np.mean(np.abs(frac)) == pytest.approx(0.5, abs=0.02)  # uniform mod q_0
    assert not np.array_equal(masked(names[:2])["node-0"], out["node-0"])  # another A: other masks
    assert not np.array_equal(masked(names, round_=2)["node-0"], out["node-0"])  # another round: other masks
    assert np.array_equal(masked(list(reversed(names)))["node-0"], out["node-0"])  # A is a set: order is moot
    with pytest.raises(th.ThresholdError, match="duplicates"):
        th.pdec_mask_context(transcript, 1, model, ["node-0", "node-0"], attempt=1)


def test_share_limbs_switches_attempt_one_only():
    """Attempt 1 is sent at L' (the compact upload), every retry at the full L (issue 21: simulatable retries)."""
    assert th.share_limbs(P, 1, 1) == 1 and th.share_limbs(P, 2, 1) == 2
    assert th.share_limbs(P, 1, 2) == th.share_limbs(P, 2, 5) == P.limbs
    for bad in (0, -1, True, 1.0):
        with pytest.raises(ValueError, match="attempt"):
            th.share_limbs(P, 1, bad)
    for bad in (0, P.limbs + 1):
        with pytest.raises(ValueError, match="limbs"):
            th.share_limbs(P, bad, 1)


def test_full_level_pdec_masks_cancel_mod_q_and_switching_each_share_keeps_them_cancelled():
    """A retry (k = 2) is masked at the full L limbs: Σ_{j∈A} (D_j + m_j) = Σ_{j∈A} D_j exactly mod q. The server
    switches each masked share to L' on arrival: Σ_j switch(D_j + m_j) is switch(Σ_j D_j) plus |A| rounding
    terms, |.| <= |A| (1/2 + 1/min q_l) + 1/2 in units of q' -- the masks leave no trace. The masks of attempt 2
    are not attempt 1's (the context binds k)."""
    from flwr_fedeval.rlwe import compact, masking

    names = ["node-0", "node-1", "node-3"]
    keys = {name: masking.new_mask_keypair() for name in names}
    shares = {name: rlwe.DecryptionShare(P, uniform_mod_q(P.primes, P.n, (2,))) for name in names}
    transcript, model = bytes(range(32)), bytes(32)

    def masked(attempt):
        context = th.pdec_mask_context(transcript, 1, model, names, attempt=attempt)
        return {j: th.mask_decryption_share(shares[j], own_name=j, own_private=keys[j][0],
                                            peers={k: keys[k][1] for k in names if k != j}, context=context).d
                for j in names}

    ring = P.ring
    out = masked(2)
    plain_sum = ring.sum(np.stack([shares[j].d for j in names]))
    assert np.array_equal(ring.sum(np.stack(list(out.values()))), plain_sum)  # exactly, mod q
    for j in names:
        assert not np.array_equal(out[j], shares[j].d)
    assert not np.array_equal(masked(1)["node-0"], out["node-0"])  # another k: other masks
    level = compact.level_parameter_set(P, 1)
    switched = level.ring.sum(np.stack([compact.switch_modulus(P, out[j], 1) for j in names]))
    diff = level.ring.to_int(level.ring.sub(switched, compact.switch_modulus(P, plain_sum, 1)))
    assert 0 < np.max(np.abs(diff)) <= 2  # 3 (1/2 + ε) + 1/2 + ε: the rounding terms only (a mask is ~q'/2)
