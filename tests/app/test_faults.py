"""Faults over the serializing in-process grid (issue 16): the honest reference, true reasons, resume."""

import json

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from flwr_fedeval.app import server_app
from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.testing import InProcessGrid


@pytest.mark.slow
def test_reference_after_a_dropout_is_over_exactly_the_contributors(tmp_path):
    """Node 1 of 3 drops its round-1 training reply and its AUC-phase reply: the FINAL reference
    pools partitions 0 and 2 of 3 (not a 2-way re-split of the data) and matches the protocol."""
    run_config = {"num-server-rounds": 2, "local-epochs": 2, "model": "logreg", "learning-rate": 0.01,
                  "num-decision-points": 2000, "decision-point-spacing": "logit", "output-dir": str(tmp_path)}
    seen = {}

    def fault(node, msg, reply):
        kind = msg.metadata.message_type
        if kind == "evaluate.threshold_counts":
            seen["arrays"] = msg.content["arrays"].to_numpy_ndarrays()
        dropped = kind == "evaluate.threshold_counts" or (
            kind == "train" and int(msg.content["config"]["server-round"]) == 1)
        return None if node == seen["victim"] and dropped else reply

    grid = InProcessGrid(client_app, 3, run_config, fault=fault)
    seen["victim"] = victim = grid.node_ids[1]
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))

    (folder,) = list(tmp_path.iterdir())
    result = json.loads((folder / "results.json").read_text())
    assert result["num_clients"] == 2 and str(victim) in result["failed_nodes"]
    assert json.loads((folder / "checkpoint" / "state.json").read_text())["round"] == 2  # checkpointed
    assert abs(result["federated_auc"] - result["reference_roc_auc_score"]) <= 1e-3

    # The reference is roc_auc_score over the contributors' own test splits (partitions 0 and 2 of 3).
    from sklearn.metrics import roc_auc_score

    from flwr_fedeval.app.harness import positive_scores
    from flwr_fedeval.app.task import JobConfig, build_model, load_client_data
    from flwr_fedeval.clients.keras_adapter import KerasModelAdapter

    cfg = JobConfig.from_run_config(run_config)
    adapter = KerasModelAdapter(build_model(cfg))
    adapter.set_weights(seen["arrays"])
    splits = [load_client_data(cfg, pid, 3) for pid in (0, 2)]
    y = np.concatenate([s.y_test for s in splits])
    s = np.concatenate([positive_scores(cfg, adapter, sp.x_test) for sp in splits])
    assert result["reference_roc_auc_score"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert result["num_test_samples"] == y.size

    # Every failure recorded with its step, round and the reason that fired (our timeout here).
    mine = [f for f in result["failures"] if f["node"] == victim]
    assert {(f["step"], f["round"]) for f in mine} == {("train", 1), ("evaluate.threshold_counts", None)}
    assert all(f["code"] == int(ReplyCode.TIMEOUT) and "our timeout of" in f["reason"] for f in mine)
    assert all(f["seconds_to_detect"] >= 0 for f in mine)


class Crash(Exception):
    pass


@pytest.mark.slow
def test_main_job_resumes_after_a_serverapp_crash(tmp_path):
    """The ServerApp dies in round 2; the same run config plus resume-from continues with round 2 and
    writes results.json into the same run folder; another run config is refused before any training."""
    from flwr_fedeval.strategies.checkpoint import CheckpointError

    run_config = {"num-server-rounds": 2, "local-epochs": 1, "model": "logreg", "output-dir": str(tmp_path)}
    armed = {"on": True}

    def fault(node, msg, reply):
        if armed["on"] and msg.metadata.message_type == "train" and msg.content["config"]["server-round"] == 2:
            raise Crash("ServerApp killed")
        return reply

    grid = InProcessGrid(client_app, 3, run_config, fault=fault)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    with pytest.raises(Crash):
        server_app.main(grid, ctx)
    (folder,) = list(tmp_path.iterdir())
    assert json.loads((folder / "checkpoint" / "state.json").read_text())["round"] == 1
    assert not (folder / "results.json").exists()

    armed["on"] = False
    other = {**run_config, "local-epochs": 2, "resume-from": str(folder)}
    n_before = len(grid.log)
    with pytest.raises(CheckpointError, match="another run config"):
        server_app.main(grid, Context(run_id=2, node_id=0, node_config={}, state=RecordDict(), run_config=other))
    assert not [t for _, t, _ in grid.log[n_before:] if t == "train"]  # refused before round 2 started

    resumed = {**run_config, "resume-from": str(folder)}
    server_app.main(grid, Context(run_id=3, node_id=0, node_config={}, state=RecordDict(), run_config=resumed))
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]
    result = json.loads((folder / "results.json").read_text())
    assert set(result["train_metrics"]) == {"2"} and result["num_clients"] == 3
    assert abs(result["federated_auc"] - result["reference_roc_auc_score"]) <= 0.01
    assert json.loads((folder / "checkpoint" / "state.json").read_text())["round"] == 2


@pytest.mark.parametrize("partitions, note", [
    ({1: (0, 3)}, "reported no partition id"),                 # node 2 did not report
    ({1: (0, 3), 2: (1, 4)}, "different num-partitions"),
    ({1: (0, 3), 2: (0, 3)}, "claim partitions [0, 0] of 3"),
    ({1: (0, 3), 2: (3, 3)}, "claim partitions [0, 3] of 3"),
])
def test_reference_is_left_out_with_a_note_when_it_cannot_be_honest(partitions, note):
    import math

    from flwr_fedeval.app.harness import contributors_reference_auc
    from flwr_fedeval.app.task import JobConfig

    auc, y, s, why = contributors_reference_auc(JobConfig(), [], [1, 2], partitions)
    assert math.isnan(auc) and y.size == 0 and s.size == 0
    assert why.startswith("left out") and note in why
