"""Compact xMK-CKKS uploads: modulus switching of c0 and of decryption shares (the smallest upload the noise allows).

A client's upload in one round is its ciphertext (c0, c1) and later its
decryption share D (Walskaar et al. 2023, Eqs. 6 and 7): three batches of
ring elements at log2 q bits per coefficient, 3 x 108 = 324 bits = 10.1 x a
float32 weight at ``xmk-n4096-q108``. Most of those bits are noise: the
decrypted sum is only good above the smudging floor B_total(M) ~ 2^67 (M = 10).
So c0 and D are *modulus-switched* to the first L' of the L RNS primes
(q' = q_0 ... q_{L'-1}, Q = q / q' the product of the dropped primes), as
OpenFHE's ``Compress(ct, towersLeft)``:

    x' = round(x / Q)  (mod q')        (:func:`switch_modulus`)

one dropped prime p at a time: with r the centred residue of x mod p,
x' = (x - r) p^{-1} mod q_i on every kept prime q_i (exact integer division),
|x/p - x'| <= 1/2; over several primes |x/Q - x'| <= 1/2 + 1/min q_l < 1.
Switching is linear up to that rounding (sum_i x_i mod q maps to
sum_i x_i' mod q' because q / Q = q'), so the server sums the switched c0'
and D' exactly as before (:func:`~flwr_fedeval.rlwe.xmkckks.combine` over
:func:`level_parameter_set`) and decodes with the scale Delta / Q.

c1 stays exact. A rounding error tau in c1_i would enter the decryption as
(sum_j s_j) tau, ||.||_inf <= n M Q / 2 (rounding noise ~ ||s||_1 Q): it
depends on the secrets, so the smudging noise would have to be 2^40 times
larger than it -- one dropped 27-bit prime would raise the noise floor by
about 21 bits. Rounding c0 and D is post-processing: c0' is a function of c0
(which the uncompressed protocol reveals) and D' of the already smudged D,
so the server's view of the compact protocol is computable from its view of
the uncompressed one and the smudging argument is unchanged.

Noise budget, bit by bit (M = ``num_clients`` ciphertexts summed and at most
M decryption shares, Delta = 2^scale_bits, B_e = tail_cut):

1. message: |sum_i m_i| <= M round(max|x| Delta), i.e. scale_bits +
   log2(max|x| M) bits (:func:`~flwr_fedeval.rlwe.params.check_noise_budget`);
2. fresh noise: B_fresh(M) = 2 n M^2 B_e + M B_e (c1 exact: no rounding term);
3. smudging: B_smudge(M) = 2^(40 + ceil log2 W + ceil log2 B_fresh(M)) per
   share, W = 3 decryptions of one sum (:func:`~flwr_fedeval.rlwe.params.smudging_bound`),
   in units of q, B_total(M) = B_fresh(M) + M B_smudge(M); the pairwise masks of
   a decryption share (:func:`~flwr_fedeval.rlwe.threshold.mask_decryption_share`)
   are added mod q' after the switch and cancel exactly: no noise term;
4. switching rounding: <= 1/2 + 1/min q_l per switched term in units of q',
   M terms c0'_i, at most M terms D'_j and one more, the server's mask
   correction in XMKFedAvg (the self-masks of C and the pairwise masks of
   K minus C, summed at L limbs and switched once): 2M + 1 terms, together
   <= (2M + 1)(1/2 + 1/min q_l) < 2M for M >= 1 and every min q_l > 6
   (2^-22.99 for the default set's smallest prime, 8380417). R = 2M, i.e. 2 M Q in units of q
   (R = 0 if Q = 1);
5. no wrap-around in Z_{q'}:  (M round(max|x| Delta) + B_total(M)) / Q + R
   <= (q' - 1) / 2;
6. margin: the rounding may at most double the worst-case error,
   R Q <= B_total(M), *or* keep the worst-case error of the decoded sum
   within ``max_error`` (default :data:`ERROR_TARGET` = 1e-6, the precision
   target of docs/explanation/upload-size.md),
   (B_total(M) + R Q + M/2) / Delta <= max_error. The decoded sum is within
   (B_total(M) + R Q + M/2) / Delta of sum_i x_i
   (:func:`compact_noise_bound`; float64 decoding adds a relative 2^-52).
   The second branch matters for few clients, where the smudging floor is
   low and the scale high: at M = 2 the default set drops two 31-bit primes
   (R Q = 2^64 = 2 B_total) and its error bound is still 2.2e-8.

:func:`compact_limbs` returns the smallest L' >= 1 that satisfies 5 and 6.
Upload per coefficient: log2 q (c1) + 2 log2 q' (c0', D'), packed at
bit_length(q_l) bits per residue by the existing format
(:mod:`~flwr_fedeval.rlwe.serialization`; a prime just below a power of two
wastes no bit). Delta from :func:`~flwr_fedeval.rlwe.params.max_scale_bits`,
max|x| = 2^16:

* ``xmk-n4096-q109`` (the default; primes below 2^24, 2^23, 2^31, 2^31):
  L' = 2 for every M from 2 to 100 (q' = 2^47.0, Q = 2^62.0), 109 + 2 x 47
  = 203 bits per coefficient, 6.35 x float32 for 949,002 weights; error
  bound of the sum 2.7e-6 at M = 10 (R Q = B_total / 8), 2.2e-7 at M = 5;
* ``xmk-n4096-q109-l5`` (five limbs, primes below 2^23, 2^22, 2^21, 2^21,
  2^22): L' = 2 for every M (q' = 2^45.0, Q = 2^63.9), 199 bits, 6.22 x;
  error bound 3.5e-6 at M = 10;
* ``xmk-n4096-q93`` (3 x 31 bits): L' = 1 for 3 <= M <= 50 (10 <= M before
  the smudging was sized for W = 3 decryptions), 93 + 31 + 31
  = 155 bits per coefficient, 4.85 x float32 for 949,002 weights (from
  8.7 x); worst-case error 2.7e-7 x M max|x| at M = 10 (1.1 x the
  uncompressed bound);
* ``xmk-n4096-q108`` (4 x 27 bits): L' = 2 for 2 <= M <= 100 (dropping a
  third prime would make the rounding 2^(81+4.3) > B_total ~ 2^69.3), 216
  bits, 6.8 x (from 10.1 x), error bound unchanged by the switch (7.3e-12 x
  M max|x| at M = 10; 1.8e-12 with the smudging of one decryption).

Reaching <= 5 x float32 is not possible at a worst-case error of the sum
of a few 1e-6 (M = 10, max|x| = 2^16): minimising log2 q + 2 log2 q' over Q
with Delta = (B_total + 2MQ) / E and log2 q <= 109 gives 197.7 bits
(6.19 x) at E = 2.7e-6 and 194.7 bits (6.09 x) at q108's 4.8e-6 for any
choice of primes, and 160 bits only for E >= 1.45e-2
(docs/explanation/upload-size.md derives it bit by bit). Two dropped
primes below 2^31 give Q <= 2^62, 2.7 bits short of the floor's Q: the
default set's 203 bits are 5.4 bits above its floor, the five-limb set's
199 bits 2.8 above its own.
Even with L' = 1, q108 would need 108 + 27 + 27 = 162 bits (5.07 x), and
its rounding would exceed the noise 2^18 times.

Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from . import serialization as ser
from .params import NoiseBudgetError, ParameterSet, check_noise_budget, total_noise_bound
from .ring import mod_signed
from .xmkckks import Ciphertext, DecryptionShare, combine, polys_to_bytes

__all__ = [
    "ERROR_TARGET",
    "CompactCiphertext",
    "add_compact_ciphertexts",
    "compact_combine_and_decode",
    "compact_count",
    "compact_rows",
    "share_count",
    "share_rows",
    "compact_limbs",
    "compact_noise_bound",
    "compress_ciphertext",
    "compress_decryption_share",
    "dropped_modulus",
    "level_parameter_set",
    "switch_modulus",
]


#: Worst-case error of the decoded sum (units of the encoded values) the switching rounding may grow the
#: bound to, where doubling the uncompressed bound would allow less (condition 6 of the module docstring):
#: the precision target of 1e-6 (docs/explanation/upload-size.md, point 4). It only matters for few
#: clients (M = 2 at the default set); from M ~ 8 on the smudging alone exceeds it at n = 4096.
ERROR_TARGET = 1e-6


def _check_limbs(params: ParameterSet, limbs: int) -> int:
    if isinstance(limbs, bool) or not isinstance(limbs, (int, np.integer)) or not 1 <= limbs <= params.limbs:
        raise ValueError(f"limbs must be an integer in [1, {params.limbs}], got {limbs!r}")
    return int(limbs)


def level_parameter_set(params: ParameterSet, limbs: int) -> ParameterSet:
    """The parameter set of the first ``limbs`` primes: where switched objects live.

    Returns ``params`` itself for ``limbs == params.limbs``; otherwise a set
    named ``"<name>/L<limbs>"`` with primes ``params.primes[:limbs]`` (same n,
    sigma, tail_cut, smudging_bits). Its objects serialize with the existing
    formats; load them with this set passed explicitly (it is not in
    :data:`~flwr_fedeval.rlwe.params.PARAMETER_SETS`).

    Raises
    ------
    ValueError
        If ``limbs`` is not in [1, params.limbs].
    """
    return _level(params, _check_limbs(params, limbs))


@functools.lru_cache(maxsize=64)
def _level(params: ParameterSet, limbs: int) -> ParameterSet:
    if limbs == params.limbs:
        return params
    return ParameterSet(
        name=f"{params.name}/L{limbs}",
        n=params.n,
        primes=params.primes[:limbs],
        sigma=params.sigma,
        tail_cut=params.tail_cut,
        smudging_bits=params.smudging_bits,
    )


def dropped_modulus(params: ParameterSet, limbs: int) -> int:
    """Q = prod(params.primes[limbs:]), the factor a switch to ``limbs`` limbs divides by."""
    return math.prod(params.primes[_check_limbs(params, limbs) :])


def switch_modulus(params: ParameterSet, x: NDArray[np.uint64], limbs: int) -> NDArray[np.uint64]:
    """Modulus switching x -> round(x / Q) mod q', dropping the last RNS primes.

    Parameters
    ----------
    params : ParameterSet
        The set ``x`` belongs to (L limbs).
    x : ndarray of shape (..., L, n), uint64
        Reduced residues.
    limbs : int
        L', the number of primes kept (1 <= L' <= L).

    Returns
    -------
    ndarray of shape (..., L', n), uint64
        x' with |x / Q - x'| <= 1/2 + 1/min_l q_l (centred representatives),
        an element of :func:`level_parameter_set` (params, L'). A copy of x
        if L' = L.

    Raises
    ------
    ValueError
        If ``x`` is not a reduced (..., L, n) uint64 array or ``limbs`` is invalid.
    """
    params.ring.check(x, "x")
    keep = _check_limbs(params, limbs)
    cur = x.astype(np.int64)
    for top in range(params.limbs - 1, keep - 1, -1):
        p = params.primes[top]
        r = cur[..., top : top + 1, :]
        r = np.where(r > p // 2, r - p, r)  # centred residue mod p, |r| <= p/2
        q = np.array(params.primes[:top], dtype=np.int64)[:, None]
        p_inv = np.array([pow(p, -1, qi) for qi in params.primes[:top]], dtype=np.int64)[:, None]
        low = cur[..., :top, :] - r  # |.| < 2^31 + 2^30
        low *= p_inv  # |.| < (2^31 + 2^30) 2^31 < 2^63 - 2^31: no reduction needed before the product
        mod_signed(low, q, out=low.view(np.uint64))  # floor mod: into [0, q_i) also for negative values
        cur = low
    out: NDArray[np.uint64] = cur.astype(np.uint64)
    return out


def compact_noise_bound(params: ParameterSet, limbs: int, *, num_clients: int) -> int:
    """B_total(M) + R Q, R = 2M (0 if nothing is dropped): worst-case noise after switching, units of q.

    The decoded compact sum is within (this + M/2) / Delta of sum_i x_i.

    Raises
    ------
    ValueError
        If ``limbs`` or ``num_clients`` is invalid.
    """
    Q = dropped_modulus(params, limbs)
    rounding = 0 if Q == 1 else 2 * num_clients * Q
    return total_noise_bound(params, num_clients) + rounding


def compact_limbs(
    params: ParameterSet, *, num_clients: int, scale_bits: int, max_abs_value: float,
    max_error: float = ERROR_TARGET,
) -> int:
    """The fewest limbs L' that c0 and the decryption shares can be switched to (module docstring, 1-6).

    Parameters
    ----------
    params : ParameterSet
    num_clients : int
        M, ciphertexts summed (and the bound on decryption shares combined).
    scale_bits : int
        log2 Delta of the encoding.
    max_abs_value : float
        Largest |value| a client encodes.
    max_error : float, default :data:`ERROR_TARGET`
        Worst-case error of the decoded sum the rounding may reach when it more than doubles the
        uncompressed bound (condition 6); finite, >= 0 (0: only the doubling rule).

    Returns
    -------
    int
        L' in [1, params.limbs]: the smallest with no wrap-around in Z_{q'}
        (condition 5) and rounding at most doubling the error or keeping it
        within ``max_error`` (condition 6).

    Raises
    ------
    NoiseBudgetError
        If the uncompressed budget already fails
        (:func:`~flwr_fedeval.rlwe.params.check_noise_budget`).
    ValueError
        If ``max_error`` is negative or not finite.
    """
    if not math.isfinite(max_error) or max_error < 0:
        raise ValueError(f"max_error must be finite and >= 0, got {max_error}")
    budget = check_noise_budget(
        params, num_clients=num_clients, scale_bits=scale_bits, max_abs_value=max_abs_value
    )
    M = budget.num_clients
    need = math.floor(max_abs_value * 2.0**scale_bits + 0.5)
    # max_error * Delta in exact rationals: condition 6's second branch without float rounding
    error_room = Fraction(max_error) * 2**scale_bits
    for keep in range(1, params.limbs + 1):
        Q = dropped_modulus(params, keep)
        q_keep = params.q // Q
        rounding = 0 if Q == 1 else 2 * M
        # condition 5 (no wrap) in exact integers: (M need + B_total) / Q + R <= (q' - 1) / 2
        fits = 2 * (M * need + budget.total_noise + rounding * Q) <= (q_keep - 1) * Q
        doubles = rounding * Q <= budget.total_noise
        within = budget.total_noise + rounding * Q + Fraction(M, 2) <= error_room
        if fits and (doubles or within):  # condition 6 (margin)
            return keep
    raise NoiseBudgetError(f"{params.name}: no level fits although the full modulus does")  # pragma: no cover


@dataclass(frozen=True, eq=False)
class CompactCiphertext:
    """A client upload with c0 switched to L' limbs and c1 exact.

    Attributes
    ----------
    params : ParameterSet
        The full parameter set (c1's).
    limbs : int
        L', the limbs of c0.
    c0 : ndarray of shape (k, L', n), uint64
        round(c0 / Q) mod q' (:func:`switch_modulus`).
    c1 : ndarray of shape (k, L, n), uint64

    Notes
    -----
    Byte format: :func:`~flwr_fedeval.rlwe.xmkckks.polys_to_bytes` of c0 under
    :func:`level_parameter_set` (params, L') followed by that of c1 under
    ``params``; both strict and bit-packed at bit_length(q_l) bits.
    """

    params: ParameterSet
    limbs: int
    c0: NDArray[np.uint64]
    c1: NDArray[np.uint64]

    def __post_init__(self) -> None:
        level = level_parameter_set(self.params, self.limbs)
        level.ring.check(self.c0, "c0")
        self.params.ring.check(self.c1, "c1")
        if self.c0.ndim != 3 or self.c0.shape[0] != self.c1.shape[0] or self.c1.ndim != 3:
            raise ValueError(f"c0 {self.c0.shape} and c1 {self.c1.shape} must be (k, ., n) with the same k")

    @property
    def level(self) -> ParameterSet:
        """The parameter set of c0 (:func:`level_parameter_set`)."""
        return level_parameter_set(self.params, self.limbs)

    def to_bytes(self) -> bytes:
        """c0 then c1, each with its own header (see Notes)."""
        return polys_to_bytes(self.level, self.c0) + polys_to_bytes(self.params, self.c1)

    @classmethod
    def from_bytes(cls, data: bytes, params: ParameterSet, limbs: int) -> CompactCiphertext:
        """Load a compact ciphertext; raises ``ValueError`` naming the bad field.

        The checks are :func:`compact_count`'s and :func:`compact_rows`' (all rows at once)."""
        count = compact_count(data, params, limbs)
        ((_, c0, c1),) = compact_rows(data, params, limbs, chunk_polys=count)
        return cls(params, int(limbs), c0, c1)


def _split(data: bytes | memoryview, params: ParameterSet, limbs: int) -> tuple[int, int]:
    """(count, byte offset of c1's header) of a compact ciphertext; every header and length checked."""
    level = level_parameter_set(params, limbs)
    _, count, aux = ser.unpack_header(data, ser.KIND_POLYNOMIALS, level)
    if aux != 0:
        raise ValueError(f"aux is {aux}, expected 0")
    split = ser.HEADER_SIZE + ser.packed_size(level, count, 1)
    if len(data) < split:
        raise ValueError(f"data too short: {len(data)} < {split} bytes for c0")
    tail = memoryview(data)[split:]
    _, got, aux = ser.unpack_header(tail, ser.KIND_POLYNOMIALS, params)
    if aux != 0:
        raise ValueError(f"aux is {aux}, expected 0")
    if got != count:
        raise ValueError(f"count is {got}, expected {count}")
    expected = ser.packed_size(params, count, 1)
    if len(tail) - ser.HEADER_SIZE != expected:
        raise ValueError(f"payload length is {len(tail) - ser.HEADER_SIZE} bytes, expected {expected} "
                         f"for count = {count}")
    return count, split


def compact_count(data: bytes | memoryview, params: ParameterSet, limbs: int) -> int:
    """k, the polynomials of a compact ciphertext's bytes, after checking both headers and lengths.

    What :meth:`CompactCiphertext.from_bytes` checks besides the residues (those are checked by
    :func:`compact_rows`, row range by row range): magic, version, kind, parameter set (c0 at
    :func:`level_parameter_set` (params, L'), c1 at ``params``), n, limbs, count (the same in
    both), aux = 0, and both payload lengths exactly.

    Raises
    ------
    ValueError
        Naming the bad field.
    """
    return _split(data, params, limbs)[0]


def compact_rows(
    data: bytes | memoryview, params: ParameterSet, limbs: int, *, chunk_polys: int
) -> Iterator[tuple[int, NDArray[np.uint64], NDArray[np.uint64]]]:
    """A compact ciphertext's bytes read ``chunk_polys`` polynomials at a time, each range checked.

    Yields ``(start, c0[start:stop], c1[start:stop])`` for consecutive ranges covering [0, k)
    (c0 rows of shape (r, L', n), c1 rows (r, L, n), uint64); every residue of a range is checked
    (< q_l) before it is yielded, so a consumer that stops at a ``ValueError`` has seen only
    canonical rows. The headers and lengths are checked (:func:`compact_count`) before the first
    range. Concatenated, the ranges are :meth:`CompactCiphertext.from_bytes`' c0 and c1 exactly.
    The server folds a ciphertext this way without parsing it whole (one reply in flight: memory flat in M).

    Raises
    ------
    ValueError
        ``chunk_polys`` < 1, or naming the bad field (header, length, ``c0 limb i`` / ``c1 limb i``
        with a value >= q_i).
    """
    if isinstance(chunk_polys, bool) or not isinstance(chunk_polys, (int, np.integer)) or chunk_polys < 1:
        raise ValueError(f"chunk_polys must be an integer >= 1, got {chunk_polys!r}")
    count, split = _split(data, params, limbs)
    level = level_parameter_set(params, limbs)
    view = memoryview(data)
    c0_payload = view[ser.HEADER_SIZE : split]
    c1_payload = view[split + ser.HEADER_SIZE :]
    for start in range(0, count, int(chunk_polys)):
        stop = min(start + int(chunk_polys), count)
        c0 = ser.unpack_rows(level, c0_payload, count, start, stop, "c0")
        c1 = ser.unpack_rows(params, c1_payload, count, start, stop, "c1")
        yield start, c0, c1


def share_count(data: bytes | memoryview, params: ParameterSet, limbs: int) -> int:
    """k, the polynomials of a decryption share's bytes at L' limbs, after checking its header and length.

    What :meth:`~flwr_fedeval.rlwe.xmkckks.DecryptionShare.from_bytes` under :func:`level_parameter_set`
    (params, L') checks besides the residues (:func:`share_rows` checks those): magic, version, kind,
    parameter set, n, limbs, count, aux = 0, payload length.

    Raises
    ------
    ValueError
        Naming the bad field.
    """
    level = level_parameter_set(params, limbs)
    _, count, aux = ser.unpack_header(data, ser.KIND_DECRYPTION_SHARE, level)
    if aux != 0:
        raise ValueError(f"aux is {aux}, expected 0")
    expected = ser.packed_size(level, count, 1)
    if len(data) - ser.HEADER_SIZE != expected:
        raise ValueError(f"payload length is {len(data) - ser.HEADER_SIZE} bytes, expected {expected} "
                         f"for count = {count}")
    return count


def share_rows(
    data: bytes | memoryview, params: ParameterSet, limbs: int, *, chunk_polys: int
) -> Iterator[tuple[int, NDArray[np.uint64]]]:
    """A decryption share's bytes read ``chunk_polys`` polynomials at a time: ``(start, d[start:stop])``,
    rows of shape (r, L', n) uint64, each range's residues checked before it is yielded (as
    :func:`compact_rows` does for a ciphertext; header and length first, :func:`share_count`).

    Raises
    ------
    ValueError
        ``chunk_polys`` < 1, or naming the bad field (header, length, ``d limb i`` >= q_i).
    """
    if isinstance(chunk_polys, bool) or not isinstance(chunk_polys, (int, np.integer)) or chunk_polys < 1:
        raise ValueError(f"chunk_polys must be an integer >= 1, got {chunk_polys!r}")
    count = share_count(data, params, limbs)
    level = level_parameter_set(params, limbs)
    payload = memoryview(data)[ser.HEADER_SIZE :]
    for start in range(0, count, int(chunk_polys)):
        stop = min(start + int(chunk_polys), count)
        yield start, ser.unpack_rows(level, payload, count, start, stop, "d")


def compress_ciphertext(ciphertext: Ciphertext, limbs: int) -> CompactCiphertext:
    """Switch c0 of a fresh ciphertext to ``limbs`` limbs; c1 stays exact (module docstring).

    Raises
    ------
    ValueError
        If ``limbs`` is invalid.
    """
    p = ciphertext.params
    return CompactCiphertext(p, _check_limbs(p, limbs), switch_modulus(p, ciphertext.c0, limbs), ciphertext.c1.copy())


def add_compact_ciphertexts(ciphertexts: Sequence[CompactCiphertext]) -> CompactCiphertext:
    """Sum (C0', C1) of compact ciphertexts of one parameter set and level.

    Raises
    ------
    ValueError
        If the list is empty or mixes parameter sets, levels or sizes.
    """
    if not ciphertexts:
        raise ValueError("ciphertexts must not be empty")
    first = ciphertexts[0]
    for j, ct in enumerate(ciphertexts):
        if ct.params != first.params or ct.limbs != first.limbs:
            raise ValueError(
                f"ciphertexts[{j}] is at {ct.params.name!r}/L{ct.limbs}, expected {first.params.name!r}/L{first.limbs}"
            )
        if ct.c0.shape != first.c0.shape:
            raise ValueError(f"ciphertexts[{j}] has shape {ct.c0.shape}, expected {first.c0.shape}")
    c0 = first.level.ring.sum(np.stack([ct.c0 for ct in ciphertexts]))
    c1 = first.params.ring.sum(np.stack([ct.c1 for ct in ciphertexts]))
    return CompactCiphertext(first.params, first.limbs, c0, c1)


def compress_decryption_share(params: ParameterSet, share: DecryptionShare, limbs: int) -> DecryptionShare:
    """Switch a decryption share (already smudged) to ``limbs`` limbs.

    Returns
    -------
    DecryptionShare under :func:`level_parameter_set` (params, limbs), d of shape (k, L', n).

    Raises
    ------
    ValueError
        If the share belongs to another set or ``limbs`` is invalid.
    """
    if share.params != params:
        raise ValueError(f"share uses parameter set {share.params.name!r}, expected {params.name!r}")
    return DecryptionShare(level_parameter_set(params, limbs), switch_modulus(params, share.d, limbs))


def compact_combine_and_decode(
    params: ParameterSet,
    limbs: int,
    c0_sum: NDArray[np.uint64],
    shares: Sequence[DecryptionShare],
    length: int,
    *,
    scale_bits: int,
) -> NDArray[np.float64]:
    """C0' + sum_j D'_j in Z_{q'}, decoded with the scale Delta / Q.

    Parameters
    ----------
    params : ParameterSet
        The full set.
    limbs : int
        L' of ``c0_sum`` and of every share.
    c0_sum : ndarray of shape (k, L', n), uint64
    shares : sequence of DecryptionShare
        Under :func:`level_parameter_set` (params, L').
    length : int
    scale_bits : int

    Returns
    -------
    ndarray of shape (length,), float64
        X' Q / 2^scale_bits with X' the centred sum: within
        (:func:`compact_noise_bound` + M/2) / 2^scale_bits of sum_i x_i.

    Raises
    ------
    ValueError
        On level, shape or parameter mismatches.
    """
    level = level_parameter_set(params, limbs)
    total = combine(level, c0_sum, shares)
    k = total.shape[0]
    if int(length) != length or not 0 <= length <= k * params.n:
        raise ValueError(f"length must be in [0, {k * params.n}], got {length}")
    values: NDArray[np.float64] = level.ring.to_centered_float(total, int(scale_bits)).reshape(-1)[: int(length)]
    return values * float(dropped_modulus(params, limbs))
