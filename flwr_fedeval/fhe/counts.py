"""Re-export of :mod:`flwr_fedeval.metrics.counts` (the counts moved there).

The plaintext counts are shared by the FHE, DP and plain AUC phases; they
live in :mod:`flwr_fedeval.metrics` so that imports run one way only
(``fhe`` → ``metrics``, never back). Import from ``flwr_fedeval.metrics.counts``.
"""

from flwr_fedeval.metrics.counts import (
    ConfusionCounts,
    Spacing,
    decision_points,
    tf_vectors,
    threshold_counts,
)

__all__ = ["ConfusionCounts", "Spacing", "decision_points", "threshold_counts", "tf_vectors"]
