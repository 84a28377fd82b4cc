"""DPAUC (Sun et al., AAAI 2023): threshold-count AUC with label DP.

Two baselines, each split into a client step and a server step:

* **DPAUC_Lap** ("Adding DP Noise to Local Statistics"): every client adds
  Laplace(1/ε′_X) noise (sensitivity 1) to each of ``TP, FP, TN, FN`` at every
  decision point θ ∈ Θ (workflow steps 2-3); the server sums the noisy counts
  (step 4), forms ``TPR = TP/(TP+FN)``, ``FPR = FP/(FP+TN)`` (step 5) and
  integrates TPR over FPR with the trapezoid rule (step 6). Per client
  ``ε = |Θ|·(ε_TP + ε_FP + ε_TN + ε_FN)`` (= ``4|Θ|ε′`` for the equal split of
  the paper's "Privacy Analysis").
* **DPAUC_RR** ("One Randomized Responses based Competitor"): clients flip
  their labels once with probability ``1/(1+e^ε)`` (Eq. 1), send exact counts
  of the flipped labels; the server computes the noisy AUC and debiases it
  (Menon et al. 2015, see :mod:`flwr_fedeval.dp.debias`).

Client steps: :func:`dpauc_laplace_client`, :func:`randomize_labels` (then
:func:`flwr_fedeval.metrics.counts.threshold_counts` on the flipped labels).
Server steps: :func:`dpauc_laplace_server`, :func:`dpauc_rr_server`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
from diffprivlib import BudgetAccountant
from numpy.typing import ArrayLike, NDArray

from flwr_fedeval.dp.budget import RandomStateLike, charge, check_epsilon, client_random_state
from flwr_fedeval.dp.debias import menon_debias
from flwr_fedeval.dp.mechanisms import (
    Sampler,
    flip_probability,
    laplace_mechanism,
    laplace_randomise,
    randomized_response,
)
from flwr_fedeval.dp.result import AUCEstimate, undefined_estimate
from flwr_fedeval.metrics.auc import UndefinedAUCError, auc_from_counts, resolution_bound
from flwr_fedeval.metrics.counts import ConfusionCounts

__all__ = [
    "Clipping",
    "DPAUCLaplaceParams",
    "NoisyCounts",
    "RandomizedResponseParams",
    "dpauc_laplace_client",
    "dpauc_laplace_server",
    "dpauc_rr_server",
    "laplace_noise_check",
    "randomize_labels",
]

logger = logging.getLogger(__name__)

Clipping = Literal["clip-sort", "no-clip"]
_STATS = ("tp", "fp", "tn", "fn")
#: A summed count whose noise standard deviation exceeds this share of the smaller class
#: (positives or negatives) swamps the ROC curve (:func:`laplace_noise_check`).
NOISE_TO_CLASS_LIMIT = 0.1


class NoisyCounts(NamedTuple):
    """Noisy ``TP, FP, TN, FN`` of one client: float64 arrays of shape ``(|Θ|,)``."""

    tp: np.ndarray
    fp: np.ndarray
    tn: np.ndarray
    fn: np.ndarray


@dataclass(frozen=True, init=False)
class DPAUCLaplaceParams:
    """Privacy parameters of DPAUC_Lap; validated on construction.

    Parameters
    ----------
    epsilon : float
        Total per-client budget ``ε > 0`` over all counts and thresholds
        (``math.inf`` disables the noise).
    n_thresholds : int
        ``|Θ| >= 2``, the number of decision points.
    split : tuple of 4 float, default=(0.25, 0.25, 0.25, 0.25)
        Positive weights of ``(TP, FP, TN, FN)``; normalised to sum to 1.
        ``ε_X = ε·w_X/|Θ|`` is the budget of each single count of statistic X.

    Notes
    -----
    Each count changes by at most 1 when one label changes (sensitivity 1), so
    by sequential composition the ``4|Θ|`` releases cost
    ``|Θ|·Σ_X ε_X = ε`` (DPAUC, "Privacy Analysis"; conservative: a label
    change moves a sample between TP↔FN and FP↔TN at each threshold).
    The noise of one count of X has standard deviation ``√2/ε_X``.

    Examples
    --------
    >>> p = DPAUCLaplaceParams.from_epsilon_prime(0.0025, n_thresholds=100)
    >>> round(p.epsilon, 12)
    1.0
    """

    epsilon: float
    n_thresholds: int
    split: tuple[float, float, float, float]

    def __init__(self, epsilon: float, n_thresholds: int,
                 split: tuple[float, float, float, float] = (0.25, 0.25, 0.25, 0.25)) -> None:
        epsilon = check_epsilon(epsilon)
        if isinstance(n_thresholds, bool) or not isinstance(n_thresholds, (int, np.integer)) or n_thresholds < 2:
            raise ValueError(f"n_thresholds must be an integer >= 2, got {n_thresholds!r}")
        try:
            weights = tuple(float(w) for w in split)
        except TypeError as exc:
            raise TypeError("split must be a sequence of 4 numbers (TP, FP, TN, FN)") from exc
        if len(weights) != 4:
            raise ValueError(f"split must have 4 weights (TP, FP, TN, FN), got {len(weights)}")
        if not all(math.isfinite(w) and w > 0 for w in weights):
            raise ValueError(f"split weights must be finite and > 0, got {weights}")
        total = sum(weights)
        object.__setattr__(self, "epsilon", epsilon)
        object.__setattr__(self, "n_thresholds", int(n_thresholds))
        object.__setattr__(self, "split", tuple(w / total for w in weights))

    @classmethod
    def from_epsilon_prime(cls, epsilon_prime: float, n_thresholds: int) -> DPAUCLaplaceParams:
        """The paper's parametrisation: ``ε′`` per count, total ``ε = 4|Θ|ε′``."""
        epsilon_prime = check_epsilon(epsilon_prime, "epsilon_prime")
        return cls(4 * int(n_thresholds) * epsilon_prime, n_thresholds)

    @property
    def epsilon_per_count(self) -> dict[str, float]:
        """``ε_X`` for X in (tp, fp, tn, fn): budget of one noisy count."""
        return {s: self.epsilon * w / self.n_thresholds for s, w in zip(_STATS, self.split)}

    @property
    def noise_scale(self) -> dict[str, float]:
        """Laplace scale ``b_X = 1/ε_X`` of each statistic (0 when ε = inf)."""
        return {s: 1.0 / e for s, e in self.epsilon_per_count.items()}

    def noise_std_of_sum(self, n_clients: int) -> dict[str, float]:
        """Standard deviation of a *summed* noisy count over ``n_clients``: ``√(2K)/ε_X``."""
        return {s: math.sqrt(2 * n_clients) * b for s, b in self.noise_scale.items()}

    def summary(self) -> str:
        eps = self.epsilon_per_count
        return (
            f"DPAUC_Lap: epsilon={self.epsilon:g} per client, |Θ|={self.n_thresholds}, "
            + ", ".join(f"ε_{s.upper()}={e:.4g}" for s, e in eps.items())
        )


def dpauc_laplace_client(
    counts: ConfusionCounts,
    params: DPAUCLaplaceParams,
    *,
    accountant: BudgetAccountant | None = None,
    random_state: RandomStateLike = None,
    sampler: Sampler = "vectorised",
) -> NoisyCounts:
    """Client step of DPAUC_Lap: add Laplace noise to every count (workflow step 3).

    Parameters
    ----------
    counts : ConfusionCounts
        This client's exact counts at the public decision points, arrays of
        shape ``(|Θ|,)`` (from :func:`flwr_fedeval.metrics.counts.threshold_counts`).
        A single-class or empty client is fine.
    params : DPAUCLaplaceParams
        ``params.n_thresholds`` must equal ``len(counts.tp)``.
    accountant : diffprivlib.BudgetAccountant or None, keyword-only
        This client's accountant; charged ``params.epsilon`` *before* any
        noise is drawn. ``None``: no accounting.
    random_state : int, RandomState or None, keyword-only
        The client's random state (see :func:`~flwr_fedeval.dp.budget.client_random_state`).
    sampler : {"vectorised", "diffprivlib"}, keyword-only
        Same distribution; ``"diffprivlib"`` calls ``Laplace.randomise`` per count.

    Returns
    -------
    NoisyCounts
        float64 arrays of shape ``(|Θ|,)``: what the client sends.

    Raises
    ------
    BudgetError
        If the accountant cannot afford ``params.epsilon`` (nothing is drawn).
    ValueError
        If the number of decision points does not match ``params``.
    """
    if not isinstance(params, DPAUCLaplaceParams):
        raise TypeError(f"params must be DPAUCLaplaceParams, got {type(params).__name__}")
    if not isinstance(counts, ConfusionCounts):
        counts = ConfusionCounts(*counts)
    n = len(counts.tp)
    if n != params.n_thresholds or any(len(c) != n for c in counts):
        raise ValueError(f"counts cover {n} decision points, params.n_thresholds is {params.n_thresholds}")
    rng = client_random_state(random_state)
    mechanisms = {
        s: laplace_mechanism(e, 1.0, rng) for s, e in params.epsilon_per_count.items()
    }  # validates before any spend
    charge(accountant, params.epsilon)
    noisy = [laplace_randomise(getattr(counts, s), mechanisms[s], rng, sampler=sampler) for s in _STATS]
    return NoisyCounts(*noisy)


def _sum_counts(client_counts: Sequence[Sequence[ArrayLike]]) -> tuple[NDArray[np.float64], ...]:
    if len(client_counts) == 0:
        raise ValueError("no client counts to aggregate")
    shapes = {np.shape(c[0]) for c in client_counts}
    if len(shapes) != 1:
        raise ValueError(f"clients report different numbers of decision points: {sorted(shapes)}")
    return tuple(np.sum([np.asarray(c[i], dtype=np.float64) for c in client_counts], axis=0) for i in range(4))


def laplace_noise_check(
    epsilon: float, n_points: int, n_clients: int, positives: float, negatives: float,
    *, limit: float = NOISE_TO_CLASS_LIMIT,
) -> dict[str, float | bool]:
    """Does the DPAUC_Lap noise swamp the counts it is added to?

    Each of the M clients adds Laplace(b) noise, b = 1/ε′ = 4N/ε, to every count
    (Sun et al., AAAI 2023, DPAUC_Lap); a summed count then carries noise of standard
    deviation σ = √(2M)·4N/ε. The ROC curve is meaningful only while σ is small against
    the smaller class, min(P, N_neg): the check is σ ≤ ``limit``·min(P, N_neg).

    Parameters
    ----------
    epsilon : float
        Per-client ε of the evaluation (``inf``: no noise, never swamped).
    n_points : int
        N, the number of decision points.
    n_clients : int
        M, the number of clients whose counts are summed.
    positives, negatives : float
        P and N_neg of the pooled test data (the server's noisy estimates; public output).
    limit : float, keyword-only, default=0.1

    Returns
    -------
    dict
        ``noise_std`` (σ, in rows), ``swamped`` (bool), ``min_epsilon`` (the smallest ε with
        σ ≤ limit·min(P, N_neg) at these P, N_neg) and ``min_class_rows`` (the smallest
        class size that makes σ ≤ limit·class at this ε), ``smaller_class`` (min(P, N_neg) as given) and
        ``smaller_class_std`` (√2·σ/√N: the noise of the server's own estimate of it, the mean over the N
        decision points of TP+FN or FP+TN; ``min_epsilon`` is as uncertain as that estimate).

    Raises
    ------
    ValueError
        ``epsilon`` ≤ 0, ``n_points`` or ``n_clients`` < 1, or ``limit`` ≤ 0.
    """
    if not epsilon > 0 or n_points < 1 or n_clients < 1 or not limit > 0:
        raise ValueError(f"need epsilon > 0, n_points >= 1, n_clients >= 1, limit > 0; got {epsilon!r}, "
                         f"{n_points!r}, {n_clients!r}, {limit!r}")
    spread = math.sqrt(2.0 * n_clients) * 4.0 * n_points
    sigma = 0.0 if math.isinf(epsilon) else spread / epsilon
    smaller = max(0.0, min(float(positives), float(negatives)))
    return {
        "noise_std": sigma,
        "swamped": bool(sigma > limit * smaller),
        "min_epsilon": spread / (limit * smaller) if smaller > 0 else math.inf,
        "min_class_rows": sigma / limit,
        "smaller_class": smaller,
        # the server's P, N_neg: means over the N decision points of sums with noise 2b^2 each
        "smaller_class_std": math.sqrt(2.0) * sigma / math.sqrt(n_points),
    }


def dpauc_laplace_server(
    client_counts: Sequence[NoisyCounts],
    *,
    clipping: Clipping = "clip-sort",
    epsilon: float = math.nan,
) -> AUCEstimate:
    """Server steps 4-6 of DPAUC_Lap: sum, rates, trapezoid AUC.

    Parameters
    ----------
    client_counts : sequence of NoisyCounts
        One entry per client, arrays of shape ``(|Θ|,)`` in descending-threshold order.
    clipping : {"clip-sort", "no-clip"}, keyword-only
        ``"clip-sort"`` (the authors' code): clip each summed count at 0; a
        threshold whose TP+FN or FP+TN is 0 becomes the point (0, 0); points are
        sorted by FPR; the AUC stays in [0, 1].
        ``"no-clip"`` (the numbers of the FHE paper, Baykara et al. 2025):
        rates from the raw noisy sums, trapezoid in threshold order; the
        estimate can be far outside [0, 1] when counts are small.
        Both integrate from the origin (0, 0), so with exact counts both equal
        :func:`flwr_fedeval.metrics.auc.auc_from_counts`.
    epsilon : float, keyword-only
        Recorded in the result only.

    Returns
    -------
    AUCEstimate
        ``variant`` records the clipping option. Undefined (NaN plus
        :class:`~flwr_fedeval.dp.result.UndefinedAUCWarning`) when a rate has a
        zero denominator (``"no-clip"``) or every threshold does
        (``"clip-sort"``), e.g. zero positives and noise disabled.
    """
    method = "dpauc-laplace"
    if clipping not in ("clip-sort", "no-clip"):
        raise ValueError(f"clipping must be 'clip-sort' or 'no-clip', got {clipping!r}")
    tp, fp, tn, fn = _sum_counts(client_counts)
    # P and N_neg from the noisy sums, averaged over the decision points (public output).
    noise = (laplace_noise_check(epsilon, tp.size, len(client_counts), float(np.mean(tp + fn)),
                                 float(np.mean(fp + tn))) if epsilon > 0 else {})
    if clipping == "clip-sort":
        tp, fp, tn, fn = (np.maximum(x, 0.0) for x in (tp, fp, tn, fn))
        pos, neg = tp + fn, fp + tn
        ok = (pos != 0) & (neg != 0)
        if not ok.any():
            return undefined_estimate(
                method, clipping, epsilon, "every threshold has TP+FN = 0 or FP+TN = 0 after clipping"
            )
        tpr = np.where(ok, tp / np.where(ok, pos, 1.0), 0.0)
        fpr = np.where(ok, fp / np.where(ok, neg, 1.0), 0.0)
        order = np.argsort(fpr, kind="stable")
        fpr, tpr = fpr[order], tpr[order]
    else:
        pos, neg = tp + fn, fp + tn
        if (pos == 0).any() or (neg == 0).any():
            return undefined_estimate(
                method, clipping, epsilon, "a threshold has TP+FN = 0 or FP+TN = 0 (division by zero)"
            )
        tpr, fpr = tp / pos, fp / neg
    fpr = np.concatenate(([0.0], fpr))
    tpr = np.concatenate(([0.0], tpr))
    auc = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1])) / 2.0)
    return AUCEstimate(auc=auc, method=method, variant=clipping, epsilon=epsilon,
                       details={f"noise_{k}" if not k.startswith("noise") else k: v for k, v in noise.items()})


@dataclass(frozen=True, init=False)
class RandomizedResponseParams:
    """Label randomized response, ε-LabelDP (DPAUC Eq. 1, FedAUC Eq. 2).

    Parameters
    ----------
    epsilon : float
        ``ε > 0``; each label is flipped once with probability
        ``ρ = 1/(1+e^ε)``; ``math.inf`` disables flipping.

    Notes
    -----
    Labels are flipped **once**; every later evaluation on the flipped labels
    is post-processing and costs nothing more (DPAUC_RR Step 1).
    """

    epsilon: float

    def __init__(self, epsilon: float):
        object.__setattr__(self, "epsilon", check_epsilon(epsilon))

    @property
    def flip_probability(self) -> float:
        return flip_probability(self.epsilon)

    def flip_std(self, n_labels: int) -> float:
        """Standard deviation of the number of flips among ``n_labels``."""
        rho = self.flip_probability
        return math.sqrt(n_labels * rho * (1 - rho))


def randomize_labels(
    labels: ArrayLike,
    params: RandomizedResponseParams,
    *,
    accountant: BudgetAccountant | None = None,
    random_state: RandomStateLike = None,
    sampler: Sampler = "vectorised",
) -> np.ndarray:
    """Client step of DPAUC_RR and FedAUC_RR: flip the labels once (Algorithm 1).

    Parameters
    ----------
    labels : array-like of shape (n_samples,)
        Binary labels in {0, 1}.
    params : RandomizedResponseParams
    accountant, random_state, sampler : keyword-only
        As in :func:`dpauc_laplace_client`; the accountant is charged
        ``params.epsilon`` before any label is flipped.

    Returns
    -------
    ndarray of int64, shape (n_samples,)
        The flipped labels; keep them and reuse them for every evaluation.
    """
    if not isinstance(params, RandomizedResponseParams):
        raise TypeError(f"params must be RandomizedResponseParams, got {type(params).__name__}")
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if labels.size and not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must contain only 0 and 1")
    rng = client_random_state(random_state)
    charge(accountant, params.epsilon)
    return randomized_response(labels, params.epsilon, rng, sampler=sampler)


def dpauc_rr_server(
    client_counts: Sequence[ConfusionCounts],
    params: RandomizedResponseParams,
) -> AUCEstimate:
    """Server step of DPAUC_RR: AUC on the flipped labels' counts, then Menon debiasing.

    Parameters
    ----------
    client_counts : sequence of ConfusionCounts
        Exact counts of the *flipped* labels, one per client.
    params : RandomizedResponseParams
        The clients' RR budget (public).

    Returns
    -------
    AUCEstimate
        ``details`` holds ``noisy_auc`` and the estimated clean totals. With
        ``epsilon = inf`` the value equals :func:`auc_from_counts` of the sum.
        Undefined (NaN + warning) when the flipped labels are single-class or
        the estimated clean base rate is not in (0, 1).
    """
    method, variant = "dpauc-rr", "debiased"
    sums = _sum_counts(client_counts)
    total = ConfusionCounts(*(np.rint(x).astype(np.int64) for x in sums))
    try:
        noisy_auc = auc_from_counts(total)
    except UndefinedAUCError as exc:
        return undefined_estimate(method, variant, params.epsilon, f"flipped labels: {exc}")
    d = menon_debias(noisy_auc, total.n_positive, total.n_negative, params.epsilon)
    details = {"noisy_auc": noisy_auc, "noisy_p": total.n_positive, "noisy_n": total.n_negative,
               "p_est": d.p_est, "n_est": d.n_est, "rho": d.rho}
    if d.auc is not None:
        # The debiasing is affine in the noisy AUC (slope 1/(1-α-β)): the discretisation part
        # of the error is the flipped labels' resolution bound scaled by it (the RR noise is separate).
        details["resolution_bound"] = resolution_bound(total) / abs(1.0 - d.alpha - d.beta)
    if d.auc is None:
        return undefined_estimate(method, variant, params.epsilon, d.reason, **details)
    return AUCEstimate(auc=float(d.auc), method=method, variant=variant, epsilon=params.epsilon, details=details)
