"""Phase results as Flower ``MetricRecord``s: ``phase.evaluate_fn`` in ``Strategy.start`` puts the AUC in
``Result.evaluate_metrics_serverapp`` (issue 23 item 3), beside the full result the phase keeps."""

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedAvg
from identities import IDENTITY_DIR, node_configs

from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.strategies.auc_phase import AUCPhaseResult, PlaintextAUCPhase
from flwr_fedeval.strategies.shapley_phase import ShapleyPhaseResult
from flwr_fedeval.testing import InProcessGrid


@pytest.mark.slow
def test_auc_phase_as_evaluate_fn_lands_in_flowers_result():
    grid = InProcessGrid(client_app, 3, {"identity-dir": IDENTITY_DIR, "local-epochs": 1},
                         node_configs=node_configs(3, fedeval_evaluations_per_model=5))
    phase = PlaintextAUCPhase(30)
    result = FedAvg(fraction_evaluate=0.0, min_available_nodes=3).start(
        grid=grid, initial_arrays=ArrayRecord(build_model(JobConfig()).get_weights()), num_rounds=1,
        train_config=ConfigRecord({"local-epochs": 1}), evaluate_fn=phase.evaluate_fn(grid, rounds=[1]))
    metrics = result.evaluate_metrics_serverapp[1]
    assert 0 not in result.evaluate_metrics_serverapp  # round 0 was not asked for
    # the final global model was evaluated: an independent run on it gives the same AUC
    again = PlaintextAUCPhase(30).run(grid, result.arrays)
    assert metrics["auc"] == pytest.approx(again.auc, abs=1e-12)
    assert metrics["auc"] == phase.results[1].auc
    assert metrics["auc-resolution-bound"] == pytest.approx(again.resolution_bound)
    assert metrics["auc-num-clients"] == 3 and metrics["auc-num-failed"] == 0


def test_evaluate_fn_needs_a_round():
    with pytest.raises(ValueError, match="rounds"):
        PlaintextAUCPhase(10).evaluate_fn(None, rounds=[])


def test_auc_metric_record_leaves_out_what_the_phase_does_not_know():
    hidden = AUCPhaseResult(auc=math.nan, thresholds=np.zeros(3), counts=None, contributors=[5, 7],
                            failed={9: "refused"}, method="fhe")
    assert dict(hidden.to_metric_record()) == {"auc-num-clients": 2, "auc-num-failed": 1}
    dp = AUCPhaseResult(auc=0.75, thresholds=np.zeros(3), counts=None, contributors=[1, 2], method="dpauc-laplace",
                        details={"epsilon": 0.5})
    assert dict(dp.to_metric_record()) == {"auc": 0.75, "auc-epsilon": 0.5, "auc-num-clients": 2,
                                           "auc-num-failed": 0}


def test_shapley_metric_record_lists_the_values_in_client_order():
    big = (1 << 63) + 5  # node IDs are unsigned 64-bit: not in the MetricRecord
    shapley = ShapleyPhaseResult(fsv={big: 0.25, 3: -0.05}, ssv=np.zeros((2, 2)), utilities=[], empty_utilities=[],
                                 rounds=[1, 2], clients=[3, big], weights={}, aux_node=0, leader=3, sample_skip=True)
    record = shapley.to_metric_record()
    assert record["shapley-fsv"] == [-0.05, 0.25]
    assert record["shapley-fsv-sum"] == pytest.approx(0.2)
    assert record["shapley-rounds"] == 2
