"""Residues of signed integers by the unsigned-offset remainder (issue 21, speed): mod_signed,
Ring.from_signed and encoding.float_ints_to_rns against Python integers, both signs, every path."""

import numpy as np
import pytest

from flwr_fedeval.rlwe.encoding import float_ints_to_rns
from flwr_fedeval.rlwe.params import PARAMETER_SETS
from flwr_fedeval.rlwe.ring import mod_signed
from flwr_fedeval.rlwe.sampling import RandomStream


def _signed_words(count: int, seed: bytes) -> np.ndarray:
    return RandomStream(seed).uint64(count).view(np.int64)


@pytest.mark.parametrize("q", [3, 65537, 2**31 - 1, 4293918721, 2**62 + 135])
def test_mod_signed_equals_python_floor_mod(q):
    v = np.maximum(_signed_words(20_000, bytes([q % 256]) * 32), -(2**63) + q + 1)  # the documented range
    v[:4] = [-(2**63) + q + 1, 2**63 - 1, -1, 0]
    got = mod_signed(v, q)
    assert got.dtype == np.uint64
    assert got.tolist() == [int(x) % q for x in v.tolist()]


@pytest.mark.parametrize("name", ["xmk-n4096-q108", "xmk-n4096-q93"])
@pytest.mark.parametrize("bits", [30, 61, 95, 300])  # the < 2^62, < 2^96 and frexp paths
def test_float_ints_to_rns_equals_python_ints(name, bits):
    params = PARAMETER_SETS[name]
    w = _signed_words(2 * params.n, bytes([bits % 256]) * 32).astype(np.float64)
    ints = np.rint(w / 2.0**63 * 2.0**bits).reshape(2, params.n)
    ints[0, :3] = [2.0**bits - 2.0 ** max(bits - 52, 0), -(2.0**bits) + 2.0 ** max(bits - 52, 0), 0.0]
    got = float_ints_to_rns(params, ints)
    for b in range(2):
        exact = [int(x) for x in ints[b].tolist()]  # float64 integers are exact Python ints
        for i, p in enumerate(params.primes):
            assert got[b, i].tolist() == [x % p for x in exact]


def test_from_signed_equals_python_floor_mod():
    ring = PARAMETER_SETS["xmk-n4096-q108"].ring
    v = _signed_words(3 * ring.n, b"\x05" * 32).reshape(3, ring.n) >> 2  # |v| < 2^62
    got = ring.from_signed(v)
    assert got.shape == (3, ring.limbs, ring.n)
    for i, p in enumerate(ring.primes):
        assert got[:, i].ravel().tolist() == [int(x) % p for x in v.ravel().tolist()]


@pytest.mark.parametrize("name", ["xmk-n4096-q108", "xmk-n4096-q93"])
def test_garner_digits_equal_the_mixed_radix_digits_of_the_crt_integer(name):
    ring = PARAMETER_SETS[name].ring
    words = RandomStream(b"\x06" * 32).uint64(ring.limbs * ring.n).reshape(ring.limbs, ring.n)
    x = (words >> np.uint64(33)) % ring.q_col
    x[:, 0] = ring.q_col[:, 0] - np.uint64(1)
    digits = ring._garner(x)
    crt = [int(v) % ring.q for v in ring.to_int(x).tolist()]
    for k in range(ring.n):
        rest = crt[k]
        for i, p in enumerate(ring.primes):
            assert int(digits[i][k]) == rest % p
            rest //= p


@pytest.mark.parametrize("name, keep", [("xmk-n4096-q109", 2), ("xmk-n4096-q109", 1), ("xmk-n4096-q108", 2)])
def test_switch_modulus_equals_the_successive_centred_rounding_of_the_crt_integer(name, keep):
    from flwr_fedeval.rlwe.compact import switch_modulus

    params = PARAMETER_SETS[name]
    ring = params.ring
    words = RandomStream(b"\x0a" * 32).uint64(2 * ring.limbs * ring.n).reshape(2, ring.limbs, ring.n)
    x = (words >> np.uint64(33)) % ring.q_col
    x[0, :, 0] = ring.q_col[:, 0] - np.uint64(1)
    x[0, :, 1] = 0
    got = switch_modulus(params, x, keep)
    for b in range(2):
        for k, big in enumerate(ring.to_int(x[b]).tolist()):
            X = int(big) % ring.q
            for p in reversed(params.primes[keep:]):  # the last prime first
                r = X % p
                X = (X - (r - p if r > p // 2 else r)) // p
            assert got[b, :, k].tolist() == [X % p for p in params.primes[:keep]]
