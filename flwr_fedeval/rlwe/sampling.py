"""Sampling from a cryptographically secure generator (never NumPy's generators).

Every random polynomial comes from a :class:`RandomStream`: the ChaCha20
keystream (``cryptography``, OpenSSL) under a 256-bit key. A fresh stream is
keyed from ``secrets.token_bytes`` (the OS CSPRNG); the public polynomial
``a`` is the stream keyed by SHA-256 of a domain-separation label, the
parameter-set id and a 32-byte public seed, so every party expands the same
``a`` from the seed (DESIGN.md §3).

Distributions (Walskaar et al. 2023, Sec. 2.9.2: chi for keys, psi for
encryption noise, phi for partial-decryption noise):

* uniform mod q -- independent uniform residues per prime (= uniform mod q by
  the CRT), by rejection sampling of 32-bit words;
* uniform ternary {-1, 0, 1} (chi: secrets s_i and ephemeral v_i), by
  rejection of bytes >= 255;
* discrete Gaussian sigma = 3.2 tail-cut at |e| <= 19 (psi: e_i, e0, e1), by
  inversion of a 64-bit cumulative distribution table;
* uniform smudging noise in [-B, B) with B = 2^k (phi: e*_i, Eq. 7), exact
  in RNS for k up to 94.
"""

from __future__ import annotations

import hashlib
import math
import secrets

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

__all__ = [
    "RandomStream",
    "new_public_seed",
    "uniform_mod_q",
    "ternary",
    "discrete_gaussian",
    "uniform_smudging",
    "expand_public_polynomial",
]

SEED_BYTES = 32
_A_DOMAIN = b"flwr-fedeval/xmkckks/public-a/v1"


class RandomStream:
    """A ChaCha20 keystream used as a CSPRNG.

    Parameters
    ----------
    key : bytes of length 32, optional
        Stream key. ``None`` (the default) draws a fresh key from
        ``secrets.token_bytes`` (the operating system CSPRNG). Pass a key only
        for deterministic expansion of *public* values or for tests.

    Raises
    ------
    ValueError
        If ``key`` is not 32 bytes.
    """

    def __init__(self, key: bytes | None = None) -> None:
        if key is None:
            key = secrets.token_bytes(32)
        if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
            raise ValueError("key must be 32 bytes")
        nonce = bytes(16)  # the key is single-use per stream
        self._enc = Cipher(algorithms.ChaCha20(bytes(key), nonce), mode=None).encryptor()

    def bytes(self, count: int) -> bytes:
        """The next ``count`` keystream bytes."""
        return self._enc.update(bytes(count))

    def uint8(self, count: int) -> np.ndarray:
        """``count`` uniform uint8 values."""
        return np.frombuffer(self.bytes(count), dtype=np.uint8)

    def uint32(self, count: int) -> np.ndarray:
        """``count`` uniform uint32 values."""
        return np.frombuffer(self.bytes(4 * count), dtype="<u4").astype(np.uint32)

    def uint64(self, count: int) -> np.ndarray:
        """``count`` uniform uint64 values."""
        return np.frombuffer(self.bytes(8 * count), dtype="<u8").astype(np.uint64)


def new_public_seed() -> bytes:
    """A fresh 32-byte public seed for :func:`expand_public_polynomial`."""
    return secrets.token_bytes(SEED_BYTES)


def _stream(rng: RandomStream | None) -> RandomStream:
    return RandomStream() if rng is None else rng


def _uniform_below(rng: RandomStream, p: int, count: int) -> np.ndarray:
    """``count`` uniform integers in [0, p), p < 2^32, by rejection."""
    bits = (p - 1).bit_length()
    mask = np.uint32((1 << bits) - 1)
    accept = p / float(1 << bits)
    out = np.empty(0, dtype=np.uint32)
    while out.size < count:
        need = count - out.size
        draw = rng.uint32(int(need / accept * 1.02) + 64) & mask
        out = np.concatenate([out, draw[draw < p][:need]])
    return out


def uniform_mod_q(
    primes: tuple[int, ...], n: int, batch: tuple[int, ...] = (), rng: RandomStream | None = None
) -> np.ndarray:
    """Uniform elements of R_q.

    Returns
    -------
    ndarray of shape batch + (L, n), dtype uint64, limb i uniform in [0, q_i)
    """
    rng = _stream(rng)
    count = int(np.prod(batch, dtype=np.int64)) * n
    limbs = [_uniform_below(rng, p, count).reshape(batch + (n,)) for p in primes]
    return np.stack(limbs, axis=-2).astype(np.uint64)


def ternary(shape: tuple[int, ...], rng: RandomStream | None = None) -> np.ndarray:
    """Uniform ternary coefficients in {-1, 0, 1}.

    Returns
    -------
    ndarray of the given shape, dtype int8
    """
    rng = _stream(rng)
    count = int(np.prod(shape, dtype=np.int64))
    out = np.empty(0, dtype=np.uint8)
    while out.size < count:
        need = count - out.size
        draw = rng.uint8(need + need // 128 + 64)
        out = np.concatenate([out, draw[draw < 255][:need]])
    return ((out % 3).astype(np.int8) - 1).reshape(shape)


def _gaussian_cdt(sigma: float, tail: int) -> tuple[np.ndarray, np.ndarray]:
    """Thresholds T_k = floor(2^64 * P(X <= x_k)) for X ~ D_{Z, sigma} cut at |x| <= tail."""
    xs = np.arange(-tail, tail + 1)
    w = [math.exp(-(int(x) ** 2) / (2.0 * sigma * sigma)) for x in xs]
    total = math.fsum(w)
    cdf, acc = [], 0.0
    for wi in w[:-1]:
        acc += wi
        cdf.append(int(acc / total * 2.0**64))
    return np.array(cdf, dtype=np.uint64), xs.astype(np.int8)


# (thresholds, values, guide): the guide table maps the top _GUIDE_BITS bits of a word to its
# sample when no threshold falls inside that bucket of words, else to _AMBIGUOUS
_CDT_CACHE: dict[tuple[float, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
_GUIDE_BITS = 16
_AMBIGUOUS = -128  # outside [-127, 127], the values' range


def _guide_table(cdt: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """int8 (2^16,): xs[#{T_k <= u}] for every u in bucket b = u >> 48 if that count is the same
    over the whole bucket [b 2^48, (b + 1) 2^48), else _AMBIGUOUS."""
    shift = np.uint64(64 - _GUIDE_BITS)
    first = np.arange(2**_GUIDE_BITS, dtype=np.uint64) << shift
    lo = np.searchsorted(cdt, first, side="right")
    hi = np.searchsorted(cdt, first | np.uint64(2**(64 - _GUIDE_BITS) - 1), side="right")
    guide: np.ndarray = np.where(lo == hi, xs[lo], _AMBIGUOUS).astype(np.int8)
    return guide


def _cdt_lookup(cdt: np.ndarray, xs: np.ndarray, guide: np.ndarray, u: np.ndarray) -> np.ndarray:
    """xs[searchsorted(cdt, u, side="right")] (int8, u's shape): the guide table, and the binary
    search only for the words in a bucket that holds a threshold (28 of 2^16 for sigma = 3.2)."""
    out: np.ndarray = guide[u >> np.uint64(64 - _GUIDE_BITS)]
    fix = np.flatnonzero(out == _AMBIGUOUS)
    if fix.size:
        out[fix] = xs[np.searchsorted(cdt, u[fix], side="right")]
    return out


def discrete_gaussian(
    shape: tuple[int, ...],
    sigma: float = 3.2,
    tail: int = 19,
    rng: RandomStream | None = None,
) -> np.ndarray:
    """Discrete Gaussian D_{Z, sigma} restricted to |x| <= tail (inversion sampling).

    The error distribution of RLWE key generation and encryption (Walskaar et
    al. 2023, Eqs. 1 and 6; σ = 3.2 as in the HomomorphicEncryption.org
    standard). Each sample is one uniform 64-bit word looked up in the
    cumulative distribution table T_k = floor(2^64·P(X ≤ x_k)) (a CDT sampler), through a guide
    table on the top 16 bits (the binary search only where a threshold splits the bucket).

    Parameters
    ----------
    shape : tuple of int
        Shape of the output, e.g. ``(L, n)`` or ``(k, L, n)``.
    sigma : float, default 3.2
        Width parameter σ (standard deviation of the untruncated Gaussian).
    tail : int, default 19
        Cut-off: floor(6σ); the mass beyond is ~1e-9 and is renormalised, as
        SEAL does with its 6-sigma clipped normal.
    rng : RandomStream, optional
        ChaCha20 stream keyed from ``secrets``; a fresh one by default.

    Returns
    -------
    ndarray of the given shape, dtype int8, values in [-tail, tail]

    Raises
    ------
    ValueError
        If ``sigma`` is not a finite number > 0, ``tail`` is not an integer in
        [0, 127] (the int8 output range), or ``shape`` has a negative entry.
    """
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not 0 < sigma < math.inf:
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    if isinstance(tail, bool) or not isinstance(tail, (int, np.integer)) or not 0 <= tail <= 127:
        raise ValueError(f"tail must be an integer in [0, 127] (int8 output), got {tail!r}")
    key = (float(sigma), int(tail))
    if key not in _CDT_CACHE:
        cdt, xs = _gaussian_cdt(*key)
        _CDT_CACHE[key] = (cdt, xs, _guide_table(cdt, xs))
    cdt, xs, guide = _CDT_CACHE[key]
    rng = _stream(rng)
    count = int(np.prod(shape, dtype=np.int64))
    u = np.frombuffer(rng.bytes(8 * count), dtype="<u8")  # the keystream's words, read in place (no copy)
    return _cdt_lookup(cdt, xs, guide, u).reshape(shape)


def uniform_smudging(
    primes: tuple[int, ...],
    n: int,
    bound_bits: int,
    batch: tuple[int, ...] = (),
    rng: RandomStream | None = None,
) -> np.ndarray:
    """Uniform integers in [-2^bound_bits, 2^bound_bits), in RNS form.

    Parameters
    ----------
    primes : tuple of int
    n : int
    bound_bits : int
        k with B = 2^k, 1 <= k <= 94.
    batch : tuple of int

    Returns
    -------
    ndarray of shape batch + (L, n), dtype uint64

    Notes
    -----
    X = hi * 2^32 + lo - 2^k with hi uniform on k+1-32 bits and lo on 32 bits,
    reduced modulo each q_i exactly in 64-bit arithmetic.
    """
    if not 1 <= bound_bits <= 94:
        raise ValueError(f"bound_bits must be in [1, 94], got {bound_bits}")
    rng = _stream(rng)
    count = int(np.prod(batch, dtype=np.int64)) * n
    width = bound_bits + 1
    lo = rng.uint32(count).astype(np.int64)
    if width > 32:
        hi = (rng.uint64(count) & np.uint64((1 << (width - 32)) - 1)).astype(np.int64)
    else:
        lo &= np.int64((1 << width) - 1)
        hi = np.zeros(count, dtype=np.int64)
    out = np.empty(batch + (len(primes), n), dtype=np.uint64)
    for i, p in enumerate(primes):
        r = hi % p
        r *= pow(2, 32, p)
        r += lo
        r += p - pow(2, bound_bits, p)  # - 2^k mod p
        r %= p
        out[..., i, :] = r.reshape(batch + (n,))
    return out


def expand_public_polynomial(
    primes: tuple[int, ...], n: int, seed: bytes, params_id: str = ""
) -> np.ndarray:
    """Deterministically expand the public polynomial ``a`` from a public seed.

    Parameters
    ----------
    primes, n : ring description
    seed : bytes of length 32
    params_id : str
        Parameter-set id, for domain separation.

    Returns
    -------
    ndarray of shape (L, n), dtype uint64, uniform in R_q

    Raises
    ------
    ValueError
        If ``seed`` is not 32 bytes.
    """
    if not isinstance(seed, (bytes, bytearray)) or len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes")
    key = hashlib.sha256(
        _A_DOMAIN + len(params_id).to_bytes(2, "little") + params_id.encode() + bytes(seed)
    ).digest()
    return uniform_mod_q(primes, n, (), RandomStream(key))
