"""Message types and record codecs shared by our strategies and client handlers.

Flower message types have the form ``<train|evaluate|query>[.<identifier>]``.
Record contents are numpy arrays in ``ArrayRecord``s (never object arrays)
and Python scalars in ``ConfigRecord``s, so every message survives the
deployment engine's serialization.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from flwr_fedeval.fhe.counts import ConfusionCounts

__all__ = [
    "EVALUATE_THRESHOLD_COUNTS",
    "counts_to_record",
    "counts_from_record",
]

#: Evaluation phase of the plaintext global AUC: thresholds in, counts out.
EVALUATE_THRESHOLD_COUNTS = "evaluate.threshold_counts"

_COUNT_FIELDS = ("tp", "fp", "tn", "fn")


def counts_to_record(counts: ConfusionCounts) -> ArrayRecord:
    """Pack TP/FP/TN/FN (int64 arrays of shape (N,)) into an ArrayRecord."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v, dtype=np.int64)) for k, v in zip(_COUNT_FIELDS, counts)})


def counts_from_record(record: ArrayRecord, num_points: int) -> ConfusionCounts:
    """Unpack and validate counts sent by a client.

    Raises
    ------
    ValueError
        If a field is missing, has the wrong length or dtype, is negative,
        or the counts are inconsistent (TP/FP not non-decreasing over the
        descending decision points, or TP+FN / FP+TN not constant).
    """
    missing = [k for k in _COUNT_FIELDS if k not in record]
    if missing:
        raise ValueError(f"counts record lacks field(s) {missing}")
    arrays = {}
    for k in _COUNT_FIELDS:
        a = record[k].numpy()
        if a.shape != (num_points,):
            raise ValueError(f"field '{k}' has shape {a.shape}, expected ({num_points},)")
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"field '{k}' has dtype {a.dtype}, expected an integer type")
        if (a < 0).any():
            raise ValueError(f"field '{k}' has negative counts")
        arrays[k] = a.astype(np.int64)
    counts = ConfusionCounts(**arrays)
    if (np.diff(counts.tp) < 0).any() or (np.diff(counts.fp) < 0).any():
        raise ValueError("TP/FP must be non-decreasing over descending decision points")
    if len(set((counts.tp + counts.fn).tolist())) > 1 or len(set((counts.fp + counts.tn).tolist())) > 1:
        raise ValueError("TP+FN and FP+TN must be the same at every decision point")
    return counts
