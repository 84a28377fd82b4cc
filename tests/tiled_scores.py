"""The issue-15 data set of the FHE AUC tests: the same 9,049 synthetic scores tiled to any size."""

import numpy as np

from flwr_fedeval.metrics.counts import decision_points, threshold_counts


def tiled_counts(factor, n_clients=5, n_points=100, seed=0):
    """Per-client TP/FP/TN/FN of 9,049 scores tiled ``factor`` times, split over ``n_clients``."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 9049)
    s = np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1)
    th = decision_points(n_points)
    return [threshold_counts(np.tile(y[i::n_clients], factor), np.tile(s[i::n_clients], factor), th)
            for i in range(n_clients)]
