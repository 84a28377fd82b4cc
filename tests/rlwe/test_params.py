"""Parameter sets: HE-Standard 128-bit bound and the worst-case noise budget."""

import math

import pytest

from flwr_fedeval.rlwe.params import (
    DEFAULT_PARAMETER_SET,
    HE_STANDARD_128_MAX_LOG2Q,
    PARAMETER_SETS,
    NoiseBudgetError,
    ParameterSet,
    check_noise_budget,
    fresh_noise_bound,
    get_parameter_set,
    max_decryptions,
    max_plaintext_int,
    max_scale_bits,
    smudging_bound,
    total_noise_bound,
)
from flwr_fedeval.rlwe.ring import find_ntt_primes


def test_named_sets_cover_n_4096_8192_16384_within_the_he_standard():
    assert {p.n for p in PARAMETER_SETS.values()} >= {4096, 8192, 16384}
    for p in PARAMETER_SETS.values():
        assert p.q.bit_length() <= HE_STANDARD_128_MAX_LOG2Q[p.n]
        assert all(q % (2 * p.n) == 1 and q < 2**31 for q in p.primes)
        assert f"q{p.q.bit_length()}" in p.name


def test_he_standard_table_matches_the_standard():
    assert HE_STANDARD_128_MAX_LOG2Q == {4096: 109, 8192: 218, 16384: 438, 32768: 881}


def test_validator_rejects_log2q_over_the_128_bit_bound():
    primes = find_ntt_primes(4096, 31, 4)  # 124 bits > 109
    with pytest.raises(ValueError, match="log2 q = 124 bits exceeds .* 109"):
        ParameterSet(name="too-big", n=4096, primes=primes)


def test_validator_rejects_unsupported_n_sigma_and_smudging():
    with pytest.raises(ValueError, match="n = 2048"):
        ParameterSet(name="x", n=2048, primes=find_ntt_primes(2048, 31, 1))
    primes = find_ntt_primes(4096, 31, 2)
    with pytest.raises(ValueError, match="sigma"):
        ParameterSet(name="x", n=4096, primes=primes, sigma=1.0)
    with pytest.raises(ValueError, match="smudging_bits"):
        ParameterSet(name="x", n=4096, primes=primes, smudging_bits=20)
    with pytest.raises(ValueError, match="not 1 mod 2n"):
        ParameterSet(name="x", n=4096, primes=(2**31 - 1,))


def test_get_parameter_set_unknown_name_raises():
    assert get_parameter_set("xmk-n4096-q109") is DEFAULT_PARAMETER_SET
    with pytest.raises(ValueError, match="unknown parameter set"):
        get_parameter_set("nope")


def test_noise_bounds_follow_the_documented_formula():
    p = DEFAULT_PARAMETER_SET
    M = 10
    fresh = 2 * p.n * M * M * 19 + M * 19
    assert fresh_noise_bound(p, M) == fresh
    smudge = smudging_bound(p, M)
    # W = 2a - 1 = 3 completed decryptions of one sum (a = 2 active sets per decryptor): W 2^40 B_fresh, rounded
    # up to a power of two (issue 21, a decryptor lost during the partial decryption)
    assert max_decryptions() == 3 and max_decryptions(1) == 1
    assert smudge >= 3 * 2**40 * fresh and smudge < 2**43 * fresh
    assert total_noise_bound(p, M) == fresh + M * smudge
    assert M * max_plaintext_int(p, M) + total_noise_bound(p, M) <= (p.q - 1) // 2


def test_max_scale_bits_is_the_largest_accepted_scale():
    p = DEFAULT_PARAMETER_SET
    k = max_scale_bits(p, num_clients=10, max_abs_value=1e4)
    budget = check_noise_budget(p, num_clients=10, scale_bits=k, max_abs_value=1e4)
    assert budget.headroom_bits > 0
    with pytest.raises(NoiseBudgetError):
        check_noise_budget(p, num_clients=10, scale_bits=k + 1, max_abs_value=1e4)


def test_sum_of_ten_unit_vectors_has_error_bound_below_1e_minus_6():
    p = DEFAULT_PARAMETER_SET
    k = max_scale_bits(p, num_clients=10, max_abs_value=1.0)
    budget = check_noise_budget(p, num_clients=10, scale_bits=k, max_abs_value=1.0)
    assert budget.error_bound < 1e-6


def test_noise_budget_rejects_too_many_clients_and_bad_arguments():
    p = DEFAULT_PARAMETER_SET
    with pytest.raises(NoiseBudgetError):
        max_plaintext_int(p, 2**20)
    with pytest.raises(ValueError, match="num_clients"):
        check_noise_budget(p, num_clients=0, scale_bits=10, max_abs_value=1.0)
    with pytest.raises(ValueError, match="max_abs_value"):
        check_noise_budget(p, num_clients=2, scale_bits=10, max_abs_value=math.inf)
