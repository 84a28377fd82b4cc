"""FedAUC (Sun et al., "Differentially Private AUC Computation in Vertical FL").

Rank-based AUC (Mann-Whitney, Eq. 1): ``AUC = (Σ r_i y_i - P(P-1)/2) / (P·N)``
with ranks ``r_i ∈ [0, M-1]`` over the pooled scores. Protocol (§4.2, §5.1,
Algorithms 2 and 4):

1. client: :func:`fedauc_shuffle_scores`: send its scores in a random order;
2. server: :func:`fedauc_server_ranks`: rank all ``M`` scores, return each
   client the ranks of its (shuffled) scores;
3. client: :func:`fedauc_unshuffle_ranks`, then one of
   :func:`fedauc_local_stats` (plaintext; on RR-flipped labels for FedAUC_RR)
   or :func:`fedauc_laplace_client` (FedAUC_Lap: Global/LocalLaplace, α split,
   orthogonal decomposition with fixed or adaptive β, §5.2-5.3);
4. server: :func:`fedauc_server_auc` (plaintext / Laplace) or
   :func:`fedauc_rr_server` (FedAUC_RR with Menon debiasing, §4.3).

Ties: the server assigns tied scores their average rank (``method="average"``),
so the plaintext protocol equals :func:`sklearn.metrics.roc_auc_score` exactly;
``"ordinal"`` gives the paper's distinct ranks ``0..M-1`` (ties broken by the
order of arrival, i.e. at random after the clients' shuffles). Either way a
rank is at most ``M-1``, the sensitivity bound of GlobalLaplace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
from diffprivlib import BudgetAccountant
from numpy.typing import ArrayLike, NDArray
from scipy.stats import rankdata

from flwr_fedeval.dp.budget import RandomStateLike, charge, check_epsilon, client_random_state
from flwr_fedeval.dp.debias import menon_debias
from flwr_fedeval.dp.dpauc import RandomizedResponseParams
from flwr_fedeval.dp.mechanisms import Sampler, laplace_mechanism, laplace_randomise
from flwr_fedeval.dp.result import AUCEstimate, undefined_estimate

__all__ = [
    "FedAUCLaplaceParams",
    "LocalStats",
    "adaptive_beta",
    "fedauc_laplace_client",
    "fedauc_local_stats",
    "fedauc_rr_server",
    "fedauc_server_auc",
    "fedauc_server_ranks",
    "fedauc_shuffle_scores",
    "fedauc_unshuffle_ranks",
]

Ties = Literal["average", "ordinal"]


class LocalStats(NamedTuple):
    """What a FedAUC client sends: ``localSum``, ``localP``, ``localN`` (floats)."""

    local_sum: float
    local_p: float
    local_n: float


def fedauc_shuffle_scores(
    scores: ArrayLike, *, random_state: RandomStateLike = None
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Client step 1: shuffle the scores before sending them.

    Returns
    -------
    shuffled : ndarray of float64, shape (n,)
        What the client sends.
    permutation : ndarray of int64, shape (n,)
        Secret: ``shuffled = scores[permutation]``; keep it for
        :func:`fedauc_unshuffle_ranks`.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-D, got shape {scores.shape}")
    if not np.isfinite(scores).all():
        raise ValueError("scores contain NaN or infinite values")
    perm = client_random_state(random_state).permutation(scores.size).astype(np.int64)
    return scores[perm], perm


def fedauc_server_ranks(client_scores: Sequence[ArrayLike], *, ties: Ties = "average") -> list[NDArray[np.float64]]:
    """Server step 2: global ranks (0 = lowest score, ``M-1`` = highest).

    Parameters
    ----------
    client_scores : sequence of array-like of shape (n_k,)
        The shuffled scores of each client (empty arrays allowed).
    ties : {"average", "ordinal"}, keyword-only
        Tie handling, see the module docstring.

    Returns
    -------
    list of ndarray of float64, shape (n_k,)
        Ranks aligned with each client's shuffled scores.
    """
    if ties not in ("average", "ordinal"):
        raise ValueError(f"ties must be 'average' or 'ordinal', got {ties!r}")
    arrays = [np.asarray(s, dtype=np.float64).ravel() for s in client_scores]
    if not arrays:
        raise ValueError("no client scores to rank")
    pooled = np.concatenate(arrays)
    ranks = rankdata(pooled, method=ties) - 1.0
    bounds = np.cumsum([0] + [a.size for a in arrays])
    return [ranks[bounds[i] : bounds[i + 1]] for i in range(len(arrays))]


def fedauc_unshuffle_ranks(ranks: ArrayLike, permutation: ArrayLike) -> NDArray[np.float64]:
    """Client: map ranks of the shuffled scores back to the client's own sample order."""
    r: NDArray[np.float64] = np.asarray(ranks, dtype=np.float64)
    perm = np.asarray(permutation)
    if r.shape != perm.shape:
        raise ValueError(f"got {r.size} ranks for {perm.size} scores")
    out = np.empty_like(r)
    out[perm] = r
    return out


def _check_ranks_labels(ranks: ArrayLike, labels: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    ranks = np.asarray(ranks, dtype=np.float64)
    labels = np.asarray(labels)
    if ranks.ndim != 1 or ranks.shape != labels.shape:
        raise ValueError(f"ranks and labels must be 1-D of equal length, got {ranks.shape} and {labels.shape}")
    if labels.size and not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must contain only 0 and 1")
    if ranks.size and ranks.min() < 0:
        raise ValueError("ranks must be >= 0")
    return ranks, labels.astype(np.float64)


def fedauc_local_stats(ranks: ArrayLike, labels: ArrayLike) -> LocalStats:
    """Client step 3 without noise: ``localSum = Σ r_i y_i``, ``localP``, ``localN``.

    Used as is by FedAUC_RR with the *flipped* labels from
    :func:`flwr_fedeval.dp.dpauc.randomize_labels` (Algorithm 2). A
    single-class or empty client gives ``localP = 0`` or ``localN = 0``.
    """
    ranks, y = _check_ranks_labels(ranks, labels)
    p = float(y.sum())
    return LocalStats(float(ranks @ y), p, float(y.size) - p)


def adaptive_beta(ranks: ArrayLike) -> float:
    """β minimising ``Var(‖u′‖∞·s1 + ‖v′‖∞·s2)`` (FedAUC §5.3).

    With ``r = u′ + v′``, ``u′ = mean(r)·1``, ``v′ = r - u′``,
    ``a = ‖u′‖∞``, ``b = ‖v′‖∞`` and ``s1 ~ Lap(1/(βε))``, ``s2 ~ Lap(1/((1-β)ε))``,
    the variance ``2a²/(βε)² + 2b²/((1-β)ε)²`` is minimal at
    ``β = a^{2/3} / (a^{2/3} + b^{2/3})`` (closed form of the paper's heuristic).
    ``β = 1`` when ``b = 0`` (all ranks equal: ``localSum = r·localP``, the
    one-sample case of §5.3). Depends on the public ranks only.
    """
    r: NDArray[np.float64] = np.asarray(ranks, dtype=np.float64)
    if r.size == 0:
        return 1.0
    mean = float(r.mean())
    a = abs(mean)
    b = float(np.max(np.abs(r - mean)))
    if b == 0.0:
        return 1.0
    if a == 0.0:
        return 0.0
    a23, b23 = a ** (2.0 / 3.0), b ** (2.0 / 3.0)
    return float(a23 / (a23 + b23))


@dataclass(frozen=True, init=False)
class FedAUCLaplaceParams:
    """Privacy parameters of FedAUC_Lap (§5.2-5.3); validated on construction.

    Parameters
    ----------
    epsilon : float
        Per-client budget ``ε > 0`` for ``(localSum, localP)`` (``inf``: no noise).
    sensitivity : {"local", "global"}, default="local"
        ``Δ_localSum``: ``"local"`` = the client's maximum rank (LocalLaplace,
        §5.2), ``"global"`` = ``M-1`` for every client (GlobalLaplace, Appendix N).
    allocation : {"alpha", "orthogonal"}, default="orthogonal"
        ``"alpha"``: independent noise, ``ε_localSum = αε``,
        ``ε_localP = (1-α)ε`` (§5.2). ``"orthogonal"``: decomposition
        ``r = u′ + v′`` with ``⟨u,y⟩`` at ``βε`` and ``⟨v′,y⟩`` at ``(1-β)ε``
        (§5.3); local sensitivities only.
    alpha : float, default=0.5
        In (0, 1); used with ``allocation="alpha"`` (the paper's choice 0.5).
    beta : float or "adaptive", default="adaptive"
        In (0, 1], or ``"adaptive"`` for :func:`adaptive_beta` per client;
        used with ``allocation="orthogonal"``.
    """

    epsilon: float
    sensitivity: str
    allocation: str
    alpha: float
    beta: float | str

    def __init__(self, epsilon: float, *, sensitivity: str = "local", allocation: str = "orthogonal",
                 alpha: float = 0.5, beta: float | str = "adaptive"):
        epsilon = check_epsilon(epsilon)
        if sensitivity not in ("local", "global"):
            raise ValueError(f"sensitivity must be 'local' or 'global', got {sensitivity!r}")
        if allocation not in ("alpha", "orthogonal"):
            raise ValueError(f"allocation must be 'alpha' or 'orthogonal', got {allocation!r}")
        if allocation == "orthogonal" and sensitivity != "local":
            raise ValueError("allocation='orthogonal' uses local sensitivities; it requires sensitivity='local'")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be a number in (0, 1), got {alpha!r}")
        if beta != "adaptive":
            if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 < beta <= 1.0:
                raise ValueError(f"beta must be 'adaptive' or a number in (0, 1], got {beta!r}")
            beta = float(beta)
        for k, v in dict(epsilon=epsilon, sensitivity=sensitivity, allocation=allocation,
                         alpha=float(alpha), beta=beta).items():
            object.__setattr__(self, k, v)

    @property
    def variant(self) -> str:
        """Name recorded in results: ``local-alpha``, ``global-alpha``, ``local-orthogonal``, ``local-adaptive``."""
        if self.allocation == "alpha":
            return f"{self.sensitivity}-alpha"
        return "local-adaptive" if self.beta == "adaptive" else "local-orthogonal"

    def summary(self) -> str:
        extra = f"alpha={self.alpha}" if self.allocation == "alpha" else f"beta={self.beta}"
        return f"FedAUC_Lap[{self.variant}]: epsilon={self.epsilon:g} per client, {extra}"


def fedauc_laplace_client(
    ranks: ArrayLike,
    labels: ArrayLike,
    params: FedAUCLaplaceParams,
    *,
    max_rank: float | None = None,
    accountant: BudgetAccountant | None = None,
    random_state: RandomStateLike = None,
    sampler: Sampler = "vectorised",
) -> LocalStats:
    """Client step 3 of FedAUC_Lap: noisy ``localSum′``, ``localP′``, ``localN′ = n_k - localP′``.

    Parameters
    ----------
    ranks : array-like of shape (n_k,)
        Global ranks of this client's samples (after :func:`fedauc_unshuffle_ranks`).
    labels : array-like of shape (n_k,)
        True labels in {0, 1}; single-class and empty clients are fine.
    params : FedAUCLaplaceParams
    max_rank : float, keyword-only
        ``M-1``, public; required for ``sensitivity="global"``.
    accountant, random_state, sampler : keyword-only
        As in :func:`flwr_fedeval.dp.dpauc.dpauc_laplace_client`; the
        accountant is charged ``params.epsilon`` before noise is drawn.

    Returns
    -------
    LocalStats
        With ``epsilon = inf`` exactly :func:`fedauc_local_stats`. An empty
        client returns ``(0, 0, 0)`` without noise (nothing to protect).

    Raises
    ------
    TypeError
        If ``params`` is not a :class:`FedAUCLaplaceParams`, or ``accountant``
        is neither ``None`` nor a diffprivlib ``BudgetAccountant``.
    ValueError
        If ``ranks`` and ``labels`` are not 1-D of equal length, a label is not
        0 or 1, or a rank is negative; with ``sensitivity="global"``, if
        ``max_rank`` is missing or a rank exceeds it; with
        ``allocation="orthogonal"``, if a fixed β of 1 leaves the non-zero
        component ``‖v′‖∞`` without budget; if ``sampler`` is unknown and noise
        is drawn (checked after the accountant was charged).
    diffprivlib.utils.BudgetError
        If the accountant cannot afford ``params.epsilon``; nothing is drawn
        and the accountant is unchanged.

    Notes
    -----
    ``"alpha"``: ``localSum′ = Σ r y + Lap(Δ/(αε))``, ``localP′ = P + Lap(1/((1-α)ε))``.
    ``"orthogonal"``: ``s1 ~ Lap(1/(βε))``, ``s2 ~ Lap(1/((1-β)ε))``,
    ``localP′ = P + s1``, ``localSum′ = Σ r y + ‖u′‖∞·s1 + ‖v′‖∞·s2``
    (``⟨u′,y⟩ + ⟨v′,y⟩ = Σ r y`` is computed directly, which is exact at zero noise).
    """
    if not isinstance(params, FedAUCLaplaceParams):
        raise TypeError(f"params must be FedAUCLaplaceParams, got {type(params).__name__}")
    ranks, y = _check_ranks_labels(ranks, labels)
    exact = fedauc_local_stats(ranks, y)
    n = float(y.size)
    rng = client_random_state(random_state)
    eps = params.epsilon
    if y.size == 0:
        # No label to protect (sensitivities are 0): release exact zeros; the
        # accountant is still charged so every client's spend is the same.
        charge(accountant, eps)
        return exact

    if params.allocation == "alpha":
        if params.sensitivity == "global":
            if max_rank is None:
                raise ValueError("sensitivity='global' needs max_rank = M - 1 (public)")
            if ranks.size and ranks.max() > max_rank:
                raise ValueError(f"a rank exceeds max_rank={max_rank}")
            delta = float(max_rank)
        else:
            delta = float(ranks.max()) if ranks.size else 0.0
        m_sum = laplace_mechanism(params.alpha * eps, delta, rng)
        m_p = laplace_mechanism((1.0 - params.alpha) * eps, 1.0, rng)
        charge(accountant, eps)
        local_sum = float(laplace_randomise(np.array([exact.local_sum]), m_sum, rng, sampler=sampler)[0])
        local_p = float(laplace_randomise(np.array([exact.local_p]), m_p, rng, sampler=sampler)[0])
        return LocalStats(local_sum, local_p, n - local_p)

    beta = adaptive_beta(ranks) if isinstance(params.beta, str) else float(params.beta)  # str: "adaptive"
    mean = float(ranks.mean()) if ranks.size else 0.0
    a = abs(mean)
    b = float(np.max(np.abs(ranks - mean))) if ranks.size else 0.0
    m1 = laplace_mechanism(beta * eps, 1.0, rng) if beta > 0 else None
    m2 = laplace_mechanism((1.0 - beta) * eps, 1.0, rng) if beta < 1 else None
    if (m1 is None and a > 0) or (m2 is None and b > 0):
        raise ValueError(f"beta={beta} leaves a non-zero component without budget")
    charge(accountant, eps)
    s1 = float(laplace_randomise(np.zeros(1), m1, rng, sampler=sampler)[0]) if m1 is not None else 0.0
    s2 = float(laplace_randomise(np.zeros(1), m2, rng, sampler=sampler)[0]) if m2 is not None else 0.0
    local_p = exact.local_p + s1
    local_sum = exact.local_sum + a * s1 + b * s2
    return LocalStats(local_sum, local_p, n - local_p)


def _sum_stats(client_stats: Sequence[LocalStats]) -> tuple[float, float, float]:
    if len(client_stats) == 0:
        raise ValueError("no client statistics to aggregate")
    arr = np.asarray([tuple(s) for s in client_stats], dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError("each client must report (local_sum, local_p, local_n)")
    g_sum, g_p, g_n = arr.sum(axis=0)
    return float(g_sum), float(g_p), float(g_n)


def _rank_auc(g_sum: float, g_p: float, g_n: float) -> float:
    return (g_sum - g_p * (g_p - 1.0) / 2.0) / (g_p * g_n)


def fedauc_server_auc(
    client_stats: Sequence[LocalStats],
    *,
    method: str = "fedauc-laplace",
    variant: str = "plaintext",
    epsilon: float = math.nan,
) -> AUCEstimate:
    """Server step 4: ``AUC = (globalSum - P̄(P̄-1)/2) / (P̄·N̄)`` (Eq. 1, Algorithm 4).

    Parameters
    ----------
    client_stats : sequence of LocalStats
        Noisy or exact statistics, one per client.
    method, variant, epsilon : keyword-only
        Recorded in the result (use ``params.variant`` for FedAUC_Lap).

    Returns
    -------
    AUCEstimate
        Undefined (NaN + warning) when ``P̄ <= 0`` or ``N̄ <= 0`` (no positive or
        no negative sample, or noise drove the estimate non-positive).
    """
    g_sum, g_p, g_n = _sum_stats(client_stats)
    details = {"global_sum": g_sum, "global_p": g_p, "global_n": g_n}
    if g_p <= 0 or g_n <= 0:
        return undefined_estimate(method, variant, epsilon, f"P̄={g_p:.6g}, N̄={g_n:.6g} are not both positive",
                                  **details)
    return AUCEstimate(auc=_rank_auc(g_sum, g_p, g_n), method=method, variant=variant, epsilon=epsilon,
                       details=details)


def fedauc_rr_server(client_stats: Sequence[LocalStats], params: RandomizedResponseParams) -> AUCEstimate:
    """Server steps of FedAUC_RR: noisy AUC on flipped labels (Algorithm 2), then Algorithm 3.

    Returns
    -------
    AUCEstimate
        ``details["noisy_auc"]`` is the AUC before debiasing. Undefined (NaN +
        warning) when the flipped labels are single-class or the estimated
        clean base rate is not in (0, 1).
    """
    method, variant = "fedauc-rr", "debiased"
    g_sum, g_p, g_n = _sum_stats(client_stats)
    details = {"global_sum": g_sum, "noisy_p": g_p, "noisy_n": g_n}
    if g_p <= 0 or g_n <= 0:
        return undefined_estimate(method, variant, params.epsilon,
                                  f"flipped labels have P̄={g_p:g}, N̄={g_n:g}", **details)
    noisy = _rank_auc(g_sum, g_p, g_n)
    d = menon_debias(noisy, g_p, g_n, params.epsilon)
    details.update(noisy_auc=noisy, p_est=d.p_est, n_est=d.n_est, rho=d.rho)
    if d.auc is None:
        return undefined_estimate(method, variant, params.epsilon, d.reason, **details)
    return AUCEstimate(auc=float(d.auc), method=method, variant=variant, epsilon=params.epsilon, details=details)
