"""``examples/quickstart-tensorflow`` runs as a Flower App on the deployment engine (issue 23).

Flower's quickstart-tensorflow shape (Keras weights travel as a list ``ArrayRecord``) on a binary
task, with xMK-CKKS secure aggregation, the FHE AUC (malicious protocol) and DPAUC_Lap: one
SuperLink and three SuperNodes with TLS, every node with its roster identity, ``flwr run
examples/quickstart-tensorflow``. Checked: the run completes (Control API status), the saved
``final_model.keras`` has the example's architecture, and the FHE AUC equals ``roc_auc_score`` of
that model on the pooled test splits within the certified resolution bound.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from deployment_support import BUDGET_S
from sklearn.metrics import roc_auc_score

from flwr_fedeval.testing.deployment import DeploymentError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-tensorflow"
NUM_NODES = 3
#: The node policy the example's README asks its nodes for (``--policy`` of ``flwr_fedeval.keys create``).
EXAMPLE_POLICY = {"fedeval-share-auc": True, "fedeval-dp-epsilon": 8.0, "fedeval-evaluations-per-model": 2}

pytestmark = [pytest.mark.deployment, pytest.mark.slow]


def test_quickstart_tensorflow_on_deployment_engine(deployment, tmp_path):
    import keras  # the [keras] extra (in [dev]); TensorFlow only here, lazily

    sys.path.insert(0, str(EXAMPLE))  # the example's own package, as its ClientApp imports it
    try:
        from tfexample.task import load_data, load_model, scores
    finally:
        sys.path.remove(str(EXAMPLE))
    from flwr_fedeval.keys import create

    ids = tmp_path / "ids"
    # the nodes' policy (issue 22; the example's README): report the FHE AUC, answer both phases of
    # the one global model, at the example's ε = 8
    create(ids, [f"node-{k}" for k in range(NUM_NODES)], policy=EXAMPLE_POLICY)
    deadline = time.monotonic() + BUDGET_S
    dep = deployment
    try:
        dep.start_superlink()
        for k in range(NUM_NODES):
            dep.start_supernode(f"supernode-{k}", {
                "partition-id": k, "num-partitions": NUM_NODES,
                "fedeval-identity-key": f"{ids}/node-{k}.key", "fedeval-roster": f"{ids}/roster.json"})
        dep.wait_for_nodes(NUM_NODES)
        out = tmp_path / "outputs"
        run = dep.run(EXAMPLE, f"num-server-rounds=2 min-nodes={NUM_NODES} output-dir='{out}'",
                      timeout=max(1.0, deadline - time.monotonic()))
    except DeploymentError as exc:
        pytest.fail(f"{exc}\n{dep.tails()}")
    assert run.status == "finished:completed", f"{run.status}\n{run.output}\n{dep.tails()}"

    results = json.loads((out / "results.json").read_text())
    model = keras.models.load_model(out / "final_model.keras", compile=False)
    expected = [w.shape for w in load_model().get_weights()]
    assert [w.shape for w in model.get_weights()] == expected  # the example's 30→16→2 MLP
    y, s = [], []
    for k in range(NUM_NODES):
        _, _, x_test, y_test = load_data(k, NUM_NODES)
        y.append(y_test)
        s.append(scores(model, x_test))
    reference = roc_auc_score(np.concatenate(y), np.concatenate(s))
    assert results["fhe_contributors"] == NUM_NODES, results
    bound = results["fhe_resolution_bound"]
    assert 0 <= bound < 0.05, results
    assert abs(results["fhe_auc"] - reference) <= bound + 1e-6, (results, reference)
    assert 0.0 <= results["dp_auc"] <= 1.0, results
