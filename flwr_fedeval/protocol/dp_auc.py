"""Messages of the differential-privacy AUC baselines: DPAUC_Lap, DPAUC_RR, FedAUC (Sun et al.).

* DPAUC_Lap, ``evaluate.dpauc_laplace``: :class:`DPAUCRequest` in, :class:`NoisyCounts` out;
* DPAUC_RR, ``evaluate.dpauc_rr``: :class:`DPAUCRequest` in,
  :class:`~flwr_fedeval.protocol.auc.ThresholdCounts` (of the flipped labels) out;
* FedAUC round 1, ``evaluate.fedauc_scores``: :class:`FedAUCScoresRequest` in, :class:`ShuffledScores` out;
* FedAUC round 2, ``evaluate.fedauc_stats``: :class:`FedAUCStatsRequest` in, :class:`LocalStatsReply` out;
* join, ``query.dp_join``: :class:`~flwr_fedeval.protocol.auc.JoinRequest` in,
  :class:`~flwr_fedeval.protocol.auc.JoinReply` out: the DPAUC and FedAUC round-1
  requests then carry the members' :class:`~flwr_fedeval.protocol.auc.SignedParticipants`.

Every request carries a ConfigRecord ``dp`` (ε of this evaluation; FedAUC: also the
session and the mechanism); the DPAUC and FedAUC round-1 requests also carry Flower's
model record, added by the server under its ``arrayrecord_key``. The ε a request names
is charged to the client's *own* budget; a request the budget cannot pay is refused
with :class:`BudgetError` (code ``BUDGET_EXHAUSTED``).

References
----------
Sun et al., "DPAUC: Differentially Private AUC Computation in Federated Learning",
AAAI 2023 (DPAUC_Lap, DPAUC_RR). Sun et al., "Differentially Private AUC Computation
in Vertical Federated Learning" (FedAUC: §4 Alg. 2-3 RR, §5 Alg. 4 Laplace).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from flwr_fedeval.protocol._base import (
    MalformedMessage,
    Payload,
    Refused,
    ReplyCode,
    Step,
    array_field,
    array_record,
    config_field,
    config_of,
    config_record,
)
from flwr_fedeval.protocol.auc import (
    JoinReply,
    JoinRequest,
    PointCounts,
    SignedParticipants,
    ThresholdCounts,
    decision_points_entry,
    decision_points_from,
)

__all__ = [
    "BudgetError",
    "DPAUCRequest",
    "DPAUC_LAPLACE",
    "DPAUC_RR",
    "DP_JOIN",
    "DP_KEY",
    "EVALUATE_DPAUC_LAPLACE",
    "EVALUATE_DPAUC_RR",
    "EVALUATE_FEDAUC_SCORES",
    "EVALUATE_FEDAUC_STATS",
    "FEDAUC_KEY",
    "FEDAUC_SCORES",
    "FEDAUC_STATS",
    "FedAUCScoresRequest",
    "FedAUCStatsRequest",
    "LocalStatsReply",
    "MECHANISMS",
    "NOISY_COUNTS_KEY",
    "NoisyCounts",
    "SCORES_KEY",
    "STATS_KEY",
    "STEPS",
    "ShuffledScores",
]

#: DPAUC_Lap: decision points + ε in, Laplace-noised counts (float64) out.
EVALUATE_DPAUC_LAPLACE = "evaluate.dpauc_laplace"
#: DPAUC_RR: decision points + ε in, exact counts of the randomized-response labels out.
EVALUATE_DPAUC_RR = "evaluate.dpauc_rr"
#: FedAUC round 1: global model + session in, the client's shuffled scores out.
EVALUATE_FEDAUC_SCORES = "evaluate.fedauc_scores"
#: FedAUC round 2: global ranks of those scores + DP parameters in, (localSum, localP, localN) out.
EVALUATE_FEDAUC_STATS = "evaluate.fedauc_stats"

#: The DP phases' join step (the plaintext phase's payloads, :mod:`flwr_fedeval.protocol.auc`).
QUERY_DP_JOIN = "query.dp_join"
#: Request record (ConfigRecord) of every DP step: ``epsilon`` (+ FedAUC's ``session``, ``mechanism``, ...).
DP_KEY = "dp"
#: DPAUC_Lap reply record (ArrayRecord): ``tp``/``fp``/``tn``/``fn``, float64, noisy.
NOISY_COUNTS_KEY = "noisy-counts"
#: FedAUC round-1 reply record (ArrayRecord): ``scores``, float64, shuffled.
SCORES_KEY = "scores"
#: FedAUC round-2 request record (ArrayRecord): ``ranks``, the global ranks of the shuffled scores.
FEDAUC_KEY = "fedauc"
#: FedAUC round-2 reply record (ConfigRecord): ``local-sum``, ``local-p``, ``local-n``.
STATS_KEY = "stats"

#: FedAUC's two mechanisms: randomized response on the labels, Laplace noise on the statistics.
MECHANISMS = ("rr", "laplace")
_SENSITIVITIES = ("local", "global")
_ALLOCATIONS = ("alpha", "orthogonal")
_STATS_FIELDS = ("local-sum", "local-p", "local-n")


class BudgetError(Refused):
    """The refusal of a request the node's ε budget (its diffprivlib accountant) cannot pay:
    a :class:`~flwr_fedeval.protocol.Refused` with code ``ReplyCode.BUDGET_EXHAUSTED``.

    Named after diffprivlib's ``BudgetError`` it replaces at the edge, so the error reply
    still reads ``BudgetError: ...``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason, code=ReplyCode.BUDGET_EXHAUSTED)


# ------------------------------------------------------------------ checked fields
def _epsilon(rec: ConfigRecord) -> float:
    """``dp.epsilon``: a number > 0; ``inf`` allowed (no noise)."""
    value = rec.get("epsilon")
    if isinstance(value, float) and value == math.inf:
        return math.inf
    eps = float(config_field(rec, DP_KEY, "epsilon", (int, float)))
    if eps <= 0:
        raise MalformedMessage(f"{DP_KEY}.epsilon", f"{eps!r} must be > 0 (inf disables the noise)")
    return eps


def _session(rec: ConfigRecord) -> tuple[str, str, float]:
    """``(session, mechanism, epsilon)`` of a FedAUC request."""
    return (config_field(rec, DP_KEY, "session", str),
            config_field(rec, DP_KEY, "mechanism", str, choices=MECHANISMS), _epsilon(rec))


def _float_array(rec: ArrayRecord, key: str, name: str, *, minimum: float | None = None) -> np.ndarray:
    """``rec[name]``: finite float64 of shape (n,), every value ``>= minimum`` when given."""
    a = array_field(rec, key, name, dtype=np.float64, shape=(None,), finite=True)
    if minimum is not None and a.size and a.min() < minimum:
        raise MalformedMessage(f"{key}.{name}", f"values below {minimum}")
    return a


# ------------------------------------------------------------------ DPAUC
@dataclasses.dataclass(frozen=True)
class DPAUCRequest(Payload):
    """Request of DPAUC_Lap and DPAUC_RR: the decision points and ε of this evaluation.

    Attributes
    ----------
    thresholds : ndarray of float64, shape (N,)
        Public decision points θ, strictly descending (record ``evaluation``, as the plaintext phase).
    epsilon : float
        ε > 0 charged to the client for this evaluation (``inf``: no noise). DPAUC_Lap splits it over
        the 4N counts (Laplace(4N/ε) each); DPAUC_RR flips the labels with probability 1/(1+e^ε).
    participants : SignedParticipants or None
        ``evaluation-participants``, the members' signed list of the join step.
    """

    LABEL = "DPAUC request"
    thresholds: np.ndarray
    epsilon: float
    participants: SignedParticipants | None = None

    def _to_record(self) -> RecordDict:
        return RecordDict({**decision_points_entry(self.thresholds),
                           DP_KEY: ConfigRecord({"epsilon": float(self.epsilon)}),
                           **(self.participants.entry() if self.participants is not None else {})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> DPAUCRequest:
        return cls(decision_points_from(content), _epsilon(config_record(content, DP_KEY)),
                   SignedParticipants.from_content(content))


@dataclasses.dataclass(frozen=True)
class NoisyCounts(PointCounts):
    """Reply of DPAUC_Lap: Laplace-noised TP/FP/TN/FN (Sun et al., AAAI 2023, DPAUC_Lap step 2).

    Attributes
    ----------
    tp, fp, tn, fn : ndarray of float64, shape (N,)
        Noisy counts at each decision point: finite, possibly negative or fractional.

    Raises (``from_record``)
    ------
    MalformedMessage
        A field missing, not float64 of shape (N,), or NaN/infinite.
    """

    LABEL = "noisy counts"
    KEY = NOISY_COUNTS_KEY
    DTYPE = np.float64


# ------------------------------------------------------------------ FedAUC
@dataclasses.dataclass(frozen=True)
class FedAUCScoresRequest(Payload):
    """Request of FedAUC round 1 (the global model travels alongside, under Flower's key).

    Attributes
    ----------
    session : str
        The phase run's id; round 2 must name the same one.
    mechanism : {"rr", "laplace"}
        Round 2's mechanism, so the client can check now that its budget pays for it.
    epsilon : float
        ε > 0 of round 2 (``inf``: no noise).
    participants : SignedParticipants or None
        ``evaluation-participants``, the members' signed list of the join step.
    """

    LABEL = "FedAUC scores request"
    session: str
    mechanism: str
    epsilon: float
    participants: SignedParticipants | None = None

    def _to_record(self) -> RecordDict:
        return RecordDict({DP_KEY: ConfigRecord({"session": self.session, "mechanism": self.mechanism,
                                                 "epsilon": float(self.epsilon)}),
                           **(self.participants.entry() if self.participants is not None else {})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> FedAUCScoresRequest:
        return cls(*_session(config_record(content, DP_KEY)), SignedParticipants.from_content(content))


@dataclasses.dataclass(frozen=True)
class ShuffledScores(Payload):
    """Reply of FedAUC round 1: the client's scores in a secret random order (FedAUC Alg. 2, step 1).

    Attributes
    ----------
    scores : ndarray of float64, shape (n_k,)
        Finite positive-class scores of the client's n_k test samples, shuffled.
    """

    LABEL = "shuffled scores"
    scores: np.ndarray

    def _to_record(self) -> RecordDict:
        return RecordDict({SCORES_KEY: ArrayRecord({"scores": Array(np.ascontiguousarray(self.scores))})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> ShuffledScores:
        return cls(_float_array(array_record(content, SCORES_KEY), SCORES_KEY, "scores"))


@dataclasses.dataclass(frozen=True)
class FedAUCStatsRequest(Payload):
    """Request of FedAUC round 2: the global ranks of the client's shuffled scores and the DP parameters.

    Attributes
    ----------
    ranks : ndarray of float64, shape (n_k,)
        Global ranks (≥ 0) of the scores the client sent in round 1, in that (shuffled) order.
    session, mechanism, epsilon
        As in :class:`FedAUCScoresRequest`.
    sensitivity : {"local", "global"} or None
        (``"laplace"`` only) Δ_localSum: the client's maximum rank or M-1 (FedAUC §5.2, App. N).
    allocation : {"alpha", "orthogonal"} or None
        (``"laplace"`` only) independent noise with the α split, or the orthogonal decomposition (§5.3).
    alpha : float or None
        (``"laplace"`` only) ε_localSum = αε, α in (0, 1).
    beta : float or "adaptive" or None
        (``"laplace"`` only) β in (0, 1] of the orthogonal decomposition, or per client.
    max_rank : float or None
        (``"laplace"`` only) M-1, the largest global rank (≥ 0).

    Raises (``from_record``)
    ------
    MalformedMessage
        A field missing or out of its domain; for ``"laplace"``, a Laplace field missing.
    """

    LABEL = "FedAUC stats request"
    ranks: np.ndarray
    session: str
    mechanism: str
    epsilon: float
    sensitivity: str | None = None
    allocation: str | None = None
    alpha: float | None = None
    beta: float | str | None = None
    max_rank: float | None = None

    def _to_record(self) -> RecordDict:
        dp = config_of({"session": self.session, "mechanism": self.mechanism, "epsilon": float(self.epsilon),
                        "sensitivity": self.sensitivity, "allocation": self.allocation, "alpha": self.alpha,
                        "beta": self.beta, "max-rank": self.max_rank})
        return RecordDict({FEDAUC_KEY: ArrayRecord({"ranks": Array(np.ascontiguousarray(self.ranks))}), DP_KEY: dp})

    @classmethod
    def _from_record(cls, content: RecordDict) -> FedAUCStatsRequest:
        ranks = _float_array(array_record(content, FEDAUC_KEY), FEDAUC_KEY, "ranks", minimum=0.0)
        rec = config_record(content, DP_KEY)
        session, mechanism, epsilon = _session(rec)
        if mechanism != "laplace":
            return cls(ranks, session, mechanism, epsilon)
        beta = rec.get("beta") if "beta" in rec else None
        if beta != "adaptive":
            beta = config_field(rec, DP_KEY, "beta", float, minimum=0.0, maximum=1.0)
        laplace: dict[str, Any] = {
            "sensitivity": config_field(rec, DP_KEY, "sensitivity", str, choices=_SENSITIVITIES),
            "allocation": config_field(rec, DP_KEY, "allocation", str, choices=_ALLOCATIONS),
            "alpha": config_field(rec, DP_KEY, "alpha", float, minimum=0.0, maximum=1.0),
            "beta": beta,
            "max_rank": config_field(rec, DP_KEY, "max-rank", float, minimum=0.0),
        }
        return cls(ranks, session, mechanism, epsilon, **laplace)


@dataclasses.dataclass(frozen=True)
class LocalStatsReply(Payload):
    """Reply of FedAUC round 2: ``(localSum, localP, localN)`` (FedAUC Alg. 3 / Alg. 4, client step).

    Attributes
    ----------
    local_sum : float
        Σ r_i y_i over the client's samples (noisy for ``"laplace"``; on RR labels for ``"rr"``).
    local_p, local_n : float
        Number of positives and negatives; ``local_p + local_n = n_k`` (noisy variants too).

    Notes
    -----
    :meth:`from_record` also takes ``num_scores=n_k`` (what the client sent in round 1).

    Raises (``from_record``)
    ------
    MalformedMessage
        A field missing or not a finite number, or ``local-p + local-n`` ≠ ``num_scores``.
    """

    LABEL = "FedAUC local statistics"
    local_sum: float
    local_p: float
    local_n: float

    def _to_record(self) -> RecordDict:
        return RecordDict({STATS_KEY: ConfigRecord({k: float(v) for k, v in zip(_STATS_FIELDS, self.values())})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> LocalStatsReply:
        rec = config_record(content, STATS_KEY)
        return cls(*(float(config_field(rec, STATS_KEY, k, (int, float))) for k in _STATS_FIELDS))

    @classmethod
    def from_record(cls, content: RecordDict, *, node: int | None = None,
                    num_scores: int | None = None) -> LocalStatsReply:
        """:meth:`Payload.from_record`, and ``local-p + local-n == num_scores`` when given."""
        stats = super().from_record(content, node=node)
        total = stats.local_p + stats.local_n
        if num_scores is not None and not np.isclose(total, num_scores, rtol=0.0, atol=1e-6 * max(1, num_scores)):
            raise MalformedMessage(f"{STATS_KEY}.local-n",
                                   f"local-p + local-n = {total:g}, but the client sent {num_scores} scores",
                                   node=node)
        return stats

    def values(self) -> tuple[float, float, float]:
        """``(local_sum, local_p, local_n)``."""
        return self.local_sum, self.local_p, self.local_n


DPAUC_LAPLACE = Step("DPAUC_Lap (noisy counts)", EVALUATE_DPAUC_LAPLACE, "client", DPAUCRequest, NoisyCounts)
DPAUC_RR = Step("DPAUC_RR (counts of randomized-response labels)", EVALUATE_DPAUC_RR, "client", DPAUCRequest,
                ThresholdCounts)
FEDAUC_SCORES = Step("FedAUC round 1 (shuffled scores)", EVALUATE_FEDAUC_SCORES, "client", FedAUCScoresRequest,
                     ShuffledScores)
FEDAUC_STATS = Step("FedAUC round 2 (local statistics)", EVALUATE_FEDAUC_STATS, "client", FedAUCStatsRequest,
                    LocalStatsReply)
#: The DP AUC baselines' step table.
DP_JOIN = Step("join (signed participation)", QUERY_DP_JOIN, "client", JoinRequest, JoinReply)
STEPS = (DPAUC_LAPLACE, DPAUC_RR, FEDAUC_SCORES, FEDAUC_STATS, DP_JOIN)
