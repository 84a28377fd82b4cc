"""t-out-of-N threshold decryption for xMK-CKKS and Shamir sharing of 32-byte secrets.

Why (DESIGN.md §3; no retries): a member of the key set lost after its upload
must not force a second round on the same global model (a deviating server
would fake dropouts and difference the sums). Instead every member
Shamir-shares its RLWE secret s_i among the N members of the signed key set
once, at key setup, and any t > N/2 of them decrypt the aggregate inside the
round. This is the threshold variant of Mouchet et al. 2021, "Multiparty
Homomorphic Encryption from Ring-Learning-with-Errors" (PETS 2021, §4 and
the "Thresholdizer"/"Combiner" of Lattigo's ``multiparty`` package), with the
additive N-out-of-N secret s = sum_i s_i of xMK-CKKS (Walskaar et al. 2023,
Eq. 1).

Protocol (★ sent, • awaited, ▲ checked, aborting otherwise; the checks on
the *set* of members -- who is in the key set, who is active -- belong to
the caller, which holds the signed transcript):

Key setup, member i with point x_i = i + 1 of the ordered key set
(:func:`member_points`), t = :func:`min_threshold` (N) or larger:

1. ``shares = split_secret(params, sk_i, threshold=t, points=points)``:
   f_i(X) = s_i + a_{i,1} X + ... + a_{i,t-1} X^{t-1} over R_q, every
   a_{i,k} uniform in R_q (CSPRNG), share f_i(x_j) for member j.
2. ★ (privately, e.g. :mod:`flwr_fedeval.keyshare` sealed to j) f_i(x_j) to
   every member j != i; keep f_i(x_i).
3. • the N - 1 shares addressed to this member; ▲ each parses
   (:meth:`SecretShare.from_bytes`: parameter set, point = own point,
   threshold = t, reduced residues).
4. ``sk_share = aggregate_shares(params, received)``: F(x_j) = sum_i f_i(x_j),
   a Shamir share of s = sum_i s_i at x_j (▲ same point, same t, same set).

Decryption of an aggregate C = (C0, C1), active set A (|A| >= t, signed):

5. ▲ own point in A, no duplicate points, |A| >= t;
   ★ D_j = threshold_partial_decrypt(...) = lambda_j F(x_j) C1 + e*_j with
   lambda_j = prod_{k in A, k != j} x_k / (x_k - x_j) (:func:`lagrange_at_zero`)
   and e*_j the smudging noise of :func:`~flwr_fedeval.rlwe.xmkckks.partial_decrypt`;
   sent at the level of the attempt k (:func:`share_limbs`: attempt 1 after the
   modulus switch of :mod:`~flwr_fedeval.rlwe.compact` to L' limbs, every
   retry k >= 2 at the full L limbs) as
   D_j + sum_{k in A, k != j} sign(j, k) PRG(K_jk) mod q' (or mod q)
   (:func:`mask_decryption_share`, K_jk from the X25519 mask keys of the key
   set under :func:`pdec_mask_context`, which binds A and k).
6. server: sum_{j in A} D_j = (sum_j lambda_j F(x_j)) C1 + sum_j e*_j
   = s C1 + sum_j e*_j, since sum_j lambda_j F(x_j) = F(0) = s exactly in
   R_q (Lagrange interpolation at 0, coefficient-wise mod every q_l), and the
   masks cancel exactly in the sum over all of A. So
   :func:`~flwr_fedeval.rlwe.xmkckks.combine_and_decode` (C0, [D_j]) decodes
   exactly as the N-out-of-N protocol, with |A| smudging terms instead of N.

Why the points must be nonzero and distinct mod every RNS prime q_l: the
interpolation happens in each field F_{q_l} separately; points 1..N with
N < min_l q_l are. Any t - 1 shares F(x_j) are jointly uniform in R_q^{t-1}
(Shamir), so t - 1 members learn nothing about s.

Noise: the decryption noise is B_fresh(M) + |A| B_smudge(M) <= B_total(M)
for |A| <= M (:func:`~flwr_fedeval.rlwe.params.total_noise_bound`); the
smudging hides B_fresh(M) as in the N-out-of-N case.

A decryptor lost during step 5: the server asks a new active set
A' with the next attempt index k (the caller's rules,
:mod:`flwr_fedeval.clients.xmkckks`: one share per A and one per k in 1..a,
at most a <= :data:`~flwr_fedeval.rlwe.params.MAX_DECRYPTION_ATTEMPTS`
active sets and one C1 per key set and round, the members passed over as
lost only grow). Unmasked, two shares of one C1 for two active sets would be
two different linear combinations of the same secret share,
lambda D' - lambda' D = lambda' e - lambda e' (mod q) with e, e' small: a
2-dimensional lattice problem per coefficient that gives F(x_j) C1, i.e.
F(x_j).

Why the retry is sent at the full level (review of the masked
shares). Had every attempt been switched to L' limbs before masking, the
server's view of a complete attempt would be
sum_{j in A} switch(v_j), v_j = lambda_j^A F(x_j) C1 + e*_j: not a function
of sum_j v_j alone, since the sum of the t rounding terms depends on each
fractional part of v_j / Q, and e*_j spans only ~2^8 multiples of Q
(B_smudge ~ 2^69-2^70, Q ~ 2^61-2^62): ~2^-8 of statistical distance per
coefficient about lambda_j^A F(x_j) C1 mod Q. One switched attempt is
harmless (post-processing of the individually smudged v_j, which are
simulatable: uniform subject to their sum); two, with two different lambda
for one F(x_j), are not covered by the 2^-40 claim. Hence :func:`share_limbs`:
attempt 1 is switched, every attempt k >= 2 is sent at L limbs (its masks
mod q), and its masked shares sum to exactly s C1 + sum_{j in A} e*_j; the
server switches each share to L' on arrival -- the masks still cancel,
since sum_j m_j = 0 mod q gives
sum_j switch(v_j + m_j) = switch(sum_j v_j) + sum_j r_j (mod q') with the
same |A| <= M rounding terms r_j as attempt 1, counted in
:func:`~flwr_fedeval.rlwe.compact.compact_noise_bound` -- and folds at L'.

Why that makes the whole view of step 5 simulatable from W = 2a - 1
smudged copies of the decryption, for any pattern of requests:

* at most one complete switched attempt exists: every member answers k = 1
  once, and two active sets have > N/2 members each, so they share a member;
  two complete k = 1 attempts would need that member's k = 1 share for both,
  i.e. A1 = A2 (and one share per A). That attempt is post-processing of the
  individually simulatable smudged shares v_j;
* every complete full-level attempt reveals sum_{j in A} v_j: for every A
  with |A| >= t, sum_{j in A} lambda_j^A F(x_j) = F(0) = s, so after the
  t - 1 colluding members subtract their own known parts, each complete
  attempt gives the server the *same* linear functional, s C1, plus fresh
  smudging -- never two different multiples of one honest F(x_j), which is
  what the lattice attack above needs;
* an incomplete attempt (or one whose members answered with different k:
  the masks' context binds k) is uniform mod q' or q: its shares carry the
  pairwise masks with the missing member, whose X25519 private key the
  server never gets.

Each member answers at most a active sets and every complete A has > N/2
members, so at most W = 2a - 1 attempts complete; the smudging is sized
for W (:func:`~flwr_fedeval.rlwe.params.smudging_bound`), so the W copies
stay within W x (the per-copy smudging distance) <= 2^-40 of the ideal
view (hybrid argument). The passed-over rule of the caller stays as
defence in depth.

32-byte secrets (X25519 mask private keys, self-mask seeds: the SecAgg
recovery of Bonawitz et al. 2017, §4) are shared over GF(2^521 - 1) by
:func:`split_bytes` / :func:`combine_bytes`
(:mod:`~flwr_fedeval.rlwe.secret_sharing`, re-exported here).

Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from . import masking
from . import serialization as ser
from .params import PARAMETER_SETS, ParameterSet, get_parameter_set, smudging_bound
from .sampling import RandomStream, uniform_mod_q, uniform_smudging
from .secret_sharing import (
    BYTES_FIELD_PRIME,
    BYTES_SHARE_SIZE,
    SECRET_BYTES,
    ThresholdError,
    _check_int,
    _check_points,
    _check_threshold,
    combine_bytes,
    split_bytes,
)
from .xmkckks import DecryptionShare, SecretKey

__all__ = [
    "BYTES_FIELD_PRIME",
    "BYTES_SHARE_SIZE",
    "SECRET_BYTES",
    "SecretShare",
    "ThresholdError",
    "aggregate_shares",
    "combine_bytes",
    "lagrange_at_zero",
    "mask_decryption_share",
    "member_points",
    "min_threshold",
    "pdec_mask_context",
    "share_limbs",
    "split_bytes",
    "split_secret",
    "threshold_partial_decrypt",
]


# --------------------------------------------------------------------------- points
def _min_prime(params: ParameterSet | None) -> int:
    if params is not None:
        return min(params.primes)
    return min(min(p.primes) for p in PARAMETER_SETS.values())


def member_points(num_members: int, *, params: ParameterSet | None = None) -> tuple[int, ...]:
    """Shamir evaluation points of an ordered key set: member i gets point i + 1.

    Parameters
    ----------
    num_members : int
        N, the size of the signed, ordered key set.
    params : ParameterSet, optional
        Bound the points by this set's smallest prime; by default the
        smallest prime of every known set (:data:`~flwr_fedeval.rlwe.params.PARAMETER_SETS`).

    Returns
    -------
    tuple of int
        (1, 2, ..., N).

    Raises
    ------
    ThresholdError
        If N is not an integer, N < 1, or N >= min_l q_l (the points would not
        be distinct and nonzero modulo every RNS prime).
    """
    N = _check_int(num_members, "num_members")
    limit = _min_prime(params)
    if not 1 <= N < limit:
        raise ThresholdError(f"num_members must be in [1, {limit - 1}], got {N}")
    return tuple(range(1, N + 1))


def min_threshold(num_members: int) -> int:
    """floor(N / 2) + 1: the smallest t with t > N / 2 (a strict majority of the key set).

    Raises
    ------
    ThresholdError
        If N is not an integer >= 1.
    """
    N = _check_int(num_members, "num_members")
    if N < 1:
        raise ThresholdError(f"num_members must be >= 1, got {N}")
    return N // 2 + 1


# --------------------------------------------------------------------------- ring shares
_SHARE_MAGIC = b"FXSS"
_SHARE_VERSION = 1
# magic, version, reserved (0), limbs, n, point, threshold, params_id: the 52 bytes of
# serialization.HEADER_SIZE, so that serialization.unpack_polys reads the payload after it.
_SHARE_HEADER = struct.Struct("<4sBBHIII32s")


@dataclass(frozen=True, eq=False)
class SecretShare:
    """A Shamir share of an RLWE secret: F(point), a ring element of R_q.

    Attributes
    ----------
    params : ParameterSet
    point : int
        The member's evaluation point x_j (1..N, :func:`member_points`).
    value : ndarray of shape (L, n), uint64
        F(x_j) in RNS form, uniform in R_q (not small: keep it in the
        member's state only).
    threshold : int
        t, the number of shares that reconstruct (degree t - 1).

    Notes
    -----
    Byte format (:meth:`to_bytes`), little-endian, 52-byte header::

        magic b"FXSS" | version u8 (1) | reserved u8 (0) | limbs u16 | n u32
        | point u32 | threshold u32 | params_id 32s (ASCII, NUL-padded)

    then the L limbs of ``value`` packed at bit_length(q_l) bits each, as
    :func:`~flwr_fedeval.rlwe.serialization.pack_polys`. Parsing is strict:
    one encoding per share.
    """

    params: ParameterSet
    point: int
    value: NDArray[np.uint64]
    threshold: int

    def __post_init__(self) -> None:
        limit = _min_prime(self.params)
        (point,) = _check_points([self.point], limit, "point")
        object.__setattr__(self, "point", point)
        t = _check_int(self.threshold, "threshold")
        if t < 1:
            raise ThresholdError(f"threshold must be >= 1, got {t}")
        object.__setattr__(self, "threshold", t)
        self.params.ring.check(self.value, "value")
        if self.value.shape != (self.params.limbs, self.params.n):
            raise ThresholdError(
                f"value has shape {self.value.shape}, expected {(self.params.limbs, self.params.n)}"
            )

    def __repr__(self) -> str:  # never print the share
        return f"SecretShare(params={self.params.name!r}, point={self.point}, threshold={self.threshold})"

    def to_bytes(self) -> bytes:
        """Header + bit-packed residues (see the class Notes)."""
        header = _SHARE_HEADER.pack(
            _SHARE_MAGIC,
            _SHARE_VERSION,
            0,
            self.params.limbs,
            self.params.n,
            self.point,
            self.threshold,
            self.params.name.encode("ascii"),
        )
        return header + ser.pack_polys(self.params, [self.value[None]])

    @classmethod
    def from_bytes(cls, data: bytes, params: ParameterSet | None = None) -> SecretShare:
        """Load a share, accepting only the canonical encoding.

        Parameters
        ----------
        data : bytes
        params : ParameterSet, optional
            Expected parameter set (``None``: looked up by its id).

        Raises
        ------
        ThresholdError
            Naming the bad field: data (type, length), magic, version,
            reserved, params_id, n, limbs, point, threshold, payload length,
            or a residue >= q_l.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ThresholdError(f"data must be bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) < _SHARE_HEADER.size:
            raise ThresholdError(f"data too short for the header: {len(data)} < {_SHARE_HEADER.size} bytes")
        magic, version, reserved, limbs, n, point, threshold, pid = _SHARE_HEADER.unpack_from(data)
        if magic != _SHARE_MAGIC:
            raise ThresholdError(f"magic is {magic!r}, expected {_SHARE_MAGIC!r}")
        if version != _SHARE_VERSION:
            raise ThresholdError(f"version is {version}, expected {_SHARE_VERSION}")
        if reserved != 0:
            raise ThresholdError(f"reserved byte is {reserved}, expected 0")
        name = pid.rstrip(b"\0")
        if b"\0" in name or not name.isascii():
            raise ThresholdError("params_id is not NUL-padded ASCII")
        try:
            got = get_parameter_set(name.decode("ascii")) if params is None else params
        except ValueError as exc:
            raise ThresholdError(f"params_id: {exc}") from None
        if name.decode("ascii") != got.name:
            raise ThresholdError(f"params_id is {name.decode('ascii')!r}, expected {got.name!r}")
        if n != got.n:
            raise ThresholdError(f"n is {n}, expected {got.n} for {got.name}")
        if limbs != got.limbs:
            raise ThresholdError(f"limbs is {limbs}, expected {got.limbs} for {got.name}")
        try:
            (value,) = ser.unpack_polys(got, data, 1, ("value",))
        except ValueError as exc:
            raise ThresholdError(str(exc)) from None
        return cls(got, point, value[0], threshold)


def _eval_poly_rns(
    coeffs: NDArray[np.uint64], x: int, q_col: NDArray[np.uint64]
) -> NDArray[np.uint64]:
    """Horner: sum_k coeffs[k] x^k mod q_l; coeffs (t, L, n) reduced, 0 <= x < min q_l < 2^31."""
    acc: NDArray[np.uint64] = coeffs[-1].copy()
    xs = np.uint64(x)
    for c in coeffs[-2::-1]:
        acc *= xs  # < 2^31 * 2^31 = 2^62: no overflow
        acc += c
        acc %= q_col
    return acc


def split_secret(
    params: ParameterSet,
    secret: SecretKey,
    *,
    threshold: int,
    points: Sequence[int],
    rng: RandomStream | None = None,
) -> dict[int, SecretShare]:
    """Shamir-share an RLWE secret over R_q (Mouchet et al. 2021, §4; Lattigo ``Thresholdizer``).

    f(X) = s + a_1 X + ... + a_{t-1} X^{t-1}, with every a_k uniform in R_q,
    evaluated coefficient-wise in every RNS limb.

    Parameters
    ----------
    params : ParameterSet
    secret : SecretKey
        s_i, ternary, shape (n,).
    threshold : int
        t, 1 <= t <= len(points).
    points : sequence of int
        Distinct points in [1, min_l q_l) (:func:`member_points`).
    rng : RandomStream, optional
        Source of a_1..a_{t-1}; a fresh OS-keyed ChaCha20 stream by default.

    Returns
    -------
    dict of int to SecretShare
        {x_j: f(x_j)}, values of shape (L, n) uint64.

    Raises
    ------
    ThresholdError
        On invalid ``threshold`` or ``points``.
    ValueError
        If ``secret`` belongs to another parameter set.
    """
    if secret.params != params:
        raise ValueError(f"secret uses parameter set {secret.params.name!r}, expected {params.name!r}")
    pts = _check_points(points, min(params.primes))
    t = _check_threshold(threshold, len(pts))
    ring = params.ring
    coeffs = np.empty((t, params.limbs, params.n), dtype=np.uint64)
    coeffs[0] = ring.from_signed(secret.s)
    if t > 1:
        coeffs[1:] = uniform_mod_q(params.primes, params.n, (t - 1,), RandomStream() if rng is None else rng)
    return {x: SecretShare(params, x, _eval_poly_rns(coeffs, x, ring.q_col), t) for x in pts}


def aggregate_shares(params: ParameterSet, shares: Sequence[SecretShare]) -> SecretShare:
    """Member j's share of s = sum_i s_i: F(x_j) = sum_i f_i(x_j) (Lattigo ``AggregateShares``).

    Parameters
    ----------
    params : ParameterSet
    shares : sequence of SecretShare
        The shares f_i(x_j) this member received from every member i (its own
        included), all at its point x_j and with the same threshold.

    Returns
    -------
    SecretShare at x_j, value of shape (L, n) uint64.

    Raises
    ------
    ThresholdError
        If ``shares`` is empty or mixes points or thresholds.
    ValueError
        If a share belongs to another parameter set.
    """
    if not shares:
        raise ThresholdError("shares must not be empty")
    point, t = shares[0].point, shares[0].threshold
    for j, sh in enumerate(shares):
        if not isinstance(sh, SecretShare):
            raise ThresholdError(f"shares[{j}] is a {type(sh).__name__}, expected SecretShare")
        if sh.params != params:
            raise ValueError(f"shares[{j}] uses parameter set {sh.params.name!r}, expected {params.name!r}")
        if sh.point != point:
            raise ThresholdError(f"shares[{j}] is at point {sh.point}, expected {point} (mixed points)")
        if sh.threshold != t:
            raise ThresholdError(f"shares[{j}] has threshold {sh.threshold}, expected {t}")
    total = params.ring.sum(np.stack([sh.value for sh in shares]))
    return SecretShare(params, point, total, t)


def lagrange_at_zero(params: ParameterSet, active: Sequence[int]) -> dict[int, NDArray[np.uint64]]:
    """Lagrange coefficients at 0 for the active points, modulo every RNS prime.

    lambda_j = prod_{k in A, k != j} x_k / (x_k - x_j)  (mod q_l), so that
    sum_{j in A} lambda_j F(x_j) = F(0) for every F of degree < |A|.

    Parameters
    ----------
    params : ParameterSet
    active : sequence of int
        The active points A, distinct, in [1, min_l q_l).

    Returns
    -------
    dict of int to ndarray of shape (L,), uint64
        {x_j: (lambda_j mod q_0, ..., lambda_j mod q_{L-1})}.

    Raises
    ------
    ThresholdError
        If ``active`` is empty, has duplicates or a point outside [1, min_l q_l).
    """
    pts = _check_points(active, min(params.primes), "active")
    out: dict[int, NDArray[np.uint64]] = {}
    for xj in pts:
        lam = []
        for q in params.primes:
            num, den = 1, 1
            for xk in pts:
                if xk != xj:
                    num = num * xk % q
                    den = den * (xk - xj) % q
            lam.append(num * pow(den, -1, q) % q)
        out[xj] = np.array(lam, dtype=np.uint64)
    return out


def threshold_partial_decrypt(
    params: ParameterSet,
    share: SecretShare,
    active: Sequence[int],
    c1_sum: NDArray[np.uint64],
    *,
    num_clients: int,
    rng: RandomStream | None = None,
) -> DecryptionShare:
    """Threshold partial decryption D_j = lambda_j F(x_j) C1 + e*_j (Mouchet et al. 2021, §4).

    The t-out-of-N counterpart of :func:`~flwr_fedeval.rlwe.xmkckks.partial_decrypt`
    (Walskaar et al. 2023, Eq. 7 with s_j replaced by lambda_j F(x_j)): the
    shares of the active set sum to s C1 + sum_j e*_j, so
    :func:`~flwr_fedeval.rlwe.xmkckks.combine_and_decode` decodes them unchanged.

    Parameters
    ----------
    params : ParameterSet
    share : SecretShare
        This member's aggregated share F(x_j) (:func:`aggregate_shares`).
    active : sequence of int
        Points of the members whose shares will be combined (signed by them);
        must contain ``share.point`` and at least ``share.threshold`` points.
    c1_sum : ndarray of shape (k, L, n), uint64
        The summed C1 of the aggregate ciphertext.
    num_clients : int
        M of the noise budget; sets the smudging half-width B_smudge(M) exactly
        as :func:`~flwr_fedeval.rlwe.xmkckks.partial_decrypt` does
        (:func:`~flwr_fedeval.rlwe.params.smudging_bound`).
    rng : RandomStream, optional
        Source of the smudging noise; a fresh OS-keyed ChaCha20 stream by default.

    Returns
    -------
    DecryptionShare of shape (k, L, n)

    Raises
    ------
    ThresholdError
        If ``active`` has duplicate or invalid points, does not contain
        ``share.point``, has fewer than ``share.threshold`` points, or more
        than ``num_clients`` (each share adds B_smudge(M); B_total(M) counts M).
    ValueError
        On parameter-set or shape mismatch, or values >= q_l.

    Notes
    -----
    The product uses the NTT (:meth:`~flwr_fedeval.rlwe.ring.Ring.mul`): a
    Shamir share is uniform in R_q, not small. The caller checks the
    protocol rules (A signed by its members, one share per key set and round).
    """
    if share.params != params:
        raise ValueError(f"share uses parameter set {share.params.name!r}, expected {params.name!r}")
    pts = _check_points(active, min(params.primes), "active")
    if share.point not in pts:
        raise ThresholdError(f"active set {list(pts)} does not contain this share's point {share.point}")
    if len(pts) < share.threshold:
        raise ThresholdError(f"active set has {len(pts)} points, fewer than the threshold {share.threshold}")
    if len(pts) > num_clients:
        raise ThresholdError(
            f"active set has {len(pts)} points, more than num_clients = {num_clients}: the noise budget "
            f"B_total(M) counts at most M smudged shares"
        )
    ring = params.ring
    ring.check(c1_sum, "c1_sum")
    if c1_sum.ndim != 3:
        raise ValueError(f"c1_sum must have shape (k, L, n), got {c1_sum.shape}")
    lam = lagrange_at_zero(params, pts)[share.point]
    scaled = share.value * lam[:, None]  # < 2^62
    scaled %= ring.q_col
    d = ring.mul(c1_sum, scaled[None])
    d = ring.add(d, _smudging_noise(params, int(c1_sum.shape[0]), num_clients, rng))
    return DecryptionShare(params, d)


def _smudging_noise(
    params: ParameterSet, num_polys: int, num_clients: int, rng: RandomStream | None
) -> NDArray[np.uint64]:
    """e*_j uniform in [-B_smudge(M), B_smudge(M)), shape (k, L, n): the noise of Eq. 7."""
    bits = smudging_bound(params, num_clients).bit_length() - 1
    noise: NDArray[np.uint64] = uniform_smudging(params.primes, params.n, bits, (num_polys,), rng)
    return noise


# --------------------------------------------------------------------------- masked shares
_PDEC_MASK_DOMAIN = b"flwr-fedeval/xmkckks/pdec-mask/v1"


def share_limbs(params: ParameterSet, limbs: int, attempt: int) -> int:
    """The limbs a decryption share of attempt k is sent at: L' = ``limbs`` for k = 1, L for k >= 2.

    Attempt 1 is modulus-switched before its masks are added (the compact upload); every retry is sent
    unswitched, so that its masked shares sum to exactly s C1 + sum_j e*_j and the server's view of
    several complete attempts is simulatable (module docstring, "Why the retry is sent at the full
    level").

    Parameters
    ----------
    params : ParameterSet
        The full set (L = ``params.limbs``).
    limbs : int
        L', the limb count signed in the key-set transcript (1 <= L' <= L).
    attempt : int
        k >= 1.

    Returns
    -------
    int
        L' or L.

    Raises
    ------
    ValueError
        If ``limbs`` is not in [1, L] or ``attempt`` is not an integer >= 1.
    """
    if isinstance(limbs, bool) or not isinstance(limbs, (int, np.integer)) or not 1 <= limbs <= params.limbs:
        raise ValueError(f"limbs must be an integer in [1, {params.limbs}], got {limbs!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, (int, np.integer)) or attempt < 1:
        raise ValueError(f"attempt must be an integer >= 1, got {attempt!r}")
    return int(limbs) if attempt == 1 else params.limbs


def pdec_mask_context(transcript: bytes, round_: int, model_hash: bytes, active: Sequence[str], *,
                      attempt: int) -> bytes:
    """Context of the pairwise masks of one decryption attempt: (domain, T, round, model hash, k, sorted A).

    Fed to :func:`~flwr_fedeval.rlwe.masking.pairwise_mask_key` as its ``context``, so the keys
    K_jk of an attempt differ from the encryption masks' (another domain and length) and from every
    other attempt's (another A or another k): the masks of two attempts are independent, and the
    shares of members that a server asked for one A under different k do not cancel.

    Parameters
    ----------
    transcript : bytes
        T, the key-set transcript digest (32 bytes).
    round_ : int
        The round (>= 0).
    model_hash : bytes
        The 32-byte hash of the global model the contributor set was signed for.
    active : sequence of str
        A, the decryptors' roster names (any order; sorted here, duplicates refused).
    attempt : int
        k >= 1, the attempt index of the request (:func:`share_limbs`).

    Raises
    ------
    ThresholdError
        If ``active`` is empty or has duplicates.
    ValueError
        If ``round_`` is not an integer >= 0 or ``attempt`` not an integer >= 1.
    """
    names = sorted(str(a) for a in active)
    if not names or len(set(names)) != len(names):
        raise ThresholdError(f"the active set must be non-empty without duplicates, got {names}")
    if isinstance(attempt, bool) or not isinstance(attempt, (int, np.integer)) or attempt < 1:
        raise ValueError(f"attempt must be an integer >= 1, got {attempt!r}")
    parts = [struct.pack(">Q", len(_PDEC_MASK_DOMAIN)), _PDEC_MASK_DOMAIN,
             masking.mask_context(bytes(transcript), round_), struct.pack(">Q", len(model_hash)), bytes(model_hash),
             struct.pack(">Q", int(attempt)), struct.pack(">Q", len(names))]
    for name in names:
        raw = name.encode()
        parts += [struct.pack(">Q", len(raw)), raw]
    return b"".join(parts)


def mask_decryption_share(
    share: DecryptionShare,
    *,
    own_name: str,
    own_private: bytes,
    peers: Mapping[str, bytes],
    context: bytes,
) -> DecryptionShare:
    """D_j + sum_{k in A, k != j} sign(j, k) PRG(K_jk)  (mod q' of ``share.params``): a masked share.

    K_jk = HKDF(X25519(x_j, X_k), context) (:func:`~flwr_fedeval.rlwe.masking.pairwise_mask_key`,
    the X25519 mask keys signed in the key-set transcript), sign +1 if j's name sorts before k's,
    -1 otherwise, PRG the AES-256-CTR expansion of :mod:`~flwr_fedeval.rlwe.masking`. Added after
    the modulus switch of attempt 1 (or to the unswitched share of a retry, mod q), so the masks of the
    members of A cancel exactly in sum_{j in A} D_j mod q' (mod q) (Bonawitz et al. 2017, §4, applied to
    the decryption shares), while any strict subset of the shares -- an attempt a member of A did not
    answer -- is uniform as long as the server knows neither private key of a pair across it.

    Parameters
    ----------
    share : DecryptionShare
        D_j at the level it is sent at (``share.params``: the parameter set, or
        :func:`~flwr_fedeval.rlwe.compact.level_parameter_set`; :func:`share_limbs`), shape (k, L', n).
    own_name : str
        j's roster name.
    own_private : bytes
        j's X25519 mask private key (32 bytes).
    peers : mapping of str to bytes
        Every other member k of A -> its X25519 mask public key (as signed in T).
    context : bytes
        :func:`pdec_mask_context` of the attempt.

    Returns
    -------
    DecryptionShare of the same shape and level.

    Raises
    ------
    ~flwr_fedeval.rlwe.masking.MaskKeyError
        ``peers`` is empty or contains ``own_name``, or an agreement fails.
    """
    masked = masking.mask_plaintext(share.params, share.d, own_name=own_name, own_private=own_private,
                                    peers=peers, context=context)
    return DecryptionShare(share.params, masked)
