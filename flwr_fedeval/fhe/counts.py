"""Confusion counts at public decision points and the T/F vectors of the FHE AUC.

Everything here is plaintext and local to one client: it is what a client
computes on its own test split before encrypting (Baykara et al. 2025, §IV-B,
Eqs. 2-3). The plaintext global AUC built from the *summed* counts is in
:mod:`flwr_fedeval.metrics.auc`; every secure variant is tested against it.

Conventions
-----------
* Decision points (thresholds) ``θ_0 > θ_1 > … > θ_{N-1}`` are public and
  data-independent; ``θ_0 = 1`` and ``θ_{N-1} = 0`` for the default spacings,
  so the last point classifies every sample as positive.
* A sample is predicted positive at ``θ_n`` iff ``score >= θ_n``.
* ``TP^n``/``FP^n`` are the cumulative true/false positives at ``θ_n``;
  ``TP^{-1} = FP^{-1} = 0``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np

Spacing = Literal["linear", "logit"]

__all__ = [
    "ConfusionCounts",
    "decision_points",
    "threshold_counts",
    "tf_vectors",
]


class ConfusionCounts(NamedTuple):
    """TP, FP, TN, FN at each decision point.

    Each field is an ``int64`` array of shape ``(N,)``, aligned with the
    decision points (descending thresholds, so TP and FP are non-decreasing).
    """

    tp: np.ndarray
    fp: np.ndarray
    tn: np.ndarray
    fn: np.ndarray

    def __add__(self, other: "ConfusionCounts") -> "ConfusionCounts":  # type: ignore[override]
        if not isinstance(other, ConfusionCounts):
            return NotImplemented
        if self.tp.shape != other.tp.shape:
            raise ValueError(
                f"cannot add counts over {self.tp.shape[0]} and "
                f"{other.tp.shape[0]} decision points"
            )
        return ConfusionCounts(*(a + b for a, b in zip(self, other)))

    @property
    def n_positive(self) -> int:
        """Number of positive samples (``TP + FN``, equal at every point)."""
        return int(self.tp[0] + self.fn[0])

    @property
    def n_negative(self) -> int:
        """Number of negative samples (``FP + TN``, equal at every point)."""
        return int(self.fp[0] + self.tn[0])


def decision_points(n_points: int, *, spacing: Spacing = "linear", logit_range: float = 12.0) -> np.ndarray:
    """Public, data-independent decision points in descending order.

    Parameters
    ----------
    n_points : int
        ``N``, the number of decision points, at least 2.
    spacing : {"linear", "logit"}, default="linear"
        ``"linear"``: ``θ_n = 1 - n/(N-1)`` (the paper's even spacing).
        ``"logit"``: the inner points are evenly spaced on the logit scale
        over ``[-logit_range, logit_range]``; ``θ_0 = 1`` and ``θ_{N-1} = 0``
        are kept. Trained models saturate their scores near 0 and 1 where
        even spacing loses resolution; logit spacing is still public.
    logit_range : float, default=12.0
        Half-width of the logit interval for ``spacing="logit"``.

    Returns
    -------
    thresholds : ndarray of shape (N,), dtype float64
        ``1 = θ_0 > θ_1 > … > θ_{N-1} = 0``.

    Raises
    ------
    ValueError
        If ``n_points < 2`` or ``spacing`` is unknown.

    References
    ----------
    Baykara, Ünal, Akgün 2025, §IV-B (decision points).
    """
    if isinstance(n_points, bool) or not isinstance(n_points, (int, np.integer)) or n_points < 2:
        raise ValueError(f"n_points must be an integer >= 2, got {n_points!r}")
    n_points = int(n_points)
    if spacing == "linear":
        return 1.0 - np.arange(n_points, dtype=np.float64) / (n_points - 1)
    if spacing == "logit":
        if not logit_range > 0:
            raise ValueError(f"logit_range must be > 0, got {logit_range!r}")
        inner = np.linspace(logit_range, -logit_range, n_points)[1:-1] if n_points > 2 else np.empty(0)
        return np.concatenate(([1.0], 1.0 / (1.0 + np.exp(-inner)), [0.0]))
    raise ValueError(f"spacing must be 'linear' or 'logit', got {spacing!r}")


def _validate_labels_scores(y_true, y_score) -> tuple[np.ndarray, np.ndarray]:
    y_true = np.asarray(y_true)
    y_score = np.asarray(y_score, dtype=np.float64)
    if y_true.ndim != 1 or y_score.ndim != 1:
        raise ValueError(
            f"y_true and y_score must be 1-D, got shapes {y_true.shape} and {y_score.shape}"
        )
    if y_true.shape != y_score.shape:
        raise ValueError(
            f"y_true and y_score must have the same length, got {y_true.shape[0]} and {y_score.shape[0]}"
        )
    if y_true.size and not np.isin(y_true, (0, 1)).all():
        raise ValueError("y_true must contain only 0 (negative) and 1 (positive)")
    if not np.isfinite(y_score).all():
        raise ValueError("y_score contains NaN or infinite values")
    if y_score.size and (y_score.min() < 0.0 or y_score.max() > 1.0):
        raise ValueError(
            f"y_score must lie in [0, 1], got range [{y_score.min()}, {y_score.max()}]"
        )
    return y_true.astype(np.int64), y_score


def threshold_counts(y_true, y_score, thresholds) -> ConfusionCounts:
    """TP, FP, TN, FN of one client's test split at every decision point.

    Parameters
    ----------
    y_true : array-like of shape (n_samples,)
        Binary labels, 1 = positive. A single-class (or empty) test split is
        allowed: its counts are still well defined and add into the global sum.
    y_score : array-like of shape (n_samples,)
        Scores in ``[0, 1]`` for the positive class.
    thresholds : array-like of shape (N,)
        Strictly descending decision points (see :func:`decision_points`).

    Returns
    -------
    ConfusionCounts
        ``int64`` arrays of shape ``(N,)``; positive iff ``score >= θ_n``.

    Raises
    ------
    ValueError
        On shape mismatch, labels outside {0, 1}, scores outside [0, 1] or
        non-finite, or thresholds that are not strictly descending.
    """
    y_true, y_score = _validate_labels_scores(y_true, y_score)
    thresholds = np.asarray(thresholds, dtype=np.float64)
    if thresholds.ndim != 1 or thresholds.size < 1:
        raise ValueError("thresholds must be a non-empty 1-D array")
    if thresholds.size > 1 and not (np.diff(thresholds) < 0).all():
        raise ValueError("thresholds must be strictly descending")
    # Sorted scores: count of scores >= θ is len - searchsorted(left).
    pos = np.sort(y_score[y_true == 1])
    neg = np.sort(y_score[y_true == 0])
    tp = (pos.size - np.searchsorted(pos, thresholds, side="left")).astype(np.int64)
    fp = (neg.size - np.searchsorted(neg, thresholds, side="left")).astype(np.int64)
    return ConfusionCounts(tp=tp, fp=fp, tn=neg.size - fp, fn=pos.size - tp)


def tf_vectors(tp, fp) -> tuple[np.ndarray, np.ndarray]:
    """The T and F vectors of Baykara et al. 2025, Eq. 3.

    ``T^n = TP^n + TP^{n-1}`` and ``F^n = FP^n - FP^{n-1}`` with
    ``TP^{-1} = FP^{-1} = 0``, so that
    ``AUC = Σ_n T^n F^n / (2 · TP^{N-1} · FP^{N-1})``.

    Parameters
    ----------
    tp, fp : array-like of shape (N,)
        Cumulative counts at descending decision points (local or summed;
        the map is linear, so summing T/F over clients equals T/F of sums).

    Returns
    -------
    T, F : ndarray of shape (N,), dtype int64
    """
    tp = np.asarray(tp, dtype=np.int64)
    fp = np.asarray(fp, dtype=np.int64)
    if tp.shape != fp.shape or tp.ndim != 1:
        raise ValueError(f"tp and fp must be 1-D of equal shape, got {tp.shape} and {fp.shape}")
    prev_tp = np.concatenate(([0], tp[:-1]))
    prev_fp = np.concatenate(([0], fp[:-1]))
    return tp + prev_tp, fp - prev_fp
