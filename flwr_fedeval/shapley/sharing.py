"""Additive secret sharing over Z_{2^k} with fixed-point encoding (SecSV, §5.1).

A value ``x`` is encoded as ``round(x·2^f) mod 2^k`` and split into
``s' = x − r`` and ``s'' = r`` (mod ``2^k``) with ``r`` uniform on ``Z_{2^k}``,
drawn from the operating system's CSPRNG (``os.urandom`` — never ``numpy.random``).
Each share alone is uniform, whatever ``x`` is; ``s' + s'' = x (mod 2^k)``.
Shares are ``uint64`` arrays (``k ≤ 62``).
"""

from __future__ import annotations

import os

import numpy as np
from numpy.typing import NDArray

__all__ = ["decode_fixed", "encode_fixed", "random_ring", "reconstruct", "share", "to_signed"]


def _check_k(k: int) -> None:
    if not 2 <= int(k) <= 62:
        raise ValueError(f"ring bits k must be in [2, 62], got {k!r}")


def random_ring(shape: int | tuple[int, ...], k: int) -> NDArray[np.uint64]:
    """Uniform elements of ``Z_{2^k}`` (uint64) from ``os.urandom``."""
    _check_k(k)
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()
    return (raw & np.uint64((1 << k) - 1)).reshape(shape)


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
