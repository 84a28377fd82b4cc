"""Evaluation phase after training: the global ROC AUC from summed counts.

The plaintext phase (this module) is the reference protocol: every client
computes TP/FP/TN/FN of its own test split at N public decision points; the
server sums them and computes the trapezoid AUC (Baykara et al. 2025,
Eqs. 2-3). It reveals every client's counts to the server; the FHE and DP
phases replace exactly this step.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_fedeval.fhe.counts import ConfusionCounts, decision_points
from flwr_fedeval.messages import EVALUATE_THRESHOLD_COUNTS, counts_from_record
from flwr_fedeval.metrics.auc import auc_from_counts, resolution_bound
from flwr_fedeval.strategies.exchange import exchange

__all__ = ["AUCPhaseResult", "PlaintextAUCPhase"]


@dataclass
class AUCPhaseResult:
    """Outcome of an AUC evaluation phase.

    Attributes
    ----------
    auc : float
        The global AUC over all contributing clients.
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
    details: dict = field(default_factory=dict)
    resolution_bound: float = math.nan

    @property
    def label(self) -> str:
        """``method`` plus its variant, CKKS engine and ε when recorded, e.g.
        ``dpauc-laplace[clip-sort, eps=1]``, ``fhe[malicious, openfhe]``."""
        extra = [str(self.details[k]) for k in ("variant", "backend") if k in self.details]
        if "epsilon" in self.details:
            extra.append(f"eps={self.details['epsilon']:g}")
        return f"{self.method}[{', '.join(extra)}]" if extra else self.method


class PlaintextAUCPhase:
    """Global AUC from plaintext threshold counts (the reference phase).

    Parameters
    ----------
    num_decision_points : int, default=100
        N, the number of public decision points.
    spacing : {"linear", "logit"}, default="linear"
        See :func:`flwr_fedeval.fhe.counts.decision_points`.
    min_nodes : int, default=2
        Fewer contributing clients than this raises ``RuntimeError``.
    arrayrecord_key : str, default="arrays"
    timeout : float, default=3600
        Seconds to wait for the replies.
    """

    message_type = EVALUATE_THRESHOLD_COUNTS

    def __init__(
        self,
        num_decision_points: int = 100,
        *,
        spacing: str = "linear",
        min_nodes: int = 2,
        arrayrecord_key: str = "arrays",
        timeout: float = 3600,
    ) -> None:
        self.thresholds = decision_points(num_decision_points, spacing=spacing)  # type: ignore[arg-type]
        self.min_nodes = min_nodes
        self.arrayrecord_key = arrayrecord_key
        self.timeout = timeout

    def run(self, grid: Grid, arrays: ArrayRecord) -> AUCPhaseResult:
        """Send the global model and thresholds to every node, sum, compute AUC.

        Raises
        ------
        RuntimeError
            If fewer than ``min_nodes`` clients return valid counts.
        flwr_fedeval.metrics.auc.UndefinedAUCError
            If the pooled test data has a single class.
        """
        node_ids = sorted(grid.get_node_ids())
        content = RecordDict(
            {
                self.arrayrecord_key: arrays,
                "evaluation": ArrayRecord({"thresholds": Array(self.thresholds)}),
            }
        )
        failed: dict[int, str] = {}
        valid = exchange(
            grid,
            dict.fromkeys(node_ids, content),
            self.message_type,
            lambda node, reply: counts_from_record(reply["counts"], self.thresholds.size),
            failed,
            what="counts",
            phase="plain",
            timeout=self.timeout,
        )
        contributors = sorted(valid)
        total: ConfusionCounts | None = None
        for node in contributors:
            total = valid[node] if total is None else total + valid[node]
        if total is None or len(contributors) < self.min_nodes:
            raise RuntimeError(
                f"AUC phase: {len(contributors)} valid replies, at least {self.min_nodes} needed"
            )
        auc = auc_from_counts(total)
        bound = resolution_bound(total)
        log(INFO, "AUC phase (plain): %d clients, %d decision points, global AUC %.6f (resolution bound %.2g)",
            len(contributors), self.thresholds.size, auc, bound)
        return AUCPhaseResult(auc, self.thresholds, total, sorted(contributors), failed, resolution_bound=bound)
