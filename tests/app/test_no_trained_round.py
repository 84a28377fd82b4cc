"""A run in which no round aggregates an update does not pass for a trained one.

The main job twice over the serializing grid, with the same nodes (roster identities, their
privacy ledgers) and the same seed, hence the same initial model: in the second run every node
refuses to train on it again (``ALREADY_CONTRIBUTED``: one update per global model, across runs).
The second run still writes its results (the failures, no trained round), evaluates the model it
holds (the initial one) and then stops as failed instead of reporting success.
"""

import json
import shutil

import pytest
from flwr.app import Context, RecordDict
from identities import IDENTITY_DIR

from flwr_fedeval.app import server_app
from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.testing import InProcessGrid


def _run(run_config: dict) -> InProcessGrid:
    ids = run_config["identity-dir"]  # the same three nodes in both runs: their ledgers beside their keys
    nodes = [{"partition-id": i, "num-partitions": 3, "fedeval-ledger": f"{ids}/node-{i}.ledger.sqlite"}
             for i in range(3)]
    grid = InProcessGrid(client_app, 3, run_config, node_configs=nodes)
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    return grid


def test_a_run_whose_every_round_was_refused_stops_as_failed_with_its_results(tmp_path):
    ids = tmp_path / "ids"  # these nodes' own ledgers, fresh
    shutil.copytree(IDENTITY_DIR, ids)
    config = {"num-server-rounds": 1, "local-epochs": 1, "model": "logreg", "secure-aggregation": "xmkckks",
              "identity-dir": str(ids)}

    _run({**config, "output-dir": str(tmp_path / "first")})
    (first,) = (tmp_path / "first").iterdir()
    assert json.loads((first / "results.json").read_text())["trained_rounds"] == [1]

    with pytest.raises(server_app.NoTrainedRound):
        _run({**config, "output-dir": str(tmp_path / "second")})
    (second,) = (tmp_path / "second").iterdir()
    result = json.loads((second / "results.json").read_text())
    assert result["trained_rounds"] == [] and result["train_metrics"] == {}
    refusals = [f for f in result["failures"] if f["step"] == "train"]
    assert len(refusals) == 3 and {f["code_name"] for f in refusals} == {"ALREADY_CONTRIBUTED"}, result["failures"]
    assert result["federated_auc"] is not None  # the model it holds (the initial one) was evaluated, and said so
