"""Evaluation phase after training: the global ROC AUC from summed counts.

The plaintext phase (this module) is the reference protocol: every client
computes TP/FP/TN/FN of its own test split at N public decision points; the
server sums them and computes the trapezoid AUC (Baykara et al. 2025,
Eqs. 2-3). It reveals every client's counts to the server; the FHE and DP
phases replace exactly this step. A join step comes first
(:func:`join_participants`): the members sign their joining, and each client
checks the signed list before it answers.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_fedeval.metrics.auc import auc_from_counts, resolution_bound
from flwr_fedeval.metrics.counts import ConfusionCounts, decision_points
from flwr_fedeval.protocol import ARRAYS_KEY, Payload, Step
from flwr_fedeval.protocol.auc import (
    JOIN,
    THRESHOLD_COUNTS,
    JoinReply,
    JoinRequest,
    SignedParticipants,
    ThresholdCounts,
    ThresholdCountsRequest,
)
from flwr_fedeval.strategies.base import EvaluationPhase

__all__ = ["AUCPhaseResult", "PlaintextAUCPhase", "join_participants", "with_model"]


def join_participants(phase: EvaluationPhase[Any], grid: Grid, nodes: list[int],
                      step: Step) -> tuple[SignedParticipants | None, list[int]]:
    """The join step of the plaintext and DP phases: ``(signed list, participants)``.

    Every node signs its joining of a fresh session; the list of the signers (roster-name order,
    each with its signature) goes with the evaluation request, and each client checks it
    (:func:`flwr_fedeval.clients.identity.check_participants`). Nodes configured without a roster
    identity reply unsigned: if none signed, there is no list (``None``) and every node that
    replied takes part; otherwise only the signers do, and the others are named in the phase's
    failures. Two nodes signing as one roster member are both left out.
    """
    session = secrets.token_hex(16)
    replies = phase.exchange(grid, dict.fromkeys(nodes, JoinRequest(session).to_record()), step.message_type,
                             lambda node, content: JoinReply.from_record(content, node=node), step="join",
                             what="join")
    signed = {n: r for n, r in replies.items() if r.signed}
    if not signed:
        return None, sorted(replies)
    by_name: dict[str, list[int]] = {}
    for node, reply in signed.items():
        by_name.setdefault(str(reply.signer), []).append(node)
    for node in replies:
        if node not in signed:
            phase.failures[node] = "no roster identity: not in the members' signed participant list"
    for name, members in by_name.items():
        if len(members) > 1:
            for node in members:
                phase.failures[node] = f"two nodes sign as roster member {name!r}"
    kept = sorted(ms[0] for ms in by_name.values() if len(ms) == 1)
    listed = SignedParticipants.of(session, [signed[n] for n in kept])
    log(INFO, "%s: signed participant list of %d: %s", phase.label, len(listed.names), ", ".join(listed.names))
    return listed, kept


def with_model(arrays: ArrayRecord, arrayrecord_key: str, request: Payload) -> RecordDict:
    """The content of a request that carries the global model: Flower's model record under
    ``arrayrecord_key`` first, then the records of ``request``."""
    return RecordDict({arrayrecord_key: arrays, **request.to_record()})


@dataclass
class AUCPhaseResult:
    """Outcome of an AUC evaluation phase.

    Attributes
    ----------
    auc : float
        The global AUC over all contributing clients; ``nan`` when the server does not learn it (an
        FHE AUC the clients keep): ``str(result)`` says why and how to change it.
    thresholds : ndarray of shape (N,)
    counts : ConfusionCounts or None
        The summed counts, when the phase reveals them (plaintext only).
    contributors : list of int
        Node IDs whose data is in the result.
    failed : dict of int to str
        Node IDs that did not contribute, with the reason.
    method : str
        The ``auc-method`` that produced ``auc``.
    details : dict
        What else a reader of the number needs (JSON-serialisable), e.g. for
        the DP phases ``variant`` (clipping / sensitivity option), ``epsilon``,
        ``defined`` and the intermediate public values.
    resolution_bound : float
        Certified ``|AUC_true − auc| <= resolution_bound``
        (:func:`flwr_fedeval.metrics.auc.resolution_bound`); ``nan`` when
        the phase does not know it (DP phases, FHE AUC not shared).
    """

    auc: float
    thresholds: np.ndarray
    counts: ConfusionCounts | None
    contributors: list[int]
    failed: dict[int, str] = field(default_factory=dict)
    method: str = "plain"
    details: dict[str, Any] = field(default_factory=dict[str, Any])
    resolution_bound: float = math.nan

    def to_metric_record(self) -> MetricRecord:
        """The result as Flower metrics (``Result.evaluate_metrics_serverapp``, see
        :meth:`~flwr_fedeval.strategies.base.EvaluationPhase.evaluate_fn`).

        Keys: ``auc`` (float in [0, 1]; absent when the phase does not reveal it, e.g. an FHE AUC not
        shared with the server), ``auc-resolution-bound`` (float; absent when unknown),
        ``auc-num-clients`` and ``auc-num-failed`` (int), ``auc-epsilon`` (float, per-client ε of the
        DP phases). The full result (method, details, contributors) stays on this object.
        """
        out = MetricRecord({"auc-num-clients": len(self.contributors), "auc-num-failed": len(self.failed)})
        for key, value in (("auc", self.auc), ("auc-resolution-bound", self.resolution_bound),
                           ("auc-epsilon", self.details.get("epsilon", math.nan))):
            if isinstance(value, (int, float)) and math.isfinite(value):
                out[key] = float(value)
        return out

    def __str__(self) -> str:
        """One readable line (:func:`flwr_fedeval.reporting.auc_summary`): the AUC with its resolution
        bound and, above 0.01, the fix; or why the server does not know it and how to change that."""
        from flwr_fedeval.reporting import auc_summary

        return auc_summary(self)

    @property
    def label(self) -> str:
        """``method`` plus its variant, CKKS engine and ε when recorded, e.g.
        ``dpauc-laplace[clip-sort, eps=1]``, ``fhe[malicious, openfhe]``."""
        extra = [str(self.details[k]) for k in ("variant", "backend") if k in self.details]
        if "epsilon" in self.details:
            extra.append(f"eps={self.details['epsilon']:g}")
        return f"{self.method}[{', '.join(extra)}]" if extra else self.method


class PlaintextAUCPhase(EvaluationPhase[Any]):
    """Global AUC from plaintext threshold counts (the reference phase).

    One step: ``evaluate.threshold_counts`` with the global model and the N
    public decision points to every node; each replies its TP/FP/TN/FN; the
    server checks and sums them and computes the trapezoid AUC (Baykara et
    al. 2025, Eqs. 2-3).

    Parameters
    ----------
    num_decision_points : int, default=100
        N, the number of public decision points.
    spacing : {"linear", "logit"}, default="linear"
        See :func:`flwr_fedeval.metrics.counts.decision_points`.
    min_nodes : int, default=2
        Fewer contributing clients than this raises ``RuntimeError``.
    arrayrecord_key : str, default="arrays"
    timeout : float, default=3600
        Seconds to wait for the replies.

    Raises
    ------
    ValueError
        For an invalid ``num_decision_points``, ``spacing``, ``min_nodes`` or ``timeout``.
    """

    method = "plain"
    message_type = THRESHOLD_COUNTS.message_type

    def __init__(
        self,
        num_decision_points: int = 100,
        *,
        spacing: str = "linear",
        min_nodes: int = 2,
        arrayrecord_key: str = ARRAYS_KEY,
        timeout: float = 3600,
    ) -> None:
        super().__init__(min_nodes=min_nodes, arrayrecord_key=arrayrecord_key, timeout=timeout)
        self.thresholds = decision_points(num_decision_points, spacing=spacing)  # type: ignore[arg-type]
        self.spacing = spacing

    def _summary_items(self) -> list[tuple[str, str]]:
        return [("Decision points", f"N={self.thresholds.size} ({self.spacing})"),
                ("AUC known to", "the server (it sees every client's counts)"), *super()._summary_items()]

    def collect_counts(self, grid: Grid, arrays: ArrayRecord, nodes: list[int],
                       participants: SignedParticipants | None = None) -> dict[int, ConfusionCounts]:
        """The step: global model, decision points and the signed participant list to ``nodes``;
        their checked counts."""
        content = with_model(arrays, self.arrayrecord_key, ThresholdCountsRequest(self.thresholds, participants))
        return self.exchange(
            grid,
            dict.fromkeys(nodes, content),
            self.message_type,
            lambda node, reply: ThresholdCounts.from_record(reply, node=node, num_points=self.thresholds.size).counts(),
            step="threshold counts",
            what="counts",
        )

    def run(self, grid: Grid, arrays: ArrayRecord) -> AUCPhaseResult:
        """Send the global model and thresholds to every node, sum, compute AUC.

        Raises
        ------
        RuntimeError
            If fewer than ``min_nodes`` clients return valid counts.
        flwr_fedeval.metrics.auc.UndefinedAUCError
            If the pooled test data has a single class.
        """
        self._start_run()
        self.summary()
        with self.step("join"):
            listed, nodes = join_participants(self, grid, sorted(grid.get_node_ids()), JOIN)
        self.require(nodes, "(join)")
        with self.step("threshold counts"):
            valid = self.collect_counts(grid, arrays, nodes, listed)
        contributors = sorted(valid)
        self.require(contributors, "(threshold counts)")
        total: ConfusionCounts = valid[contributors[0]]
        for node in contributors[1:]:
            total = total + valid[node]
        auc = auc_from_counts(total)
        bound = resolution_bound(total)
        log(INFO, "AUC phase (plain): %d clients, %d decision points, global AUC %.6f (resolution bound %.2g)",
            len(contributors), self.thresholds.size, auc, bound)
        return AUCPhaseResult(auc, self.thresholds, total, contributors, self.failures.reasons(),
                              resolution_bound=bound)
