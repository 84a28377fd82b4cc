"""Fixed-point encoding of float vectors into batches of R_q plaintexts.

A vector x of length N becomes ceil(N / n) polynomials whose coefficients
are round_half_even(x_j * Delta), Delta = 2^scale_bits, in order, the last
polynomial zero-padded (coefficient encoding: one value per coefficient, as
the plaintext m_i of Eq. 6 in Walskaar et al. 2023). Because the aggregate
is a sum (Eq. 3 / Eq. 11), decoding the decrypted sum gives
sum_i round(x_i Delta) / Delta up to the noise bound of
:func:`~flwr_fedeval.rlwe.params.check_noise_budget`.

Encoding refuses -- with :class:`EncodingRangeError`, never by wrapping -- any
vector with a non-finite value or a coefficient larger than
:func:`~flwr_fedeval.rlwe.params.max_plaintext_int`, the per-client limit that
keeps the M-fold sum plus worst-case noise below q/2.
"""

from __future__ import annotations

import numpy as np

from .params import ParameterSet, max_plaintext_int
from .ring import mod_signed

__all__ = ["EncodingRangeError", "encode", "decode", "num_polys"]

_POW2_TABLE_LEN = 1100


class EncodingRangeError(ValueError):
    """A value (or the M-fold sum) could wrap modulo q, or is not finite."""


def num_polys(params: ParameterSet, length: int) -> int:
    """Number of polynomials ceil(length / n) for a vector of ``length`` values."""
    return -(-int(length) // params.n)


_POW2_CACHE: dict[tuple[int, ...], np.ndarray] = {}


def _pow2_table(primes: tuple[int, ...]) -> np.ndarray:
    if primes not in _POW2_CACHE:
        tab = np.empty((len(primes), _POW2_TABLE_LEN), dtype=np.int64)
        for i, p in enumerate(primes):
            acc = 1
            for k in range(_POW2_TABLE_LEN):
                tab[i, k] = acc
                acc = acc * 2 % p
        _POW2_CACHE[primes] = tab
    return _POW2_CACHE[primes]


def float_ints_to_rns(params: ParameterSet, ints: np.ndarray) -> np.ndarray:
    """Exact residues of integer-valued float64 coefficients.

    Parameters
    ----------
    ints : ndarray of shape (..., n), float64, integer values (any magnitude
        below 2^1000)

    Returns
    -------
    ndarray of shape (..., L, n), uint64

    Notes
    -----
    For |v| < 2^96 writes v = h 2^44 + l with float64-exact h = floor(v / 2^44)
    and 0 <= l < 2^44, so v mod q_i = ((h mod q_i)(2^44 mod q_i) + l) mod q_i;
    larger magnitudes use v = m 2^s with m < 2^53 (``frexp``).
    """
    out = np.empty(ints.shape[:-1] + (params.limbs, params.n), dtype=np.uint64)
    peak = float(np.max(np.abs(ints))) if ints.size else 0.0
    if peak < 2.0**62:
        iv = ints.astype(np.int64)
        for i, p in enumerate(params.primes):
            mod_signed(iv, p, out=out[..., i, :])
        return out
    if peak < 2.0**96:
        h = np.floor(ints * 2.0**-44)
        low = (ints - h * 2.0**44).astype(np.int64)
        hi = h.astype(np.int64)
        low_u = low.view(np.uint64)  # in [0, 2^44)
        for i, p in enumerate(params.primes):
            r = mod_signed(hi, p)
            r *= np.uint64(pow(2, 44, p))
            r += low_u
            np.remainder(r, np.uint64(p), out=out[..., i, :])
        return out
    mant, exp = np.frexp(ints)
    shift = np.maximum(exp - 53, 0)
    m = np.where(exp > 53, np.ldexp(mant, 53), ints).astype(np.int64)
    tab = _pow2_table(params.primes)
    for i, p in enumerate(params.primes):
        r = mod_signed(m, p)
        r *= tab[i].view(np.uint64)[shift]
        np.remainder(r, np.uint64(p), out=out[..., i, :])
    return out


def encode(
    params: ParameterSet, values: np.ndarray, *, scale_bits: int, num_clients: int
) -> np.ndarray:
    """Encode a float vector as fixed-point plaintext polynomials.

    Parameters
    ----------
    params : ParameterSet
    values : array-like of shape (N,), float
        N >= 1 values (e.g. a flattened model update plus its example count).
    scale_bits : int
        Delta = 2^scale_bits; coefficients are round_half_even(x * Delta).
    num_clients : int
        M, the number of such vectors that will be summed; bounds the
        per-coefficient magnitude so that the sum cannot wrap.

    Returns
    -------
    ndarray of shape (ceil(N / n), L, n), dtype uint64
        Plaintexts in RNS form, zero-padded.

    Raises
    ------
    EncodingRangeError
        If a value is NaN/inf or |round(x Delta)| > max_plaintext_int(params, M).
    ValueError
        If ``values`` is not 1-D and non-empty, or ``scale_bits`` is invalid.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D array, got shape {x.shape}")
    if int(scale_bits) != scale_bits or not 0 <= scale_bits <= 900:
        raise ValueError(f"scale_bits must be an integer in [0, 900], got {scale_bits}")
    if not np.all(np.isfinite(x)):
        raise EncodingRangeError(
            f"values contain {int(np.sum(~np.isfinite(x)))} NaN/inf entries"
        )
    limit = max_plaintext_int(params, num_clients)
    with np.errstate(over="ignore"):
        ints = np.rint(np.ldexp(x, int(scale_bits)))
    peak = float(np.max(np.abs(ints)))
    if not np.isfinite(peak) or peak > limit:
        bad = int(np.sum(~(np.abs(ints) <= limit)))
        raise EncodingRangeError(
            f"{bad} values exceed the fixed-point range: |round(x * 2^{scale_bits})| "
            f"up to {peak:.6g} > {limit} allowed for num_clients = {num_clients} "
            f"(max |x| = {limit / 2.0**scale_bits:.6g}); lower scale_bits or use "
            f"a parameter set with larger q"
        )
    n = params.n
    k = num_polys(params, x.size)
    padded = np.zeros(k * n, dtype=np.float64)
    padded[: x.size] = ints
    return float_ints_to_rns(params, padded.reshape(k, n))


def decode(
    params: ParameterSet, plaintext: np.ndarray, *, scale_bits: int, length: int
) -> np.ndarray:
    """Decode plaintext polynomials back to floats.

    Parameters
    ----------
    params : ParameterSet
    plaintext : ndarray of shape (k, L, n), uint64
    scale_bits : int
    length : int
        Number of values to return (<= k * n); the padding is dropped.

    Returns
    -------
    ndarray of shape (length,), float64
        X_j / 2^scale_bits with X_j the centred representative in (-q/2, q/2].
        decode(encode(x)) == round_half_even(x * Delta) / Delta exactly.

    Raises
    ------
    ValueError
        If shapes, dtype or ``length`` are inconsistent or a coefficient is >= q_i.
    """
    ring = params.ring
    ring.check(plaintext, "plaintext")
    if plaintext.ndim != 3:
        raise ValueError(f"plaintext must have shape (k, L, n), got {plaintext.shape}")
    total = plaintext.shape[0] * params.n
    if int(length) != length or not 0 <= length <= total:
        raise ValueError(f"length must be in [0, {total}], got {length}")
    return ring.to_centered_float(plaintext, int(scale_bits)).reshape(-1)[: int(length)]
