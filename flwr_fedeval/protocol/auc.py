"""Messages of the plaintext AUC phase: decision points in, TP/FP/TN/FN out.

One step (Baykara et al. 2025, Eqs. 2-3, the reference protocol the FHE and DP
phases replace):

* ``evaluate.threshold_counts``: :class:`ThresholdCountsRequest` (+ Flower's model record) in,
  :class:`ThresholdCounts` out.

The decision points (record ``evaluation``) and the counts (record ``counts``)
are shared with the DP phases (:mod:`flwr_fedeval.protocol.dp_auc`: DPAUC_Lap
sends the same request plus ε, DPAUC_RR replies the same counts) and the FHE
phase's request (:func:`decision_points_entry`, :func:`decision_points_from`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from flwr_fedeval.metrics.counts import ConfusionCounts
from flwr_fedeval.protocol._base import MalformedMessage, Payload, Step, array_field, array_record

__all__ = [
    "COUNTS_KEY",
    "COUNT_FIELDS",
    "EVALUATE_THRESHOLD_COUNTS",
    "EVALUATION_KEY",
    "PointCounts",
    "STEPS",
    "THRESHOLD_COUNTS",
    "ThresholdCounts",
    "ThresholdCountsRequest",
    "decision_points_entry",
    "decision_points_from",
]

#: Message type of the plaintext AUC phase's one step.
EVALUATE_THRESHOLD_COUNTS = "evaluate.threshold_counts"
#: Request record (ArrayRecord): ``thresholds``, the public decision points.
EVALUATION_KEY = "evaluation"
#: Reply record (ArrayRecord): ``tp``, ``fp``, ``tn``, ``fn``.
COUNTS_KEY = "counts"
_THRESHOLDS = "thresholds"
#: The field names of the four counts, in :class:`~flwr_fedeval.metrics.counts.ConfusionCounts` order.
COUNT_FIELDS = ("tp", "fp", "tn", "fn")

C = TypeVar("C", bound="PointCounts")


# ------------------------------------------------------------------ decision points
def decision_points_entry(thresholds: np.ndarray) -> dict[str, ArrayRecord]:
    """``{"evaluation": ArrayRecord({"thresholds": ...})}``, to merge into a request's content.

    ``thresholds`` : float64 array of shape (N,), the strictly descending public decision points θ.
    """
    return {EVALUATION_KEY: ArrayRecord({_THRESHOLDS: Array(np.ascontiguousarray(thresholds, dtype=np.float64))})}


def decision_points_from(content: RecordDict) -> np.ndarray:
    """The decision points θ of a request: float64 of shape (N,), N ≥ 1, finite, strictly descending.

    Raises
    ------
    MalformedMessage
        If the record or field is missing, not a 1-D float64 array, empty, not finite,
        or not strictly descending.
    """
    field = f"{EVALUATION_KEY}.{_THRESHOLDS}"
    theta = array_field(array_record(content, EVALUATION_KEY), EVALUATION_KEY, _THRESHOLDS,
                        dtype=np.float64, shape=(None,), finite=True)
    if theta.size == 0:
        raise MalformedMessage(field, "no decision points")
    if (np.diff(theta) >= 0).any():
        raise MalformedMessage(field, "decision points must be strictly descending")
    return theta


# ------------------------------------------------------------------ payloads
@dataclasses.dataclass(frozen=True)
class ThresholdCountsRequest(Payload):
    """Request of ``evaluate.threshold_counts``: the public decision points.

    Attributes
    ----------
    thresholds : ndarray of float64, shape (N,)
        Decision points θ_0 > … > θ_{N-1}, finite (:func:`~flwr_fedeval.metrics.counts.decision_points`).
        Inside [0, 1] they are probabilities; otherwise the scores' own units (logits).

    The server adds the global model under its ``arrayrecord_key`` (Flower's record, not parsed here).
    """

    LABEL = "threshold counts request"
    thresholds: np.ndarray

    def _to_record(self) -> RecordDict:
        return RecordDict(decision_points_entry(self.thresholds))

    @classmethod
    def _from_record(cls, content: RecordDict) -> ThresholdCountsRequest:
        return cls(decision_points_from(content))


@dataclasses.dataclass(frozen=True)
class PointCounts(Payload):
    """Base of the replies that carry four arrays ``tp``, ``fp``, ``tn``, ``fn`` of one value per
    decision point, in record ``KEY`` with dtype ``DTYPE`` (:class:`ThresholdCounts`,
    :class:`~flwr_fedeval.protocol.dp_auc.NoisyCounts`).

    :meth:`from_record` also takes ``num_points=N`` (the decision points the server sent) and
    then requires shape (N,).

    Raises (``from_record``)
    ------
    MalformedMessage
        A field missing, not of ``DTYPE``, not of one shape (N,), or NaN/infinite.
    """

    KEY: ClassVar[str] = ""
    DTYPE: ClassVar[type] = np.float64
    tp: np.ndarray
    fp: np.ndarray
    tn: np.ndarray
    fn: np.ndarray

    def _to_record(self) -> RecordDict:
        return RecordDict({self.KEY: ArrayRecord({k: Array(np.ascontiguousarray(getattr(self, k), dtype=self.DTYPE))
                                                  for k in COUNT_FIELDS})})

    @classmethod
    def _arrays(cls, content: RecordDict) -> dict[str, np.ndarray]:
        rec = array_record(content, cls.KEY)
        out: dict[str, np.ndarray] = {}
        for name in COUNT_FIELDS:
            first = out.get(COUNT_FIELDS[0])
            out[name] = array_field(rec, cls.KEY, name, dtype=cls.DTYPE, finite=True,
                                    shape=(None,) if first is None else first.shape)
        return out

    @classmethod
    def _from_record(cls: type[C], content: RecordDict) -> C:
        return cls(**cls._arrays(content))

    @classmethod
    def from_record(cls: type[C], content: RecordDict, *, node: int | None = None,
                    num_points: int | None = None) -> C:
        """:meth:`Payload.from_record`, and every field of shape ``(num_points,)`` when given."""
        reply = super().from_record(content, node=node)
        for name in COUNT_FIELDS:
            shape = getattr(reply, name).shape
            if num_points is not None and shape != (num_points,):
                raise MalformedMessage(f"{cls.KEY}.{name}", f"shape {shape}, expected ({num_points},)", node=node)
        return reply

    def values(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(tp, fp, tn, fn)``."""
        return self.tp, self.fp, self.tn, self.fn


@dataclasses.dataclass(frozen=True)
class ThresholdCounts(PointCounts):
    """Reply of ``evaluate.threshold_counts`` (and of DPAUC_RR): one client's TP/FP/TN/FN.

    Attributes
    ----------
    tp, fp, tn, fn : ndarray of int64, shape (N,)
        Counts at each decision point (descending θ, so TP and FP are non-decreasing;
        TP+FN = P and FP+TN = N_neg at every point), Baykara et al. 2025, Eq. 2.

    Raises (``from_record``)
    ------
    MalformedMessage
        As :class:`PointCounts`; also a negative count, TP/FP decreasing, or TP+FN / FP+TN
        not constant over the decision points.
    """

    LABEL = "threshold counts"
    KEY = COUNTS_KEY
    DTYPE = np.int64

    @classmethod
    def of(cls, counts: ConfusionCounts) -> ThresholdCounts:
        """The reply carrying ``counts``."""
        return cls(*(np.ascontiguousarray(a, dtype=np.int64) for a in counts))

    def counts(self) -> ConfusionCounts:
        """The counts as :class:`~flwr_fedeval.metrics.counts.ConfusionCounts` (int64)."""
        return ConfusionCounts(*self.values())

    @classmethod
    def _from_record(cls, content: RecordDict) -> ThresholdCounts:
        a = cls._arrays(content)
        for name, v in a.items():
            if (v < 0).any():
                raise MalformedMessage(f"{COUNTS_KEY}.{name}", "negative counts")
        for name in ("tp", "fp"):
            if (np.diff(a[name]) < 0).any():
                raise MalformedMessage(f"{COUNTS_KEY}.{name}", "must be non-decreasing over descending decision points")
        for x, y in (("tp", "fn"), ("fp", "tn")):
            if np.unique(a[x] + a[y]).size > 1:
                raise MalformedMessage(f"{COUNTS_KEY}.{y}",
                                       f"{x.upper()}+{y.upper()} must be the same at every decision point")
        return cls(**a)


THRESHOLD_COUNTS = Step("threshold counts", EVALUATE_THRESHOLD_COUNTS, "client", ThresholdCountsRequest,
                        ThresholdCounts)
#: The plaintext AUC phase's step table.
STEPS = (THRESHOLD_COUNTS,)
