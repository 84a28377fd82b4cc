"""Federated AUC under FHE, semi-honest aggregator (Baykara, Ünal, Akgün 2025, §IV-C).

Protocol steps as plain functions over bytes (no Flower). A Flower
evaluation phase runs, per evaluation:

1. key holder: ``ctx = create_context()``; ``ctx.public_bytes()`` → server;
   ``ctx.secret_bytes()`` → other clients through :mod:`flwr_fedeval.keyshare`.
2. every client (steps 1–4 of §IV-C):
   ``msg = client_encrypt_counts(ctx, counts, config=cfg)`` → server.
3. server (steps 5–8): ``result = aggregate_auc(public_ctx, [msg, ...])``
   → every client. ``public_ctx = load_context(public_bytes)`` holds no
   secret key.
4. every client (step 9): ``client_decrypt_auc(ctx, result).auc``.

Packing (one batch of ``n/2`` slots per ciphertext, three ciphertexts per
client; ``T``/``F`` of the curve *closed* at ``(1, 1)``, ``n = 0..N`` with the
closing bin ``n = N``, :func:`~flwr_fedeval.metrics.counts.closed_tf_vectors`)::

    A = [T^0 … T^N, P - Σ_n T^n, 0 …] / K       (slot N+1 holds the correction)
    B = [F^0 … F^N, 0,            0 …] / K
    R = [p_0 … p_N, 0,            0 …] / K       (positives per bin)

Then ``A⊙B`` holds ``T^n F^n`` in slots ``0..N`` and exact zeros elsewhere,
``Σ_slots A = P`` and ``Σ_slots B = N_neg`` (``F`` telescopes, Eq. 3), so the
server computes with whole-batch sums only (Eq. 7 of step 7)::

    num   = Σ_slots (A ⊙ B)                    (every slot = Σ T^n F^n / K²)
    denom = (Σ_slots A) ⊙ (Σ_slots B)          (every slot = P·N_neg / K²)
    res   = Σ_slots (R ⊙ B)                    (every slot = Σ_b p_b n_b / K²)

and multiplies them by plaintext masks ``[c, 0, …]``, ``[2c, 0, …]`` and
``[c, 0, …]`` (step 8). Before the mask every slot holds only ``num``,
``denom`` or ``res``; after it, slot 0 holds the masked value and every other
slot is zero up to CKKS noise, so a client that decrypts every slot learns
the masked triple only — never a per-threshold product. (The authors' C++
``EvalSum(num, N)`` over a larger batch leaves partial sums in other slots.)
The clients divide: ``AUC = num/denom`` and the certified resolution bound
``½ Σ_b p_b n_b / (P N_neg) = res/denom``
(:func:`flwr_fedeval.metrics.auc.resolution_bound`). *Privacy cost of the
bound*: the clients (never the server) learn one more aggregate of the pooled
data, the fraction of positive/negative pairs that share a bin; the upload
grows by one ciphertext per client.

Count encoding, derived — nothing to tune
-----------------------------------------
Every count is divided by the public ``K = count_scale`` before encryption.
``K`` is not chosen by the user: it is the power of two
``2^(⌈log2 R⌉ − 3)`` derived from ``R = max_rows``, the public bound on the
pooled test rows that the protocol already has (the sum of the clients'
step-1 declarations). Then ``R/K ≤ 8`` and every decrypted value is at most
``(R/K)² ≤ 64`` whatever the data (``2c·P·N_neg/K² ≤ R²/K²`` with the mask
``c ≤ 2``), far inside the decryption headroom ``max_final_value`` of both
default parameter sets (TenSEAL ``2^10``, OpenFHE ``2^9``): no overflow at
any size. The encoding is scale-free, so the AUC's CKKS error depends on the
class balance, not on ``R``. The client bounds the absolute CKKS error of
each decrypted value ``v`` by ``ε(v) = 2·2^-(Δbits − 20)·(2|v| + 2R/K)`` (20
bits is the measured loss of the circuit: ct×ct product, whole-batch sum,
mask; ``benchmarks/bench_fhe_auc_scale.py`` and the tests measure the error
3–35× below it on both protocols), and
estimates the AUC's error ``(ε(num) + AUC·ε(denom))/denom`` from the
decrypted values. A client refuses (:class:`AUCPrecisionError`) when that estimate
exceeds ``max_error`` (default 1e-6) — a minority class of a handful of
samples among millions of rows — or when the AUC lies outside ``[0, 1]``
beyond it; no path returns an AUC outside ``[0, 1]``.

Supported maximum: one count ``1/K`` must stay above ``ε``, i.e.
``R ≤ 2^(Δbits − 23)`` (:func:`max_pooled_rows`):

==================================  ==========  =========================
parameter set                       Δ           max pooled rows ``R``
==================================  ==========  =========================
TenSEAL default (n=8192)            2^49        2^26 = 67,108,864
OpenFHE default (n=16384, depth 2)  2^50        2^27 = 134,217,728
OpenFHE fast set (n=8192, opt-in)   2^47        2^24 = 16,777,216
==================================  ==========  =========================

:func:`ckks_params_for` is the key holder's choice in the Flower phase.

A larger ``max_rows`` is refused up front (:class:`CountBoundError`, naming the
maximum and the fix); so is a client whose counts exceed its declaration.

"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from flwr_fedeval.fhe.backend import CKKSContext, CKKSParams, SerializationError, pack_blobs, unpack_blobs
from flwr_fedeval.metrics.auc import UndefinedAUCError
from flwr_fedeval.metrics.counts import ConfusionCounts, bin_counts, closed_tf_vectors

__all__ = [
    "AUCPrecisionError",
    "AUCResult",
    "CountBoundError",
    "FHEAUCConfig",
    "ThresholdMetrics",
    "aggregate_auc",
    "aggregate_threshold_metrics",
    "client_decrypt_auc",
    "client_decrypt_threshold_metrics",
    "client_encrypt_confusion",
    "client_encrypt_counts",
    "client_vectors",
    "count_scale_for",
    "max_pooled_rows",
    "ckks_params_for",
    "random_mask",
]

#: Bits of the scaling factor the AUC circuit loses (measured, both backends; see module docstring).
_CIRCUIT_LOSS_BITS = 20


class CountBoundError(ValueError):
    """Counts exceed the declared public bound, or the bound exceeds the parameter set's maximum."""


class AUCPrecisionError(ValueError):
    """The decrypted AUC cannot be certified to ``max_error`` (or lies outside [0, 1]).

    Raised instead of returning a number that may be wrong. The message names
    the estimated error and the fix.
    """


def max_pooled_rows(params: CKKSParams) -> int:
    """Largest public pooled-row bound ``R`` a parameter set supports: ``2^(Δbits − 23)``.

    Beyond it one count (``1/K``) falls below the CKKS error of the final
    values (see module docstring). TenSEAL default: 2^26; OpenFHE default
    (Δ = 2^45): 2^22; OpenFHE paper set (Δ = 2^50): 2^27 (:func:`ckks_params_for`
    switches to it above 2^22).
    """
    return 1 << (int(params.scale_bits) - _CIRCUIT_LOSS_BITS - 3)


def ckks_params_for(backend: str, slots: int, max_rows: int) -> CKKSParams:
    """The CKKS parameter set the key holder uses for ``slots`` slots and the public bound ``max_rows``.

    The backend's default set (:meth:`CKKSParams.default`, 128-bit per the
    HE Standard) with the smallest batch holding ``slots``, checked to support
    ``max_rows`` (:func:`max_pooled_rows`). Derived from public values only,
    so every party can check the choice.

    Raises
    ------
    CountBoundError
        If no set of ``backend`` supports ``max_rows`` (names the maximum).
    ValueError
        If ``slots`` exceed the set's slot count, or ``max_rows`` < 1.
    """
    _check_max_rows(max_rows)
    params = CKKSParams.for_slots(int(slots), backend)
    check_supported(FHEAUCConfig(n_points=2, max_rows=int(max_rows)), params)
    return params


def count_scale_for(max_rows: int, *, shift: int = 3) -> float:
    """The derived public count scale ``K = 2^(⌈log2 max_rows⌉ − shift)``.

    ``R/K ≤ 2^shift``; the semi-honest protocol uses ``shift = 3``, the
    malicious one ``2`` (its multipliers grow the values by up to 6×).
    """
    _check_max_rows(max_rows)
    return float(2.0 ** (int(max_rows - 1).bit_length() - shift))


def _check_max_rows(max_rows: object) -> None:
    if isinstance(max_rows, bool) or not isinstance(max_rows, (int, np.integer)) or max_rows < 1:
        raise ValueError(
            f"max_rows must be an integer >= 1 (public bound on the pooled test rows), got {max_rows!r}"
        )


@dataclass(frozen=True)
class FHEAUCConfig:
    """Public configuration of the FHE AUC phase (same on every party).

    Parameters
    ----------
    n_points : int
        ``N``, number of decision points (see :func:`~flwr_fedeval.metrics.counts.decision_points`).
    max_rows : int
        Public upper bound ``R`` on the pooled test rows (every client's
        rows summed), e.g. the sum of the clients' step-1 declarations. The
        count encoding ``K`` is derived from it (:attr:`count_scale`); any
        bound at least the true size works, up to :func:`max_pooled_rows`
        of the parameter set. A loose bound costs precision quadratically
        (a bound 4× the true size: ~16× the CKKS error, still ~1e-7 on
        balanced data).
    mask_range : (float, float), default=(0.5, 2.0)
        The aggregator's multiplicative mask ``c`` is log-uniform on this
        interval (CSPRNG). CKKS headroom bounds it; clients therefore learn
        ``denom`` within a factor ``mask_range[1]/mask_range[0]`` — the
        paper's multiplicative masking with a bounded support (§A1).
    max_error : float, default=1e-6
        A client refuses (:class:`AUCPrecisionError`) an AUC whose estimated
        CKKS error exceeds this.

    Raises
    ------
    ValueError
        On a bad value of any field.
    """

    n_points: int
    max_rows: int
    mask_range: tuple[float, float] = (0.5, 2.0)
    max_error: float = 1e-6

    #: ``R/K <= 2^_shift`` (see :func:`count_scale_for`).
    _shift = 3
    #: Safety factor of the CKKS error estimate (:meth:`ckks_error`).
    _error_safety = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.n_points, bool) or not isinstance(self.n_points, (int, np.integer)) or self.n_points < 2:
            raise ValueError(f"n_points must be an integer >= 2, got {self.n_points!r}")
        _check_max_rows(self.max_rows)
        lo, hi = self.mask_range
        if not (0 < lo <= hi <= 2.0):
            raise ValueError(f"mask_range must satisfy 0 < low <= high <= 2, got {self.mask_range!r}")
        if not (0 < self.max_error < 1e-2):
            raise ValueError(f"max_error must be in (0, 1e-2), got {self.max_error!r}")

    @property
    def count_scale(self) -> float:
        """The derived public count scale ``K`` (:func:`count_scale_for`)."""
        return count_scale_for(int(self.max_rows), shift=self._shift)

    @property
    def value_bound(self) -> float:
        """Largest magnitude of a normalised value ``(R/K)²`` (before protocol factors)."""
        return (int(self.max_rows) / self.count_scale) ** 2

    def ckks_error(self, params: CKKSParams, value: float) -> float:
        """Estimated bound on the absolute CKKS error of one decrypted final value.

        ``safety · 2^-(Δbits − 20) · (2|value| + 2 R/K)``: a part relative to
        the value (mask and rescale noise) and a part from the operands of the
        ct×ct product (at most ``R/K`` each, normalised). Measured on both
        backends the error stays 3–35× below it (``safety = 2``).
        """
        unit = 2.0 ** -(int(params.scale_bits) - _CIRCUIT_LOSS_BITS)
        return self._error_safety * unit * (2.0 * abs(value) + 2.0 * int(self.max_rows) / self.count_scale)


def check_supported(config: FHEAUCConfig, params: CKKSParams) -> None:
    """Refuse a ``max_rows`` beyond the parameter set's maximum, or values beyond its headroom.

    Raises
    ------
    CountBoundError
        Naming the maximum and the fix.
    """
    limit = max_pooled_rows(params)
    if int(config.max_rows) > limit:
        raise CountBoundError(
            f"max_rows={config.max_rows} exceeds the maximum of {limit:,} pooled rows this CKKS parameter set "
            f"supports ({params.backend}, scaling factor 2^{params.scale_bits}); fix: use a parameter set with "
            "a larger scaling factor (e.g. OpenFHE scale_bits=50 allows 2^27) or evaluate on a subsample"
        )


def _check_rows(counts: ConfusionCounts, config: FHEAUCConfig, declared_rows: int | None) -> None:
    rows = counts.n_positive + counts.n_negative
    if rows > int(config.max_rows):
        raise CountBoundError(
            f"this client's test split has {rows} rows, more than the public pooled bound "
            f"max_rows={config.max_rows}; fix: declare a bound at least the true size"
        )
    if declared_rows is not None and rows > int(declared_rows):
        raise CountBoundError(
            f"this client's test split has {rows} rows, more than it declared ({declared_rows}); "
            "fix: declare a bound at least the true size (the count encoding is derived from it)"
        )


def random_mask(mask_range: tuple[float, float]) -> float:
    """Log-uniform ``c`` on ``mask_range`` from the OS CSPRNG (``secrets``)."""
    lo, hi = mask_range
    u = secrets.randbits(53) / float(1 << 53)
    return float(math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))))


class AUCResult(NamedTuple):
    """What a client learns: the AUC, its bounds, and the masked values it was divided from.

    ``|AUC_true − auc| <= resolution_bound + ckks_error``.
    """

    auc: float
    resolution_bound: float
    ckks_error: float
    num_masked: float
    denom_masked: float


def _check_counts(counts: ConfusionCounts, n_points: int) -> None:
    if not isinstance(counts, ConfusionCounts):
        raise TypeError(f"counts must be a ConfusionCounts, got {type(counts).__name__}")
    if counts.tp.shape != (n_points,):
        raise ValueError(f"counts cover {counts.tp.shape[0]} decision points, config says {n_points}")


def client_vectors(counts: ConfusionCounts, *, config: FHEAUCConfig, slot_count: int,
                   declared_rows: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plaintext slot layout ``(A, B, R)`` of one client (see module docstring).

    Returns
    -------
    A, B, R : ndarray of shape (slot_count,), float64

    Raises
    ------
    CountBoundError
        If the client's rows exceed ``config.max_rows`` or ``declared_rows``.
    ValueError
        If the counts do not match ``config.n_points`` or the batch is too small.
    """
    _check_counts(counts, config.n_points)
    _check_rows(counts, config, declared_rows)
    n = config.n_points
    if n + 2 > slot_count:
        raise ValueError(f"N={n} decision points need {n + 2} slots, the batch has {slot_count}")
    t, f = closed_tf_vectors(counts)
    pb, _ = bin_counts(counts)
    k = float(config.count_scale)
    a = np.zeros(slot_count)
    b = np.zeros(slot_count)
    r = np.zeros(slot_count)
    a[: n + 1] = t / k
    a[n + 1] = (counts.n_positive - int(t.sum())) / k
    b[: n + 1] = f / k
    r[: n + 1] = pb / k
    return a, b, r


def client_encrypt_counts(ctx: CKKSContext, counts: ConfusionCounts, *, config: FHEAUCConfig,
                          declared_rows: int | None = None) -> bytes:
    """Steps 2–4: encrypt one client's ``T``/``F``/bin vectors (closed curve).

    Parameters
    ----------
    ctx : CKKSContext
        A context with the public key (every client holds the private one).
    counts : ConfusionCounts
        This client's counts at the ``config.n_points`` public decision points.
    declared_rows : int, optional
        The bound this client declared on its test rows (step 1); counts
        beyond it are refused.

    Returns
    -------
    bytes
        The message to the aggregator (three ciphertexts).

    Raises
    ------
    CountBoundError
        If ``config.max_rows`` exceeds :func:`max_pooled_rows` of the
        context's parameters, or the client's rows exceed ``config.max_rows``
        or ``declared_rows``.
    """
    check_supported(config, ctx.params)
    vecs = client_vectors(counts, config=config, slot_count=ctx.slot_count, declared_rows=declared_rows)
    return pack_blobs([ctx.serialize_ciphertext(ctx.encrypt(v)) for v in vecs])


def _load_client_messages(ctx: CKKSContext, messages: Sequence[bytes], per_client: int) -> list[list[Any]]:
    if len(messages) == 0:
        raise ValueError("no client messages to aggregate")
    out = []
    for i, msg in enumerate(messages):
        try:
            blobs = unpack_blobs(msg, expected=per_client)
            out.append([ctx.deserialize_ciphertext(b) for b in blobs])
        except SerializationError as exc:
            raise type(exc)(f"client message {i}: {exc}") from None
    return out


def aggregate_auc(ctx: CKKSContext, messages: Sequence[bytes], *, config: FHEAUCConfig) -> bytes:
    """Steps 5–8 (aggregator): sum, multiply, whole-batch sums, mask.

    Parameters
    ----------
    ctx : CKKSContext
        The *public* context (no secret key needed or expected).
    messages : sequence of bytes
        One :func:`client_encrypt_counts` message per client.
    config : FHEAUCConfig
        Public protocol parameters; ``mask_range`` bounds the random mask c.

    Returns
    -------
    bytes
        ``E(c·num)``, ``E(2c·P·N)`` and ``E(c·res)`` for the clients; ``c`` is discarded.

    Raises
    ------
    ValueError
        If ``messages`` is empty.
    flwr_fedeval.fhe.backend.SerializationError
        If a message is not exactly three framed ciphertexts of this backend
        (the message names the client's index in ``messages``).
    flwr_fedeval.fhe.backend.ContextMismatchError
        If a ciphertext was made under another key set or backend (a
        subclass of ``SerializationError``; also names the index).
    """
    loaded = _load_client_messages(ctx, messages, 3)
    a = ctx.add_many([m[0] for m in loaded])
    b = ctx.add_many([m[1] for m in loaded])
    r = ctx.add_many([m[2] for m in loaded])
    num = ctx.sum_slots(ctx.multiply(a, b))
    denom = ctx.multiply(ctx.sum_slots(a), ctx.sum_slots(b))
    res = ctx.sum_slots(ctx.multiply(r, b))
    c = random_mask(config.mask_range)
    out = [ctx.multiply_plain(num, [c]), ctx.multiply_plain(denom, [2.0 * c]), ctx.multiply_plain(res, [c])]
    return pack_blobs([ctx.serialize_ciphertext(x) for x in out])


def _undefined_floor(config: FHEAUCConfig) -> float:
    # The smallest defined denominator is 2·1·1/K² times the smallest mask; half of it.
    return config.mask_range[0] / float(config.count_scale) ** 2


def certify(auc: float, bound: float, err: float, config: FHEAUCConfig, what: str) -> tuple[float, float]:
    """Refuse an imprecise or out-of-range AUC; clip CKKS noise at the ends of ``[0, 1]``.

    Raises
    ------
    AUCPrecisionError
        If ``err > config.max_error`` or ``auc``/``bound`` lie outside
        ``[0, 1]``/``[0, ½]`` by more than ``err``.
    """
    if not (math.isfinite(auc) and math.isfinite(bound)):
        raise AUCPrecisionError(f"{what}: the decrypted AUC is not finite")
    if err > config.max_error:
        raise AUCPrecisionError(
            f"{what}: the CKKS error of this AUC may reach {err:.2g} > max_error={config.max_error:g}: the "
            f"minority class is tiny relative to the pooled bound max_rows={config.max_rows}; fix: a "
            "parameter set with a larger scaling factor, or more samples of the minority class"
        )
    if not (-err <= auc <= 1.0 + err and -err <= bound <= 0.5 + err):
        raise AUCPrecisionError(
            f"{what}: decrypted AUC {auc!r} (resolution bound {bound!r}) outside [0, 1] beyond the CKKS "
            f"error {err:.2g}: CKKS overflow (counts beyond max_rows={config.max_rows}?) or a deviating "
            "aggregator; no AUC is returned"
        )
    return min(max(auc, 0.0), 1.0), min(max(bound, 0.0), 0.5)


def client_decrypt_auc(ctx: CKKSContext, result: bytes, *, config: FHEAUCConfig) -> AUCResult:
    """Step 9: decrypt the masked triple and divide.

    Returns
    -------
    AUCResult
        AUC in ``[0, 1]``, its resolution bound and CKKS error estimate.

    Raises
    ------
    UndefinedAUCError
        If the pooled data has a single class (masked denominator ≈ 0).
    AUCPrecisionError
        If the AUC cannot be certified to ``config.max_error`` or lies
        outside ``[0, 1]`` (see :func:`certify`).
    """
    blobs = unpack_blobs(result, expected=3)
    num, den, res = (float(ctx.decrypt(ctx.deserialize_ciphertext(b))[0]) for b in blobs)
    if not den >= _undefined_floor(config):
        raise UndefinedAUCError("global AUC is undefined: the pooled test data has a single class")
    auc, bound = num / den, res / den
    err = (config.ckks_error(ctx.params, num) + abs(auc) * config.ckks_error(ctx.params, den)) / den
    auc, bound = certify(auc, bound, err, config, "semi-honest FHE AUC")
    return AUCResult(auc=auc, resolution_bound=bound, ckks_error=err, num_masked=num, denom_masked=den)


# --- accuracy, precision, recall, F1 at one threshold ---------------------------

class ThresholdMetrics(NamedTuple):
    """Global metrics at one threshold; ``nan`` where the ratio is undefined."""

    accuracy: float
    precision: float
    recall: float
    f1: float


# (numerator weights, denominator weights) over slots [TP, FP, TN, FN].
_METRIC_WEIGHTS = {
    "accuracy": ((1, 0, 1, 0), (1, 1, 1, 1)),
    "precision": ((1, 0, 0, 0), (1, 1, 0, 0)),
    "recall": ((1, 0, 0, 0), (1, 0, 0, 1)),
    "f1": ((2, 0, 0, 0), (2, 1, 0, 1)),
}


def client_encrypt_confusion(ctx: CKKSContext, tp: int, fp: int, tn: int, fn: int, *, config: FHEAUCConfig) -> bytes:
    """Encrypt one client's ``[TP, FP, TN, FN]`` at a single public threshold.

    ``config.n_points`` is ignored here; the derived ``count_scale`` and
    ``mask_range`` apply.

    Raises
    ------
    CountBoundError
        If the four counts sum to more than ``config.max_rows``.
    Use ``threshold_counts(y, s, [θ])`` to get the four counts.
    """
    vals = np.array([tp, fp, tn, fn], dtype=np.float64)
    if (vals < 0).any() or not np.all(vals == np.round(vals)):
        raise ValueError(f"counts must be non-negative integers, got {vals.tolist()}")
    if vals.sum() > int(config.max_rows):
        raise CountBoundError(
            f"this client's test split has {int(vals.sum())} rows, more than the public pooled bound "
            f"max_rows={config.max_rows}; fix: declare a bound at least the true size"
        )
    return pack_blobs([ctx.serialize_ciphertext(ctx.encrypt(vals / config.count_scale))])


def aggregate_threshold_metrics(ctx: CKKSContext, messages: Sequence[bytes], *, config: FHEAUCConfig) -> bytes:
    """Aggregator: for each metric, masked ``E(c_k·num_k)`` and ``E(c_k·den_k)``.

    Each metric gets its own mask ``c_k``, so clients learn the four ratios
    and nothing else; every slot but slot 0 is zero up to noise.
    """
    loaded = _load_client_messages(ctx, messages, 1)
    g = ctx.add_many([m[0] for m in loaded])
    blobs = []
    for name in ("accuracy", "precision", "recall", "f1"):
        c = random_mask(config.mask_range)
        for w in _METRIC_WEIGHTS[name]:
            lin = ctx.sum_slots(ctx.multiply_plain(g, [float(x) for x in w]))
            blobs.append(ctx.serialize_ciphertext(ctx.multiply_plain(lin, [c])))
    return pack_blobs(blobs)


def client_decrypt_threshold_metrics(ctx: CKKSContext, result: bytes, *, config: FHEAUCConfig) -> ThresholdMetrics:
    """Decrypt the eight masked values and divide; ``nan`` for an empty denominator."""
    blobs = unpack_blobs(result, expected=8)
    vals = [float(ctx.decrypt(ctx.deserialize_ciphertext(b))[0]) for b in blobs]
    floor = 0.5 * config.mask_range[0] / float(config.count_scale)  # smallest defined denominator / 2
    ratios = []
    for i in range(4):
        num, den = vals[2 * i], vals[2 * i + 1]
        ratios.append(num / den if den >= floor else float("nan"))
    return ThresholdMetrics(*ratios)
