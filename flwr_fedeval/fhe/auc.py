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

Packing (one batch of ``n/2`` slots per ciphertext, two ciphertexts per client)::

    A = [T^0 … T^{N-1}, TP^{N-1} - Σ_n T^n, 0 …] / K      (slot N holds the correction)
    B = [F^0 … F^{N-1}, 0,                    0 …] / K

``K`` is the public ``count_scale``. Then ``A⊙B`` holds ``T^n F^n`` in slots
``0..N-1`` and exact zeros elsewhere, ``Σ_slots A = TP^{N-1}`` and
``Σ_slots B = FP^{N-1}`` (``F`` telescopes, Eq. 3), so the server computes
with whole-batch sums only (Eq. 7 of step 7)::

    num   = Σ_slots (A ⊙ B)                    (every slot = Σ T^n F^n / K²)
    denom = (Σ_slots A) ⊙ (Σ_slots B)          (every slot = TP·FP / K²)

and multiplies each by a plaintext mask ``[c, 0, 0, …]`` resp.
``[2c, 0, …]`` (step 8). Before the mask every slot holds only ``num`` or
``denom``; after it, slot 0 holds ``c·num`` (``2c·TP·FP``) and every other
slot is zero up to CKKS noise, so a client that decrypts every slot learns
the masked pair only — never a per-threshold product. (The authors' C++
``EvalSum(num, N)`` over a larger batch leaves partial sums in other slots.)

Precision and headroom: with the default TenSEAL set (Δ = 2^49) the
relative error of ``num``/``denom`` is ~1e-9 when the normalised values are
O(0.1…100); the decryption headroom is ~1000. Choose ``count_scale`` within
a factor ~4 of the pooled test-set size (:func:`suggest_count_scale`):
roughly ``0.3·K ≤ total samples ≤ 20·K`` is safe.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from flwr_fedeval.fhe.backend import CKKSContext, SerializationError, pack_blobs, unpack_blobs
from flwr_fedeval.fhe.counts import ConfusionCounts, tf_vectors
from flwr_fedeval.metrics.auc import UndefinedAUCError

__all__ = [
    "AUCResult",
    "FHEAUCConfig",
    "ThresholdMetrics",
    "aggregate_auc",
    "aggregate_threshold_metrics",
    "client_decrypt_auc",
    "client_decrypt_threshold_metrics",
    "client_encrypt_confusion",
    "client_encrypt_counts",
    "client_vectors",
    "random_mask",
    "suggest_count_scale",
]


@dataclass(frozen=True)
class FHEAUCConfig:
    """Public configuration of the FHE AUC phase (same on every party).

    Parameters
    ----------
    n_points : int
        ``N``, number of decision points (see :func:`~flwr_fedeval.fhe.counts.decision_points`).
    count_scale : float, default=128.0
        Public constant ``K`` every count is divided by before encryption
        (CKKS headroom and precision; see module docstring).
    mask_range : (float, float), default=(0.5, 2.0)
        The aggregator's multiplicative mask ``c`` is log-uniform on this
        interval (CSPRNG). CKKS headroom bounds it; clients therefore learn
        ``denom`` within a factor ``mask_range[1]/mask_range[0]`` — the
        paper's multiplicative masking with a bounded support (§A1).
    """

    n_points: int
    count_scale: float = 128.0
    mask_range: tuple[float, float] = (0.5, 2.0)

    def __post_init__(self) -> None:
        if isinstance(self.n_points, bool) or not isinstance(self.n_points, (int, np.integer)) or self.n_points < 2:
            raise ValueError(f"n_points must be an integer >= 2, got {self.n_points!r}")
        if not (isinstance(self.count_scale, (int, float)) and math.isfinite(self.count_scale) and self.count_scale > 0):
            raise ValueError(f"count_scale must be a finite number > 0, got {self.count_scale!r}")
        lo, hi = self.mask_range
        if not (0 < lo <= hi and math.isfinite(hi)):
            raise ValueError(f"mask_range must satisfy 0 < low <= high < inf, got {self.mask_range!r}")


def suggest_count_scale(expected_total_samples: float) -> float:
    """A public ``count_scale`` for an *expected* (public, rough) pooled test size.

    Returns ``max(1, expected/2)``, a power of two so that the choice
    itself carries little information; any value within a factor ~4 works.
    """
    if not expected_total_samples > 0:
        raise ValueError(f"expected_total_samples must be > 0, got {expected_total_samples!r}")
    return float(2 ** max(0, round(math.log2(expected_total_samples / 2))))


def random_mask(mask_range: tuple[float, float]) -> float:
    """Log-uniform ``c`` on ``mask_range`` from the OS CSPRNG (``secrets``)."""
    lo, hi = mask_range
    u = secrets.randbits(53) / float(1 << 53)
    return float(math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))))


class AUCResult(NamedTuple):
    """What a client learns: the AUC and the masked pair it was divided from."""

    auc: float
    num_masked: float
    denom_masked: float


def _check_counts(counts: ConfusionCounts, n_points: int) -> None:
    if not isinstance(counts, ConfusionCounts):
        raise TypeError(f"counts must be a ConfusionCounts, got {type(counts).__name__}")
    if counts.tp.shape != (n_points,):
        raise ValueError(f"counts cover {counts.tp.shape[0]} decision points, config says {n_points}")


def client_vectors(counts: ConfusionCounts, *, config: FHEAUCConfig, slot_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Plaintext slot layout ``(A, B)`` of one client (see module docstring).

    Returns
    -------
    A, B : ndarray of shape (slot_count,), float64
    """
    _check_counts(counts, config.n_points)
    n = config.n_points
    if n + 1 > slot_count:
        raise ValueError(f"N={n} decision points need {n + 1} slots, the batch has {slot_count}")
    t, f = tf_vectors(counts.tp, counts.fp)
    k = float(config.count_scale)
    a = np.zeros(slot_count)
    b = np.zeros(slot_count)
    a[:n] = t / k
    a[n] = (int(counts.tp[-1]) - int(t.sum())) / k
    b[:n] = f / k
    return a, b


def client_encrypt_counts(ctx: CKKSContext, counts: ConfusionCounts, *, config: FHEAUCConfig) -> bytes:
    """Steps 2–4: encrypt one client's ``T``/``F`` vectors and totals.

    Parameters
    ----------
    ctx : CKKSContext
        A context with the public key (every client holds the private one).
    counts : ConfusionCounts
        This client's counts at the ``config.n_points`` public decision points.

    Returns
    -------
    bytes
        The message to the aggregator (two ciphertexts).
    """
    a, b = client_vectors(counts, config=config, slot_count=ctx.slot_count)
    return pack_blobs([ctx.serialize_ciphertext(ctx.encrypt(a)), ctx.serialize_ciphertext(ctx.encrypt(b))])


def _load_client_messages(ctx: CKKSContext, messages: Sequence[bytes], per_client: int) -> list[list]:
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
        ``E(c·num)`` and ``E(2c·TP·FP)`` for the clients; ``c`` is discarded.

    Raises
    ------
    ValueError
        If ``messages`` is empty.
    flwr_fedeval.fhe.backend.SerializationError
        If a message is not exactly two framed ciphertexts of this backend
        (the message names the client's index in ``messages``).
    flwr_fedeval.fhe.backend.ContextMismatchError
        If a ciphertext was made under another key set or backend (a
        subclass of ``SerializationError``; also names the index).
    """
    loaded = _load_client_messages(ctx, messages, 2)
    a = ctx.add_many([m[0] for m in loaded])
    b = ctx.add_many([m[1] for m in loaded])
    num = ctx.sum_slots(ctx.multiply(a, b))
    denom = ctx.multiply(ctx.sum_slots(a), ctx.sum_slots(b))
    c = random_mask(config.mask_range)
    out_num = ctx.multiply_plain(num, [c])
    out_den = ctx.multiply_plain(denom, [2.0 * c])
    return pack_blobs([ctx.serialize_ciphertext(out_num), ctx.serialize_ciphertext(out_den)])


def _undefined_floor(config: FHEAUCConfig) -> float:
    # The smallest defined denominator is 2·1·1/K² times the smallest mask.
    return config.mask_range[0] / float(config.count_scale) ** 2


def client_decrypt_auc(ctx: CKKSContext, result: bytes, *, config: FHEAUCConfig) -> AUCResult:
    """Step 9: decrypt the masked pair and divide.

    Raises
    ------
    UndefinedAUCError
        If the pooled data has a single class (masked denominator ≈ 0).
    """
    blobs = unpack_blobs(result, expected=2)
    num = float(ctx.decrypt(ctx.deserialize_ciphertext(blobs[0]))[0])
    den = float(ctx.decrypt(ctx.deserialize_ciphertext(blobs[1]))[0])
    if not den >= _undefined_floor(config):
        raise UndefinedAUCError("global AUC is undefined: the pooled test data has a single class")
    return AUCResult(auc=num / den, num_masked=num, denom_masked=den)


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

    ``config.n_points`` is ignored here; ``count_scale`` and ``mask_range`` apply.
    Use ``threshold_counts(y, s, [θ])`` to get the four counts.
    """
    vals = np.array([tp, fp, tn, fn], dtype=np.float64)
    if (vals < 0).any() or not np.all(vals == np.round(vals)):
        raise ValueError(f"counts must be non-negative integers, got {vals.tolist()}")
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
