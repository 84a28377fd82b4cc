"""Compact uploads: modulus switching of c0 and decryption shares (issue 21 item 4)."""

import numpy as np
import pytest

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe import compact
from flwr_fedeval.rlwe.params import get_parameter_set
from flwr_fedeval.rlwe.sampling import uniform_mod_q

Q93 = get_parameter_set("xmk-n4096-q93")
Q108 = get_parameter_set("xmk-n4096-q108")
SEED_CNN_WEIGHTS = 949_002  # flwr_fedeval.clients.models.SEED_CNN_NUM_PARAMETERS


@pytest.mark.parametrize("params", [Q93, Q108])
def test_switch_modulus_rounds_x_over_Q_within_one_half(params):
    x = uniform_mod_q(params.primes, params.n, (2,))
    x[0, :, :4] = 0  # 0 and values next to it, including negative centred ones
    x[0, :, 1] = 1
    x[0, :, 2] = params.ring.q_col[:, 0] - 1
    for keep in range(1, params.limbs + 1):
        got = compact.switch_modulus(params, x, keep)
        level = compact.level_parameter_set(params, keep)
        assert got.shape == (2, keep, params.n) and got.dtype == np.uint64
        Q = compact.dropped_modulus(params, keep)
        exact = params.ring.to_int(x)  # centred, in (-q/2, q/2]
        back = level.ring.to_int(got)
        err = max(abs(int(b) * Q - int(e)) for b, e in zip(back.ravel(), exact.ravel()))
        assert 2 * err <= Q + 2 * Q // min(params.primes)  # |x/Q - x'| <= 1/2 + 1/min q_l
        assert back[0, 0] == 0 and back[0, 1] == (1 if Q == 1 else 0) and back[0, 2] == (-1 if Q == 1 else 0)


def test_switching_is_additive_up_to_rounding():
    x = uniform_mod_q(Q93.primes, Q93.n, (3,))
    level = compact.level_parameter_set(Q93, 1)
    summed = compact.switch_modulus(Q93, Q93.ring.sum(x), 1)
    parts = level.ring.sum(compact.switch_modulus(Q93, x, 1))
    diff = level.ring.to_int(level.ring.sub(summed, parts))
    assert max(abs(int(v)) for v in diff.ravel()) <= 2  # three roundings, each < 1


def test_level_parameter_set_and_bad_limbs():
    level = compact.level_parameter_set(Q108, 2)
    assert level.primes == Q108.primes[:2] and level.n == Q108.n and level.name == "xmk-n4096-q108/L2"
    assert compact.level_parameter_set(Q108, 4) is Q108
    assert compact.level_parameter_set(Q108, 2) is level  # cached: one ring per level
    for bad in (0, 5, True, 1.0):
        with pytest.raises(ValueError, match="limbs"):
            compact.level_parameter_set(Q108, bad)
    with pytest.raises(ValueError, match="x has coefficients"):
        compact.switch_modulus(Q108, Q108.ring.zeros((1,)) + Q108.ring.q_col, 1)


def _round(params, num_clients, values, *, threshold=False):
    """M clients encrypt, compress c0; shares computed on the exact C1 then compressed."""
    a = rlwe.expand_a(params, rlwe.new_public_seed())
    keys = [rlwe.keygen(params, a) for _ in range(num_clients)]
    pk = rlwe.aggregate_public_keys([b for _, b in keys])
    max_abs = float(np.max(np.abs(values)))
    k = rlwe.max_scale_bits(params, num_clients=num_clients, max_abs_value=max_abs)
    keep = compact.compact_limbs(params, num_clients=num_clients, scale_bits=k, max_abs_value=max_abs)
    uploads = [
        compact.compress_ciphertext(rlwe.encrypt_vector(params, pk, a, x, scale_bits=k, num_clients=num_clients), keep)
        for x in values
    ]
    uploads = [compact.CompactCiphertext.from_bytes(u.to_bytes(), params, keep) for u in uploads]  # the wire
    total = compact.add_compact_ciphertexts(uploads)
    if threshold:
        points = rlwe.member_points(num_clients)
        t = rlwe.min_threshold(num_clients)
        dealt = [rlwe.split_secret(params, sk, threshold=t, points=points) for sk, _ in keys]
        active = points[-t:]
        shares = [
            rlwe.threshold_partial_decrypt(
                params, rlwe.aggregate_shares(params, [d[x] for d in dealt]), active, total.c1,
                num_clients=num_clients,
            )
            for x in active
        ]
    else:
        shares = [rlwe.partial_decrypt(params, sk, total.c1, num_clients=num_clients) for sk, _ in keys]
    level = compact.level_parameter_set(params, keep)
    small = [compact.compress_decryption_share(params, d, keep) for d in shares]
    small = [rlwe.DecryptionShare.from_bytes(d.to_bytes(), level) for d in small]
    got = compact.compact_combine_and_decode(params, keep, total.c0, small, values.shape[1], scale_bits=k)
    fixed = np.sum(np.rint(values * 2.0**k), axis=0) / 2.0**k
    bound = (compact.compact_noise_bound(params, keep, num_clients=num_clients) + num_clients / 2) / 2.0**k
    return keep, got, fixed, bound, uploads, small


def test_compact_round_at_q93_keeps_one_limb_and_decodes_within_the_bound():
    M = 10
    gen = np.random.default_rng(7)  # test data, not key material
    values = gen.uniform(-1.0, 1.0, (M, 2 * Q93.n - 5))
    values[:, :50] = 1.0  # every client at +max: the M-fold sum at the top of Z_q'
    values[:, 50:100] = -1.0
    keep, got, fixed, bound, uploads, shares = _round(Q93, M, values)
    assert keep == 1
    assert uploads[0].c0.shape == (2, 1, Q93.n) and uploads[0].c1.shape == (2, 3, Q93.n)
    assert shares[0].d.shape == (2, 1, Q93.n)
    err = np.max(np.abs(got - fixed))
    assert err <= bound
    assert bound <= 1.5 * rlwe.check_noise_budget(Q93, num_clients=M, scale_bits=88, max_abs_value=1.0).error_bound
    assert np.allclose(got[:50], M) and np.allclose(got[50:100], -M)


def test_compact_round_with_threshold_shares_at_q108():
    M = 5
    gen = np.random.default_rng(8)
    values = gen.uniform(-2.0**16, 2.0**16, (M, 300))
    keep, got, fixed, bound, _, _ = _round(Q108, M, values, threshold=True)
    assert keep == 2
    assert np.max(np.abs(got - fixed)) <= bound


def test_compact_limbs_stops_where_the_rounding_would_exceed_the_noise_and_the_error_target():
    # at q93 with M = 2: one limb lets the rounding (2 M Q) more than double the worst-case error
    # (condition 6, first branch), two limbs do not (M = 3 until the smudging was sized for W = 3
    # decryptions of one sum, issue 21: the noise grew by 2 bits and one limb now holds M = 3); one limb
    # still keeps the error of the sum within the 1e-6 target at this scale (second branch), so the
    # default takes it, and a target just below its bound does not
    M = 2
    k = rlwe.max_scale_bits(Q93, num_clients=M, max_abs_value=1.0)
    bound_2 = compact.compact_noise_bound(Q93, 2, num_clients=M)
    bound_1 = compact.compact_noise_bound(Q93, 1, num_clients=M)
    assert bound_1 > 2 * rlwe.total_noise_bound(Q93, M) >= bound_2
    error_1 = (bound_1 + M / 2) / 2.0**k
    assert error_1 <= compact.ERROR_TARGET
    assert compact.compact_limbs(Q93, num_clients=M, scale_bits=k, max_abs_value=1.0) == 1
    assert compact.compact_limbs(Q93, num_clients=M, scale_bits=k, max_abs_value=1.0, max_error=0.0) == 2
    assert compact.compact_limbs(Q93, num_clients=M, scale_bits=k, max_abs_value=1.0,
                                 max_error=error_1 * 0.99) == 2
    with pytest.raises(ValueError, match="max_error"):
        compact.compact_limbs(Q93, num_clients=M, scale_bits=k, max_abs_value=1.0, max_error=-1.0)


def test_compact_limbs_refuses_what_the_full_modulus_cannot_hold():
    with pytest.raises(rlwe.NoiseBudgetError):
        compact.compact_limbs(Q93, num_clients=10, scale_bits=120, max_abs_value=1.0)
    # a smaller scale leaves more room: never more limbs than at the largest scale
    k = rlwe.max_scale_bits(Q108, num_clients=10, max_abs_value=1.0)
    assert compact.compact_limbs(Q108, num_clients=10, scale_bits=k - 30, max_abs_value=1.0) <= 2


def test_compact_ciphertext_parsing_is_strict():
    x = uniform_mod_q(Q93.primes, Q93.n, (1,))
    ct = compact.CompactCiphertext(Q93, 1, compact.switch_modulus(Q93, x, 1), x)
    data = ct.to_bytes()
    back = compact.CompactCiphertext.from_bytes(data, Q93, 1)
    assert np.array_equal(back.c0, ct.c0) and np.array_equal(back.c1, ct.c1)
    with pytest.raises(ValueError, match="params_id"):
        compact.CompactCiphertext.from_bytes(data, Q93, 2)
    with pytest.raises(ValueError, match="payload length"):
        compact.CompactCiphertext.from_bytes(data[:-1], Q93, 1)
    with pytest.raises(ValueError, match="payload length"):
        compact.CompactCiphertext.from_bytes(data + b"\0", Q93, 1)
    with pytest.raises(ValueError, match="c0"):
        compact.CompactCiphertext(Q93, 1, x, x)
    with pytest.raises(ValueError, match="same k"):
        compact.CompactCiphertext(Q93, 1, ct.c0, np.concatenate([x, x]))
    with pytest.raises(ValueError, match="L2"):
        compact.add_compact_ciphertexts([ct, compact.compress_ciphertext(rlwe.Ciphertext(Q93, x, x), 2)])
    with pytest.raises(ValueError, match="parameter set"):
        compact.compress_decryption_share(Q108, rlwe.DecryptionShare(Q93, x), 1)


def _upload_bytes(params, keep, weights):
    """Measured bytes of one client's compact upload (ciphertext + decryption share), real encodings."""
    k = rlwe.num_polys(params, weights + 1)  # the weights and the example count n_i
    c1 = params.ring.zeros((k,))  # the encoding's length does not depend on the values
    ct = compact.compress_ciphertext(rlwe.Ciphertext(params, c1, c1), keep)
    share = compact.compress_decryption_share(params, rlwe.DecryptionShare(params, c1), keep)
    return len(ct.to_bytes()) + len(share.to_bytes())


def test_upload_size_per_float32_weight_for_the_seed_cnn():
    weights = SEED_CNN_WEIGHTS
    k = rlwe.max_scale_bits(Q93, num_clients=10, max_abs_value=2.0**16)
    keep = compact.compact_limbs(Q93, num_clients=10, scale_bits=k, max_abs_value=2.0**16)
    ratio_93 = _upload_bytes(Q93, keep, weights) / (4 * weights)
    assert keep == 1 and ratio_93 <= 5.0  # the goal
    coefficients = rlwe.num_polys(Q93, weights + 1) * Q93.n
    assert ratio_93 == pytest.approx((93 + 31 + 31) / 8 * coefficients / (4 * weights), rel=1e-4)  # bit-packed
    k = rlwe.max_scale_bits(Q108, num_clients=10, max_abs_value=2.0**16)
    keep = compact.compact_limbs(Q108, num_clients=10, scale_bits=k, max_abs_value=2.0**16)
    ratio_108 = _upload_bytes(Q108, keep, weights) / (4 * weights)
    assert keep == 2 and ratio_108 < 0.67 * 10.2  # from 10.1 x: c0 and D at 54 of 108 bits


Q109 = get_parameter_set("xmk-n4096-q109")


# slack: the most the set's error bound may exceed q108's where q108's exceeds ERROR_TARGET (the default
# must not exceed it at all; the five-limb set does at a few M, by up to 11 %, hence not the default)
@pytest.mark.parametrize("name, widths, bits, slack", [("xmk-n4096-q109", [24, 23, 31, 31], 203, 1.0),
                                                        ("xmk-n4096-q109-l5", [23, 22, 21, 21, 22], 199, 1.12)])
def test_split_set_passes_the_security_check_and_keeps_two_limbs_for_2_to_100_clients(name, widths, bits, slack):
    # the split sets of docs/explanation/upload-size.md: the largest NTT primes below 2^w, w in widths
    params = get_parameter_set(name)
    assert [p.bit_length() for p in params.primes] == widths
    assert all(p % (2 * params.n) == 1 and p > 0.94 * 2 ** p.bit_length() for p in params.primes)
    assert params.q.bit_length() == rlwe.HE_STANDARD_128_MAX_LOG2Q[4096] == 109
    rlwe.validate_security(params)
    with pytest.raises(ValueError, match="log2 q"):  # one more bit would fail the HE-Standard check
        w = widths[1] + 1
        rlwe.ParameterSet(name="x", n=4096, primes=(params.primes[0], rlwe.find_ntt_primes(4096, w, 2)[1])
                          + params.primes[2:])
    for M in range(2, 101):
        k = rlwe.max_scale_bits(params, num_clients=M, max_abs_value=2.0**16)
        keep = compact.compact_limbs(params, num_clients=M, scale_bits=k, max_abs_value=2.0**16)
        assert keep == 2, M
        assert sum(widths) + 2 * sum(widths[:keep]) == bits
        error = (compact.compact_noise_bound(params, keep, num_clients=M) + M / 2) / 2.0**k
        k108 = rlwe.max_scale_bits(Q108, num_clients=M, max_abs_value=2.0**16)
        keep108 = compact.compact_limbs(Q108, num_clients=M, scale_bits=k108, max_abs_value=2.0**16)
        error108 = (compact.compact_noise_bound(Q108, keep108, num_clients=M) + M / 2) / 2.0**k108
        # never worse than q108 where q108 misses the target, within the target where it meets it
        assert error <= max(slack * error108, compact.ERROR_TARGET), M


@pytest.mark.parametrize("M", [2, 5, 10])
def test_compact_round_at_q109_decodes_within_the_bound(M):
    # M = 2: the rounding more than doubles the noise (2MQ = 2 B_total) but keeps the error of the sum
    # within ERROR_TARGET; M = 5 and 10: at most doubles it
    gen = np.random.default_rng(9)  # test data, not key material
    values = gen.uniform(-2.0**16, 2.0**16, (M, 300))
    values[:, :20] = 2.0**16  # every client at +max: the M-fold sum at the top of Z_q'
    values[:, 20:40] = -(2.0**16)
    keep, got, fixed, bound, uploads, shares = _round(Q109, M, values, threshold=True)
    assert keep == 2
    assert uploads[0].c0.shape == (1, 2, Q109.n) and shares[0].d.shape == (1, 2, Q109.n)
    assert bound <= max(compact.ERROR_TARGET, 2 * rlwe.check_noise_budget(
        Q109, num_clients=M, scale_bits=rlwe.max_scale_bits(Q109, num_clients=M, max_abs_value=2.0**16),
        max_abs_value=2.0**16).error_bound)
    assert np.max(np.abs(got - fixed)) <= bound
    assert np.allclose(got[:20], M * 2.0**16) and np.allclose(got[20:40], -M * 2.0**16)


def test_the_default_is_the_four_limb_split_set():
    assert rlwe.DEFAULT_PARAMETER_SET is Q109


def test_upload_size_per_float32_weight_at_q109_is_203_bits_per_coefficient():
    weights = SEED_CNN_WEIGHTS
    coefficients = rlwe.num_polys(Q109, weights + 1) * Q109.n
    ratios = {}
    for M in (2, 5, 10, 100):
        k = rlwe.max_scale_bits(Q109, num_clients=M, max_abs_value=2.0**16)
        keep = compact.compact_limbs(Q109, num_clients=M, scale_bits=k, max_abs_value=2.0**16)
        ratios[M] = _upload_bytes(Q109, keep, weights) / (4 * weights)
        assert ratios[M] == pytest.approx((109 + 2 * 47) / 8 * coefficients / (4 * weights), rel=1e-4)
    k = rlwe.max_scale_bits(Q108, num_clients=10, max_abs_value=2.0**16)
    keep = compact.compact_limbs(Q108, num_clients=10, scale_bits=k, max_abs_value=2.0**16)
    assert ratios[10] < 0.95 * _upload_bytes(Q108, keep, weights) / (4 * weights)  # 203 vs 216 bits
    assert ratios[10] < 6.36
