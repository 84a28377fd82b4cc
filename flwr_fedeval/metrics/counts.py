"""Confusion counts at public decision points and the T/F vectors of the FHE AUC.

Everything here is plaintext and local to one client: it is what a client
computes on its own test split before encrypting (Baykara et al. 2025, §IV-B,
Eqs. 2-3). The plaintext global AUC built from the *summed* counts is in
:mod:`flwr_fedeval.metrics.auc`; every secure variant is tested against it.
This module is shared by the plain, FHE (:mod:`flwr_fedeval.fhe`) and DP
phases; it imports none of them.

Conventions
-----------
* Decision points (thresholds) ``θ_0 > θ_1 > … > θ_{N-1}`` are public and
  data-independent. They need not start at 1 or end at 0, nor lie in
  ``[0, 1]`` (real-valued scores such as logits or ``decision_function``
  outputs work the same): the ROC curve is always closed at ``(0, 0)`` and
  ``(1, 1)`` with the totals ``P`` and ``N`` (:func:`closed_tf_vectors`).
* A sample is predicted positive at ``θ_n`` iff ``score >= θ_n``.
* ``TP^n``/``FP^n`` are the cumulative true/false positives at ``θ_n``;
  ``TP^{-1} = FP^{-1} = 0``; the closing point is ``TP^N = P``, ``FP^N = N``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

Spacing = Literal["linear", "logit"]
#: The decision-point spacings :func:`decision_points` accepts.
SPACINGS: tuple[str, ...] = ("linear", "logit")

__all__ = [
    "SPACINGS",
    "ConfusionCounts",
    "bin_counts",
    "closed_tf_vectors",
    "decision_points",
    "threshold_counts",
    "tf_vectors",
]


class ConfusionCounts(NamedTuple):
    """TP, FP, TN, FN at each decision point.

    Each field is an ``int64`` array of shape ``(N,)``, aligned with the
    decision points (descending thresholds, so TP and FP are non-decreasing).
    Counts made by :func:`threshold_counts` or by ``+`` are read-only arrays.

    ``a + b`` adds element-wise (shape-checked); ``0 + a`` is ``a``, so
    ``sum(list_of_counts)`` works.
    """

    tp: NDArray[np.int64]
    fp: NDArray[np.int64]
    tn: NDArray[np.int64]
    fn: NDArray[np.int64]

    def __add__(self, other: object) -> ConfusionCounts:
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool) and other == 0:
            return self
        if not isinstance(other, ConfusionCounts):
            return NotImplemented
        if len({a.shape for a in (*self, *other)}) != 1 or self.tp.ndim != 1:
            raise ValueError(
                f"cannot add counts over {self.tp.shape} and {other.tp.shape} decision points "
                "(every field must be 1-D of one length)"
            )
        return ConfusionCounts(*(_frozen(np.asarray(a, dtype=np.int64) + np.asarray(b, dtype=np.int64))
                                 for a, b in zip(self, other)))

    def __radd__(self, other: object) -> ConfusionCounts:
        # ``sum()`` starts from the int 0.
        return self.__add__(other)

    @property
    def n_positive(self) -> int:
        """Number of positive samples (``TP + FN``, equal at every point)."""
        return int(self.tp[0] + self.fn[0])

    @property
    def n_negative(self) -> int:
        """Number of negative samples (``FP + TN``, equal at every point)."""
        return int(self.fp[0] + self.tn[0])


def _frozen(a: NDArray[np.int64]) -> NDArray[np.int64]:
    a.setflags(write=False)
    return a


def decision_points(n_points: int, *, spacing: Spacing = "linear", logit_range: float = 12.0,
                    units: Literal["probability", "logit"] = "probability") -> np.ndarray:
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
    units : {"probability", "logit"}, default="probability"
        ``"logit"`` (with ``spacing="logit"`` only): the points in logit
        units, ``linspace(logit_range, -logit_range, N)``, for models scored
        with the pre-softmax logit margin (no float32 saturation at 0 or 1;
        the curve is closed at (0, 0) and (1, 1) anyway).

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
    if units == "logit":
        if spacing != "logit":
            raise ValueError("units='logit' needs spacing='logit'")
        if not logit_range > 0:
            raise ValueError(f"logit_range must be > 0, got {logit_range!r}")
        return np.linspace(float(logit_range), -float(logit_range), n_points)
    if units != "probability":
        raise ValueError(f"units must be 'probability' or 'logit', got {units!r}")
    if spacing == "linear":
        return 1.0 - np.arange(n_points, dtype=np.float64) / (n_points - 1)
    if spacing == "logit":
        if not logit_range > 0:
            raise ValueError(f"logit_range must be > 0, got {logit_range!r}")
        inner = np.linspace(logit_range, -logit_range, n_points)[1:-1] if n_points > 2 else np.empty(0)
        return np.concatenate(([1.0], 1.0 / (1.0 + np.exp(-inner)), [0.0]))
    raise ValueError(f"spacing must be 'linear' or 'logit', got {spacing!r}")


def _validate_labels_scores(
    y_true: ArrayLike, y_score: ArrayLike, score_range: tuple[float, float] | None = (0.0, 1.0)
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
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
    if score_range is not None and y_score.size:
        lo, hi = score_range
        if y_score.min() < lo or y_score.max() > hi:
            raise ValueError(
                f"y_score must lie in [{lo:g}, {hi:g}], got range [{y_score.min()}, {y_score.max()}]; "
                "for real-valued scores (logits, decision_function outputs) pass score_range=None"
            )
    return y_true.astype(np.int64), y_score


def threshold_counts(y_true: ArrayLike, y_score: ArrayLike, thresholds: ArrayLike, *,
                     score_range: tuple[float, float] | None = (0.0, 1.0)) -> ConfusionCounts:
    """TP, FP, TN, FN of one client's test split at every decision point.

    Parameters
    ----------
    y_true : array-like of shape (n_samples,)
        Binary labels, 1 = positive. A single-class (or empty) test split is
        allowed: its counts are still well defined and add into the global sum.
    y_score : array-like of shape (n_samples,)
        Scores for the positive class, higher = more positive; in
        ``score_range``.
    thresholds : array-like of shape (N,)
        Strictly descending, finite, public decision points (see
        :func:`decision_points`), in the units of ``y_score``.
    score_range : (float, float) or None, default=(0.0, 1.0)
        Accepted score range (probabilities by default, a guard against
        scores on the wrong scale). ``None`` accepts any finite real score,
        as :func:`sklearn.metrics.roc_auc_score` does (logits,
        ``decision_function`` outputs).

    Returns
    -------
    ConfusionCounts
        ``int64`` arrays of shape ``(N,)``; positive iff ``score >= θ_n``.

    Raises
    ------
    ValueError
        On shape mismatch, labels outside {0, 1}, scores outside
        ``score_range`` or non-finite, or thresholds that are not finite and
        strictly descending.
    """
    y_true, y_score = _validate_labels_scores(y_true, y_score, score_range)
    thresholds = np.asarray(thresholds, dtype=np.float64)
    if thresholds.ndim != 1 or thresholds.size < 1:
        raise ValueError("thresholds must be a non-empty 1-D array")
    if not np.isfinite(thresholds).all():
        raise ValueError("thresholds must be finite")
    if thresholds.size > 1 and not (np.diff(thresholds) < 0).all():
        raise ValueError("thresholds must be strictly descending")
    # Sorted scores: count of scores >= θ is len - searchsorted(left).
    pos = np.sort(y_score[y_true == 1])
    neg = np.sort(y_score[y_true == 0])
    tp = (pos.size - np.searchsorted(pos, thresholds, side="left")).astype(np.int64)
    fp = (neg.size - np.searchsorted(neg, thresholds, side="left")).astype(np.int64)
    return ConfusionCounts(tp=_frozen(tp), fp=_frozen(fp), tn=_frozen(neg.size - fp), fn=_frozen(pos.size - tp))


def tf_vectors(tp: ArrayLike, fp: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
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


def closed_tf_vectors(counts: ConfusionCounts) -> tuple[np.ndarray, np.ndarray]:
    """``T`` and ``F`` of the ROC curve closed at ``(1, 1)``: shape ``(N + 1,)``.

    :func:`tf_vectors` extended by the closing bin ``n = N`` with
    ``TP^N = P`` and ``FP^N = N_neg`` (every sample predicted positive), so
    ``Σ_{n=0}^{N} T^n F^n / (2 P N_neg)`` is the trapezoid over the curve
    from ``(0, 0)`` through every decision point to ``(1, 1)`` whatever the
    decision points (Baykara et al. 2025, Eqs. 2-3, with ``θ_N = -∞``).
    Linear in the counts: summing over clients commutes.

    Returns
    -------
    T, F : ndarray of shape (N + 1,), dtype int64
    """
    p = np.asarray(counts.tp, dtype=np.int64) + np.asarray(counts.fn, dtype=np.int64)
    n = np.asarray(counts.fp, dtype=np.int64) + np.asarray(counts.tn, dtype=np.int64)
    return tf_vectors(np.append(counts.tp, p[0]), np.append(counts.fp, n[0]))


def bin_counts(counts: ConfusionCounts) -> tuple[np.ndarray, np.ndarray]:
    """Positives ``p_b`` and negatives ``n_b`` per bin between adjacent decision points.

    Bin ``b = 0`` holds scores ``>= θ_0``, bin ``b`` (``1 <= b < N``) scores in
    ``[θ_b, θ_{b-1})`` and the closing bin ``b = N`` scores ``< θ_{N-1}``.
    ``n_b`` equals ``F^b`` of :func:`closed_tf_vectors`.

    Returns
    -------
    p, n : ndarray of shape (N + 1,), dtype int64
    """
    t, f = closed_tf_vectors(counts)
    tp = np.append(counts.tp, int(counts.tp[0] + counts.fn[0])).astype(np.int64)
    return np.diff(tp, prepend=0), f
