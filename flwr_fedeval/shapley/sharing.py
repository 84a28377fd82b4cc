"""Additive secret sharing over Z_{2^k} with fixed-point encoding (SecSV, §5.1).

A value ``x`` is encoded as ``round(x·2^f) mod 2^k`` and split into
``s' = x − r`` and ``s'' = r`` (mod ``2^k``) with ``r`` uniform on ``Z_{2^k}``,
drawn from the operating system's CSPRNG (``os.urandom`` — never ``numpy.random``).
Each share alone is uniform, whatever ``x`` is; ``s' + s'' = x (mod 2^k)``.
Shares are ``uint64`` arrays (``k ≤ 62``).

Labels are shared over the prime field ``F_p``, ``p = 2^31 − 1`` (:data:`LABEL_PRIME`,
:func:`share_field`), for the zero test of :mod:`.zerotest`.
"""

from __future__ import annotations

import os

import numpy as np
from numpy.typing import NDArray

__all__ = ["LABEL_PRIME", "decode_fixed", "encode_fixed", "random_field", "random_ring", "reconstruct", "share",
           "share_field", "to_signed"]

#: The Mersenne prime ``2^31 − 1``: labels are shared over ``F_p`` (products of two elements fit in uint64).
LABEL_PRIME = 2 ** 31 - 1


def _check_k(k: int) -> None:
    if not 2 <= int(k) <= 62:
        raise ValueError(f"ring bits k must be in [2, 62], got {k!r}")


def random_ring(shape: int | tuple[int, ...], k: int) -> NDArray[np.uint64]:
    """Uniform elements of ``Z_{2^k}`` (uint64) from ``os.urandom``."""
    _check_k(k)
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()
    return (raw & np.uint64((1 << k) - 1)).reshape(shape)


def random_field(shape: int | tuple[int, ...], p: int) -> NDArray[np.uint64]:
    """Uniform integers in ``[0, p)`` (uint64), ``2 ≤ p ≤ 2^32``, from ``os.urandom`` by rejection
    sampling (exactly uniform: no modular bias)."""
    if not 2 <= int(p) <= 2 ** 32:
        raise ValueError(f"p must be in [2, 2^32], got {p!r}")
    n = int(np.prod(shape, dtype=np.int64))
    mask = np.uint64((1 << (int(p) - 1).bit_length()) - 1)
    out = np.empty(0, dtype=np.uint64)
    while out.size < n:
        need = n - out.size
        raw = np.frombuffer(os.urandom(8 * (need + 8)), dtype=np.uint64) & mask
        out = np.concatenate([out, raw[raw < np.uint64(p)][:need]])
    return out.reshape(shape)


def share_field(v: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Two additive shares over ``F_p`` of the integers ``0 ≤ v < p``: ``((v − r) mod p, r)``."""
    v = np.asarray(v, dtype=np.uint64)
    if v.size and int(v.max()) >= p:
        raise ValueError(f"values up to {int(v.max())} are not elements of F_{p}")
    r = random_field(v.shape, p)
    return (v + np.uint64(p) - r) % np.uint64(p), r


def encode_fixed(x: np.ndarray, frac_bits: int, k: int) -> np.ndarray:
    """``round(x·2^frac_bits) mod 2^k`` as uint64; raises if a value does not fit in k−1 bits."""
    _check_k(k)
    q = np.rint(np.asarray(x, dtype=np.float64) * float(2 ** frac_bits))
    if np.abs(q).max(initial=0) >= 2.0 ** (k - 1):
        raise ValueError(
            f"fixed-point values up to {np.abs(q).max():.3g} do not fit the signed range of Z_2^{k}")
    return (q.astype(np.int64).astype(np.uint64)) & np.uint64((1 << k) - 1)


def to_signed(v: np.ndarray, k: int) -> np.ndarray:
    """Centered representative in ``[−2^(k−1), 2^(k−1))`` (int64) of ring elements."""
    v = np.asarray(v, dtype=np.uint64) & np.uint64((1 << k) - 1)
    s = v.astype(np.int64)
    return np.where(s >= (1 << (k - 1)), s - (1 << k), s)


def decode_fixed(v: np.ndarray, frac_bits: int, k: int) -> np.ndarray:
    return to_signed(v, k).astype(np.float64) / float(2 ** frac_bits)


def share(v: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Two additive shares of the ring elements ``v`` (uint64): ``(v − r, r) mod 2^k``."""
    _check_k(k)
    v = np.asarray(v, dtype=np.uint64)
    r = random_ring(v.shape, k)
    return (v - r) & np.uint64((1 << k) - 1), r


def reconstruct(s1: np.ndarray, s2: np.ndarray, k: int) -> np.ndarray:
    return (np.asarray(s1, dtype=np.uint64) + np.asarray(s2, dtype=np.uint64)) & np.uint64((1 << k) - 1)
