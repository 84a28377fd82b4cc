"""Ring laws and exactness of both multiplication paths (NTT and FFT small)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fedeval.rlwe.ring import (
    Ring,
    find_ntt_primes,
    get_ring,
    is_prime,
    schoolbook_negacyclic,
)
from flwr_fedeval.rlwe.sampling import RandomStream, ternary, uniform_mod_q

LOG_NS = st.integers(min_value=6, max_value=10)
SEEDS = st.binary(min_size=32, max_size=32)
KINDS = st.sampled_from(["uniform", "max", "sparse"])


def _ring(log_n: int) -> Ring:
    n = 2**log_n
    return get_ring(n, find_ntt_primes(n, 31, 3))


def _element(ring: Ring, seed: bytes, kind: str, batch=()) -> np.ndarray:
    x = uniform_mod_q(ring.primes, ring.n, batch, RandomStream(seed))
    if kind == "max":
        x = np.broadcast_to(ring.q_col - np.uint64(1), x.shape).copy()
    elif kind == "sparse":
        x[..., 1:] = 0
    return x


def _schoolbook(ring: Ring, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.stack(
        [schoolbook_negacyclic(x[i], y[i], p) for i, p in enumerate(ring.primes)]
    )


@settings(max_examples=25, deadline=None)
@given(LOG_NS, SEEDS, SEEDS, KINDS)
def test_ntt_product_equals_schoolbook_on_all_limbs(log_n, s1, s2, kind):
    ring = _ring(log_n)
    x = _element(ring, s1, kind)
    y = _element(ring, s2, "uniform")
    assert np.array_equal(ring.mul(x, y), _schoolbook(ring, x, y))


@settings(max_examples=25, deadline=None)
@given(LOG_NS, SEEDS, SEEDS)
def test_fft_small_product_equals_schoolbook_on_all_limbs(log_n, s1, s2):
    ring = _ring(log_n)
    s = ternary((ring.n,), RandomStream(s1))
    y = _element(ring, s2, "uniform")
    expected = _schoolbook(ring, ring.from_signed(s), y)
    assert np.array_equal(ring.mul_small(s, y), expected)


@settings(max_examples=20, deadline=None)
@given(LOG_NS, SEEDS, SEEDS, SEEDS)
def test_multiplication_is_associative_and_commutative(log_n, s1, s2, s3):
    ring = _ring(log_n)
    x, y, z = (_element(ring, s, "uniform") for s in (s1, s2, s3))
    assert np.array_equal(ring.mul(ring.mul(x, y), z), ring.mul(x, ring.mul(y, z)))
    assert np.array_equal(ring.mul(x, y), ring.mul(y, x))


@settings(max_examples=20, deadline=None)
@given(LOG_NS, SEEDS, SEEDS, SEEDS)
def test_multiplication_distributes_over_addition(log_n, s1, s2, s3):
    ring = _ring(log_n)
    x, y, z = (_element(ring, s, "uniform") for s in (s1, s2, s3))
    left = ring.mul(x, ring.add(y, z))
    right = ring.add(ring.mul(x, y), ring.mul(x, z))
    assert np.array_equal(left, right)


@settings(max_examples=20, deadline=None)
@given(LOG_NS, SEEDS, SEEDS)
def test_additive_group_laws(log_n, s1, s2):
    ring = _ring(log_n)
    x, y = _element(ring, s1, "uniform"), _element(ring, s2, "max")
    assert np.array_equal(ring.add(x, y), ring.add(y, x))
    assert not np.any(ring.add(x, ring.neg(x)))
    assert np.array_equal(ring.sub(ring.add(x, y), y), x)
    assert np.all(ring.add(x, y) < ring.q_col)


@settings(max_examples=10, deadline=None)
@given(LOG_NS, SEEDS)
def test_ntt_roundtrip_and_batch_matches_single(log_n, seed):
    ring = _ring(log_n)
    x = _element(ring, seed, "uniform", (3,))
    assert np.array_equal(ring.intt(ring.ntt(x)), x)
    assert np.array_equal(ring.ntt(x)[1], ring.ntt(x[1]))


def test_x_times_x_pow_n_minus_1_is_minus_one():
    ring = _ring(6)
    x = ring.zeros()
    x[:, 1] = 1
    y = ring.zeros()
    y[:, ring.n - 1] = 1
    prod = ring.mul(x, y)
    assert np.array_equal(prod[:, 0], ring.q_col[:, 0] - 1)
    assert not np.any(prod[:, 1:])


def test_mul_small_is_exact_at_n_4096_batched():
    ring = get_ring(4096, find_ntt_primes(4096, 31, 3))
    rng = RandomStream(bytes(32))
    v = ternary((2, ring.n), rng)
    y = uniform_mod_q(ring.primes, ring.n, (), rng)
    assert np.array_equal(ring.mul_small(v, y), ring.mul(ring.from_signed(v), y))


def test_centered_float_reconstruction_is_exact():
    ring = get_ring(64, find_ntt_primes(64, 31, 3))
    half = (ring.q - 1) // 2
    vals = [0, 1, -1, half, -half, 2**60 + 3, -(2**61) - 5, 2**88, -(2**87)] + [7] * 55
    x = ring.from_int(np.array(vals, dtype=object))
    assert [int(v) for v in ring.to_int(x)] == vals
    got = ring.to_centered_float(x)
    assert [float(v) for v in vals] == list(got)
    assert ring.to_centered_float(x, 3)[1] == 0.125


@pytest.mark.parametrize(
    "n, primes, field",
    [
        (100, (12289,), "n must be a power of two"),
        (64, (12289, 12289), "distinct"),
        (64, (2**31 + 2**7 + 1,), "below 2\\^31"),
        (64, (12289 + 128 * 2,), "not prime"),
        (64, (7681 + 2,), "not 1 mod 2n"),
    ],
)
def test_ring_rejects_invalid_moduli(n, primes, field):
    with pytest.raises(ValueError, match=field):
        Ring(n, primes)


def test_find_ntt_primes_are_ntt_friendly():
    primes = find_ntt_primes(4096, 31, 3)
    assert all(is_prime(p) and p % 8192 == 1 and p < 2**31 for p in primes)
    assert not is_prime(2**31 - 1 - 2) and is_prime(2**31 - 1)


def test_chunked_fft_products_match_ntt_for_batches_larger_than_a_chunk():
    ring = get_ring(4096, find_ntt_primes(4096, 31, 3))
    rng = RandomStream(bytes(range(32)))
    k = 37  # > one chunk of 32 polynomials
    v = ternary((k, ring.n), rng)
    y = uniform_mod_q(ring.primes, ring.n, (k,), rng)
    fixed = uniform_mod_q(ring.primes, ring.n, (), rng)
    addend = ring.from_signed(ternary((k, ring.n), rng)).view(np.int64)
    spec_v = ring.fft_small(v)
    got = ring.mul_small_spectrum(spec_v, 64.0, fixed, addend=addend)
    expected = ring.add(ring.mul(ring.from_signed(v), fixed), addend.view(np.uint64))
    assert np.array_equal(got, expected)
    s = v[0]
    got2 = ring.mul_small_spectrum(ring.fft_small(s), 64.0, y)
    assert np.array_equal(got2, ring.mul(ring.from_signed(s), y))


@pytest.mark.parametrize("bits, count", [(27, 4), (31, 3)])
def test_lazy_ntt_is_exact_at_the_largest_residues_for_both_prime_sizes(bits, count):
    # the NTT reduces lazily (values grow by q per stage, reduced only before a product could
    # pass 2^64): all residues q_i - 1 are the worst case for that growth, at n = 4096
    ring = get_ring(4096, find_ntt_primes(4096, bits, count))
    x = np.broadcast_to(ring.q_col - np.uint64(1), (count, 4096)).copy()
    y = uniform_mod_q(ring.primes, ring.n, (), RandomStream(bytes(32)))
    assert np.array_equal(ring.intt(ring.ntt(x)), x)
    assert np.array_equal(ring.mul(x, y), _schoolbook(ring, x, y))
