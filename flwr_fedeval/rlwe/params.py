"""Parameter sets for xMK-CKKS aggregation and their security/noise validator.

A :class:`ParameterSet` fixes the ring (n, RNS primes), the error distribution
and the statistical smudging parameter. Construction validates it against the
HomomorphicEncryption.org standard (128-bit classical security, ternary
secret, sigma ~ 3.2): log2 q <= 109, 218, 438, 881 for n = 2^12 .. 2^15.

Noise budget (worst case, infinity norm)
----------------------------------------
With M clients, ternary s_i and v_i, fresh errors |e| <= B_e (the discrete
Gaussian is tail-cut at B_e = floor(6 sigma) = 19), aggregate decryption
(Walskaar et al. 2023, Eq. 5 / Eq. 11) returns

    C0 + sum_j D_j = sum_i m_i + (sum_i v_i)(sum_j e_j) + sum_i e0_i
                     + (sum_j s_j)(sum_i e1_i) + sum_j e*_j      (mod q).

A product of two polynomials has ||f g||_inf <= n ||f||_inf ||g||_inf, so the
*fresh decryption noise* (everything but the plaintext and the smudging) is

    B_fresh(M) = 2 n M^2 B_e + M B_e                     (fresh_noise_bound)

Each partial decryption D_j = s_j C1 + e*_j (Eq. 7) adds smudging noise e*_j
uniform in [-B_smudge, B_smudge) with

    B_smudge(M) = 2^(lambda + ceil(log2 W) + ceil(log2 B_fresh(M))) >= W 2^lambda B_fresh(M)

(lambda = ``smudging_bits`` = 40). One smudged decryption is within
statistical distance B_fresh / B_smudge of one without the secret-dependent
terms; W completed decryptions of the same sum, each with fresh smudging,
are within W B_fresh / B_smudge <= 2^-lambda (hybrid argument). W =
:func:`max_decryptions` (:data:`MAX_DECRYPTION_ATTEMPTS`): a decryptor gives
a share for at most a <= MAX_DECRYPTION_ATTEMPTS active sets A per key set
and round (:mod:`~flwr_fedeval.rlwe.threshold`), every A has more than N/2
members, so a server completes at most floor((a N - 1) / (N / 2)) <= 2a - 1
decryptions of one sum; W = 3 for a = 2, i.e. 2 bits more than one
decryption would need. Total noise:

    B_total(M) = B_fresh(M) + M B_smudge(M).

Decryption is correct (no wrap-around) iff every coefficient of the M-fold
plaintext sum plus the noise stays below q/2:

    M * round(max|x| * Delta) + B_total(M) <= (q - 1) / 2,     Delta = 2^scale_bits

and the decoded sum then differs from sum_i round(x_i Delta)/Delta by at most
B_total(M)/Delta (and from the exact float sum by (B_total(M) + M/2)/Delta).
:func:`check_noise_budget` enforces the inequality; :func:`max_scale_bits`
picks the largest Delta that satisfies it.

References
----------
M. Albrecht et al., "Homomorphic Encryption Security Standard",
HomomorphicEncryption.org, 2018, Table 1 (ternary secret, 128-bit classical).
J. Ma et al., "Privacy-preserving federated learning based on multi-key
homomorphic encryption", Int. J. Intell. Syst. 2022 (xMK-CKKS).
I. Walskaar, M. C. Tran, F. Catak, "A Practical Implementation of Medical
Privacy-Preserving Federated Learning Using Multi-Key Homomorphic Encryption
and Flower Framework", Cryptography 7(4) 48, 2023, Eqs. 1-11.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .ring import Ring, find_ntt_primes, get_ring, validate_primes

__all__ = [
    "HE_STANDARD_128_MAX_LOG2Q",
    "HE_STANDARD_128_TABLE",
    "ParameterSet",
    "NoiseBudget",
    "NoiseBudgetError",
    "PARAMETER_SETS",
    "DEFAULT_PARAMETER_SET",
    "get_parameter_set",
    "validate_security",
    "fresh_noise_bound",
    "MAX_DECRYPTION_ATTEMPTS",
    "max_decryptions",
    "smudging_bound",
    "total_noise_bound",
    "max_plaintext_int",
    "check_noise_budget",
    "max_scale_bits",
]

#: Max log2 q for 128-bit classical security, ternary secret (HE Standard, Table 1), every ring
#: dimension of the table. The one copy of the table: :mod:`flwr_fedeval.fhe.backend` uses it too.
HE_STANDARD_128_TABLE: dict[int, int] = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}

#: The rows xMK-CKKS parameter sets may use (n >= 2^12: smaller rings leave no room for the noise budget).
HE_STANDARD_128_MAX_LOG2Q: dict[int, int] = {n: b for n, b in HE_STANDARD_128_TABLE.items() if n >= 4096}

#: Standard deviation of the discrete Gaussian assumed by the HE Standard tables.
SIGMA = 3.2


class NoiseBudgetError(ValueError):
    """A parameter choice whose worst-case decryption noise could reach q/2."""


@dataclass(frozen=True)
class ParameterSet:
    """A named, validated xMK-CKKS parameter set.

    Parameters
    ----------
    name : str
        Identifier written into every serialized object (ASCII, <= 32 bytes).
    n : int
        Ring degree, one of 4096, 8192, 16384, 32768.
    primes : tuple of int
        RNS primes q_i < 2^31 with q_i = 1 (mod 2n); q = prod(primes).
    sigma : float, default 3.2
        Standard deviation of the discrete Gaussian errors (>= 3.2).
    tail_cut : int, default 19
        Errors are sampled with |e| <= tail_cut (floor(6 sigma)); the noise
        bounds use this value.
    smudging_bits : int, default 40
        lambda of the smudging noise: B_smudge >= 2^lambda * B_fresh (>= 40).

    Raises
    ------
    ValueError
        If any field is invalid or log2 q exceeds the HE-Standard 128-bit
        bound for n; the message names the field.
    """

    name: str
    n: int
    primes: tuple[int, ...]
    sigma: float = SIGMA
    tail_cut: int = 19
    smudging_bits: int = 40

    def __post_init__(self) -> None:
        object.__setattr__(self, "primes", tuple(int(p) for p in self.primes))
        validate_security(self)

    @property
    def ring(self) -> Ring:
        """The :class:`~flwr_fedeval.rlwe.ring.Ring` (cached)."""
        return get_ring(self.n, self.primes)

    @property
    def q(self) -> int:
        """The modulus q = prod(primes) (Python int)."""
        return math.prod(self.primes)

    @property
    def limbs(self) -> int:
        """Number of RNS primes L."""
        return len(self.primes)

    @property
    def log2_q(self) -> float:
        """log2 q."""
        return math.log2(self.q)

    @property
    def security_bound_log2_q(self) -> int:
        """HE-Standard max log2 q for this n (128-bit classical, ternary secret)."""
        return HE_STANDARD_128_MAX_LOG2Q[self.n]


def validate_security(params: ParameterSet) -> None:
    """Refuse parameter sets below 128-bit security or otherwise malformed.

    Raises
    ------
    ValueError
        Message naming the offending field: ``name``, ``n``, ``primes``,
        ``sigma``, ``tail_cut``, ``smudging_bits`` or ``log2 q``.
    """
    if not isinstance(params.name, str) or not params.name or len(params.name.encode()) > 32:
        raise ValueError("name must be a non-empty string of at most 32 bytes")
    if not params.name.isascii():
        raise ValueError("name must be ASCII")
    if params.n not in HE_STANDARD_128_MAX_LOG2Q:
        raise ValueError(
            f"n = {params.n} has no 128-bit HE-Standard bound; "
            f"allowed: {sorted(HE_STANDARD_128_MAX_LOG2Q)}"
        )
    bits = params.q.bit_length() if params.primes else 0
    bound = HE_STANDARD_128_MAX_LOG2Q[params.n]
    if bits > bound:
        raise ValueError(
            f"log2 q = {bits} bits exceeds the HE-Standard 128-bit bound of "
            f"{bound} bits for n = {params.n}"
        )
    if params.sigma < SIGMA:
        raise ValueError(f"sigma = {params.sigma} is below {SIGMA}")
    if params.tail_cut < 6 * params.sigma - 1:
        raise ValueError(f"tail_cut = {params.tail_cut} is below ~6 sigma")
    if params.smudging_bits < 40:
        raise ValueError(f"smudging_bits = {params.smudging_bits} is below 40")
    validate_primes(params.n, params.primes)


def fresh_noise_bound(params: ParameterSet, num_clients: int) -> int:
    """Worst-case fresh decryption noise B_fresh(M) = 2 n M^2 B_e + M B_e.

    Bound on ||(sum v)(sum e) + sum e0 + (sum s)(sum e1)||_inf in Eq. 5.

    Raises
    ------
    ValueError
        If ``num_clients < 1``.
    """
    M = _check_clients(num_clients)
    B = params.tail_cut
    return 2 * params.n * M * M * B + M * B


#: The most active sets A a decryptor gives a share for per key set and round (the signed ``a`` of the
#: key-set transcript is at most this; :mod:`flwr_fedeval.rlwe.threshold`). The smudging noise is sized
#: for it, whatever a the key set signs.
MAX_DECRYPTION_ATTEMPTS = 2


def max_decryptions(attempts: int = MAX_DECRYPTION_ATTEMPTS) -> int:
    """W = 2a - 1: the most completed decryptions of one sum when every decryptor answers at most
    ``attempts`` active sets A and every A has more than N/2 members (sum over the W sets of |A| <= a N).

    Raises
    ------
    ValueError
        If ``attempts`` is not an integer >= 1.
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts must be an integer >= 1, got {attempts!r}")
    return 2 * attempts - 1


def smudging_bound(params: ParameterSet, num_clients: int) -> int:
    """Half-width B_smudge(M) = 2^(lambda + ceil(log2 W) + ceil(log2 B_fresh(M))) of the smudging noise.

    W = :func:`max_decryptions` () = 3: up to W decryptions of one sum stay within 2^-lambda
    statistical distance together (module docstring).
    """
    fresh = fresh_noise_bound(params, num_clients)
    extra = (max_decryptions() - 1).bit_length()  # ceil(log2 W)
    return 1 << (params.smudging_bits + extra + (fresh - 1).bit_length())


def total_noise_bound(params: ParameterSet, num_clients: int) -> int:
    """B_total(M) = B_fresh(M) + M * B_smudge(M): worst-case noise after Eq. 11."""
    M = _check_clients(num_clients)
    return fresh_noise_bound(params, M) + M * smudging_bound(params, M)


def max_plaintext_int(params: ParameterSet, num_clients: int) -> int:
    """Largest |coefficient| one client may encrypt: (floor((q-1)/2) - B_total) // M.

    Raises
    ------
    NoiseBudgetError
        If the noise alone exhausts q/2 for this many clients.
    """
    M = _check_clients(num_clients)
    room = (params.q - 1) // 2 - total_noise_bound(params, M)
    if room < M:
        raise NoiseBudgetError(
            f"{params.name}: worst-case noise for num_clients = {M} exceeds q/2"
        )
    return room // M


@dataclass(frozen=True)
class NoiseBudget:
    """Result of :func:`check_noise_budget` (all integers exact).

    Attributes
    ----------
    num_clients, scale_bits : int
    max_abs_value : float
    fresh_noise, smudging, total_noise : int
        B_fresh(M), B_smudge(M), B_total(M).
    max_plaintext_int : int
        Per-client coefficient limit.
    headroom_bits : float
        log2((q/2) / (M * round(max|x| Delta) + B_total)); > 0 means no wrap.
    error_bound : float
        Worst-case |decoded sum - sum_i x_i| = (B_total + M/2) / Delta.
    """

    num_clients: int
    scale_bits: int
    max_abs_value: float
    fresh_noise: int
    smudging: int
    total_noise: int
    max_plaintext_int: int
    headroom_bits: float
    error_bound: float


def check_noise_budget(
    params: ParameterSet, *, num_clients: int, scale_bits: int, max_abs_value: float
) -> NoiseBudget:
    """Validate M * round(max|x| 2^scale_bits) + B_total(M) <= (q-1)/2.

    Parameters
    ----------
    params : ParameterSet
    num_clients : int
        M, the number of ciphertexts summed (>= 1).
    scale_bits : int
        log2 of the fixed-point scale Delta (>= 0).
    max_abs_value : float
        Largest |value| any client encodes (finite, >= 0).

    Returns
    -------
    NoiseBudget

    Raises
    ------
    NoiseBudgetError
        If the M-fold sum plus worst-case noise could wrap modulo q.
    ValueError
        For invalid arguments.
    """
    M = _check_clients(num_clients)
    if int(scale_bits) != scale_bits or scale_bits < 0:
        raise ValueError(f"scale_bits must be a non-negative integer, got {scale_bits}")
    if not math.isfinite(max_abs_value) or max_abs_value < 0:
        raise ValueError(f"max_abs_value must be finite and >= 0, got {max_abs_value}")
    limit = max_plaintext_int(params, M)
    need = math.floor(max_abs_value * 2.0**scale_bits + 0.5)
    total = total_noise_bound(params, M)
    if need > limit:
        raise NoiseBudgetError(
            f"{params.name}: num_clients = {M}, scale_bits = {scale_bits}, "
            f"max_abs_value = {max_abs_value} needs |coefficient| {need} > {limit} "
            f"allowed by q/2 after noise {total}"
        )
    used = M * need + total
    return NoiseBudget(
        num_clients=M,
        scale_bits=int(scale_bits),
        max_abs_value=float(max_abs_value),
        fresh_noise=fresh_noise_bound(params, M),
        smudging=smudging_bound(params, M),
        total_noise=total,
        max_plaintext_int=limit,
        headroom_bits=math.log2(params.q / 2) - math.log2(used),
        error_bound=(total + M / 2) / 2.0**scale_bits,
    )


def max_scale_bits(params: ParameterSet, *, num_clients: int, max_abs_value: float) -> int:
    """Largest scale_bits accepted by :func:`check_noise_budget`.

    Raises
    ------
    NoiseBudgetError
        If even scale_bits = 0 does not fit.
    """
    limit = max_plaintext_int(params, num_clients)
    if max_abs_value <= 0:
        k = limit.bit_length()
    else:
        k = max(0, int(math.floor(math.log2(limit / max_abs_value))) + 1)
    while k >= 0:
        try:
            check_noise_budget(
                params, num_clients=num_clients, scale_bits=k, max_abs_value=max_abs_value
            )
            return k
        except NoiseBudgetError:
            k -= 1
    raise NoiseBudgetError(
        f"{params.name}: max_abs_value = {max_abs_value} does not fit for "
        f"num_clients = {num_clients} at any scale"
    )


def _check_clients(num_clients: int) -> int:
    if int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients}")
    return int(num_clients)


def _make(name: str, n: int, bits: int, count: int) -> ParameterSet:
    return ParameterSet(name=name, n=n, primes=find_ntt_primes(n, bits, count))


def _make_split(name: str, n: int, widths: tuple[int, ...]) -> ParameterSet:
    """Primes of unequal widths, in the given order: for each width b the largest NTT prime below 2^b
    not taken yet (the second 31 in ``(24, 23, 31, 31)`` is the second-largest prime below 2^31).

    A compact upload keeps the first primes (:func:`~flwr_fedeval.rlwe.compact.switch_modulus` drops
    from the end), so the widths of the first and of the last primes set q' and Q.
    """
    primes = [find_ntt_primes(n, b, widths[: j + 1].count(b))[-1] for j, b in enumerate(widths)]
    return ParameterSet(name=name, n=n, primes=tuple(primes))


#: Named 128-bit parameter sets (id -> ParameterSet). log2 q in the name.
#:
#: ``xmk-n4096-q109`` is the split set sized for the smallest upload (docs/explanation/upload-size.md): primes just
#: below 2^24, 2^23, 2^31, 2^31 (q < 2^109, log2 q = 108.997; every prime sits at the top of its
#: bit width, so per-limb bit packing wastes < 0.01 bit). A compact upload keeps the first two
#: (q' = 2^47.0) and drops the two 31-bit primes (Q = 2^62.0): 109 + 2 x 47 = 203 bits per
#: coefficient for every M from 2 to 100 (:func:`~flwr_fedeval.rlwe.compact.compact_limbs`),
#: against 216 for ``xmk-n4096-q108`` (four 27-bit primes, q' = 2^54, Q = 2^54).
#: ``xmk-n4096-q109-l5`` has five limbs (the largest NTT primes below 2^23, 2^22, 2^21, 2^21, 2^22;
#: log2 q = 108.86): q' = 2^45.0 kept, Q = 2^63.9 dropped (three primes: two below 2^31 cannot
#: reach it), 109 + 2 x 45 = 199 bits per coefficient (L' = 2 for M = 2..100); worst-case error of
#: the sum 3.5e-6 at M = 10 (q108: 4.8e-6, q109: 2.7e-6), up to 1.11 x q108's at some M (15: the
#: power-of-two scale is the same and the rounding adds); a fifth limb costs ring work per
#: coefficient. Selectable, not the default (upload-size.md).
PARAMETER_SETS: dict[str, ParameterSet] = {
    p.name: p
    for p in (
        _make("xmk-n4096-q93", 4096, 31, 3),
        _make("xmk-n4096-q108", 4096, 27, 4),
        _make_split("xmk-n4096-q109", 4096, (24, 23, 31, 31)),
        _make_split("xmk-n4096-q109-l5", 4096, (23, 22, 21, 21, 22)),
        _make("xmk-n8192-q155", 8192, 31, 5),
        _make("xmk-n16384-q217", 16384, 31, 7),
    )
}

#: The default set: ``xmk-n4096-q109`` (n = 4096, log2 q = 108.997 <= 109, 128-bit; kept primes of
#: 24 and 23 bits, dropped primes of 31 bits). Chosen over q108 (four 27-bit primes) for the upload:
#: 203 instead of 216 bits per coefficient (6.35x instead of 6.76x float32), with a worst-case
#: decoding error of the sum ((B_total + 2MQ + M/2)/Delta, max_abs_value = 2**16) at most q108's
#: from M = 3 to 100 (2.7e-6 against 4.8e-6 at M = 10, 2.4e-2 against 4.9e-2 at M = 100) and
#: 2.2e-8 at M = 2 (q108: 1.5e-8), within the 1e-6 target of
#: :data:`~flwr_fedeval.rlwe.compact.ERROR_TARGET`. Chosen over q109-l5 (199 bits) for that
#: error (q109-l5 exceeds q108's at some M) and four limbs instead of five; over q93 (three 31-bit
#: primes, ~3/4 of the ring cost) for the error: about M·B_smudge/Δ, 0.18 at q93 with 10 clients.
DEFAULT_PARAMETER_SET = PARAMETER_SETS["xmk-n4096-q109"]


def get_parameter_set(name: str) -> ParameterSet:
    """Look up a named parameter set.

    Raises
    ------
    ValueError
        If ``name`` is unknown.
    """
    try:
        return PARAMETER_SETS[name]
    except KeyError:
        raise ValueError(
            f"unknown parameter set {name!r}; known: {sorted(PARAMETER_SETS)}"
        ) from None
