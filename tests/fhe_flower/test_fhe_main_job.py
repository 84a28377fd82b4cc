"""The main job with ``auc-method = "fhe"`` end to end over the serializing in-process grid
(CKKS engine: ``FHE_BACKEND``, ``tenseal`` by default; ``openfhe`` in the Python 3.10 CI leg)."""

import json
import math

import pytest
from flwr.app import Context, RecordDict
from identities import IDENTITY_DIR

from flwr_fedeval.app import server_app
from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.fhe.backend import default_backend
from flwr_fedeval.testing import InProcessGrid


def _run(tmp_path, **overrides):
    run_config = {"num-server-rounds": 1, "local-epochs": 2, "output-dir": str(tmp_path),
                  "auc-method": "fhe", "fhe-backend": default_backend(), "identity-dir": IDENTITY_DIR, **overrides}
    grid = InProcessGrid(client_app, 3, run_config)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    server_app.main(grid, ctx)
    (folder,) = list(tmp_path.iterdir())
    return grid, json.loads((folder / "results.json").read_text())


@pytest.mark.slow
def test_main_job_malicious_fhe_auc_matches_pooled_reference(tmp_path):
    grid, result = _run(tmp_path, **{"fhe-auc": "malicious"})
    assert result["auc_method"] == "fhe" and result["auc_details"]["variant"] == "malicious"
    assert result["num_clients"] == 3 and result["failed_nodes"] == {}
    assert abs(result["federated_auc"] - result["reference_roc_auc_score"]) <= 0.01
    assert result["federated_auc"] > 0.8
    assert result["auc_details"]["auc_known_to"] == "clients and server"
    types = {t for _, t, ok in grid.log if ok}
    assert {"query.fhe_pubkey", "query.fhe_keygen", "evaluate.fhe_counts", "query.fhe_result"} <= types


@pytest.mark.slow
def test_main_job_semi_honest_reports_private_threshold_metrics(tmp_path):
    _, result = _run(tmp_path, **{"fhe-auc": "semi-honest"})
    details = result["auc_details"]
    assert details["variant"] == "semi-honest"
    assert abs(result["federated_auc"] - result["reference_roc_auc_score"]) <= 0.02
    ref = result["reference_threshold_metrics"]
    for k, v in details["threshold_metrics"].items():
        assert abs(v - ref[k]) <= 1e-6 or (math.isnan(v) and math.isnan(ref[k])), k


@pytest.mark.slow
def test_a_participant_lost_at_the_counts_step_fails_the_run_and_results_json_says_so(tmp_path):
    """Issue 22: a listed participant killed while it encrypts its counts (Flower drops it at the
    heartbeat, simulated time): the FHE phase fails instead of re-running over the others; the
    ServerApp raises (Flower ends the run ``finished:failed``) after writing results.json with the
    error, no AUC and the failures."""
    from flwr_fedeval.strategies.fhe_phase import FHEPhaseFailedError

    run_config = {"num-server-rounds": 1, "local-epochs": 1, "output-dir": str(tmp_path), "model": "logreg",
                  "auc-method": "fhe", "fhe-backend": default_backend(), "identity-dir": IDENTITY_DIR,
                  "num-decision-points": 20}
    grid = InProcessGrid(client_app, 3, run_config)
    victim = grid.node_ids[2]
    grid.fault = lambda n, m, r: (grid.kill(n, gone_after=60.0), r)[1] if (
        n == victim and m.metadata.message_type == "evaluate.fhe_counts") else r
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    with pytest.raises(FHEPhaseFailedError):
        server_app.main(grid, ctx)
    (folder,) = list(tmp_path.iterdir())
    result = json.loads((folder / "results.json").read_text())
    assert result["federated_auc"] is None and "FHE AUC phase failed" in result["auc_phase_error"]
    assert result["lost_participants"] == [str(victim)] and str(victim) in result["failed_nodes"]
    assert any(f["node"] == victim and f["step"] == "evaluate.fhe_counts" for f in result["failures"])
    assert [t for _, t, _ in grid.log].count("query.fhe_pubkey") == 3  # no re-run from step 1
