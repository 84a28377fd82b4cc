"""CSPRNG-backed distributions and the expansion of the public polynomial a."""

import numpy as np
import pytest

from flwr_fedeval.rlwe.params import DEFAULT_PARAMETER_SET as P
from flwr_fedeval.rlwe.sampling import (
    RandomStream,
    discrete_gaussian,
    expand_public_polynomial,
    new_public_seed,
    ternary,
    uniform_mod_q,
    uniform_smudging,
)


def test_ternary_is_uniform_on_minus_one_zero_one():
    t = ternary((60000,))
    assert t.dtype == np.int8 and set(np.unique(t)) == {-1, 0, 1}
    counts = np.array([(t == v).sum() for v in (-1, 0, 1)])
    assert np.all(np.abs(counts - 20000) < 800)  # > 6 sigma slack


def test_discrete_gaussian_has_sigma_3_2_and_tail_cut():
    e = discrete_gaussian((200000,))
    assert np.abs(e).max() <= 19
    assert abs(e.std() - 3.2) < 0.05 and abs(e.mean()) < 0.05


@pytest.mark.parametrize("kwargs", [dict(sigma=0.0), dict(sigma=-3.2), dict(sigma=float("nan")),
                                    dict(sigma=float("inf")), dict(tail=128), dict(tail=-1), dict(tail=2.5)])
def test_discrete_gaussian_refuses_bad_parameters(kwargs):
    with pytest.raises(ValueError, match="sigma|tail"):
        discrete_gaussian((8,), **kwargs)


def test_discrete_gaussian_refuses_a_negative_shape():
    with pytest.raises(ValueError):
        discrete_gaussian((-1,))


def test_uniform_mod_q_is_below_each_prime_and_spread():
    x = uniform_mod_q(P.primes, P.n, (4,))
    assert x.shape == (4, P.limbs, P.n) and x.dtype == np.uint64
    assert np.all(x < P.ring.q_col)
    means = x.mean(axis=(0, 2)) / np.array(P.primes)
    assert np.all(np.abs(means - 0.5) < 0.02)


def test_uniform_smudging_covers_its_range_exactly():
    bits = 70
    x = uniform_smudging(P.primes, P.n, bits, (2,))
    vals = np.array([int(v) for v in P.ring.to_int(x).reshape(-1)], dtype=object)
    assert min(vals) >= -(2**bits) and max(vals) < 2**bits
    assert max(vals) - min(vals) > 2 ** (bits + 1) * 0.99
    assert float(np.std(vals.astype(float))) == pytest.approx(2**bits / 3**0.5, rel=0.05)


def test_public_polynomial_is_deterministic_per_seed_and_params():
    seed = new_public_seed()
    a1 = expand_public_polynomial(P.primes, P.n, seed, P.name)
    a2 = expand_public_polynomial(P.primes, P.n, seed, P.name)
    assert np.array_equal(a1, a2) and np.all(a1 < P.ring.q_col)
    other = expand_public_polynomial(P.primes, P.n, new_public_seed(), P.name)
    assert np.mean(a1 == other) < 0.01
    other_id = expand_public_polynomial(P.primes, P.n, seed, "another-id")
    assert np.mean(a1 == other_id) < 0.01
    with pytest.raises(ValueError, match="seed must be 32 bytes"):
        expand_public_polynomial(P.primes, P.n, b"short", P.name)


def test_fresh_streams_differ_and_keyed_streams_repeat():
    assert RandomStream().bytes(32) != RandomStream().bytes(32)
    assert RandomStream(bytes(32)).bytes(64) == RandomStream(bytes(32)).bytes(64)
    with pytest.raises(ValueError, match="32 bytes"):
        RandomStream(b"abc")
