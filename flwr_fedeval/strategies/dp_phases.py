"""Evaluation phases for the differential-privacy AUC baselines (server side).

Four phases, one per ``auc-method``; the DP math is in :mod:`flwr_fedeval.dp`,
the client handlers in :mod:`flwr_fedeval.clients.dp_handlers`.

==================  ==========================================  =============================
``auc-method``      class                                       message types
==================  ==========================================  =============================
``dpauc-laplace``   :class:`DPAUCLaplacePhase` (DPAUC_Lap)      ``evaluate.dpauc_laplace``
``dpauc-rr``        :class:`DPAUCRRPhase` (DPAUC_RR)            ``evaluate.dpauc_rr``
``fedauc-rr``       :class:`FedAUCRRPhase` (FedAUC_RR)          ``evaluate.fedauc_scores``,
                                                                ``evaluate.fedauc_stats``
``fedauc-laplace``  :class:`FedAUCLaplacePhase` (FedAUC_Lap)    same two
==================  ==========================================  =============================

Each phase starts with a join step
(:func:`~flwr_fedeval.strategies.auc_phase.join_participants`: the members sign
their joining; each client checks the signed list before it answers), sends to
the participants, splits the replies into valid and failed
(no reply, error reply — e.g. ``BudgetError`` — or a malformed reply; each
logged with the node ID), raises ``RuntimeError`` when fewer than
``min_nodes`` clients contribute, and returns an
:class:`~flwr_fedeval.strategies.auc_phase.AUCPhaseResult` whose ``details``
record the variant, ε and the public intermediate values. The server never
sees exact counts (DPAUC_Lap), true labels (RR) or which score belongs to
which sample (FedAUC: clients shuffle before sending).

References
----------
Sun et al., "DPAUC: Differentially Private AUC Computation in Federated
Learning", AAAI 2023. Sun et al., "Differentially Private AUC Computation in
Vertical Federated Learning" (FedAUC).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Collection
from logging import INFO, WARNING
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from numpy.typing import ArrayLike

from flwr_fedeval import constraints
from flwr_fedeval.constraints import Choices, Interval
from flwr_fedeval.metrics.counts import SPACINGS, decision_points
from flwr_fedeval.protocol import ARRAYS_KEY, ReplyCode
from flwr_fedeval.protocol.auc import ThresholdCounts
from flwr_fedeval.protocol.dp_auc import (
    DP_JOIN,
    DPAUC_LAPLACE,
    DPAUC_RR,
    FEDAUC_SCORES,
    FEDAUC_STATS,
    DPAUCRequest,
    FedAUCScoresRequest,
    FedAUCStatsRequest,
    LocalStatsReply,
    NoisyCounts,
    ShuffledScores,
)
from flwr_fedeval.strategies.auc_phase import AUCPhaseResult, join_participants, with_model
from flwr_fedeval.strategies.base import EvaluationPhase, Failures

__all__ = ["DPAUCLaplacePhase", "DPAUCRRPhase", "FedAUCLaplacePhase", "FedAUCRRPhase"]

if TYPE_CHECKING:  # flwr_fedeval.dp imports diffprivlib and scikit-learn: loaded when a DP phase runs
    from flwr_fedeval.dp import AUCEstimate, LocalStats
    from flwr_fedeval.dp.dpauc import Clipping


def _details(estimate: AUCEstimate, failures: Failures, **extra: Any) -> dict[str, Any]:
    """JSON-friendly record of how the number was produced."""
    details = {
        "variant": estimate.variant,
        "epsilon": float(estimate.epsilon),
        "defined": estimate.defined,
        "reason": estimate.reason,
        **{k: float(v) for k, v in estimate.details.items()},
        **extra,
    }
    refused = sorted(failures.with_code(ReplyCode.BUDGET_EXHAUSTED))
    if refused:
        details["budget_refused"] = refused
    return details


class _DPPhase(EvaluationPhase[Any]):
    """Shared configuration and bookkeeping of the DP phases (see the subclasses)."""

    label = "AUC phase"

    def _finish(self, estimate: AUCEstimate, thresholds: ArrayLike, contributors: Collection[int],
                **extra: Any) -> AUCPhaseResult:
        log(INFO, "AUC phase (%s, %s, eps=%g): %d clients, AUC %.6f%s", self.method, estimate.variant,
            estimate.epsilon, len(contributors), estimate.auc, "" if estimate.defined else f" ({estimate.reason})")
        return AUCPhaseResult(
            auc=float(estimate.auc),
            thresholds=np.asarray(thresholds, dtype=np.float64),
            counts=None,
            contributors=sorted(contributors),
            failed=self.failures.reasons(),
            method=self.method,
            details=_details(estimate, self.failures, **extra),
            resolution_bound=float(estimate.details.get("resolution_bound", math.nan)),
        )


class _ThresholdDPPhase(_DPPhase):
    """DPAUC phases: the plaintext phase's request plus a ``dp`` ConfigRecord."""

    message_type = ""

    def __init__(self, num_decision_points: int = 100, *, spacing: str = "linear",
                 min_nodes: int = 2, arrayrecord_key: str = ARRAYS_KEY, timeout: float = 3600) -> None:
        super().__init__(min_nodes=min_nodes, arrayrecord_key=arrayrecord_key, timeout=timeout)
        self.thresholds = decision_points(num_decision_points, spacing=spacing)  # type: ignore[arg-type]
        self.spacing = spacing

    def _collect(self, grid: Grid, arrays: ArrayRecord, epsilon: float, reply: type[NoisyCounts | ThresholdCounts],
                 what: str) -> dict[int, Any]:
        """The one step: global model, decision points and ε to every node; their checked ``reply``."""
        self._start_run()
        self.summary()
        with self.step("join"):
            listed, nodes = join_participants(self, grid, sorted(grid.get_node_ids()), DP_JOIN)
        self.require(nodes, "(join)")
        content = with_model(arrays, self.arrayrecord_key, DPAUCRequest(self.thresholds, epsilon, listed))
        n = self.thresholds.size
        with self.step(what):
            valid = self.exchange(grid, dict.fromkeys(nodes, content), self.message_type,
                                  lambda node, c: reply.from_record(c, node=node, num_points=n),
                                  step=what, what=what)
        self.require(valid, f"({what})")
        return valid


class DPAUCLaplacePhase(_ThresholdDPPhase):
    """DPAUC_Lap: Laplace-noised threshold counts, trapezoid AUC (Sun et al., AAAI 2023).

    Every client adds Laplace(1/ε′) noise to TP, FP, TN, FN at each of the N
    public decision points, with ``ε = 4Nε′`` its total for this evaluation;
    the server sums and integrates TPR over FPR.

    Parameters
    ----------
    num_decision_points : int, default=100
        N = |Θ|, the number of public decision points.
    epsilon : float, default=1.0
        Per-client ε of one evaluation (``math.inf`` = no noise). Each
        client's own accountant decides whether it can pay.
    clipping : {"clip-sort", "no-clip"}, default="clip-sort"
        ``"clip-sort"``: the authors' code (negative sums clipped to 0, points
        sorted by FPR, AUC in [0, 1]); ``"no-clip"``: the FHE paper's numbers.
        Recorded as ``details["variant"]``.
    spacing : {"linear", "logit"}, default="linear"
    min_nodes : int, default=2
        Fewer contributing clients than this raises ``RuntimeError``.
    arrayrecord_key : str, default="arrays"
    timeout : float, default=3600
    """

    method = "dpauc-laplace"
    message_type = DPAUC_LAPLACE.message_type
    #: What each parameter accepts (:mod:`flwr_fedeval.constraints`); ``math.inf`` ε = no noise.
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "num_decision_points": [Interval(Integral, 2, None, closed="left")],
        "epsilon": [Interval(Real, 0, math.inf, closed="right")],
        "clipping": [Choices(("clip-sort", "no-clip"))],
        "spacing": [Choices(SPACINGS)],
    }

    def __init__(self, num_decision_points: int = 100, *, epsilon: float = 1.0, clipping: str = "clip-sort",
                 spacing: str = "linear", min_nodes: int = 2, arrayrecord_key: str = ARRAYS_KEY,
                 timeout: float = 3600) -> None:
        constraints.check_params(type(self), {"num_decision_points": num_decision_points, "epsilon": epsilon,
                                              "clipping": clipping, "spacing": spacing})
        super().__init__(num_decision_points, spacing=spacing,
                         min_nodes=min_nodes, arrayrecord_key=arrayrecord_key, timeout=timeout)
        from flwr_fedeval.dp import DPAUCLaplaceParams
        self.params = DPAUCLaplaceParams(epsilon, self.thresholds.size)  # validates epsilon
        self.clipping: Clipping = "no-clip" if clipping == "no-clip" else "clip-sort"  # checked above

    def _summary_items(self) -> list[tuple[str, str]]:
        return [("Mechanism", self.params.summary()), ("Clipping", self.clipping),
                ("Decision points", f"N={self.thresholds.size} ({self.spacing})"), *super()._summary_items()]

    def run(self, grid: Grid, arrays: ArrayRecord) -> AUCPhaseResult:
        """Collect noisy counts from every node and compute the DPAUC_Lap estimate.

        Raises
        ------
        RuntimeError
            If fewer than ``min_nodes`` clients return valid noisy counts.
        """
        n = self.thresholds.size
        valid = self._collect(grid, arrays, self.params.epsilon, NoisyCounts, "noisy counts")
        from flwr_fedeval.dp import dpauc_laplace_server
        estimate = dpauc_laplace_server([valid[k].values() for k in sorted(valid)], clipping=self.clipping,
                                        epsilon=self.params.epsilon)
        if estimate.details.get("noise_swamped"):
            d = estimate.details
            log(WARNING, "DPAUC_Lap: the noise swamps the counts (std %.3g rows per summed count at eps=%g, N=%d, "
                "%d clients, against ~%.0f ± %.0f rows of the smaller class, estimated from the noisy sums): the "
                "AUC %.4f is not meaningful. Use eps >= ~%.3g, fewer decision points, or >= %.0f test rows of each "
                "class", d["noise_std"], self.params.epsilon, n, len(valid), d["noise_smaller_class"],
                d["noise_smaller_class_std"], estimate.auc, d["noise_min_epsilon"], d["noise_min_class_rows"])
        return self._finish(estimate, self.thresholds, valid, num_decision_points=n)


class DPAUCRRPhase(_ThresholdDPPhase):
    """DPAUC_RR: counts of randomized-response labels, Menon debiasing (Sun et al., AAAI 2023).

    Each client flips its labels once with probability ``1/(1+e^ε)`` (kept
    for later evaluations at the same ε) and sends the exact counts of the
    flipped labels; the server computes the AUC and debiases it with the
    estimated base rate (Menon et al. 2015).

    Parameters
    ----------
    num_decision_points : int, default=100
    epsilon : float, default=1.0
        Per-client ε of the label flip (``math.inf`` = no flips).
    spacing, min_nodes, arrayrecord_key, timeout
        As in :class:`DPAUCLaplacePhase`.
    """

    method = "dpauc-rr"
    message_type = DPAUC_RR.message_type

    def __init__(self, num_decision_points: int = 100, *, epsilon: float = 1.0, spacing: str = "linear",
                 min_nodes: int = 2, arrayrecord_key: str = ARRAYS_KEY, timeout: float = 3600) -> None:
        super().__init__(num_decision_points, spacing=spacing,
                         min_nodes=min_nodes, arrayrecord_key=arrayrecord_key, timeout=timeout)
        from flwr_fedeval.dp import RandomizedResponseParams
        self.params = RandomizedResponseParams(epsilon)

    def _summary_items(self) -> list[tuple[str, str]]:
        return [("Mechanism", f"DPAUC_RR: epsilon={self.params.epsilon:g} per client (flip probability "
                              f"{self.params.flip_probability:.4g})"),
                ("Decision points", f"N={self.thresholds.size} ({self.spacing})"), *super()._summary_items()]

    def run(self, grid: Grid, arrays: ArrayRecord) -> AUCPhaseResult:
        """Collect counts of the flipped labels and compute the debiased AUC.

        Raises
        ------
        RuntimeError
            If fewer than ``min_nodes`` clients return valid counts.
        """
        n = self.thresholds.size
        valid = self._collect(grid, arrays, self.params.epsilon, ThresholdCounts, "counts")
        from flwr_fedeval.dp import dpauc_rr_server
        estimate = dpauc_rr_server([valid[k].counts() for k in sorted(valid)], self.params)
        return self._finish(estimate, self.thresholds, valid, num_decision_points=n)


class _FedAUCPhase(_DPPhase):
    """FedAUC's two round trips: shuffled scores up, ranks down, local stats up.

    Round 1 goes to every node; a node whose budget cannot pay round 2 refuses
    already here, so the ranks cover exactly the round-1 contributors. A
    contributor that fails round 2 invalidates the ranks of all the others
    (its scores are in them): the phase then raises ``RuntimeError``.
    """

    mechanism = ""
    #: ε per client of one evaluation (set by the subclass from its validated parameters).
    epsilon: float

    def __init__(self, *, epsilon: float = 1.0, ties: str = "average",
                 min_nodes: int = 2, arrayrecord_key: str = ARRAYS_KEY, timeout: float = 3600) -> None:
        super().__init__(min_nodes=min_nodes, arrayrecord_key=arrayrecord_key, timeout=timeout)
        if ties not in ("average", "ordinal"):
            raise ValueError(f"ties must be 'average' or 'ordinal', got {ties!r}")
        self.ties = ties

    def _dp_config(self, max_rank: float) -> dict[str, Any]:
        """The Laplace fields of the round-2 request (:class:`~flwr_fedeval.protocol.dp_auc.FedAUCStatsRequest`)."""
        raise NotImplementedError

    def _estimate(self, stats: list[LocalStats]) -> AUCEstimate:
        raise NotImplementedError

    def run(self, grid: Grid, arrays: ArrayRecord) -> AUCPhaseResult:
        """Run both round trips and compute the (debiased / noisy) rank AUC.

        Raises
        ------
        RuntimeError
            If fewer than ``min_nodes`` clients send scores, or a client that
            sent scores does not return valid statistics.
        """
        self._start_run()
        self.summary()
        session = secrets.token_hex(16)
        with self.step("round 1 (shuffled scores)"):
            scores = self.collect_scores(grid, arrays, session)
        self.require(scores, "round 1")
        order = sorted(scores)
        with self.step("global ranks"):
            from flwr_fedeval.dp import fedauc_server_ranks
            ranks = fedauc_server_ranks([scores[k] for k in order], ties=self.ties)  # type: ignore[arg-type]
        num_scores = sum(scores[k].size for k in order)
        with self.step("round 2 (local statistics)"):
            stats = self.collect_stats(grid, session, dict(zip(order, ranks)),
                                       {k: scores[k].size for k in order}, float(max(num_scores - 1, 0)))
        lost = sorted(set(order) - set(stats))
        if lost:
            raise RuntimeError(
                f"AUC phase ({self.method}): node(s) {lost} sent scores but no valid statistics; the global "
                f"ranks include their scores, so the others' statistics cannot be used: "
                f"{'; '.join(self.failures.lines())}"
            )
        estimate = self._estimate([stats[k] for k in order])
        return self._finish(estimate, [], order, ties=self.ties, num_scores=int(num_scores))

    def collect_scores(self, grid: Grid, arrays: ArrayRecord, session: str) -> dict[int, np.ndarray]:
        """Round 1 after the join step: the global model and the signed participant list to the
        participants; each node's shuffled scores (checked)."""
        with self.step("join"):
            listed, nodes = join_participants(self, grid, sorted(grid.get_node_ids()), DP_JOIN)
        self.require(nodes, "(join)")
        request = with_model(arrays, self.arrayrecord_key,
                             FedAUCScoresRequest(session, self.mechanism, self.epsilon, listed))
        return self.exchange(grid, dict.fromkeys(nodes, request), FEDAUC_SCORES.message_type,
                             lambda node, c: ShuffledScores.from_record(c, node=node).scores,
                             step="round 1", what="scores")

    def collect_stats(self, grid: Grid, session: str, ranks: dict[int, np.ndarray], sizes: dict[int, int],
                      max_rank: float) -> dict[int, LocalStats]:
        """Round 2: each round-1 contributor's global ranks; its (noisy) ``(localSum, localP, localN)``."""
        contents = {k: FedAUCStatsRequest(r, session, self.mechanism, self.epsilon, **self._dp_config(max_rank))
                    .to_record() for k, r in ranks.items()}
        from flwr_fedeval.dp import LocalStats
        return self.exchange(grid, contents, FEDAUC_STATS.message_type,
                             lambda node, c: LocalStats(*LocalStatsReply.from_record(c, node=node,
                                                                                     num_scores=sizes[node]).values()),
                             step="round 2", what="stats")


class FedAUCRRPhase(_FedAUCPhase):
    """FedAUC_RR: rank AUC on randomized-response labels, Menon debiasing (FedAUC §4, Alg. 2-3).

    Parameters
    ----------
    epsilon : float, default=1.0
        Per-client ε of the label flip (``math.inf`` = no flips); labels are
        flipped once per ε and shared with DPAUC_RR.
    ties : {"average", "ordinal"}, default="average"
        Tie handling of the global ranks (``"average"`` equals
        ``roc_auc_score`` exactly at ε = ∞).
    min_nodes, arrayrecord_key, timeout
        As in :class:`DPAUCLaplacePhase`.
    """

    method = "fedauc-rr"
    mechanism = "rr"

    def __init__(self, *, epsilon: float = 1.0, ties: str = "average",
                 min_nodes: int = 2, arrayrecord_key: str = ARRAYS_KEY, timeout: float = 3600) -> None:
        super().__init__(ties=ties, min_nodes=min_nodes, arrayrecord_key=arrayrecord_key, timeout=timeout)
        from flwr_fedeval.dp import RandomizedResponseParams
        self.params = RandomizedResponseParams(epsilon)
        self.epsilon = self.params.epsilon

    def _summary_items(self) -> list[tuple[str, str]]:
        return [("Mechanism", f"FedAUC_RR: epsilon={self.epsilon:g} per client"), ("Ties", self.ties),
                *super()._summary_items()]

    def _dp_config(self, max_rank: float) -> dict[str, Any]:
        return {}

    def _estimate(self, stats: list[LocalStats]) -> AUCEstimate:
        from flwr_fedeval.dp import fedauc_rr_server
        return fedauc_rr_server(stats, self.params)


class FedAUCLaplacePhase(_FedAUCPhase):
    """FedAUC_Lap: Laplace-noised ``localSum``/``localP`` (FedAUC §5, Alg. 4).

    Parameters
    ----------
    epsilon : float, default=1.0
        Per-client ε for ``(localSum, localP)`` (``math.inf`` = no noise).
    sensitivity : {"local", "global"}, default="local"
        LocalLaplace (the client's maximum rank) or GlobalLaplace (``M-1``).
    allocation : {"alpha", "orthogonal"}, default="orthogonal"
        Independent noise with the α split, or the orthogonal decomposition
        ``r = u′ + v′`` with β (§5.3; local sensitivity only).
    alpha : float, default=0.5
        ``ε_localSum = αε`` with ``allocation="alpha"``.
    beta : float or "adaptive", default="adaptive"
        β of the orthogonal decomposition, or per client by :func:`~flwr_fedeval.dp.adaptive_beta`.
    ties, min_nodes, arrayrecord_key, timeout
        As in :class:`FedAUCRRPhase`.
    """

    method = "fedauc-laplace"
    mechanism = "laplace"
    #: What each parameter accepts (:mod:`flwr_fedeval.constraints`); relations: :meth:`parameter_relations`.
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "epsilon": [Interval(Real, 0, math.inf, closed="right")],
        "sensitivity": [Choices(("local", "global"))],
        "allocation": [Choices(("alpha", "orthogonal"))],
        "alpha": [Interval(Real, 0, 1, closed="neither")],
        "beta": [Choices(("adaptive",)), Interval(Real, 0, 1, closed="right")],
    }

    @classmethod
    def parameter_relations(cls, **params: Any) -> list[constraints.Problem]:
        """Problems between parameters each valid alone: those :class:`~flwr_fedeval.dp.FedAUCLaplaceParams`
        refuses (the orthogonal allocation needs local sensitivities)."""
        names = ("epsilon", "sensitivity", "allocation", "alpha", "beta")
        full = {name: constraints.default_of(cls, name) for name in names}
        full.update({k: v for k, v in params.items() if k in full})
        try:
            from flwr_fedeval.dp import FedAUCLaplaceParams
            FedAUCLaplaceParams(full.pop("epsilon"), **full)
        except ValueError as exc:
            return [constraints.Problem(("sensitivity", "allocation"), str(exc))]
        return []

    def __init__(self, *, epsilon: float = 1.0, sensitivity: str = "local", allocation: str = "orthogonal",
                 alpha: float = 0.5, beta: float | str = "adaptive", ties: str = "average",
                 min_nodes: int = 2, arrayrecord_key: str = ARRAYS_KEY, timeout: float = 3600) -> None:
        constraints.check_params(type(self), {"epsilon": epsilon, "sensitivity": sensitivity,
                                              "allocation": allocation, "alpha": alpha, "beta": beta})
        super().__init__(ties=ties, min_nodes=min_nodes, arrayrecord_key=arrayrecord_key, timeout=timeout)
        from flwr_fedeval.dp import FedAUCLaplaceParams
        self.params = FedAUCLaplaceParams(epsilon, sensitivity=sensitivity, allocation=allocation,
                                          alpha=alpha, beta=beta)
        self.epsilon = self.params.epsilon

    def _summary_items(self) -> list[tuple[str, str]]:
        return [("Mechanism", self.params.summary()), ("Ties", self.ties), *super()._summary_items()]

    def _dp_config(self, max_rank: float) -> dict[str, Any]:
        p = self.params
        return {"sensitivity": p.sensitivity, "allocation": p.allocation, "alpha": p.alpha,
                "beta": p.beta, "max_rank": max_rank}

    def _estimate(self, stats: list[LocalStats]) -> AUCEstimate:
        from flwr_fedeval.dp import fedauc_server_auc
        return fedauc_server_auc(stats, method=self.method, variant=self.params.variant, epsilon=self.epsilon)

