"""Key-additive RLWE encryption (KAHE) of a model update: one message per client and round.

Construction (Bell-Gascon et al., "Willow: Secure Aggregation with One-Shot Clients", CRYPTO 2025;
google/secure-aggregation ``shell_wrapper/kahe.cc``), on the project's ring R_Q = Z_Q[X]/(X^n + 1),
Q = q_0 ... q_{L-1} a product of NTT primes below 2^31 (:mod:`~flwr_fedeval.rlwe.ring`):

* public polynomials a_0, a_1, ... (one per block of n coefficients), uniform mod every q_i, expanded
  from a public seed (:func:`public_seed`: a domain-separated hash of the signed key-set transcript T
  and the round) by ChaCha20 keyed by the seed and the parameters' digest, one keystream per prime
  (block j at a fixed counter offset), 32-bit words rejection-sampled below q_i (:func:`public_polynomials`);
* client i: a fresh key k_i (discrete Gaussian, σ_key) per round, and for block j a fresh error e_ij
  (discrete Gaussian, σ_error) and

      c_ij = a_j k_i + e_ij + Δ x_ij   (mod Q)                                  (:func:`encrypt`)

  with x_ij the block's fixed-point values round(2^F clip(v, ±B)) followed by the exact integer slots;
* the server adds the c_ij of the contributors C per limb (:class:`KaheSum`), receives
  K_C = Σ_{i∈C} k_i (the key capsules' sum, decrypted under threshold xMK-CKKS and rounded by
  :func:`round_key_sum`) and decodes

      Y_j = Σ_i c_ij − a_j K_C = Δ Σ_i x_ij + Σ_i e_ij   (mod Q),   Σ_i x_ij = round(Y_j / Δ)

  exactly (:meth:`KaheSum.decode`), checking |Y_j − Δ Σ x_ij| ≤ error_bound on every coefficient.

MSB encoding with NTT primes. Willow uses LSB encoding (c = a k + t e + m, message read mod t) with
gcd(t, Q) = 1. Here the message sits in the high part, Δ x, with Δ ≈ Q / (2 M_max B 2^F), and the
error in the low part; Q is a product of NTT primes, so the ring's fast products apply and nothing asks
t to be coprime to Q. LSB encoding with a power-of-two Q is excluded: t | Q lets anyone reduce c mod t,
giving a k + m mod t with no error term, i.e. noiseless linear equations in k mod t. MSB decoding costs
one integer division per coefficient, encryption nothing extra.

Product a_j k. Both products of the construction have one small factor (|k| ≤ ⌈tail σ_key⌉ for the
client, |K_C| ≤ M_max ⌈tail σ_key⌉ for the server), so they use the ring's exact float64 FFT
negacyclic product (:meth:`~flwr_fedeval.rlwe.ring.Ring.mul_small_spectrum`: Percival's error bound
is checked and rounding recovers the integer convolution exactly; two limbs share one complex FFT),
with the spectrum of k computed once for all blocks and the buffers allocated once per call
(:class:`_BlockProduct`). On this machine it is several times faster than the NTT product INTT(â ⊙ k̂)
at 232 blocks × 2 limbs (about 10 ms against 50 ms for the INTT alone),
and it needs a_j in the coefficient domain: :func:`public_polynomials` samples them there (a uniform
polynomial is uniform in either domain, so sampling costs the same).

Fresh k per round. Two rounds with contributor sets C ≠ C' under the same keys would reveal
K_C − K_C' = Σ_{C∖C'} k_i, a single client's key when C ∖ C' = {i}, and with it that client's
updates of both rounds. A key is used for all blocks of one round only (multi-sample RLWE with the
distinct public a_j: as secure as RLWE with that many samples).

Why Gaussian and not ternary keys (Hint-RLWE). The server learns K_C = Σ k_i and, after decoding,
E_j = Σ e_ij exactly. For an honest client i these are *hints* k_i + (the other honest keys). Kim,
Lee, Seo and Song ("Toward Practical Lattice-Based Proof of Knowledge from Hint-MLWE", CRYPTO 2023)
show that RLWE with a Gaussian secret of width σ_1 and Q hints s + y_l with Gaussian y_l of width
σ_2 stays as hard as RLWE with width σ, 1/σ^2 = 2 (1/σ_1^2 + Q/σ_2^2) (their main theorem, the
constant as we read it: the factor 2 comes from the discrete-Gaussian convolution step; without it,
σ is the width of k_i given the hint, the heuristic figure). With at least two honest contributors
(one hint, σ_1 = σ_2 = σ_key) the width left is σ_key/√2 heuristically (3.18 at σ_key = 4.5, the HE
Standard's 3.2) and σ_key/2 = 2.25 by the proven reduction; the same holds for e with σ_error. A
ternary k has no such guarantee: with two honest ternary keys a coefficient of their sum equal to ±2
reveals both coefficients. σ_key = 4.5 and σ_error = 4.5√2 are Willow's choices (``kahe.h``:
kPrgSecretS, kPrgErrorS); both are validated to be at least :data:`KAHE_MIN_SIGMA` = 4.5.

Security of the sizes. log2 Q is checked against the HomomorphicEncryption.org 128-bit table
(:data:`~flwr_fedeval.rlwe.params.HE_STANDARD_128_TABLE`, σ = 3.2): 109 bits at n = 4096. The sets
this module picks use 50 to 60 bits at n = 4096 (M_max ≤ 100, B = 2^16, F = 21), below the same
standard's 256-bit bound at n = 4096 (58 bits) or just above it, so even the proven σ_key/2 = 2.25
(a narrower secret than the table assumes) leaves a wide margin over 128 bits.

Error of the decoded sum (worst case, stated, not probabilistic). Every error sample is tail-cut at
⌈tail σ_error⌉, so |Σ_i e_ij| ≤ error_bound = M_max ⌈tail σ_error⌉; with Δ ≥ 2 error_bound + 1 and
Δ plaintext_bound + error_bound ≤ (Q − 1)/2 the decoding of Σ x is exact. The decoded float sum
Σ_i round(2^F v_i) / 2^F differs from Σ_i clip(v_i) by at most M_max 2^-(F+1) per coordinate
(round half to even, :data:`KaheParameters.max_sum_error`); the integer slots are exact.

Wrong key sums are detected. A key sum K' ≠ K_C leaves a_j (K_C − K') in Y_j, pseudo-uniform mod Q;
the residual check |Y_j − Δ round(Y_j/Δ)| ≤ error_bound then fails on each coefficient with
probability 1 − (2 error_bound + 1)/Δ ≥ 1/2 (the validation asks Δ ≥ 2 (2 error_bound + 1): one bit
of Q more than correctness needs), so a wrong key sum passes a block of n coefficients with
probability at most 2^-n.

Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from numpy.typing import NDArray

from .params import HE_STANDARD_128_TABLE
from .ring import Ring, find_ntt_primes, get_ring, mod_signed, mod_u64, validate_primes
from .sampling import RandomStream, discrete_gaussian
from .serialization import _pack_bits, _unpack_bits

__all__ = [
    "KAHE_MIN_SIGMA",
    "KAHE_SIGMA_ERROR",
    "KAHE_SIGMA_KEY",
    "KAHE_TAIL",
    "KaheCiphertext",
    "KaheError",
    "KaheParameters",
    "KaheSum",
    "count_clipped",
    "encrypt",
    "encrypt_bytes",
    "kahe_parameters",
    "public_polynomials",
    "public_seed",
    "round_key_sum",
    "sample_key",
]

#: σ of the key k (Willow's kPrgSecretS).
KAHE_SIGMA_KEY = 4.5
#: σ of the per-block error e (Willow's kPrgErrorS = √2 · 4.5).
KAHE_SIGMA_ERROR = 4.5 * math.sqrt(2.0)
#: Tail cut in units of σ: samples satisfy |x| ≤ ⌈tail σ⌉ (mass beyond 8σ: ~1e-15 per sample).
KAHE_TAIL = 8.0
#: Smallest σ accepted for k and e: with two honest contributors, σ/√2 = 3.18 ≈ the HE Standard's 3.2
#: is left after the server learns their sum (module docstring, Hint-RLWE).
KAHE_MIN_SIGMA = 4.5
_MIN_TAIL = 6.0
_MAX_CUT = 127  # the CDT sampler returns int8

_PARAMS_MAGIC = b"FKHP"
_PARAMS_VERSION = 1
_PARAMS_HEAD = struct.Struct("<4sBBHI")  # magic, version, reserved, L, n
_PARAMS_TAIL = struct.Struct("<ddddHII")  # sigma_key, sigma_error, tail, bound, F, M_max, integer_slots

_CT_MAGIC = b"FKHE"
_CT_VERSION = 1
_CT_HEADER = struct.Struct("<4sBBHQII32s16s")  # magic, version, 0, 0, num_values, start, count, digest, seed tag
HEADER_SIZE = _CT_HEADER.size

_SEED_DOMAIN = b"flwr-fedeval/kahe/public-seed/v1"
_A_DOMAIN = b"flwr-fedeval/kahe/public-a/v2"
_TAG_DOMAIN = b"flwr-fedeval/kahe/seed-tag/v1"
SEED_BYTES = 32

# blocks per range when the server reads or decodes a reply (a few MiB of temporaries)
_CHUNK_BLOCKS = 32
# blocks per range when a client encrypts or packs
_ENCRYPT_BLOCKS = 32


class KaheError(ValueError):
    """A KAHE parameter, input, reply or decryption is invalid (the message says which and why)."""


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


@dataclass(frozen=True)
class KaheParameters:
    """A validated KAHE parameter set (bound in the signed key-set transcript by :meth:`to_bytes`).

    Parameters
    ----------
    n : int
        Ring dimension, a power of two with a row in the HE-Standard 128-bit table.
    primes : tuple of int
        Distinct NTT primes q_i = 1 (mod 2n), q_i < 2^31; Q = prod(primes).
    sigma_key, sigma_error : float
        σ of the discrete Gaussian key k and per-block error e (≥ :data:`KAHE_MIN_SIGMA`).
    tail : float
        Tail cut in units of σ (≥ 6): samples satisfy |x| ≤ ⌈tail σ⌉ ≤ 127.
    bound : float
        B: every value is clipped to [−B, B] before encoding (finite, > 0).
    fractional_bits : int
        F: values are encoded as round(2^F v) (0 ≤ F ≤ 62).
    max_contributors : int
        M_max ≥ 1: the most ciphertexts a sum may hold.
    integer_slots : int
        Trailing slots that carry exact integers (|int| ≤ B 2^F each), e.g. n_i and a clip count.

    Raises
    ------
    KaheError
        Naming the field and the violated condition (module docstring): malformed field, primes not
        NTT-friendly or not distinct, log2 Q above the HE-Standard 128-bit bound for n, σ below
        :data:`KAHE_MIN_SIGMA`, tail cut beyond the sampler's range, Δ < 2 (2 error_bound + 1)
        (no exact, checked decoding for M_max contributors).
    """

    n: int
    primes: tuple[int, ...]
    sigma_key: float
    sigma_error: float
    tail: float
    bound: float
    fractional_bits: int
    max_contributors: int
    integer_slots: int
    _digest: bytes = field(init=False, repr=False, compare=False, hash=False, default=b"")

    def __post_init__(self) -> None:
        if not _is_int(self.n) or self.n not in HE_STANDARD_128_TABLE:
            raise KaheError(f"n = {self.n!r} has no HE-Standard 128-bit row; allowed: {sorted(HE_STANDARD_128_TABLE)}")
        object.__setattr__(self, "n", int(self.n))
        try:
            primes = validate_primes(self.n, tuple(self.primes))
        except (ValueError, TypeError) as exc:
            raise KaheError(f"primes: {exc}") from None
        object.__setattr__(self, "primes", primes)
        for name in ("sigma_key", "sigma_error", "tail", "bound"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(v):
                raise KaheError(f"{name} must be a finite number, got {v!r}")
            object.__setattr__(self, name, float(v))
        for name in ("fractional_bits", "max_contributors", "integer_slots"):
            v = getattr(self, name)
            if not _is_int(v):
                raise KaheError(f"{name} must be an integer, got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.sigma_key < KAHE_MIN_SIGMA:
            raise KaheError(
                f"sigma_key = {self.sigma_key} is below {KAHE_MIN_SIGMA}: the key sum would leave an "
                "honest key narrower than Hint-RLWE needs"
            )
        if self.sigma_error < KAHE_MIN_SIGMA:
            raise KaheError(
                f"sigma_error = {self.sigma_error} is below {KAHE_MIN_SIGMA}: the error sum would leave "
                "an honest error narrower than Hint-RLWE needs"
            )
        if self.tail < _MIN_TAIL:
            raise KaheError(f"tail = {self.tail} is below {_MIN_TAIL} sigma")
        for name, sigma in (("sigma_key", self.sigma_key), ("sigma_error", self.sigma_error)):
            if math.ceil(self.tail * sigma) > _MAX_CUT:
                raise KaheError(f"tail * {name} = {self.tail * sigma} exceeds the sampler's range {_MAX_CUT}")
        if not self.bound > 0:
            raise KaheError(f"bound must be > 0, got {self.bound}")
        if not 0 <= self.fractional_bits <= 62:
            raise KaheError(f"fractional_bits must be in [0, 62], got {self.fractional_bits}")
        if self.max_contributors < 1 or self.max_contributors >= 2**32:
            raise KaheError(f"max_contributors must be in [1, 2^32), got {self.max_contributors}")
        if not 0 <= self.integer_slots < self.n:
            raise KaheError(f"integer_slots must be in [0, n), got {self.integer_slots}")
        if self.value_bound < 1 or self.value_bound >= 2**62:
            raise KaheError(
                f"bound * 2^fractional_bits = {self.bound * 2.0**self.fractional_bits} must be in [1, 2^62)"
            )
        bits = self.modulus.bit_length()
        limit = HE_STANDARD_128_TABLE[self.n]
        if bits > limit:
            raise KaheError(
                f"log2 Q = {bits} bits exceeds the HE-Standard 128-bit bound of {limit} bits for n = {self.n}"
            )
        need = 2 * (2 * self.error_bound + 1)
        if self.delta < need:
            raise KaheError(
                f"Q = 2^{math.log2(self.modulus):.2f} is too small: delta = {self.delta} < 2 (2 error_bound + 1) = "
                f"{need} for max_contributors = {self.max_contributors}, bound = {self.bound}, "
                f"fractional_bits = {self.fractional_bits} (need Q >= {_min_modulus(self)})"
            )
        object.__setattr__(self, "_digest", hashlib.sha256(self.to_bytes()).digest())

    # ------------------------------------------------------------------ derived sizes
    @property
    def modulus(self) -> int:
        """Q = prod(primes) (Python int)."""
        return math.prod(self.primes)

    @property
    def limbs(self) -> int:
        """L, the number of primes."""
        return len(self.primes)

    @property
    def value_bound(self) -> int:
        """⌈B 2^F⌉: the largest |x| of one client's coefficient (fixed-point value or integer slot)."""
        return math.ceil(self.bound * 2.0**self.fractional_bits)

    @property
    def plaintext_bound(self) -> int:
        """M_max ⌈B 2^F⌉: the largest |Σ x| of a sum's coefficient."""
        return self.max_contributors * self.value_bound

    @property
    def key_cut(self) -> int:
        """⌈tail σ_key⌉: |k| of every key coefficient."""
        return math.ceil(self.tail * self.sigma_key)

    @property
    def error_cut(self) -> int:
        """⌈tail σ_error⌉: |e| of every error coefficient."""
        return math.ceil(self.tail * self.sigma_error)

    @property
    def error_bound(self) -> int:
        """Worst-case |Σ e| of a sum's coefficient: M_max ⌈tail σ_error⌉."""
        return self.max_contributors * self.error_cut

    @property
    def delta(self) -> int:
        """Δ = ⌊((Q − 1)/2 − error_bound) / plaintext_bound⌋: the largest with Δ·plaintext_bound + error_bound
        ≤ (Q − 1)/2 (no wrap-around of a sum of M_max ciphertexts)."""
        return max(0, ((self.modulus - 1) // 2 - self.error_bound) // self.plaintext_bound)

    @property
    def bits_per_coefficient(self) -> int:
        """Σ bit_length(q_i): upload bits per encrypted coefficient (residues packed at each prime's width)."""
        return sum(p.bit_length() for p in self.primes)

    @property
    def max_sum_error(self) -> float:
        """Worst-case |decoded float sum − Σ_i clip(v_i)| per coordinate: M_max 2^-(F+1) (quantisation by round
        half to even; the decryption itself is exact; the float64 result is exact while |Σ x| < 2^53)."""
        return self.max_contributors * 2.0 ** -(self.fractional_bits + 1)

    @property
    def digest(self) -> bytes:
        """SHA-256 of :meth:`to_bytes` (32 bytes): names the set in ciphertext headers and stream keys."""
        return self._digest

    @property
    def ring(self) -> Ring:
        """The cached :class:`~flwr_fedeval.rlwe.ring.Ring` of (n, primes)."""
        return get_ring(self.n, self.primes)

    def num_blocks(self, num_values: int) -> int:
        """⌈(num_values + integer_slots) / n⌉: ring elements of one ciphertext."""
        return -(-(int(num_values) + self.integer_slots) // self.n)

    # ------------------------------------------------------------------ canonical bytes
    def to_bytes(self) -> bytes:
        """Canonical, deterministic encoding (little-endian): magic b"FKHP", version, L, n, the primes (u32
        each), σ_key, σ_error, tail, B (float64), F (u16), M_max, integer_slots (u32). Equal sets give equal
        bytes; any change of a field changes them."""
        return (
            _PARAMS_HEAD.pack(_PARAMS_MAGIC, _PARAMS_VERSION, 0, len(self.primes), self.n)
            + struct.pack(f"<{len(self.primes)}I", *self.primes)
            + _PARAMS_TAIL.pack(
                self.sigma_key,
                self.sigma_error,
                self.tail,
                self.bound,
                self.fractional_bits,
                self.max_contributors,
                self.integer_slots,
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> KaheParameters:
        """Inverse of :meth:`to_bytes` (strict: exact length, magic, version; then full validation).

        Raises
        ------
        KaheError
            Naming the bad field.
        """
        data = bytes(data)
        if len(data) < _PARAMS_HEAD.size:
            raise KaheError(f"parameter bytes too short: {len(data)}")
        magic, version, reserved, limbs, n = _PARAMS_HEAD.unpack_from(data)
        if magic != _PARAMS_MAGIC:
            raise KaheError(f"magic is {magic!r}, expected {_PARAMS_MAGIC!r}")
        if version != _PARAMS_VERSION or reserved != 0:
            raise KaheError(f"version is {version}.{reserved}, expected {_PARAMS_VERSION}.0")
        expected = _PARAMS_HEAD.size + 4 * limbs + _PARAMS_TAIL.size
        if len(data) != expected:
            raise KaheError(f"parameter bytes are {len(data)} long, expected {expected} for {limbs} primes")
        primes = struct.unpack_from(f"<{limbs}I", data, _PARAMS_HEAD.size)
        sk, se, tail, bound, f, m, s = _PARAMS_TAIL.unpack_from(data, _PARAMS_HEAD.size + 4 * limbs)
        out = cls(n, tuple(primes), sk, se, tail, bound, f, m, s)
        if out.to_bytes() != data:  # e.g. a NaN payload or -0.0 that compares but does not round-trip
            raise KaheError("parameter bytes are not canonical")
        return out


def _modulus_floor(plaintext_bound: int, error_bound: int) -> int:
    """Smallest odd Q with ((Q − 1)/2 − eb) // pb ≥ 2 (2 eb + 1)."""
    eb, pb = error_bound, plaintext_bound
    return 2 * (2 * (2 * eb + 1) * pb + eb) + 1


def _min_modulus(p: KaheParameters) -> int:
    return _modulus_floor(p.plaintext_bound, p.error_bound)


def _primes_for(n: int, total_bits: int) -> tuple[int, ...]:
    """The fewest primes (< 2^31) whose widths sum to ``total_bits``, widths as equal as possible (wider first),
    each the largest NTT primes below 2^width not taken yet."""
    limbs = -(-total_bits // 31)
    base, extra = divmod(total_bits, limbs)
    widths = [base + 1] * extra + [base] * (limbs - extra)
    out: list[int] = []
    for j, w in enumerate(widths):
        out.append(find_ntt_primes(n, w, widths[: j + 1].count(w))[-1])
    return tuple(out)


@functools.lru_cache(maxsize=128)
def kahe_parameters(
    max_contributors: int,
    *,
    bound: float = 2.0**16,
    fractional_bits: int = 21,
    integer_slots: int = 2,
    n: int = 4096,
) -> KaheParameters:
    """The KAHE set with the fewest bits of Q that validates, for ``max_contributors`` clients.

    Q must satisfy Δ = ⌊((Q − 1)/2 − eb) / pb⌋ ≥ 2 (2 eb + 1) with pb = M ⌈B 2^F⌉ and eb = M ⌈tail σ_error⌉,
    i.e. Q ≥ Q_min = 2 (2 (2 eb + 1) pb + eb) + 1: about 2 + log2(M B 2^F) + log2(2 M ⌈tail σ_error⌉ + 1)
    bits (52.3 at M = 10, 59.0 at M = 100 for B = 2^16, F = 21). The total width T starts at
    bit_length(Q_min) and grows until the product of ⌈T/31⌉ primes of (nearly) equal widths summing to T
    reaches Q_min: two primes of 27 and 26 bits at M = 10, of 30 and 29 at M = 100. σ_key, σ_error and the
    tail are the module defaults (:data:`KAHE_SIGMA_KEY`, :data:`KAHE_SIGMA_ERROR`, :data:`KAHE_TAIL`).

    Deterministic (same arguments, same primes) and cached.

    Raises
    ------
    KaheError
        If no modulus within the HE-Standard 128-bit bound for ``n`` fits, or an argument is invalid.
    """
    if not _is_int(n) or n not in HE_STANDARD_128_TABLE:
        raise KaheError(f"n = {n!r} has no HE-Standard 128-bit row")
    if not _is_int(max_contributors) or max_contributors < 1:
        raise KaheError(f"max_contributors must be an integer >= 1, got {max_contributors!r}")
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound) or bound <= 0:
        raise KaheError(f"bound must be a finite number > 0, got {bound!r}")
    if not _is_int(fractional_bits) or not 0 <= fractional_bits <= 62:
        raise KaheError(f"fractional_bits must be an integer in [0, 62], got {fractional_bits!r}")
    M = int(max_contributors)
    q_min = _modulus_floor(
        M * math.ceil(float(bound) * 2.0**fractional_bits), M * math.ceil(KAHE_TAIL * KAHE_SIGMA_ERROR)
    )
    limit = HE_STANDARD_128_TABLE[n]
    for total in range(q_min.bit_length(), limit + 1):
        primes = _primes_for(n, total)
        if math.prod(primes) >= q_min:
            return KaheParameters(
                n,
                primes,
                KAHE_SIGMA_KEY,
                KAHE_SIGMA_ERROR,
                KAHE_TAIL,
                float(bound),
                int(fractional_bits),
                int(max_contributors),
                int(integer_slots),
            )
    raise KaheError(
        f"max_contributors = {max_contributors}, bound = {bound}, fractional_bits = {fractional_bits} "
        f"need log2 Q >= {math.log2(q_min):.1f} > {limit} bits, the 128-bit bound for n = {n}"
    )


# ---------------------------------------------------------------------------------------------- a_j s
class _BlockProduct:
    """(a_j s + addend_j) mod q_i for ranges of up to ``chunk`` blocks, s small and fixed (k or −K_C).

    The ring's exact FFT product (:meth:`~flwr_fedeval.rlwe.ring.Ring.mul_small_spectrum`, equal to it
    bit for bit: both recover the exact integer convolution, Percival's bound checked once for s): two limbs
    in one complex FFT, the spectrum of s computed once, and every buffer allocated once per call of
    :func:`encrypt` or :meth:`KaheSum.decode` and reused for each range (numpy's ``out=``), so that the
    ranges allocate nothing (page faults of fresh temporaries cost more than the FFTs here). A product that
    needs the split into 16-bit pieces (s too wide for one piece: large K_C) is the ring's own.
    """

    def __init__(self, params: KaheParameters, small: NDArray[np.int64], chunk: int) -> None:
        self.ring = ring = params.ring
        s = np.asarray(small, dtype=np.int64)
        self.norm = float(np.sqrt(np.sum(s.astype(np.float64) ** 2)))
        self.spec = ring.fft_small(s)
        self.primes = params.primes
        self.one_piece = ring._pieces(self.norm, float(max(params.primes) - 1) ** 2 * params.n) == 1
        shape = (chunk, params.n)
        if self.one_piece:
            self.z = np.empty(shape, dtype=np.complex128)
            self.w = np.empty(shape, dtype=np.complex128)
            self.t = np.empty(shape, dtype=np.float64)
            self.r = np.empty(shape, dtype=np.int64)
            self.quot = np.empty(shape, dtype=np.uint64)

    def __call__(self, a: NDArray[np.uint64], addend: NDArray[np.int64] | None, out: NDArray[np.uint64]) -> None:
        """out[j, i] = (a[j, i] s + addend[j, i or 0]) mod q_i.

        a : (cnt, L, n) uint64, residues; addend : None or int64 (cnt, L or 1, n), |addend| < 2^62 − n 2^31;
        out : (cnt, L, n) uint64 (may be a view).
        """
        if not self.one_piece:
            out[...] = self.ring.mul_small_spectrum(self.spec, self.norm, a, addend=addend)
            return
        cnt, L = a.shape[0], a.shape[1]
        ring = self.ring
        for i0 in range(0, L, 2):
            z, w = self.z[:cnt], self.w[:cnt]
            z.real = a[:, i0].view(np.int64)  # residues < 2^31: int64 converts to float faster than uint64
            if i0 + 1 < L:
                z.imag = a[:, i0 + 1].view(np.int64)
            else:
                z.imag = 0.0
            z *= ring._twist
            np.fft.fft(z, axis=-1, out=w)
            w *= self.spec
            np.fft.ifft(w, axis=-1, norm="forward", out=z)  # unscaled inverse: 1/n is in the untwist
            z *= ring._untwist
            for i, part in ((i0, z.real), (i0 + 1, z.imag)):
                if i >= L:
                    break
                t, r = self.t[:cnt], self.r[:cnt]
                np.rint(part, out=t)  # the exact integer convolution (|error| < 1/4)
                np.copyto(r, t, casting="unsafe")
                if addend is not None:
                    r += addend[:, i if addend.shape[1] > 1 else 0]
                q = self.primes[i]
                u = r.view(np.uint64)
                u += np.uint64((2**63 // q) * q)  # r > -2^63 + q: now in [0, 2^64), same residue
                mod_u64(u, q, out=out[:, i], scratch=self.quot[:cnt])


# ---------------------------------------------------------------------------------------------- public a_j
def public_seed(transcript: bytes, round_: int) -> bytes:
    """The round's public seed: SHA-256(domain ‖ len(T) ‖ T ‖ round), 32 bytes.

    Parameters
    ----------
    transcript : bytes
        The signed key-set transcript T (it holds the KAHE parameters' bytes).
    round_ : int
        Server round, 0 ≤ round_ < 2^64.

    Raises
    ------
    KaheError
        If ``transcript`` is not bytes or ``round_`` is out of range.
    """
    if not isinstance(transcript, (bytes, bytearray, memoryview)):
        raise KaheError(f"transcript must be bytes, got {type(transcript).__name__}")
    if not _is_int(round_) or not 0 <= round_ < 2**64:
        raise KaheError(f"round_ must be an integer in [0, 2^64), got {round_!r}")
    t = bytes(transcript)
    return hashlib.sha256(_SEED_DOMAIN + len(t).to_bytes(8, "little") + t + int(round_).to_bytes(8, "little")).digest()


def _check_seed(seed: bytes) -> bytes:
    if not isinstance(seed, (bytes, bytearray)) or len(seed) != SEED_BYTES:
        raise KaheError(f"seed must be {SEED_BYTES} bytes")
    return bytes(seed)


def _seed_tag(params: KaheParameters, seed: bytes) -> bytes:
    return hashlib.sha256(_TAG_DOMAIN + params.digest + seed).digest()[:16]


@functools.lru_cache(maxsize=64)
def _draw_words(n: int, q: int) -> int:
    """Words drawn per (block, prime) stream: enough for n accepted residues except with probability ~2^-60."""
    p = q / 2.0 ** q.bit_length()
    sd = math.sqrt(n * (1 - p)) / p
    return 16 * math.ceil((n / p + 12 * sd + 64) / 16)


def _stream_nonce(counter: int, prime_index: int, overflow_block: int | None = None) -> bytes:
    """The 16 bytes ChaCha20 takes (RFC 7539: a 32-bit little-endian block counter, then a 96-bit nonce).

    Main stream of prime i: nonce (i as u32, 0 as u32, 0 as u32), counter at the block's first word / 16.
    Overflow stream of block j, prime i: nonce (i as u32, 1 as u32, j as u32), counter 0.
    """
    if overflow_block is None:
        return counter.to_bytes(4, "little") + prime_index.to_bytes(4, "little") + bytes(8)
    return (
        bytes(4) + prime_index.to_bytes(4, "little") + (1).to_bytes(4, "little") + overflow_block.to_bytes(4, "little")
    )


def _zeros(size: int) -> memoryview:
    """``size`` zero bytes (the plaintext whose ChaCha20 encryption is the keystream)."""
    return memoryview(bytearray(size))


def public_polynomials(params: KaheParameters, seed: bytes, start_block: int, num_blocks: int) -> NDArray[np.uint64]:
    """The public polynomials a_j of blocks [start_block, start_block + num_blocks), coefficient domain.

    Prime q_i (bit length b_i), W_i = :func:`_draw_words` (n, q_i) words per block (a multiple of 16: one
    block's words are whole ChaCha20 blocks). The words of block j are the ChaCha20 keystream under key
    SHA-256(domain ‖ params digest ‖ seed), nonce (i, 0, 0) and block counter j W_i / 16, read as
    little-endian 32-bit words w_0 … w_{W_i − 1}, each masked to b_i bits (one keystream per prime: block j
    starts at word j W_i of it). Coefficient t < n is w_t if w_t < q_i; the coefficients whose word is
    rejected take, in order of t, the accepted words among w_n … w_{W_i − 1} in order, then (probability
    about 2^-60 per block and prime) the accepted words of block j's overflow stream (nonce (i, 1, j),
    counter 0). Every coefficient is a fresh accepted word, so a_j is exactly uniform mod q_i; any range of
    blocks is expanded independently of the others (one keystream call per prime and range).

    Parameters
    ----------
    params : KaheParameters
    seed : bytes of length 32
        From :func:`public_seed` (never a server field).
    start_block, num_blocks : int
        0 ≤ start_block, 0 ≤ num_blocks, (start_block + num_blocks) W_i / 16 ≤ 2^32 (the 32-bit ChaCha20
        block counter: about 16 million blocks of n = 4096).

    Returns
    -------
    ndarray of shape (num_blocks, L, n), uint64, limb i uniform in [0, q_i)

    Raises
    ------
    KaheError
        If the seed or the range is invalid.
    """
    seed = _check_seed(seed)
    if not _is_int(start_block) or not _is_int(num_blocks) or start_block < 0 or num_blocks < 0:
        raise KaheError(f"block range [{start_block!r}, +{num_blocks!r}) is invalid")
    start_block, num_blocks = int(start_block), int(num_blocks)
    n, L = params.n, params.limbs
    for q in params.primes:
        if (start_block + num_blocks) * _draw_words(n, q) // 16 > 2**32:
            raise KaheError(
                f"block range [{start_block}, +{num_blocks}) is beyond the 2^32 ChaCha20 blocks of the public stream"
            )
    key = hashlib.sha256(_A_DOMAIN + params.digest + seed).digest()
    out = np.empty((num_blocks, L, n), dtype=np.uint64)
    if num_blocks == 0:
        return out
    for i, q in enumerate(params.primes):
        words = _draw_words(n, q)
        size = num_blocks * words * 4
        buf = bytearray(size)
        enc = Cipher(algorithms.ChaCha20(key, _stream_nonce(start_block * words // 16, i)), mode=None).encryptor()
        enc.update_into(_zeros(size), buf)
        vals = np.frombuffer(buf, dtype="<u4").reshape(num_blocks, words)
        vals &= np.uint32((1 << q.bit_length()) - 1)
        head = vals[:, :n]
        rejected = np.flatnonzero(head >= np.uint32(q))
        if rejected.size:
            rows, cols = np.divmod(rejected, n)
            rank = np.arange(rows.size) - np.searchsorted(rows, rows, side="left")  # k-th rejection of its row
            pool = vals[rows, n:]  # the candidates of each rejected word's row
            accepted = np.cumsum(pool < np.uint32(q), axis=1)
            take = accepted > rank[:, None]
            found = take[:, -1]
            head[rows[found], cols[found]] = pool[found, np.argmax(take[found], axis=1)]
            if not found.all():  # pragma: no cover - probability ~2^-60 per block and prime (tests force it)
                _overflow(key, i, q, start_block, head, rows[~found], cols[~found], accepted[~found, -1], rank[~found])
        out[:, i, :] = head
    return out


def _overflow(
    key: bytes,
    prime_index: int,
    q: int,
    start_block: int,
    head: NDArray[np.uint32],
    rows: NDArray[np.intp],
    cols: NDArray[np.intp],
    pool_accepted: NDArray[np.integer],
    rank: NDArray[np.integer],
) -> None:
    """Fill the rejected coefficients left after the pool from each block's overflow stream, in order."""
    mask = np.uint32((1 << q.bit_length()) - 1)
    for r in np.unique(rows):
        mine = rows == r
        need = (rank[mine] - pool_accepted[mine]).astype(np.int64)  # index among the overflow's accepted words
        enc = Cipher(
            algorithms.ChaCha20(key, _stream_nonce(0, prime_index, start_block + int(r))), mode=None
        ).encryptor()
        got = np.empty(0, dtype=np.uint32)
        while got.size <= int(need.max()):
            more = np.frombuffer(enc.update(bytes(4 * 64)), dtype="<u4") & mask
            got = np.concatenate([got, more[more < np.uint32(q)]])
        head[r, cols[mine]] = got[need]


# ---------------------------------------------------------------------------------------------- client
def sample_key(params: KaheParameters) -> NDArray[np.int64]:
    """A fresh key k: n discrete Gaussian coefficients, σ_key, |k| ≤ ⌈tail σ_key⌉, from a fresh ChaCha20
    stream keyed by the OS CSPRNG (:class:`~flwr_fedeval.rlwe.sampling.RandomStream`).

    Returns
    -------
    ndarray of shape (n,), int64
    """
    k: NDArray[np.int64] = discrete_gaussian((params.n,), params.sigma_key, params.key_cut, RandomStream()).astype(
        np.int64
    )
    return k


def count_clipped(params: KaheParameters, values: NDArray[np.floating]) -> int:
    """How many of ``values`` :func:`encrypt` clips (|v| > B): the caller may put it in an integer slot."""
    return int(np.count_nonzero(np.abs(np.asarray(values, dtype=np.float64)) > params.bound))


@dataclass(frozen=True, eq=False)
class KaheCiphertext:
    """One client's KAHE ciphertext of a vector: blocks c_j = a_j k + e_j + Δ x_j mod Q.

    Attributes
    ----------
    params : KaheParameters
    seed_tag : bytes of length 16
        SHA-256(domain ‖ params digest ‖ seed)[:16]: names the public seed (a reply for another round's seed
        is refused when folded).
    num_values : int
        m, the fixed-point values (the integer slots follow them).
    residues : ndarray of shape (num_blocks, L, n), uint64
        c_j per prime, reduced below q_i.
    clipped : int
        Values clipped to ±B by :func:`encrypt` (client-side only: not in :meth:`to_bytes`).

    Notes
    -----
    Bytes: a 72-byte header (little-endian: magic b"FKHE", version, 2 reserved bytes, num_values u64,
    start_block u32 (0), num_blocks u32, params digest 32 bytes, seed tag 16 bytes) then, for each prime q_i,
    the residues of all blocks, block after block, packed at bit_length(q_i) bits each (eight per
    bit_length(q_i) bytes, as :mod:`~flwr_fedeval.rlwe.serialization`). Block j of prime i sits at a fixed
    offset, so :meth:`rows` reads a range of blocks without parsing the rest.
    """

    params: KaheParameters
    seed_tag: bytes
    num_values: int
    residues: NDArray[np.uint64]
    clipped: int = 0

    @property
    def num_blocks(self) -> int:
        """Blocks of n coefficients."""
        return int(self.residues.shape[0])

    def to_bytes(self) -> bytes:
        """Header and bit-packed residues (class Notes)."""
        p = self.params
        head = _CT_HEADER.pack(
            _CT_MAGIC, _CT_VERSION, 0, 0, self.num_values, 0, self.num_blocks, p.digest, self.seed_tag
        )
        out = bytearray(HEADER_SIZE + self.payload_size(p, self.num_blocks))
        out[:HEADER_SIZE] = head
        for lo in range(0, self.num_blocks, _ENCRYPT_BLOCKS):  # a range at a time: temporaries stay in cache
            _pack_range(out, p, self.num_blocks, lo, self.residues[lo : lo + _ENCRYPT_BLOCKS])
        return bytes(out)

    @staticmethod
    def payload_size(params: KaheParameters, num_blocks: int) -> int:
        """Bytes after the header for ``num_blocks`` blocks."""
        return num_blocks * params.n * params.bits_per_coefficient // 8

    @staticmethod
    def read_header(data: bytes | bytearray | memoryview, params: KaheParameters) -> tuple[int, int, bytes]:
        """Check a reply's header and total length: returns (num_values, num_blocks, seed_tag).

        Raises
        ------
        KaheError
            Naming the field: data type or length, magic, version, params digest, block range, total length.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise KaheError(f"data must be bytes, got {type(data).__name__}")
        if len(data) < HEADER_SIZE:
            raise KaheError(f"data too short for the header: {len(data)} < {HEADER_SIZE} bytes")
        magic, version, r0, r1, m, start, count, digest, tag = _CT_HEADER.unpack_from(data)
        if magic != _CT_MAGIC:
            raise KaheError(f"magic is {magic!r}, expected {_CT_MAGIC!r}")
        if version != _CT_VERSION or r0 or r1:
            raise KaheError(f"version is {version} ({r0}, {r1}), expected {_CT_VERSION} (0, 0)")
        if digest != params.digest:
            raise KaheError("params digest does not match the key set's KAHE parameters")
        if start != 0:
            raise KaheError(f"start_block is {start}, expected 0")
        if count != params.num_blocks(m) or count < 1:
            raise KaheError(f"num_blocks is {count}, expected {params.num_blocks(m)} for num_values = {m}")
        expected = HEADER_SIZE + KaheCiphertext.payload_size(params, count)
        if len(data) != expected:
            raise KaheError(f"length is {len(data)} bytes, expected {expected}")
        return int(m), int(count), bytes(tag)

    @staticmethod
    def rows(
        data: bytes | bytearray | memoryview, params: KaheParameters, start: int, count: int
    ) -> NDArray[np.uint64]:
        """Blocks [start, start + count) of a reply, every residue checked below its prime.

        The header and length are checked first (:meth:`read_header`).

        Returns
        -------
        ndarray of shape (count, L, n), uint64

        Raises
        ------
        KaheError
            A header field, the block range, or ``limb i`` holding a value >= q_i.
        """
        _, total, _ = KaheCiphertext.read_header(data, params)
        return _rows(memoryview(data), params, total, start, count)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, params: KaheParameters) -> KaheCiphertext:
        """Parse a whole reply (client-side checks and tests; the server folds with :class:`KaheSum`).

        Raises
        ------
        KaheError
            As :meth:`rows`.
        """
        m, total, tag = cls.read_header(data, params)
        return cls(params, tag, m, _rows(memoryview(data), params, total, 0, total))


def _pack_range(out: bytearray, params: KaheParameters, total: int, start: int, rows: NDArray[np.uint64]) -> None:
    """Pack blocks [start, start + len(rows)) of a ciphertext of ``total`` blocks into ``out`` (header and
    payload, :class:`KaheCiphertext` Notes): every limb's residues at their fixed offset."""
    n, count = params.n, rows.shape[0]
    buf = np.frombuffer(out, dtype=np.uint8)
    pos = HEADER_SIZE
    for i, q in enumerate(params.primes):
        b = q.bit_length()
        lo = pos + start * n * b // 8
        dst = buf[lo : lo + count * n * b // 8].reshape(count * n // 8, b)
        _pack_bits(np.ascontiguousarray(rows[:, i, :]).reshape(-1), b, out=dst)
        pos += total * n * b // 8


def _rows(view: memoryview, params: KaheParameters, total: int, start: int, count: int) -> NDArray[np.uint64]:
    if not _is_int(start) or not _is_int(count) or not (start >= 0 and count >= 1 and start + count <= total):
        raise KaheError(f"blocks [{start}, {start}+{count}) are not within [0, {total})")
    n = params.n
    out = np.empty((count, params.limbs, n), dtype=np.uint64)
    pos = HEADER_SIZE
    for i, q in enumerate(params.primes):
        b = q.bit_length()
        lo = pos + start * n * b // 8
        vals = _unpack_bits(view[lo : lo + count * n * b // 8], b, count * n)
        if vals.max() >= q:
            raise KaheError(f"limb {i} has values >= q_{i} = {q}")
        out[:, i, :] = vals.reshape(count, n)
        pos += total * n * b // 8
    return out


@dataclass(frozen=True, eq=False)
class _Input:
    """A client's checked input: the values (float64, not yet scaled), the scale s, the integer slots, the
    blocks and the count of values with |s·v| > B."""

    values: NDArray[np.float64]
    scale: float
    integers: NDArray[np.int64]
    num_blocks: int
    clipped: int


def _check_input(params: KaheParameters, values: np.ndarray, integers: np.ndarray, scale: float) -> _Input:
    """Check the values (1-D, finite), the integer slots (|int| ≤ B 2^F) and the scale (finite, > 0); count
    the values that :func:`_encode_range` clips. No copy of the values unless they are not float64 or some
    are clipped (the count then needs s·v)."""
    v = np.asarray(values)
    if v.ndim != 1 or not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
        raise KaheError(f"values must be a 1-D float array, got shape {v.shape} dtype {v.dtype}")
    ints = np.asarray(integers)
    if ints.shape != (params.integer_slots,) or not (np.issubdtype(ints.dtype, np.integer) or ints.size == 0):
        raise KaheError(
            f"integers must be an integer array of shape ({params.integer_slots},), got {ints.shape} {ints.dtype}"
        )
    ints = ints.astype(np.int64)
    if ints.size and int(np.abs(ints).max()) > params.value_bound:
        raise KaheError(
            f"an integer slot exceeds B 2^F = {params.value_bound} in magnitude: clip or refuse it before encrypting"
        )
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise KaheError(f"scale must be a number, got {type(scale).__name__}")
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise KaheError(f"scale must be finite and > 0, got {scale!r}")
    m = v.shape[0]
    v = v.astype(np.float64, copy=False)
    low, high = (float(v.min()), float(v.max())) if m else (0.0, 0.0)
    if not (math.isfinite(low) and math.isfinite(high)):  # min and max are NaN if any value is
        raise KaheError("values must be finite (NaN or infinity found)")
    # rounding is monotone: every s·v is within ±B iff s·min and s·max are
    if -params.bound <= scale * low and scale * high <= params.bound:
        clipped = 0
    else:
        clipped = int(np.count_nonzero(np.abs(v * scale) > params.bound))
    return _Input(v, scale, ints, params.num_blocks(m), clipped)


def _encode_range(
    params: KaheParameters, inp: _Input, lo: int, out: NDArray[np.int64], work: NDArray[np.float64]
) -> None:
    """x of blocks [lo, lo + len(out)): round(2^F clip(s·v, ±B)) (round half to even), then the integer
    slots, then zeros. ``out`` (cnt, n) int64 and ``work`` (>= cnt·n,) float64 are overwritten.

    s·v·2^F is computed as v·(s 2^F): multiplying by a power of two is exact, so this is round(s·v)·2^F,
    and clipping at ±B 2^F is clipping s·v at ±B, scaled.
    """
    n = params.n
    flat = out.reshape(-1)
    first = lo * n
    m, s = inp.values.shape[0], params.integer_slots
    stop = min(m, first + flat.size)
    if first < stop:
        w = work[: stop - first]
        np.multiply(inp.values[first:stop], inp.scale * 2.0**params.fractional_bits, out=w)
        if inp.clipped:
            bound = params.bound * 2.0**params.fractional_bits  # exact: B times a power of two
            np.clip(w, -bound, bound, out=w)
        np.rint(w, out=w)
        flat[: stop - first] = w
    tail = max(first, m)  # the integer slots and the padding that fall in this range
    if tail < first + flat.size:
        flat[tail - first :] = 0
        a, b = max(tail, m), min(first + flat.size, m + s)
        if a < b:
            flat[a - first : b - first] = inp.integers[a - m : b - m]


def encrypt(
    params: KaheParameters,
    seed: bytes,
    key: NDArray[np.int64],
    values: NDArray[np.floating],
    integers: NDArray[np.integer],
) -> KaheCiphertext:
    """Encrypt one client's vector: c_j = a_j k + e_j + Δ x_j mod Q for every block j.

    x is the m values clipped to [−B, B] (never refused: the count is returned as ``clipped``) and quantised
    to round(2^F v) with round half to even, then the ``integer_slots`` integers exactly, zero-padded to
    ⌈(m + integer_slots)/n⌉ blocks. e_j is fresh discrete Gaussian (σ_error, tail-cut) per block from a fresh
    CSPRNG stream; a_j from :func:`public_polynomials`; a_j k by the ring's exact FFT product with the
    spectrum of k computed once (module docstring).

    Parameters
    ----------
    params : KaheParameters
    seed : bytes of length 32
        The round's public seed (:func:`public_seed`).
    key : ndarray of shape (n,), int64
        This round's key from :func:`sample_key` (|k| ≤ ⌈tail σ_key⌉; a fresh key every round).
    values : ndarray of shape (m,), float64
        Finite values (float32 is converted).
    integers : ndarray of shape (integer_slots,), int64
        Exact integers, |int| ≤ B 2^F each.

    Returns
    -------
    KaheCiphertext

    Raises
    ------
    KaheError
        Bad shapes or dtypes, a non-finite value, a key out of range, or an integer with |int| > B 2^F:
        the integers are the client's own data (e.g. n_i), so the caller decides whether to clip or refuse;
        a silent wrap-around would corrupt the sum.
    """
    seed = _check_seed(seed)
    inp = _encrypt_input(params, key, values, integers, 1.0)
    c = np.empty((inp.num_blocks, params.limbs, params.n), dtype=np.uint64)
    for lo, rows in _encrypt_ranges(params, seed, key, inp):
        c[lo : lo + rows.shape[0]] = rows
    return KaheCiphertext(params, _seed_tag(params, seed), int(inp.values.shape[0]), c, inp.clipped)


def encrypt_bytes(
    params: KaheParameters,
    seed: bytes,
    key: NDArray[np.int64],
    values: NDArray[np.floating],
    integers: NDArray[np.integer],
    *,
    scale: float = 1.0,
) -> memoryview:
    """``encrypt(params, seed, key, scale * values, integers).to_bytes()``, byte for byte, packed range by
    range.

    Each range of blocks is quantised, encrypted and packed in turn (one range of residues and of x in
    memory instead of the whole ciphertext's and vector's): what a client sends. ``scale`` (finite, > 0)
    multiplies the values before the clip (a client's n_i: clip(n_i·Δw, ±B)) without a scaled copy of them.

    Parameters and errors as :func:`encrypt`, and ``scale`` (a :class:`KaheError` if not finite and > 0).

    Returns
    -------
    memoryview
        A read-only view of the reply (:class:`KaheCiphertext` Notes: header, then every prime's packed
        residues), over the one buffer it was packed into (no copy into a ``bytes``).
    """
    seed = _check_seed(seed)
    inp = _encrypt_input(params, key, values, integers, scale)
    nb = inp.num_blocks
    out = bytearray(HEADER_SIZE + KaheCiphertext.payload_size(params, nb))
    out[:HEADER_SIZE] = _CT_HEADER.pack(
        _CT_MAGIC, _CT_VERSION, 0, 0, inp.values.shape[0], 0, nb, params.digest, _seed_tag(params, seed)
    )
    for lo, rows in _encrypt_ranges(params, seed, key, inp):
        _pack_range(out, params, nb, lo, rows)
    return memoryview(out).toreadonly()


def _encrypt_input(
    params: KaheParameters,
    key: NDArray[np.int64],
    values: NDArray[np.floating],
    integers: NDArray[np.integer],
    scale: float,
) -> _Input:
    """The checks of :func:`encrypt` (key, values, integers, scale)."""
    k = np.asarray(key)
    if k.shape != (params.n,) or not np.issubdtype(k.dtype, np.integer):
        raise KaheError(f"key must be an integer array of shape ({params.n},)")
    if int(np.abs(k.astype(np.int64)).max()) > params.key_cut:
        raise KaheError(f"key has a coefficient beyond the tail cut {params.key_cut}: not from sample_key")
    return _check_input(params, values, integers, scale)


def _encrypt_ranges(
    params: KaheParameters, seed: bytes, key: NDArray[np.int64], inp: _Input
) -> Iterator[tuple[int, NDArray[np.uint64]]]:
    """(lo, c_j for the blocks j of [lo, lo + cnt)) range by range, c_j = a_j k + e_j + Δ x_j mod q_i, x_j
    quantised range by range (:func:`_encode_range`).

    The rows yielded (cnt, L, n) uint64 are one buffer, reused for the next range: the consumer copies or
    packs them before asking for the next. Every buffer is allocated once per call.
    """
    seed = _check_seed(seed)
    nb, n = inp.num_blocks, params.n
    chunk = min(_ENCRYPT_BLOCKS, nb)
    product = _BlockProduct(params, np.asarray(key).astype(np.int64), chunk)
    rng = RandomStream()
    c = np.empty((chunk, params.limbs, n), dtype=np.uint64)
    x = np.empty((chunk, n), dtype=np.int64)
    work = np.empty(chunk * n, dtype=np.float64)
    for lo in range(0, nb, _ENCRYPT_BLOCKS):  # a range of blocks at a time: temporaries stay in cache
        cnt = min(_ENCRYPT_BLOCKS, nb - lo)
        xs = x[:cnt]
        _encode_range(params, inp, lo, xs, work)
        e = discrete_gaussian((cnt, n), params.sigma_error, params.error_cut, rng)
        # addend t = e + Δ x, reduced by the product's final reduction: c = a k + t mod q_i
        if params.modulus < 2**61:
            xs *= params.delta  # |Δ x| ≤ Δ B 2^F < Q/2 < 2^60: exact
            xs += e
            addend = xs[:, None, :]
        else:
            addend = np.empty((cnt, params.limbs, n), dtype=np.int64)
            for i, q in enumerate(params.primes):
                r = addend[:, i, :]
                mod_signed(xs, q, out=r.view(np.uint64))
                r *= params.delta % q  # < 2^62
                r %= q
                r += e
        product(public_polynomials(params, seed, lo, cnt), addend, c[:cnt])
        yield lo, c[:cnt]


# ---------------------------------------------------------------------------------------------- server
def round_key_sum(approx: NDArray[np.floating]) -> NDArray[np.int64]:
    """Round the CKKS-decrypted key sum K_C to integers, refusing an uncertain rounding.

    Parameters
    ----------
    approx : ndarray of shape (n,), float64
        The decrypted Σ k_i, each coefficient within the capsule's decryption error of an integer.

    Returns
    -------
    ndarray of shape (n,), int64

    Raises
    ------
    KaheError
        If a coefficient is not finite, beyond 2^52, or more than 1/4 from the nearest integer: a wrong
        rounding would decode to a wrong model (the decoding check would then refuse it too, later).
    """
    a = np.asarray(approx, dtype=np.float64)
    if a.ndim != 1:
        raise KaheError(f"approx must be 1-D, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or (a.size and float(np.abs(a).max()) >= 2.0**52):
        raise KaheError("key sum has a non-finite or huge coefficient")
    r = np.rint(a)
    off = np.abs(a - r)
    if a.size and float(off.max()) > 0.25:
        j = int(off.argmax())
        raise KaheError(
            f"key sum coefficient {j} = {a[j]!r} is {off[j]:.3f} from an integer (> 1/4): the capsule "
            "decryption is not accurate enough to round"
        )
    out: NDArray[np.int64] = r.astype(np.int64)
    return out


class KaheSum:
    """The server's running sum Σ_i c_i mod Q of KAHE replies, folded range by range, and its decoding.

    Parameters
    ----------
    params : KaheParameters
    seed : bytes of length 32
        The round's public seed (:func:`public_seed`).
    num_values : int
        m, the values every reply carries (replies with another m are refused).
    chunk_blocks : int, default 32
        Blocks read (and decoded) per range: the memory besides the sum is a few such ranges.

    Notes
    -----
    The sum is held per limb as uint32 (every q_i < 2^31, so s + c < 2^32): shape (L, num_blocks, n),
    4 bytes per prime and coefficient, whatever the number of replies. A successful :meth:`decode` releases
    it (the server decodes a round's sum once; its memory is free before the model is rebuilt): a later
    :meth:`add` or :meth:`decode` raises.
    """

    def __init__(
        self, params: KaheParameters, seed: bytes, num_values: int, *, chunk_blocks: int = _CHUNK_BLOCKS
    ) -> None:
        if not _is_int(num_values) or num_values < 0:
            raise KaheError(f"num_values must be an integer >= 0, got {num_values!r}")
        if not _is_int(chunk_blocks) or chunk_blocks < 1:
            raise KaheError(f"chunk_blocks must be an integer >= 1, got {chunk_blocks!r}")
        self.params = params
        self.seed = _check_seed(seed)
        self.num_values = int(num_values)
        self.num_blocks = params.num_blocks(num_values)
        self.chunk_blocks = int(chunk_blocks)
        self._tag = _seed_tag(params, self.seed)
        self._sum: NDArray[np.uint32] | None = np.zeros((params.limbs, self.num_blocks, params.n), dtype=np.uint32)
        self._q32 = [np.uint32(q) for q in params.primes]
        self.count = 0

    def _live(self) -> NDArray[np.uint32]:
        if self._sum is None:
            raise KaheError("this sum was decoded already: its residues are released")
        return self._sum

    @property
    def residues(self) -> NDArray[np.uint32]:
        """A copy of the running sum, shape (L, num_blocks, n), uint32.

        Raises
        ------
        KaheError
            After a successful :meth:`decode` (the sum is released).
        """
        return self._live().copy()

    def _ranges(self) -> Iterator[tuple[int, int]]:
        for lo in range(0, self.num_blocks, self.chunk_blocks):
            yield lo, min(self.chunk_blocks, self.num_blocks - lo)

    def _limbs(self, view: memoryview, total: int, lo: int, cnt: int) -> list[NDArray[np.uint32]]:
        """Blocks [lo, lo + cnt) of a reply, one (cnt·n,) uint32 array per limb, each checked below q_i."""
        p, n = self.params, self.params.n
        out, pos = [], HEADER_SIZE
        for i, q in enumerate(p.primes):
            b = q.bit_length()
            start = pos + lo * n * b // 8
            vals = _unpack_bits(view[start : start + cnt * n * b // 8], b, cnt * n, np.uint32)
            if int(vals.max()) >= q:
                raise KaheError(f"limb {i} has values >= q_{i} = {q}")
            out.append(vals)
            pos += total * n * b // 8
        return out

    def _apply(self, limbs: list[NDArray[np.uint32]], lo: int, sign: int) -> None:
        total = self._live()
        for i, (q, v) in enumerate(zip(self._q32, limbs)):
            s = total[i, lo : lo + v.size // self.params.n].reshape(-1)
            if sign > 0:
                s += v  # < 2q < 2^32
                np.minimum(s, s - q, out=s)  # s - q wraps around when s < q
            else:
                s -= v  # wraps around when s < v
                np.minimum(s, s + q, out=s)  # s + q wraps back into [0, q) exactly then

    def add(self, data: bytes | bytearray | memoryview) -> None:
        """Fold one reply into the sum, range by range.

        The header (magic, version, params digest, seed tag, num_values, block range) and the total length
        are checked before anything is added; each range's residues are checked (< q_i) before it is added.
        If a later range is malformed, the ranges already added are subtracted again: a refused reply leaves
        the sum and :attr:`count` unchanged.

        Raises
        ------
        KaheError
            Naming the bad field; or the sum was decoded already.
        """
        self._live()
        m, total, tag = KaheCiphertext.read_header(data, self.params)
        if tag != self._tag:
            raise KaheError("seed tag does not match this round's public seed (a reply of another round?)")
        if m != self.num_values:
            raise KaheError(f"num_values is {m}, expected {self.num_values}")
        view = memoryview(data)
        done: list[tuple[int, int]] = []
        try:
            for lo, cnt in self._ranges():
                self._apply(self._limbs(view, total, lo, cnt), lo, +1)
                done.append((lo, cnt))
        except KaheError:
            for lo, cnt in done:
                self._apply(self._limbs(view, total, lo, cnt), lo, -1)
            raise
        self.count += 1

    def decode(self, key_sum: NDArray[np.integer]) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """Decode the sum with the contributors' key sum K = Σ k_i.

        Y_j = Σ c_j − a_j K mod Q, centred; Σ x_j = round(Y_j / Δ), with the check |Y_j − Δ Σ x_j| ≤
        error_bound on every coefficient; range by range (a_j expanded per range).

        Parameters
        ----------
        key_sum : ndarray of shape (n,), integer
            K from :func:`round_key_sum`.

        Returns
        -------
        (sums, integers)
            sums : ndarray of shape (num_values,), float64: Σ_i round(2^F clip(v_i)) / 2^F, within
            :attr:`KaheParameters.max_sum_error` of Σ_i clip(v_i); integers : ndarray of shape
            (integer_slots,), int64: the exact sums of the integer slots.

        Raises
        ------
        KaheError
            No ciphertext folded, more than M_max, a key sum out of range (|K| > count ⌈tail σ_key⌉), or
            "the decryption is not exact" (a wrong key sum, or a reply encrypted under another seed or key),
            or the sum was decoded already. A refused decoding keeps the sum; a successful one releases it.
        """
        p = self.params
        total = self._live()
        if self.count < 1:
            raise KaheError("no ciphertext folded: nothing to decode")
        if self.count > p.max_contributors:
            raise KaheError(
                f"{self.count} ciphertexts folded, more than max_contributors = {p.max_contributors}: "
                "the decoding would not be exact"
            )
        K = np.asarray(key_sum)
        if K.shape != (p.n,) or not np.issubdtype(K.dtype, np.integer):
            raise KaheError(f"key_sum must be an integer array of shape ({p.n},)")
        K = K.astype(np.int64)
        if int(np.abs(K).max()) > self.count * p.key_cut:
            raise KaheError(
                f"key_sum has a coefficient beyond {self.count} x {p.key_cut}: not a sum of {self.count} keys"
            )
        ring = p.ring
        product = _BlockProduct(p, -K, min(self.chunk_blocks, self.num_blocks))
        y = np.empty((min(self.chunk_blocks, self.num_blocks), p.limbs, p.n), dtype=np.uint64)
        m, s = self.num_values, p.integer_slots
        sums = np.empty(m, dtype=np.float64)
        ints = np.empty(s, dtype=np.int64)
        delta, eb, Q = p.delta, p.error_bound, p.modulus
        fast = Q < 2**62
        scale = 2.0**-p.fractional_bits
        for lo, cnt in self._ranges():
            a = public_polynomials(p, self.seed, lo, cnt)
            acc = total[:, lo : lo + cnt].transpose(1, 0, 2).astype(np.int64)  # (cnt, L, n)
            product(a, acc, y[:cnt])  # S - a K mod q_i
            if fast:
                x = _decode_fast(ring, y[:cnt], Q, delta, eb)
            else:
                x = _decode_slow(ring, y[:cnt], Q, delta, eb)
            flat = x.reshape(-1)
            first, last = lo * p.n, lo * p.n + flat.size
            if first < m:
                hi = min(m, last)
                sums[first:hi] = flat[: hi - first] * scale
            if last > m and s:
                a0, b0 = max(first, m), min(last, m + s)
                if a0 < b0:
                    ints[a0 - m : b0 - m] = flat[a0 - first : b0 - first]
        del total
        self._sum = None  # decoded: released before the caller rebuilds the model
        return sums, ints


def _not_exact() -> KaheError:
    return KaheError(
        "the decryption is not exact: a coefficient is farther than error_bound from a multiple of "
        "delta (wrong key sum, or a reply under another seed or key)"
    )


def _decode_fast(ring: Ring, y: NDArray[np.uint64], Q: int, delta: int, eb: int) -> NDArray[np.int64]:
    """Centred CRT (Garner, Q < 2^62: exact in int64), then Σx = round(Y/Δ) with the residual check."""
    digits = ring._garner(y)  # mixed-radix digits d_i in [0, q_i)
    Y = digits[-1].copy()
    for i in range(len(digits) - 2, -1, -1):
        Y *= ring.primes[i]
        Y += digits[i]
    np.subtract(Y, Q, out=Y, where=Y > (Q - 1) // 2)  # centred
    x = Y + delta // 2
    x //= delta  # floor division: round to nearest
    r = x * delta
    np.subtract(Y, r, out=r)
    if int(r.max()) > eb or int(r.min()) < -eb:
        raise _not_exact()
    out: NDArray[np.int64] = x
    return out


def _decode_slow(ring: Ring, y: NDArray[np.uint64], Q: int, delta: int, eb: int) -> NDArray[np.int64]:
    """As :func:`_decode_fast` for Q ≥ 2^62, with Python integers."""
    Y = ring.to_int(y)  # centred, object array
    x = (Y + delta // 2) // delta
    r = Y - x * delta
    if max(abs(int(v)) for v in r.reshape(-1)) > eb:
        raise _not_exact()
    return x.astype(np.int64)
