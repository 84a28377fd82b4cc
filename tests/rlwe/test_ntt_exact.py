"""The fast ring paths against slow references (issue 21, speed): the blocked, transposed,
Shoup-lazy NTT and INTT, and the FFT product's reduction of s*y + addend.

The reference evaluates the definition with Python integers: the forward NTT in bit-reversed
order is x(psi^(2 rev(k) + 1)) (Longa--Naehrig 2016, Eq. 1 with the twist by psi), the inverse
solves it back. Every parameter set's primes are used (27-bit q108, 31-bit q93 and larger sets,
the split 24/23/31/31-bit q109 shape), with all-(q_i - 1) inputs as the worst case of the lazy
growth and batches that cross the block size and the transposed stages (n > 64).
"""

import numpy as np
import pytest

from flwr_fedeval.rlwe.params import PARAMETER_SETS
from flwr_fedeval.rlwe.ring import Ring, _bit_reverse, find_ntt_primes, schoolbook_negacyclic
from flwr_fedeval.rlwe.sampling import RandomStream, uniform_mod_q

_SPLIT_Q109 = (
    find_ntt_primes(4096, 24, 1)[0],
    find_ntt_primes(4096, 23, 1)[0],
    *find_ntt_primes(4096, 31, 2),
)
PRIME_SETS = {name: p.primes for name, p in PARAMETER_SETS.items()} | {"split-24-23-31-31": _SPLIT_Q109}


def _reference_ntt(ring: Ring, x: np.ndarray) -> np.ndarray:
    """Slow NTT of one element (L, n): out[i, k] = sum_j x[i, j] psi_i^((2 rev(k) + 1) j) mod q_i."""
    n = ring.n
    rev = _bit_reverse(n)
    out = np.zeros((ring.limbs, n), dtype=np.uint64)
    for i, q in enumerate(ring.primes):
        coeffs = [int(c) for c in x[i]]
        for k in range(n):
            r = pow(ring.psi[i], 2 * int(rev[k]) + 1, q)
            acc, p = 0, 1
            for c in coeffs:
                acc += c * p
                p = p * r % q
            out[i, k] = acc % q
    return out


def _inputs(ring: Ring, batch: int, seed: bytes) -> np.ndarray:
    x = uniform_mod_q(ring.primes, ring.n, (batch,), RandomStream(seed))
    x[0] = ring.q_col - np.uint64(1)  # largest residues: the lazy bound's worst case
    x[-1, :, 1:] = 0
    return x


@pytest.mark.parametrize("name", sorted(PRIME_SETS))
@pytest.mark.parametrize("n", [8, 128])
def test_ntt_matches_the_definition_and_intt_inverts_it(name, n):
    primes = tuple(p for p in PRIME_SETS[name] if p % (2 * n) == 1)
    ring = Ring(n, primes)
    x = _inputs(ring, 3, bytes([n % 256]) * 32)
    got = ring.ntt(x)
    for b in range(x.shape[0]):
        assert np.array_equal(got[b], _reference_ntt(ring, x[b]))
    assert np.array_equal(ring.intt(got), x)
    assert np.array_equal(ring.ntt(x[1]), got[1])  # unbatched (L, n)


@pytest.mark.parametrize("name", sorted(PRIME_SETS))
def test_n4096_product_equals_schoolbook_across_blocks(name):
    ring = Ring(4096, PRIME_SETS[name])
    batch = 2**16 // (ring.limbs * ring.n) * 2 + 1  # two full blocks and a partial one
    x = _inputs(ring, batch, b"\x07" * 32)
    y = uniform_mod_q(ring.primes, ring.n, (), RandomStream(b"\x08" * 32))
    y[:, ::2] = ring.q_col - np.uint64(1)
    spectra = ring.ntt(x)
    assert np.all(spectra.max(axis=(0, 2)) < ring.q_col[:, 0])  # fully reduced
    assert np.array_equal(ring.intt(spectra), x)
    prod = ring.mul(x, y[None])
    for b in (0, batch // 2, batch - 1):
        expected = np.stack([schoolbook_negacyclic(x[b, i], y[i], p) for i, p in enumerate(ring.primes)])
        assert np.array_equal(prod[b], expected)


def test_ntt_rejects_a_wrong_trailing_shape():
    ring = Ring(128, find_ntt_primes(128, 31, 2))
    with pytest.raises(ValueError, match="expected"):
        ring.ntt(np.zeros((3, 128), dtype=np.uint64))


@pytest.mark.parametrize("name", ["xmk-n4096-q108", "xmk-n4096-q93", "split-24-23-31-31"])
def test_fft_product_with_signed_addend_reduces_like_python_ints(name):
    # _from_spectrum reduces s*y + addend by an unsigned remainder after an offset: check it
    # against exact Python integers, with addends of both signs up to the documented 2^62 - n 2^31
    n = 128
    ring = Ring(n, PRIME_SETS[name])
    rs = RandomStream(b"\x09" * 32)
    y = uniform_mod_q(ring.primes, n, (3,), rs)
    y[0] = ring.q_col - np.uint64(1)
    s = (rs.uint64(3 * n) % np.uint64(3)).astype(np.int64).reshape(3, n) - 1
    s[0] = -1  # the most negative convolution against the largest residues
    addend = (rs.uint64(3 * ring.limbs * n) >> np.uint64(2)).view(np.int64).reshape(3, ring.limbs, n)
    addend[1] = -addend[1]
    addend[2] //= 2**30
    addend[0] = -(2**62 - n * 2**31) + 1
    s_norm = float(np.sqrt(np.max(np.sum(s.astype(np.float64) ** 2, axis=-1))))
    got = ring.mul_small_spectrum(ring.fft_small(s), s_norm, y, addend=addend)
    for b in range(3):
        for i, q in enumerate(ring.primes):
            conv = [0] * n
            for j in range(n):
                for k in range(n):
                    v = int(s[b, j]) * int(y[b, i, k])
                    if j + k < n:
                        conv[j + k] += v
                    else:
                        conv[j + k - n] -= v
            want = [(c + int(a)) % q for c, a in zip(conv, addend[b, i])]
            assert got[b, i].tolist() == want
