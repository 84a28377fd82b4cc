"""The ServerApp warns, with the fix, when the AUC's certified resolution bound is wide (issue 15.3)."""

import logging

import numpy as np

from flwr_fedeval.app.server_app import warn_resolution
from flwr_fedeval.metrics.auc import resolution_bound
from flwr_fedeval.metrics.counts import decision_points, threshold_counts


def test_server_app_warns_on_a_wide_resolution_bound(caplog):
    """Saturated probabilities (float32 softmax) give a wide bound: the ServerApp warns with the fix."""
    y = np.r_[np.ones(50, int), np.zeros(50, int)]
    s = np.r_[np.ones(45), np.full(5, 0.3), np.ones(20), np.zeros(30)]  # saturated at exactly 0/1
    bound = resolution_bound(threshold_counts(y, s, decision_points(100, spacing="logit")))
    assert bound > 0.1
    flwr_logger = logging.getLogger("flwr")
    propagate = flwr_logger.propagate
    flwr_logger.propagate = True
    try:
        with caplog.at_level(logging.WARNING):
            assert warn_resolution(bound)
    finally:
        flwr_logger.propagate = propagate
    assert "logit" in caplog.text and "more decision points" in caplog.text
    assert not warn_resolution(0.004) and not warn_resolution(float("nan"))
