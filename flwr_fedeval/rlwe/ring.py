"""The ring R_q = Z_q[X]/(X^n + 1) in residue-number-system (RNS) form.

An element of R_q is stored as the residues of its coefficients modulo each
prime q_i of q = q_0 * ... * q_{L-1}: a ``uint64`` array of shape ``(L, n)``,
or ``(..., L, n)`` for a batch of elements (the batch axes come first). Every
prime satisfies q_i = 1 (mod 2n) and q_i < 2^31, so products of two residues
fit in 62 bits and never overflow 64-bit integers.

Two multiplication paths are provided, both exact:

* :meth:`Ring.mul` -- general product by the negacyclic number-theoretic
  transform (NTT, Longa--Naehrig iterative Cooley--Tukey / Gentleman--Sande
  butterflies with the 2n-th root psi merged into the twiddles), vectorised so
  that each butterfly stage is one set of numpy calls for all limbs of a few
  polynomials (a cache-sized block); twiddle products by Shoup's precomputed
  quotient (Harvey 2014), no division; lazy reduction with proven bounds.
* :meth:`Ring.mul_small` -- product of a polynomial with *small* integer
  coefficients (ternary secrets, ternary ephemeral keys) by an arbitrary ring
  element, by an exact float64 FFT negacyclic convolution: twist by
  exp(i*pi*j/n), FFT, pointwise product, inverse FFT, untwist, round. The wide
  operand is split into 16-bit pieces whenever the rigorous error bound of
  Percival (2003) for FFT convolution could reach 1/4; two real signals are
  packed into one complex FFT. This is the path the xMK-CKKS operations use
  (every product there has a ternary factor: Eqs. 1, 6, 7 of Walskaar et al.
  2023).

References
----------
D. Harvey, "Faster arithmetic for number-theoretic transforms", J. Symb.
Comput. 60 (2014) (Shoup's modular multiplication in the butterfly).
P. Longa and M. Naehrig, "Speeding up the Number Theoretic Transform for
Faster Ideal Lattice-Based Cryptography", CANS 2016.
C. Percival, "Rapid multiplication modulo the sum and difference of highly
composite numbers", Math. Comp. 72 (2003), Theorem 5.1 (FFT error bound).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Ring",
    "get_ring",
    "is_prime",
    "validate_primes",
    "find_ntt_primes",
    "schoolbook_negacyclic",
    "mod_signed",
    "mod_u64",
]

_MAX_PRIME_BITS = 31
_EPS = 2.0**-53
# Rounding is safe when the proven FFT error bound is below 1/2; keep a margin.
_FFT_ERROR_LIMIT = 0.25
# polynomials per chunk in the batched FFT product (keeps temporaries in cache)
_CHUNK = 32
# Shoup's modular product takes inputs below 2^_SHOUP_SHIFT (w' = floor(w 2^32 / q))
_SHOUP_SHIFT = 32
# uint64 values per block of the NTT (a few polynomials: the working set stays in cache)
_NTT_BLOCK = 2**16
# stages with half-width t < _NTT_T run on a transposed copy (long inner loops for numpy)
_NTT_T = 64


def is_prime(p: int) -> bool:
    """Deterministic Miller--Rabin primality test, exact for ``p < 2**64``."""
    if p < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for s in small:
        if p % s == 0:
            return p == s
    d, r = p - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in small:
        x = pow(a, d, p)
        if x in (1, p - 1):
            continue
        for _ in range(r - 1):
            x = x * x % p
            if x == p - 1:
                break
        else:
            return False
    return True


def find_ntt_primes(n: int, bits: int, count: int) -> tuple[int, ...]:
    """Return the ``count`` largest primes ``p < 2**bits`` with ``p = 1 (mod 2n)``.

    Parameters
    ----------
    n : int
        Ring degree (power of two).
    bits : int
        Every prime is below ``2**bits``; at most 31.
    count : int
        Number of primes.

    Returns
    -------
    tuple of int
        Primes in decreasing order.

    Raises
    ------
    ValueError
        If ``bits > 31`` or not enough primes exist.
    """
    if bits > _MAX_PRIME_BITS:
        raise ValueError(f"bits must be <= {_MAX_PRIME_BITS}, got {bits}")
    step = 2 * n
    p = ((2**bits - 1) // step) * step + 1
    if p >= 2**bits:
        p -= step
    out: list[int] = []
    while len(out) < count and p > step:
        if is_prime(p):
            out.append(p)
        p -= step
    if len(out) < count:
        raise ValueError(f"only {len(out)} primes = 1 mod {step} below 2^{bits}")
    return tuple(out)


def _primitive_2n_root(q: int, n: int) -> int:
    """Smallest psi with psi^n = -1 (mod q), i.e. a primitive 2n-th root of unity."""
    for g in range(2, q):
        psi = pow(g, (q - 1) // (2 * n), q)
        if pow(psi, n, q) == q - 1:
            return psi
    raise ValueError(f"no primitive {2 * n}-th root of unity mod {q}")  # pragma: no cover


def _powers(base: int, count: int, q: int) -> list[int]:
    out, acc = [], 1
    for _ in range(count):
        out.append(acc)
        acc = acc * base % q
    return out


def _bit_reverse(n: int) -> np.ndarray:
    bits = n.bit_length() - 1
    idx = np.arange(n)
    rev = np.zeros(n, dtype=np.int64)
    for b in range(bits):
        rev |= ((idx >> b) & 1) << (bits - 1 - b)
    return rev


def schoolbook_negacyclic(x: NDArray[np.integer], y: NDArray[np.integer], q: int) -> NDArray[np.uint64]:
    """Reference O(n^2) product of two polynomials modulo (X^n + 1, q).

    Parameters
    ----------
    x, y : ndarray of shape (n,)
        Integer coefficients (any integer dtype; reduced mod q first).
    q : int
        Modulus below 2^31.

    Returns
    -------
    ndarray of shape (n,), dtype uint64
        Coefficients of x*y mod (X^n + 1) reduced into [0, q).
    """
    xs: NDArray[np.int64] = np.asarray(x).astype(np.int64) % q
    ys: NDArray[np.int64] = np.asarray(y).astype(np.int64) % q
    n = xs.shape[-1]
    if n > 2**14:
        raise ValueError("schoolbook_negacyclic is a reference for n <= 2^14")
    # direct O(n^2) convolution of x with 16-bit pieces of y: every partial sum
    # is below n * 2^31 * 2^16 <= 2^61, exact in int64
    lo: NDArray[np.int64] = np.convolve(xs, ys & 0xFFFF) % q
    hi: NDArray[np.int64] = np.convolve(xs, ys >> 16) % q
    full = (lo + (hi << 16) % q) % q  # (2n - 1,)
    out: NDArray[np.int64] = full[:n].copy()
    out[: n - 1] -= full[n:]  # X^n = -1
    return (out % q).astype(np.uint64)


def mod_signed(
    v: NDArray[np.int64], q: int | NDArray[np.integer], out: NDArray[np.uint64] | None = None
) -> NDArray[np.uint64]:
    """v mod q in [0, q) as uint64, for int64 ``v`` > -2^63 + q and moduli 1 <= q < 2^63.

    Adds the multiple (2^63 div q) q (< 2^63 + 1, so v plus it is in [0, 2^64)) in uint64 and takes
    the unsigned remainder: numpy's signed floor-mod is about twice as slow on values of mixed sign.
    ``q`` broadcasts against ``v``; ``out`` (uint64, v's shape) may be ``v.view(np.uint64)``.
    A scalar ``q`` takes the remainder as u - (u // q) q (:func:`mod_u64`).
    """
    qu = np.asarray(q, dtype=np.uint64)
    if out is None:
        out = np.empty(v.shape, dtype=np.uint64)
    np.add(v.view(np.uint64), (np.uint64(2**63) // qu) * qu, out=out)
    if qu.ndim == 0:
        return mod_u64(out, int(qu), out=out)
    np.remainder(out, qu, out=out)
    return out


def mod_u64(
    u: NDArray[np.uint64], q: int, out: NDArray[np.uint64] | None = None, scratch: NDArray[np.uint64] | None = None
) -> NDArray[np.uint64]:
    """u mod q in [0, q) for uint64 ``u`` and a scalar modulus 1 <= q < 2^63: u - (u // q) q.

    Bit for bit :func:`numpy.remainder`; numpy divides by a scalar with libdivide's multiply-and-shift
    (several times faster than its remainder loop, one hardware division per element). ``out`` and
    ``scratch`` (uint64, u's shape) may be given to reuse buffers; ``out`` may be ``u``.
    """
    qu = np.uint64(q)
    quot = np.floor_divide(u, qu, out=scratch)
    quot *= qu
    return np.subtract(u, quot, out=out)


def _reduce_once(x: NDArray[np.uint64], q: NDArray[np.uint64], scratch: NDArray[np.uint64]) -> None:
    """x <- x mod q in place for x in [0, 2q) (uint64): min(x, x - q), since x - q wraps around when x < q."""
    np.subtract(x, q, out=scratch)
    np.minimum(x, scratch, out=x)


class Ring:
    """R_q = Z_q[X]/(X^n + 1) with q a product of NTT-friendly primes.

    Parameters
    ----------
    n : int
        Degree, a power of two, at least 2.
    primes : sequence of int
        Distinct primes q_i < 2^31 with q_i = 1 (mod 2n).

    Raises
    ------
    ValueError
        If ``n`` is not a power of two or a prime is invalid (message names it).

    Notes
    -----
    Elements are ``uint64`` arrays of shape ``(..., L, n)`` with every limb
    ``i`` reduced into ``[0, q_i)``; all methods accept any leading batch shape.
    """

    def __init__(self, n: int, primes: Sequence[int]) -> None:
        primes = validate_primes(n, primes)
        self.n = n
        self.primes = primes
        self.limbs = len(primes)
        self.q = math.prod(primes)
        self.q_col: NDArray[np.uint64] = np.array(primes, dtype=np.uint64)[:, None]  # (L, 1)
        self._q_i64 = self.q_col.astype(np.int64)
        self._build_ntt_tables()
        self._build_fft_tables()
        self._build_crt_tables()

    # ------------------------------------------------------------------ basics
    def __repr__(self) -> str:
        return f"Ring(n={self.n}, primes={self.primes})"

    def zeros(self, batch: tuple[int, ...] = ()) -> NDArray[np.uint64]:
        """Zero element(s), shape ``batch + (L, n)``, dtype uint64."""
        return np.zeros(batch + (self.limbs, self.n), dtype=np.uint64)

    def check(self, x: NDArray[np.uint64], name: str = "x") -> NDArray[np.uint64]:
        """Validate an element: dtype uint64, trailing shape (L, n), limbs < q_i.

        Raises
        ------
        ValueError
            Naming ``name`` and the offending property.
        """
        if not isinstance(x, np.ndarray) or x.dtype != np.uint64:
            raise ValueError(f"{name} must be a numpy uint64 array")
        if x.shape[-2:] != (self.limbs, self.n):
            raise ValueError(f"{name} has shape {x.shape}, expected (..., {self.limbs}, {self.n})")
        if x.size and np.any(x.reshape(-1, self.limbs, self.n).max(axis=(0, 2)) >= self.q_col[:, 0]):  # no mask
            raise ValueError(f"{name} has coefficients >= q_i")
        return x

    def add(self, x: NDArray[np.uint64], y: NDArray[np.uint64]) -> NDArray[np.uint64]:
        """x + y, shapes broadcast; returns uint64 ``(..., L, n)``."""
        s = x + y
        _reduce_once(s, self.q_col, np.empty_like(s))
        return s

    def sum(self, xs: NDArray[np.uint64], axis: int = 0) -> NDArray[np.uint64]:
        """Sum of elements along a batch ``axis`` (at most 2^32 terms)."""
        xs = np.asarray(xs)
        if xs.shape[axis] > 2**32:
            raise ValueError("too many terms for an overflow-free sum")
        return np.sum(xs, axis=axis, dtype=np.uint64) % self.q_col

    def neg(self, x: NDArray[np.uint64]) -> NDArray[np.uint64]:
        """-x; returns uint64 ``(..., L, n)``."""
        out = self.q_col - x
        out[x == 0] = 0
        return out

    def sub(self, x: NDArray[np.uint64], y: NDArray[np.uint64]) -> NDArray[np.uint64]:
        """x - y; returns uint64 ``(..., L, n)``."""
        return self.add(x, self.neg(y))

    def from_signed(self, v: np.ndarray) -> np.ndarray:
        """Map signed integer coefficients (``(..., n)``, |v| < 2^62) into RNS.

        Returns
        -------
        ndarray of shape (..., L, n), dtype uint64
        """
        v = np.asarray(v, dtype=np.int64)
        return mod_signed(np.broadcast_to(v[..., None, :], v.shape[:-1] + (self.limbs, self.n)), self._q_i64)

    # --------------------------------------------------------------------- NTT
    def _build_ntt_tables(self) -> None:
        n, L = self.n, self.limbs
        rev = _bit_reverse(n)
        psi_rev = np.zeros((L, n), dtype=np.int64)
        psi_inv_rev = np.zeros((L, n), dtype=np.int64)
        n_inv = np.zeros((L, 1), dtype=np.int64)
        self.psi = []
        for i, q in enumerate(self.primes):
            psi = _primitive_2n_root(q, n)
            self.psi.append(psi)
            psi_inv = pow(psi, -1, q)
            pw = np.array(_powers(psi, n, q), dtype=np.int64)
            pwi = np.array(_powers(psi_inv, n, q), dtype=np.int64)
            psi_rev[i] = pw[rev]
            psi_inv_rev[i] = pwi[rev]
            n_inv[i, 0] = pow(n, -1, q)
        self._psi_rev = psi_rev
        self._psi_inv_rev = psi_inv_rev
        self._n_inv = n_inv
        self._psi_rev_u = psi_rev.astype(np.uint64)
        self._psi_inv_rev_u = psi_inv_rev.astype(np.uint64)
        self._n_inv_u = n_inv.astype(np.uint64)
        # Shoup companions w' = floor(w 2^32 / q_i) < 2^32: w < q_i < 2^31, so w 2^32 < 2^63 is exact
        shift = np.uint64(_SHOUP_SHIFT)
        self._psi_rev_shoup = (self._psi_rev_u << shift) // self.q_col
        self._psi_inv_rev_shoup = (self._psi_inv_rev_u << shift) // self.q_col
        self._n_inv_shoup = (self._n_inv_u << shift) // self.q_col
        # lazy NTT values stay < b q_i with b <= _lazy_max, so below 2^32 (Shoup's input range)
        self._lazy_max = 2**_SHOUP_SHIFT // max(self.primes)
        # limbs in runs of equal 2^32 div q_i: each run keeps its own lazy bound (a 24-bit prime's
        # limbs need no reduction inside the transform when the 31-bit ones need one per stage)
        self._groups: list[tuple[slice, int]] = []
        for i, p in enumerate(self.primes):
            lm = 2**_SHOUP_SHIFT // p
            if self._groups and self._groups[-1][1] == lm:
                self._groups[-1] = (slice(self._groups[-1][0].start, i + 1), lm)
            else:
                self._groups.append((slice(i, i + 1), lm))
        self._tw_cache: dict[tuple[bool, int, int], tuple[NDArray[np.uint64], NDArray[np.uint64]]] = {}

    def _blocks(self, x: np.ndarray) -> tuple[NDArray[np.uint64], tuple[int, ...]]:
        """A C-contiguous uint64 copy of ``x`` viewed as (B, L, n), and its shape."""
        a = np.array(x, dtype=np.uint64, copy=True, order="C")
        if a.shape[-2:] != (self.limbs, self.n):
            raise ValueError(f"x has shape {a.shape}, expected (..., {self.limbs}, {self.n})")
        return a.reshape((-1, self.limbs, self.n)), a.shape

    def _fit(
        self,
        blk: NDArray[np.uint64],
        bound: int,
        need: int,
        scratch: NDArray[np.uint64],
        q: NDArray[np.uint64] | None = None,
    ) -> int:
        """Halve the range of ``blk`` (values < bound * q_i) until bound <= need; returns the new bound.

        ``q`` (default: every prime, (L, 1)) holds the primes of ``blk``'s limbs (axis -2).

        One step: x <- min(x, x - c q_i), c = ceil(bound / 2): x - c q wraps around (is huge) when
        x < c q, so the minimum is x mod-reduced by c q exactly when x >= c q; x < 2 c q gives x < c q.
        """
        while bound > need:
            c = (bound + 1) // 2
            sc = scratch[: blk.size].reshape(blk.shape)
            np.subtract(blk, (self.q_col if q is None else q) * np.uint64(c), out=sc)
            np.minimum(blk, sc, out=blk)
            bound = c
        return bound

    def _fit_groups(self, blk: NDArray[np.uint64], bounds: list[int], div: int, scratch: NDArray[np.uint64]) -> None:
        """:meth:`_fit` of each limb group of ``blk`` (k, L, n) to (2^32 div q_i) // ``div``; updates ``bounds``."""
        for g, (sl, lm) in enumerate(self._groups):
            bounds[g] = self._fit(blk[:, sl], bounds[g], lm // div, scratch, self.q_col[sl])

    def _shoup_mul(
        self,
        h: NDArray[np.uint64],
        w: tuple[NDArray[np.uint64], NDArray[np.uint64]],
        tmp: NDArray[np.uint64],
        out: NDArray[np.uint64],
        trailing: int | None = None,
    ) -> None:
        """out <- h w mod q_i, in [0, 2 q_i), for h < 2^32 (Shoup's method, as in Harvey 2014); out may be h.

        ``w`` = (twiddles, their Shoup companions w' = floor(w 2^32 / q_i)) broadcast against ``h``
        (limb axis followed by ``trailing`` axes, default: limb axis 1).
        0 <= h w / q - floor(h w' / 2^32) < h / 2^32 + 1 < 2, so h w - floor(h w' / 2^32) q is in
        [0, 2q); h w' < 2^64 and the difference is taken mod 2^64.
        """
        q = self.q_col.reshape((self.limbs,) + (1,) * (h.ndim - 2 if trailing is None else trailing))
        np.multiply(h, w[1], out=tmp)
        tmp >>= _SHOUP_SHIFT
        tmp *= q
        np.multiply(h, w[0], out=out)
        out -= tmp

    def _stage(
        self, arr: NDArray[np.uint64], m: int, t: int, inverse: bool, scratch: NDArray[np.uint64]
    ) -> tuple[
        NDArray[np.uint64],
        NDArray[np.uint64],
        tuple[NDArray[np.uint64], NDArray[np.uint64]],
        NDArray[np.uint64],
        NDArray[np.uint64],
    ]:
        """Views for one butterfly stage: u, h (the pairs), twiddles, and two scratch arrays.

        ``arr`` is (k, L, n) in natural order, or (k, L, T, n / T) transposed (element j at
        [j mod T, j div T]) for the stages with 2t <= T, where it gives numpy long inner loops.
        Pairs are (j, j + t) for j = i 2t + r, 0 <= r < t, twiddle index m + i.
        """
        k, L, n = arr.shape[0], self.limbs, self.n
        size = k * L * n // 2
        table = self._psi_inv_rev_u if inverse else self._psi_rev_u
        shoup = self._psi_inv_rev_shoup if inverse else self._psi_rev_shoup
        if arr.ndim == 3:
            pairs = arr.reshape(k, L, m, 2, t)
            u, h = pairs[..., 0, :], pairs[..., 1, :]
            w = (table[:, m : 2 * m, None], shoup[:, m : 2 * m, None])
        else:
            T = arr.shape[2]
            pairs = arr.reshape(k, L, T // (2 * t), 2, t, n // T)
            u, h = pairs[:, :, :, 0], pairs[:, :, :, 1]
            key = (inverse, m, t)
            if key not in self._tw_cache:  # i = (j div T) (T / 2t) + (j mod T) div 2t

                def tw(tab: NDArray[np.uint64]) -> NDArray[np.uint64]:
                    grid = tab[:, m : 2 * m].reshape(L, n // T, T // (2 * t)).transpose(0, 2, 1)
                    return np.ascontiguousarray(grid)[:, :, None, :]

                self._tw_cache[key] = (tw(table), tw(shoup))
            w = self._tw_cache[key]
        tmp = scratch[:size].reshape(u.shape)
        other = scratch[size : 2 * size].reshape(u.shape)
        return u, h, w, tmp, other

    def _transposed(self, a: NDArray[np.uint64], out: NDArray[np.uint64]) -> NDArray[np.uint64]:
        """(k, L, n) -> (k, L, T, n / T), element j at [j mod T, j div T]; ``out`` is the buffer."""
        k, L, n = a.shape
        t_ = out[: a.size].reshape(k, L, _NTT_T, n // _NTT_T)
        np.copyto(t_, a.reshape(k, L, n // _NTT_T, _NTT_T).transpose(0, 1, 3, 2))
        return t_

    def ntt(self, x: np.ndarray) -> np.ndarray:
        """Forward negacyclic NTT (bit-reversed output order).

        Parameters
        ----------
        x : ndarray of shape (..., L, n), uint64, limbs reduced mod q_i

        Returns
        -------
        ndarray of shape (..., L, n), uint64
            Evaluations at the odd powers psi^(2k+1) (bit-reversed order), so
            that ``intt(ntt(x) * ntt(y) mod q)`` is the negacyclic product.

        Raises
        ------
        ValueError
            If the trailing shape is not (L, n).

        Notes
        -----
        Cooley--Tukey butterflies (Longa--Naehrig 2016, Alg. 1) in uint64, in
        place, a few polynomials at a time so that the working set stays in
        cache; the stages with half-width t < T = 16 run on a transposed copy
        so that every numpy call has a long inner loop. Twiddle products by
        Shoup's method (:meth:`_shoup_mul`, no division), lazy reduction:
        values < b q_i; the butterfly (u, h) -> (u + v, u - v + 2q) with
        v = h w in [0, 2q) raises b by 2; before a stage whose inputs could
        reach 2^32 (b q_max > 2^32) the range is halved by :meth:`_fit`.
        The bound b is kept per run of limbs with equal 2^32 div q_i: primes
        below 2^27 need no reduction inside at n = 4096 (b <= 23 < 32),
        31-bit primes one per stage (q109's 24/23-bit limbs are not touched
        by its 31-bit limbs' reductions). ``%`` once at the end.
        """
        return self._ntt(x, lazy=False)

    def _ntt(self, x: np.ndarray, lazy: bool) -> np.ndarray:
        """:meth:`ntt`; with ``lazy`` the result is only reduced below self._lazy_max * q_i (<= 2^32)."""
        a, shape = self._blocks(x)
        B, L, n = a.shape
        q2 = self.q_col[:, :, None] * np.uint64(2)
        k = max(1, min(B, _NTT_BLOCK // (L * n)))
        scratch = np.empty(k * L * n, dtype=np.uint64)
        tbuf = np.empty(k * L * n, dtype=np.uint64)
        for lo in range(0, B, k):
            blk = a[lo : lo + k]
            kb = blk.shape[0]
            arr = blk
            bounds = [1] * len(self._groups)  # every value of group g's limbs is < bounds[g] * q_i
            t, m = n, 1
            while m < n:
                t //= 2
                if arr.ndim == 3 and 2 * t <= _NTT_T < n:
                    arr = self._transposed(blk, tbuf)
                self._fit_groups(arr.reshape(kb, L, n), bounds, 1, scratch)
                u, h, w, tmp, v = self._stage(arr, m, t, False, scratch)
                self._shoup_mul(h, w, tmp, v)
                np.subtract(u, v, out=h)  # u - v + 2q < (bound + 2) q (wraps around, then back)
                h += q2.reshape((L,) + (1,) * (h.ndim - 2))
                u += v  # < (bound + 2) q
                bounds = [b + 2 for b in bounds]
                m *= 2
            if arr.ndim == 4:
                np.copyto(blk.reshape(kb, L, n // _NTT_T, _NTT_T), arr.transpose(0, 1, 3, 2))
            if lazy:
                self._fit_groups(blk, bounds, 1, scratch)
            else:
                blk %= self.q_col
        return a.reshape(shape)

    def intt(self, x: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`ntt`; shape ``(..., L, n)``, uint64.

        Raises
        ------
        ValueError
            If the trailing shape is not (L, n).

        Notes
        -----
        Gentleman--Sande butterflies (Longa--Naehrig 2016, Alg. 2), blocked,
        transposed for t < 16 and lazy as :meth:`ntt`:
        (u, v) -> (u + v, (u - v + b q) w) with the product by Shoup's method
        in [0, 2q), so b -> max(2b, 2); the range is halved (:meth:`_fit`)
        before a stage where u - v + b q could reach 2^32. The final scaling by
        n^-1 is one more Shoup product, then one conditional subtraction.
        """
        return self._intt(x, 1)

    def _intt(self, x: np.ndarray, start: int) -> np.ndarray:
        """:meth:`intt` of values below ``start * q_i`` (<= 2^32), reduced on output."""
        a, shape = self._blocks(x)
        B, L, n = a.shape
        k = max(1, min(B, _NTT_BLOCK // (L * n)))
        scratch = np.empty(k * L * n, dtype=np.uint64)
        tbuf = np.empty(k * L * n, dtype=np.uint64)
        for lo in range(0, B, k):
            blk = a[lo : lo + k]
            kb = blk.shape[0]
            arr = self._transposed(blk, tbuf) if n > _NTT_T else blk
            bounds = [start] * len(self._groups)  # every value of group g's limbs is < bounds[g] * q_i
            t, m = 1, n
            while m > 1:
                if arr.ndim == 4 and 2 * t > _NTT_T:
                    np.copyto(blk.reshape(kb, L, n // _NTT_T, _NTT_T), arr.transpose(0, 1, 3, 2))
                    arr = blk
                self._fit_groups(arr.reshape(kb, L, n), bounds, 2, scratch)
                h_ = m // 2
                u, v, w, d, tmp = self._stage(arr, h_, t, True, scratch)
                lead = (1,) * (d.ndim - 2)
                per_limb = np.array(
                    [b for (sl, _), b in zip(self._groups, bounds) for _ in range(sl.start, sl.stop)], dtype=np.uint64
                )
                np.subtract(u, v, out=d)  # u - v + bound q in [1, 2 bound q), <= 2^32
                d += (self.q_col[:, 0] * per_limb).reshape((L,) + lead)
                u += v  # < 2 bound q
                self._shoup_mul(d, w, tmp, v)
                for g, ((sl, lm), b) in enumerate(zip(self._groups, bounds)):
                    if 4 * b > lm:  # 2b would need a _fit of these limbs next: halve u in place instead
                        ug, dg = u[:, sl], d[:, sl]
                        np.subtract(ug, (self.q_col[sl, 0] * np.uint64(b)).reshape((-1,) + lead), out=dg)
                        np.minimum(ug, dg, out=ug)  # u < 2 b q -> u < b q
                        bounds[g] = max(b, 2)
                    else:
                        bounds[g] = max(2 * b, 2)
                t *= 2
                m = h_
            if arr.ndim == 4:
                np.copyto(blk.reshape(kb, L, n // _NTT_T, _NTT_T), arr.transpose(0, 1, 3, 2))
            self._fit_groups(blk, bounds, 1, scratch)
            flat = blk.reshape(kb, L, 1, n)
            tmp = scratch[: blk.size].reshape(flat.shape)
            self._shoup_mul(flat, (self._n_inv_u[:, :, None], self._n_inv_shoup[:, :, None]), tmp, flat)
            self._fit(blk, 2, 1, scratch)
        return a.reshape(shape)

    def mul(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Negacyclic product x*y in R_q by NTT; shapes broadcast ``(..., L, n)``.

        The pointwise product is Shoup's (:meth:`_shoup_mul`) of the larger operand's lazy
        transform (< 2^32) by the smaller's reduced one; the inverse starts from [0, 2q).
        """
        x, y = np.asarray(x), np.asarray(y)
        if x.size < y.size:
            x, y = y, x
        # the larger operand stays lazy (< 2^32); the smaller is reduced and gets Shoup companions
        wide = self._ntt(x, lazy=True)
        fixed = self.ntt(y)
        companion = (fixed << np.uint64(_SHOUP_SHIFT)) // self.q_col
        shape = np.broadcast_shapes(wide.shape, fixed.shape)
        prod = wide if wide.shape == shape else np.array(np.broadcast_to(wide, shape))
        tmp = np.empty(shape, dtype=np.uint64)
        self._shoup_mul(prod, (fixed, companion), tmp, prod, trailing=1)  # in [0, 2q)
        return self._intt(prod, 2)

    # ---------------------------------------------------- exact FFT small path
    def _build_fft_tables(self) -> None:
        j = np.arange(self.n)
        self._twist = np.exp(1j * np.pi * j / self.n)  # psi_c^j, psi_c = e^{i pi/n}
        self._untwist = np.conj(self._twist) / self.n  # includes 1/n of the IFFT
        k = self.n.bit_length() - 1 + 2  # FFT levels plus the two twist products
        self._fft_err_factor = _EPS * (3 * k + (3 * k + 1) * math.sqrt(5) + 3 * k)

    def fft_small(self, s: np.ndarray) -> np.ndarray:
        """Twisted FFT of small signed polynomials.

        Parameters
        ----------
        s : ndarray of shape (..., n), integer dtype, small coefficients

        Returns
        -------
        ndarray of shape (..., n), complex128
        """
        return np.fft.fft(np.asarray(s, dtype=np.float64) * self._twist, axis=-1)

    def _pieces(self, s_norm: float, wide_norm_sq_max: float) -> int:
        """Number of pieces (1 or 2) the wide operand needs for an exact product.

        ``s_norm`` is max ||s||_2 over the small operands; ``wide_norm_sq_max``
        is max ||y||_2^2 of one real wide signal. Packing two real signals in
        one complex FFT multiplies the complex signal's norm by at most sqrt(2).
        """
        bound = s_norm * math.sqrt(2.0 * wide_norm_sq_max) * self._fft_err_factor
        if bound < _FFT_ERROR_LIMIT:
            return 1
        piece = wide_norm_sq_max / 2.0**30  # 16-bit pieces: norm^2 / 2^30 (hi part)
        bound = s_norm * math.sqrt(2.0 * max(piece, self.n * 2.0**32)) * self._fft_err_factor
        if bound < _FFT_ERROR_LIMIT:
            return 2
        raise ValueError("small operand too large for an exact FFT product")  # pragma: no cover

    def _wide_spectrum(self, y: np.ndarray, pieces: int) -> np.ndarray:
        """Pack real signals (..., S, n) (S = signals, values < 2^31) into
        complex spectra (..., ceil(S*pieces/2), n)."""
        if pieces == 2:
            lo = (y & np.uint64(0xFFFF)).astype(np.float64)
            hi = (y >> np.uint64(16)).astype(np.float64)
            sig: NDArray[np.float64] = np.stack([lo, hi], axis=-2).reshape(y.shape[:-2] + (-1, self.n))
        else:
            sig = y.astype(np.float64)
        S = sig.shape[-2]
        if S % 2:
            pad = np.zeros(sig.shape[:-2] + (1, self.n))
            sig = np.concatenate([sig, pad], axis=-2)
        z = np.empty(sig.shape[:-2] + (sig.shape[-2] // 2, self.n), dtype=np.complex128)
        z.real = sig[..., 0::2, :]
        z.imag = sig[..., 1::2, :]
        z *= self._twist
        return np.fft.fft(z, axis=-1)

    def _from_spectrum(
        self,
        spec: np.ndarray,
        signals: int,
        pieces: int,
        q_signal: np.ndarray,
        addend: np.ndarray | None = None,
    ) -> np.ndarray:
        """Inverse of the packing: spectrum products -> (..., signals, n) uint64.

        ``addend`` (int64, broadcastable to (..., signals, n), |addend| < 2^62 -
        n 2^31) is added to the exact integer convolution before reduction.
        """
        z = np.fft.ifft(spec, axis=-1, norm="forward")  # unscaled inverse
        z *= self._untwist
        out = np.empty(z.shape[:-2] + (2 * z.shape[-2], self.n), dtype=np.int64)
        out[..., 0::2, :] = np.rint(z.real)
        out[..., 1::2, :] = np.rint(z.imag)
        del z
        out = out[..., : signals * pieces, :]
        if pieces == 2:
            out = out.reshape(out.shape[:-2] + (signals, 2, self.n))
            res = out[..., 1, :] << 16
            res += out[..., 0, :]
        else:
            res = out
        if addend is not None:
            res += addend
        # |conv| < 2^59 where the FFT is exact and |addend| < 2^62: mod_signed's range
        return mod_signed(res, q_signal, out=res.view(np.uint64))

    def mul_small(self, s: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Exact negacyclic product of small polynomials ``s`` with elements ``y``.

        Parameters
        ----------
        s : ndarray of shape (..., n), signed integer dtype
            Small coefficients (e.g. ternary). Broadcasts against the batch
            axes of ``y``.
        y : ndarray of shape (..., L, n), uint64
            Ring elements.

        Returns
        -------
        ndarray of shape (..., L, n), uint64
            s*y in R_q (every limb).

        Notes
        -----
        Exact: the wide operand is split into 16-bit pieces whenever the FFT
        error bound ||s||_2 ||y||_2 * c(n) * 2^-53 (Percival 2003) could exceed
        1/4, so rounding recovers the integer convolution.
        """
        s = np.asarray(s)
        s_norm = float(np.sqrt(np.max(np.sum(s.astype(np.float64) ** 2, axis=-1))))
        return self.mul_small_spectrum(self.fft_small(s), s_norm, y)

    def mul_small_spectrum(
        self,
        s_spec: np.ndarray,
        s_norm: float,
        y: np.ndarray,
        q_signal: np.ndarray | None = None,
        addend: np.ndarray | None = None,
    ) -> np.ndarray:
        """As :meth:`mul_small` with ``s`` given by :meth:`fft_small` and its max 2-norm.

        ``y`` may stack several elements on its signal axis: shape (..., S, n)
        with ``q_signal`` (int64, shape (S, 1)) giving each row's modulus
        (default: the ring's primes, S = L). ``addend`` (int64, broadcastable
        to the result, small) is added before the final reduction: returns
        (s*y + addend) mod q_signal.
        """
        if q_signal is None:
            q_signal = self._q_i64
        S = y.shape[-2]
        wide_sq = float(q_signal.max() - 1) ** 2 * self.n
        pieces = self._pieces(s_norm, wide_sq)
        k = max(s_spec.shape[0] if s_spec.ndim == 2 else 1, y.shape[0] if y.ndim == 3 else 1)
        if s_spec.ndim > 2 or y.ndim > 3 or k <= _CHUNK:
            spec = self._wide_spectrum(y, pieces) * s_spec[..., None, :]
            return self._from_spectrum(spec, S, pieces, q_signal, addend)
        # one leading batch axis: work in cache-sized chunks of polynomials
        y_fixed = self._wide_spectrum(y, pieces) if y.ndim == 2 else None
        out = np.empty((k, S, self.n), dtype=np.uint64)
        for i in range(0, k, _CHUNK):
            sl = slice(i, min(i + _CHUNK, k))
            ys = y_fixed if y_fixed is not None else self._wide_spectrum(y[sl], pieces)
            ss = s_spec[sl] if s_spec.ndim == 2 else s_spec
            add = None
            if addend is not None:
                add = addend[sl] if addend.ndim == 3 and addend.shape[0] == k else addend
            out[sl] = self._from_spectrum(ys * ss[..., None, :], S, pieces, q_signal, add)
        return out

    # --------------------------------------------------------------------- CRT
    def _build_crt_tables(self) -> None:
        L, p = self.limbs, self.primes
        # Garner: digit_i = (x_i - sum_{j<i} d_j P_j) * P_i^{-1} mod q_i, P_i = prod_{j<i} q_j
        self._garner_pmod = np.zeros((L, L), dtype=np.int64)  # P_j mod q_i
        self._garner_inv = np.zeros(L, dtype=np.int64)  # P_i^{-1} mod q_i
        for i in range(L):
            P = 1
            for j in range(i):
                self._garner_pmod[i, j] = P % p[i]
                P *= p[j]
            self._garner_inv[i] = pow(P % p[i], -1, p[i]) if i else 1
        half = (self.q - 1) // 2
        digits = []
        for i in range(L):
            digits.append(half % p[i])
            half //= p[i]
        self._half_digits = digits  # mixed-radix digits of floor((q-1)/2)
        self._words = (self.q.bit_length() + 31) // 32 + 1

    def _garner(self, x: np.ndarray) -> list[np.ndarray]:
        """Mixed-radix digits d_i in [0, q_i) of the integer X in [0, q): X = sum d_i P_i."""
        p = self.primes
        xs = x.astype(np.int64)
        digits: list[np.ndarray] = []
        for i in range(self.limbs):
            acc = xs[..., i, :].copy()
            for j in range(i):
                term = digits[j] * self._garner_pmod[i, j]  # [0, q_j) times [0, q_i): < 2^62
                acc -= mod_u64(term.view(np.uint64), p[i], out=term.view(np.uint64)).view(np.int64)
            mod_signed(acc, p[i], out=acc.view(np.uint64))  # acc > -i p_i
            acc *= self._garner_inv[i]  # [0, q_i) times [0, q_i): < 2^62
            mod_u64(acc.view(np.uint64), p[i], out=acc.view(np.uint64))
            digits.append(acc)
        return digits

    def to_centered_float(self, x: np.ndarray, scale_bits: int = 0) -> np.ndarray:
        """CRT-reconstruct centred coefficients and divide by 2^scale_bits.

        Parameters
        ----------
        x : ndarray of shape (..., L, n), uint64
        scale_bits : int
            The result is X / 2^scale_bits with X the representative of the
            coefficient in (-q/2, q/2].

        Returns
        -------
        ndarray of shape (..., n), float64
            Exact whenever X/2^scale_bits is representable in float64 (e.g.
            any X with at most 53 significant bits); otherwise within a few ulp.
            Computed with exact multi-word integer arithmetic (Garner's
            mixed-radix conversion, then Horner in 32-bit words).
        """
        p = self.primes
        d = self._garner(x)
        # negative iff X > floor((q-1)/2): lexicographic compare of the digits, top first
        greater = np.zeros(d[0].shape, dtype=bool)
        equal = np.ones(d[0].shape, dtype=bool)
        for i in reversed(range(self.limbs)):
            greater |= equal & (d[i] > self._half_digits[i])
            equal &= d[i] == self._half_digits[i]
        neg = greater
        # |X| = q - X for negative ones: mixed-radix negation with borrow
        borrow = np.zeros(d[0].shape, dtype=np.int64)
        for i in range(self.limbs):
            t = d[i] + borrow
            nd = (p[i] - t) % p[i]
            borrow = (t > 0).astype(np.int64)
            d[i] = np.where(neg, nd, d[i])
        # Horner in 32-bit words: X = d_0 + q_0 (d_1 + q_1 (d_2 + ...))
        W = self._words
        words = np.zeros((W,) + d[0].shape, dtype=np.int64)
        mask = np.int64(0xFFFFFFFF)
        words[0] = d[self.limbs - 1]
        for i in reversed(range(self.limbs - 1)):
            c = d[i]
            for w in range(W):
                t = words[w] * p[i] + c
                words[w] = t & mask
                c = t >> 32
        out = np.zeros(d[0].shape, dtype=np.float64)
        for w in reversed(range(W)):
            out += words[w].astype(np.float64) * 2.0 ** (32 * w - scale_bits)
        return np.where(neg, -out, out)

    def to_int(self, x: np.ndarray) -> np.ndarray:
        """Slow exact CRT: centred Python ints, object array of shape (..., n).

        For tests and debugging only.
        """
        q = self.q
        coeffs = []
        for p in self.primes:
            Qi = q // p
            coeffs.append(Qi * pow(Qi, -1, p))
        xs = x.astype(object)
        val = sum(xs[..., i, :] * coeffs[i] for i in range(self.limbs)) % q
        return np.where(val > (q - 1) // 2, val - q, val)

    def from_int(self, v: np.ndarray) -> np.ndarray:
        """Map arbitrary Python ints (object array (..., n)) into RNS (slow)."""
        v = np.asarray(v, dtype=object)
        return np.stack([(v % p).astype(np.uint64) for p in self.primes], axis=-2)


def validate_primes(n: int, primes: Sequence[int]) -> tuple[int, ...]:
    """Check ``n`` is a power of two and each prime is NTT-friendly.

    Returns
    -------
    tuple of int
        The primes as Python ints.

    Raises
    ------
    ValueError
        Naming ``n`` or ``primes[i]`` and the violated condition
        (power of two; prime; = 1 mod 2n; < 2^31; distinct; non-empty).
    """
    if n < 2 or n & (n - 1):
        raise ValueError(f"n must be a power of two >= 2, got {n}")
    primes = tuple(int(p) for p in primes)
    if not primes:
        raise ValueError("primes must not be empty")
    if len(set(primes)) != len(primes):
        raise ValueError(f"primes must be distinct, got {primes}")
    for i, p in enumerate(primes):
        if p >= 2**_MAX_PRIME_BITS:
            raise ValueError(f"primes[{i}] = {p} is not below 2^31")
        if p % (2 * n) != 1:
            raise ValueError(f"primes[{i}] = {p} is not 1 mod 2n = {2 * n}")
        if not is_prime(p):
            raise ValueError(f"primes[{i}] = {p} is not prime")
    return primes


@functools.lru_cache(maxsize=32)
def get_ring(n: int, primes: tuple[int, ...]) -> Ring:
    """Cached :class:`Ring` (tables are computed once per (n, primes))."""
    return Ring(n, primes)
