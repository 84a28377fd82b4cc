"""Shamir secret sharing of 32-byte secrets over GF(2^521 - 1), and the checks shared with the RLWE shares.

Used for the SecAgg recovery of Bonawitz et al. 2017, §4 (Flower's SecAgg+
does the same): every member shares its X25519 mask private key
(:mod:`~flwr_fedeval.rlwe.masking`) and every contributor its self-mask seed
(:mod:`~flwr_fedeval.rlwe.selfmask`) among the key set; t shares rebuild the
mask key of a member lost before its upload or the seed of one that uploaded.

f(X) = S + a_1 X + ... + a_{t-1} X^{t-1} over F_p, p = 2^521 - 1 (a Mersenne
prime > 2^256, so a 32-byte secret S, read big-endian, is one field element),
a_k uniform in F_p from ``secrets``; the share of point x is f(x), a
fixed-length 66-byte big-endian field element (Shamir 1979). Any t - 1 shares
are jointly uniform: they say nothing about S.

Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "BYTES_FIELD_PRIME",
    "BYTES_SHARE_SIZE",
    "SECRET_BYTES",
    "ThresholdError",
    "combine_bytes",
    "split_bytes",
]


class ThresholdError(ValueError):
    """Bad threshold input: too few shares, duplicate or invalid points, malformed share."""


def _check_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ThresholdError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _check_points(points: Sequence[int], limit: int, what: str = "points") -> tuple[int, ...]:
    """Integers in [1, limit), distinct, non-empty."""
    if isinstance(points, (str, bytes)) or not isinstance(points, Sequence) or not points:
        raise ThresholdError(f"{what} must be a non-empty sequence of integers")
    out = tuple(_check_int(x, what) for x in points)
    for x in out:
        if not 1 <= x < limit:
            raise ThresholdError(f"{what} contains {x}: points must be in [1, {limit - 1}]")
    if len(set(out)) != len(out):
        dup = sorted({x for x in out if out.count(x) > 1})
        raise ThresholdError(f"{what} has duplicate points {dup}")
    return out


def _check_threshold(threshold: int, count: int) -> int:
    t = _check_int(threshold, "threshold")
    if not 1 <= t <= count:
        raise ThresholdError(f"threshold must be in [1, {count}] (the number of points), got {t}")
    return t


#: The field of :func:`split_bytes`: the Mersenne prime 2^521 - 1 (> 2^256).
BYTES_FIELD_PRIME = 2**521 - 1
#: Length of one byte-secret share: a big-endian field element, ceil(521 / 8) bytes.
BYTES_SHARE_SIZE = (BYTES_FIELD_PRIME.bit_length() + 7) // 8
#: Length of the secrets :func:`split_bytes` shares (X25519 private keys, seeds).
SECRET_BYTES = 32


def _check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, (bytes, bytearray)) or len(secret) != SECRET_BYTES:
        raise ThresholdError(f"secret must be {SECRET_BYTES} bytes")
    return bytes(secret)


def split_bytes(secret: bytes, *, threshold: int, points: Sequence[int]) -> dict[int, bytes]:
    """Shamir-share a 32-byte secret over F_p, p = 2^521 - 1 (Shamir 1979; Bonawitz et al. 2017, §4).

    f(X) = S + a_1 X + ... + a_{t-1} X^{t-1} with S the secret as a
    big-endian integer (< 2^256 < p) and a_k uniform in F_p (``secrets``).

    Parameters
    ----------
    secret : bytes of length 32
    threshold : int
        t, 1 <= t <= len(points).
    points : sequence of int
        Distinct points in [1, p).

    Returns
    -------
    dict of int to bytes
        {x_j: f(x_j)}, each a 66-byte big-endian field element.

    Raises
    ------
    ThresholdError
        If the secret is not 32 bytes, or on invalid ``threshold``/``points``.
    """
    s = int.from_bytes(_check_secret(secret), "big")
    pts = _check_points(points, BYTES_FIELD_PRIME)
    t = _check_threshold(threshold, len(pts))
    p = BYTES_FIELD_PRIME
    coeffs = [s] + [secrets.randbelow(p) for _ in range(t - 1)]
    return {x: _poly_at(coeffs, x).to_bytes(BYTES_SHARE_SIZE, "big") for x in pts}


def _poly_at(coeffs: Sequence[int], x: int) -> int:
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % BYTES_FIELD_PRIME
    return acc


def _interpolate(points: Sequence[tuple[int, int]], x: int) -> int:
    """Value at x of the polynomial of degree < len(points) through (x_j, y_j), over F_p."""
    p = BYTES_FIELD_PRIME
    total = 0
    for xj, yj in points:
        num, den = 1, 1
        for xk, _ in points:
            if xk != xj:
                num = num * (x - xk) % p
                den = den * (xj - xk) % p
        total = (total + yj * num * pow(den, -1, p)) % p
    return total


def combine_bytes(shares: Mapping[int, bytes], *, threshold: int) -> bytes:
    """Reconstruct a 32-byte secret from at least t shares of :func:`split_bytes`.

    Interpolates f(0) through the t smallest points; every further share must
    lie on the same polynomial (a share that does not is detected, never
    silently used).

    Parameters
    ----------
    shares : mapping of int to bytes
        {x_j: 66-byte share}, at least ``threshold`` of them.
    threshold : int
        t used at :func:`split_bytes`.

    Returns
    -------
    bytes of length 32

    Raises
    ------
    ThresholdError
        Fewer than t shares; a point outside [1, p); a share that is not
        66 bytes or not a canonical field element (>= p); shares that are
        inconsistent (more than t given, not on one polynomial of degree < t);
        or a reconstructed value >= 2^256 (not a 32-byte secret: wrong shares).
    """
    if not isinstance(shares, Mapping):
        raise ThresholdError("shares must be a mapping {point: share bytes}")
    t = _check_int(threshold, "threshold")
    if t < 1:
        raise ThresholdError(f"threshold must be >= 1, got {t}")
    if len(shares) < t:
        raise ThresholdError(f"{len(shares)} shares given, the threshold is {t}")
    pts = _check_points(sorted(shares), BYTES_FIELD_PRIME)
    values = []
    for x in pts:
        raw = shares[x]
        if not isinstance(raw, (bytes, bytearray)) or len(raw) != BYTES_SHARE_SIZE:
            raise ThresholdError(f"share at point {x} must be {BYTES_SHARE_SIZE} bytes")
        y = int.from_bytes(raw, "big")
        if y >= BYTES_FIELD_PRIME:
            raise ThresholdError(f"share at point {x} is not a canonical field element (>= 2^521 - 1)")
        values.append((x, y))
    base = values[:t]
    for x, y in values[t:]:
        if _interpolate(base, x) != y:
            raise ThresholdError(f"share at point {x} is inconsistent with the others")
    s = _interpolate(base, 0)
    if s >= 1 << (8 * SECRET_BYTES):
        raise ThresholdError("the shares do not reconstruct a 32-byte secret")
    return s.to_bytes(SECRET_BYTES, "big")
