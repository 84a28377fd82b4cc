"""Plaintext reference AUC from summed threshold counts (the exact baseline).

Every secure AUC variant (FHE, DP) is tested against :func:`auc_from_counts`
on the same counts, and this in turn against
:func:`sklearn.metrics.roc_auc_score` on the pooled data.

The ROC curve is always closed at ``(0, 0)`` and ``(1, 1)`` by the totals
``P`` and ``N`` (whatever the decision points), and every AUC comes with its
certified *resolution bound*: pairs of a positive and a negative that fall
in the same bin between adjacent decision points are counted ½ by the
trapezoid although the true AUC counts each 0 or 1, so::

    |AUC_true − AUC| <= ½ · Σ_b p_b · n_b / (P · N)

(:func:`resolution_bound`; ``b`` runs over the ``N + 1`` bins including the
two closing ones). It is exact: the bound is reached when every such pair
is ordered the same way.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from flwr_fedeval.metrics.counts import ConfusionCounts, bin_counts, closed_tf_vectors

__all__ = [
    "RESOLUTION_WARN_THRESHOLD",
    "AUCWithBound",
    "UndefinedAUCError",
    "auc_from_counts",
    "auc_with_bound",
    "resolution_bound",
    "resolution_advice",
    "roc_points",
]

#: A resolution bound above this deserves a warning (ServerApp, experiments).
RESOLUTION_WARN_THRESHOLD = 0.01


class UndefinedAUCError(ValueError):
    """The global AUC is undefined: the pooled test data has a single class."""


class AUCWithBound(NamedTuple):
    """An AUC and its certified resolution bound (``|AUC_true − auc| <= bound``)."""

    auc: float
    resolution_bound: float


def _totals(counts: ConfusionCounts) -> tuple[int, int]:
    if not isinstance(counts, ConfusionCounts):
        raise TypeError(f"counts must be a ConfusionCounts, got {type(counts).__name__}")
    p, n = counts.n_positive, counts.n_negative
    if p == 0 or n == 0:
        raise UndefinedAUCError(
            f"global AUC is undefined: the pooled test data has {p} positive and {n} negative samples"
        )
    return p, n


def auc_from_counts(counts: ConfusionCounts) -> float:
    """Trapezoid ROC AUC from (summed) counts, curve closed at (0, 0) and (1, 1).

    ``AUC = Σ_{n=0}^{N} T^n F^n / (2 · P · N_neg)`` (Baykara et al. 2025,
    Eqs. 2-3) with the closing bin ``T^N = TP^{N-1} + P``,
    ``F^N = N_neg − FP^{N-1}`` (:func:`~flwr_fedeval.metrics.counts.closed_tf_vectors`):
    the trapezoid rule over ``(0, 0)``, the ROC points
    ``(FP^n/N_neg, TP^n/P)`` and ``(1, 1)``, for any decision points.

    Parameters
    ----------
    counts : ConfusionCounts
        Counts summed over all clients, arrays of shape ``(N,)``.

    Returns
    -------
    float
        The AUC in ``[0, 1]``.

    Raises
    ------
    UndefinedAUCError
        If the pooled data has no positive or no negative sample (the AUC is
        undefined; single-class *clients* are fine as long as the sum is not).
    """
    p, n = _totals(counts)
    t, f = closed_tf_vectors(counts)
    # Python ints: exact, no int64 overflow for any realistic size.
    numerator = sum(int(a) * int(b) for a, b in zip(t, f))
    return numerator / (2.0 * p * n)


def resolution_bound(counts: ConfusionCounts) -> float:
    """Certified bound ``½ · Σ_b p_b n_b / (P N)`` on ``|AUC_true − auc_from_counts|``.

    ``p_b``, ``n_b``: positives and negatives in bin ``b`` between adjacent
    decision points, including the closing bins above ``θ_0`` and below
    ``θ_{N-1}`` (:func:`~flwr_fedeval.metrics.counts.bin_counts`).

    Returns
    -------
    float
        In ``[0, 0.5]``; 0 when no bin holds both classes.

    Raises
    ------
    UndefinedAUCError
        If the pooled data has a single class.
    """
    p, n = _totals(counts)
    pb, nb = bin_counts(counts)
    return sum(int(a) * int(b) for a, b in zip(pb, nb)) / (2.0 * p * n)


def auc_with_bound(counts: ConfusionCounts) -> AUCWithBound:
    """:func:`auc_from_counts` and :func:`resolution_bound` of the same counts."""
    return AUCWithBound(auc_from_counts(counts), resolution_bound(counts))


def resolution_advice(bound: float) -> str:
    """The warning text for a resolution bound above :data:`RESOLUTION_WARN_THRESHOLD`."""
    return (
        f"the AUC's resolution bound is {bound:.4f} (> {RESOLUTION_WARN_THRESHOLD}): many positive/negative "
        "pairs share a bin between adjacent decision points. Fix: logit-spaced decision points "
        "(run config decision-point-spacing='logit'; spacing='logit' of the AUC phases), more decision "
        "points, or scores as logits (pre-softmax margin) so saturated probabilities do not collapse "
        "into one bin"
    )


def roc_points(counts: ConfusionCounts) -> tuple[np.ndarray, np.ndarray]:
    """ROC curve points ``(FPR, TPR)`` closed at ``(0, 0)`` and ``(1, 1)``, for plotting.

    Returns
    -------
    fpr, tpr : ndarray of shape (N + 2,), dtype float64
        Non-decreasing; the trapezoid over them equals :func:`auc_from_counts`.

    Raises
    ------
    UndefinedAUCError
        If the pooled data has a single class.
    """
    p, n = _totals(counts)
    fpr = np.concatenate(([0.0], np.asarray(counts.fp) / n, [1.0]))
    tpr = np.concatenate(([0.0], np.asarray(counts.tp) / p, [1.0]))
    return fpr, tpr
