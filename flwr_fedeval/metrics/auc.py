"""Plaintext reference AUC from summed threshold counts (the exact baseline).

Every secure AUC variant (FHE, DP) is tested against :func:`auc_from_counts`
on the same counts, and this in turn against
:func:`sklearn.metrics.roc_auc_score` on the pooled data.
"""

from __future__ import annotations

import numpy as np

from flwr_fedeval.fhe.counts import ConfusionCounts, tf_vectors

__all__ = ["UndefinedAUCError", "auc_from_counts", "roc_points"]


class UndefinedAUCError(ValueError):
    """The global AUC is undefined: the pooled test data has a single class."""


def auc_from_counts(counts: ConfusionCounts) -> float:
    """Trapezoid ROC AUC from (summed) counts at descending decision points.

    ``AUC = Σ_n T^n F^n / (2 · TP^{N-1} · FP^{N-1})`` (Baykara et al. 2025,
    Eqs. 2-3), i.e. the trapezoid rule over the ROC points
    ``(FP^n/P_neg, TP^n/P_pos)`` starting at ``(0, 0)``. With the default
    decision points (``θ_{N-1} = 0``) the curve ends at ``(1, 1)``.

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
    t, f = tf_vectors(counts.tp, counts.fp)
    tp_last = int(counts.tp[-1])
    fp_last = int(counts.fp[-1])
    if counts.n_positive == 0 or counts.n_negative == 0 or tp_last == 0 or fp_last == 0:
        raise UndefinedAUCError(
            "global AUC is undefined: the pooled test data has "
            f"{counts.n_positive} positive and {counts.n_negative} negative samples "
            f"(at the last decision point TP={tp_last}, FP={fp_last})"
        )
    # Python ints: exact, no int64 overflow for any realistic size.
    numerator = sum(int(a) * int(b) for a, b in zip(t, f))
    return numerator / (2.0 * tp_last * fp_last)


def roc_points(counts: ConfusionCounts) -> tuple[np.ndarray, np.ndarray]:
    """ROC curve points ``(FPR, TPR)`` including the origin, for plotting.

    Returns
    -------
    fpr, tpr : ndarray of shape (N + 1,), dtype float64
    """
    p, n = counts.n_positive, counts.n_negative
    if p == 0 or n == 0:
        raise UndefinedAUCError("ROC curve undefined for single-class pooled data")
    fpr = np.concatenate(([0.0], counts.fp / n))
    tpr = np.concatenate(([0.0], counts.tp / p))
    return fpr, tpr
