"""Synthetic scores for tests and benchmarks of the federated AUC protocols.

:func:`tiled_counts` is the data set of the FHE AUC accuracy tests and of
``benchmarks/bench_fhe_auc_scale.py``: 9,049 labels ``y ~ Bernoulli(1/2)`` with
scores ``clip(N(0.35 + 0.3 y, 0.2), 0, 1)``, tiled ``factor`` times and split
round-robin over the clients, so that the pooled AUC is the same at every size.

Example
-------
::

    from flwr_fedeval.metrics.auc import auc_from_counts
    from flwr_fedeval.testing.scores import tiled_counts

    counts = tiled_counts(50)              # 5 clients, 100 decision points
    print(auc_from_counts(sum(counts)))    # the plaintext counts-AUC of 452,450 scores
"""

from __future__ import annotations

import numpy as np

from flwr_fedeval.metrics.counts import ConfusionCounts, decision_points, threshold_counts

__all__ = ["tiled_counts"]


def tiled_counts(factor: int, n_clients: int = 5, n_points: int = 100, seed: int = 0) -> list[ConfusionCounts]:
    """Per-client TP/FP/TN/FN of 9,049 synthetic scores tiled ``factor`` times, split over ``n_clients``.

    Parameters
    ----------
    factor : int
        How many times the 9,049 scores are repeated (the pooled size is ``9049 * factor``).
    n_clients : int, default=5
        Client ``i`` holds the scores ``i, i + n_clients, ...`` of the base set, tiled.
    n_points : int, default=100
        Number of decision points (:func:`~flwr_fedeval.metrics.counts.decision_points`, linear).
    seed : int, default=0
        Seed of the base set.

    Returns
    -------
    list of ConfusionCounts
        One per client, at the same decision points.
    """
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 9049)
    s = np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1)
    th = decision_points(n_points)
    return [threshold_counts(np.tile(y[i::n_clients], factor), np.tile(s[i::n_clients], factor), th)
            for i in range(n_clients)]
