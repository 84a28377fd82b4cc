"""The main job end to end over the serializing in-process grid (no Ray)."""

import json
import shutil

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from identities import IDENTITY_DIR

from flwr_fedeval.app import server_app
from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.testing import InProcessGrid


@pytest.mark.slow
def test_main_job_runs_and_federated_auc_matches_pooled_reference(tmp_path):
    run_config = {"num-server-rounds": 2, "local-epochs": 3, "output-dir": str(tmp_path)}
    grid = InProcessGrid(client_app, 3, run_config)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    server_app.main(grid, ctx)

    (folder,) = list(tmp_path.iterdir())
    result = json.loads((folder / "results.json").read_text())
    assert (folder / "roc.png").stat().st_size > 1000
    assert result["num_clients"] == 3
    assert result["num_test_samples"] > 100
    assert abs(result["federated_auc"] - result["reference_roc_auc_score"]) <= 0.01
    assert result["federated_auc"] > 0.8  # training did something
    assert 0 <= result["resolution_bound"] <= 0.5
    assert abs(result["federated_auc"] - result["reference_roc_auc_score"]) <= result["resolution_bound"] + 1e-9
    assert set(result["train_metrics"]) == {"1", "2"}
    # every node took part in train (2 rounds), evaluate (2) and the AUC phase
    for node in grid.node_ids:
        types = [t for n, t, ok in grid.log if n == node and ok]
        assert types.count("train") == 2 and "evaluate.threshold_counts" in types
    assert all(v > 0 for v in grid.bytes_up.values())


@pytest.mark.slow
def test_failing_client_is_reported_and_left_out_of_the_auc(tmp_path):
    from flwr.app import ArrayRecord

    from flwr_fedeval.app.task import JobConfig, build_model
    from flwr_fedeval.strategies.auc_phase import PlaintextAUCPhase

    bad = {}

    def fault(node, msg, reply):
        if msg.metadata.message_type == "evaluate.threshold_counts" and node == bad["node"] \
                and not reply.has_error():  # the second run below: a second evaluation of the model is refused
            counts = reply.content["counts"]
            tp = counts["tp"].numpy().copy()
            tp[0] = -1
            from flwr.app import Array
            counts["tp"] = Array(tp)
        return reply

    grid = InProcessGrid(client_app, 3, {}, fault=fault)
    bad["node"] = grid.node_ids[1]
    arrays = ArrayRecord(build_model(JobConfig()).get_weights())
    result = PlaintextAUCPhase(50, min_nodes=2).run(grid, arrays)
    assert result.contributors == sorted(set(grid.node_ids) - {bad["node"]})
    assert "negative" in result.failed[bad["node"]]
    assert 0.0 <= result.auc <= 1.0
    with pytest.raises(RuntimeError, match="at least 3"):
        PlaintextAUCPhase(50, min_nodes=3).run(grid, arrays)


@pytest.mark.slow
def test_main_job_with_xmkckks_secure_aggregation(tmp_path):
    run_config = {
        "num-server-rounds": 2,
        "local-epochs": 3,
        "secure-aggregation": "xmkckks",
        "output-dir": str(tmp_path),
        "identity-dir": IDENTITY_DIR,
    }
    seen = []

    def spy(node, msg, reply):
        if msg.metadata.message_type == "train":
            seen.append(reply)
        return reply

    grid = InProcessGrid(client_app, 3, run_config, fault=spy)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    server_app.main(grid, ctx)
    (folder,) = list(tmp_path.iterdir())
    result = json.loads((folder / "results.json").read_text())
    assert abs(result["federated_auc"] - result["reference_roc_auc_score"]) <= 0.01
    assert result["federated_auc"] > 0.8
    assert result["train_metrics"]["2"]["num-examples"] > 0  # Σ n_i, decrypted
    assert len(seen) == 6 and all("arrays" not in r.content for r in seen)
    types = {t for _, t, _ in grid.log}
    assert {"query.xmk_keygen", "query.xmk_reveal", "query.xmk_pdec"} <= types


def test_score_histogram_counts_each_class_on_both_scales():
    from flwr_fedeval.app.harness import score_histogram

    y = np.array([0, 1, 1, 0, 1])
    s = np.array([0.0, 1.0, 0.99999, 0.2, 0.5])
    h = score_histogram(y, s, bins=4)
    assert sum(h["linear"]["positive"]) == 3 and sum(h["linear"]["negative"]) == 2
    assert sum(h["logit"]["positive"]) == 3 and h["logit"]["positive"][-1] == 2  # 1.0 and 0.99999 saturate
    assert h["saturated_fraction"] == pytest.approx(3 / 5)


@pytest.mark.slow
def test_main_job_with_secure_shapley_values(tmp_path):
    """Simulation-style roles: partition 3 of 4 is the auxiliary server A (no data, no training)."""
    ids = tmp_path / "ids"             # the nodes' policy files accept an honest-but-curious P
    shutil.copytree(IDENTITY_DIR, ids)
    for i in range(4):
        (ids / f"node-{i}.policy.toml").write_text("fedeval-secsv-trust-principal = true\n")
    out = tmp_path / "out"
    run_config = {"num-server-rounds": 2, "local-epochs": 3, "learning-rate": 0.01, "output-dir": str(out),
                  "model": "logreg",
                  "shapley": "secsv", "shapley-aux-partition-id": 3, "identity-dir": str(ids)}
    grid = InProcessGrid(client_app, 4, run_config)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    server_app.main(grid, ctx)

    (folder,) = list(out.iterdir())
    result = json.loads((folder / "results.json").read_text())
    aux = grid.node_ids[3]
    sv = result["shapley"]
    assert sv["aux_node"] == aux and len(sv["clients"]) == 3 and aux not in sv["clients"]
    assert result["num_clients"] == 3 and sv["rounds"] == [1, 2]
    full = sv["utilities"][-1]["-".join(map(str, sorted(sv["clients"])))]
    assert sum(sv["fsv"].values()) == pytest.approx(full - 0.5, abs=1e-9)   # efficiency over the run
    assert full > 0.8                                                      # a trained model
    assert (folder / "fsv.png").stat().st_size > 1000
    aux_types = {t for n, t, ok in grid.log if n == aux}
    assert "train" not in aux_types and not any(t.startswith("evaluate") for t in aux_types)
    assert result["num_test_samples"] > 100      # 3 data partitions of breast cancer, 20 % test


def test_shapley_config_needs_a_linear_model():
    from flwr_fedeval.app.task import JobConfig

    with pytest.raises(ValueError, match="logreg"):
        JobConfig.from_run_config({"shapley": "secsv"})
    with pytest.raises(ValueError, match="secure-aggregation"):
        JobConfig.from_run_config({"shapley": "secsv", "model": "logreg", "secure-aggregation": "xmkckks"})
    with pytest.raises(ValueError, match="no fixed-point parameters fit"):
        JobConfig.from_run_config({"shapley": "secsv", "model": "logreg", "shapley-feature-bound": 1e9})


@pytest.mark.slow
def test_results_json_records_each_xmk_round_by_roster_identity(tmp_path):
    """5 clients, one lost before its upload (no train reply) and one after it (killed at step 2b): results.json
    lists, per xMK round, the signed contributor set (size 4), who was left out before uploading and who was
    lost after, by roster identity (never node IDs), and that the round completed."""
    run_config = {"num-server-rounds": 1, "local-epochs": 1, "model": "logreg", "learning-rate": 0.01,
                  "secure-aggregation": "xmkckks", "output-dir": str(tmp_path), "identity-dir": IDENTITY_DIR}
    lost = {}

    def fault(node, msg, reply):
        kind = msg.metadata.message_type
        if node == lost["before"] and kind == "train":
            return None
        if node == lost["after"] and kind == "query.xmk_contributors":
            grid.kill(node)
            return None
        return reply

    grid = InProcessGrid(client_app, 5, run_config, fault=fault)
    lost.update(before=grid.node_ids[1], after=grid.node_ids[3])
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    (folder,) = list(tmp_path.iterdir())
    result = json.loads((folder / "results.json").read_text())
    (record,) = result["xmk_rounds"]
    # InProcessGrid gives partition i the roster identity node-i (tests/identities.py)
    assert record["round"] == 1 and record["completed"] is True and record["threshold"] == 3
    assert record["members"] == [f"node-{i}" for i in range(5)]
    assert record["num_contributors"] == 4 and record["contributors"] == ["node-0", "node-2", "node-3", "node-4"]
    assert list(record["left_out"]) == ["node-1"] and list(record["lost_after_upload"]) == ["node-3"]
    assert record["signers"] == ["node-0", "node-2", "node-4"] and record["decryptors"] == record["signers"]
    node_ids = {str(n) for n in grid.node_ids}
    names = [*record["members"], *record["contributors"], *record["left_out"], *record["lost_after_upload"]]
    assert not node_ids & set(names)
    assert result["train_metrics"]["1"]["num-clients"] == 4
    state = json.loads((folder / "checkpoint" / "state.json").read_text())
    assert state["strategy"]["contributor_sets"] == result["xmk_rounds"]
