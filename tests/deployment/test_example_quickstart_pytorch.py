"""``examples/quickstart-pytorch`` runs as a Flower App on the deployment engine (issue 23).

Flower's quickstart-pytorch shape (a PyTorch ``state_dict`` travels as a named ``ArrayRecord``)
with xMK-CKKS secure aggregation, the FHE AUC (malicious protocol) and DPAUC_Lap: one SuperLink
and three SuperNodes with TLS, every node with its roster identity, ``flwr run
examples/quickstart-pytorch``. Checked: the run completes (Control API status), the final model
is a ``state_dict`` with the example's names, and the FHE AUC equals ``roc_auc_score`` of that
model on the pooled test splits within the certified resolution bound.
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

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-pytorch"
NUM_NODES = 3

pytestmark = [pytest.mark.deployment, pytest.mark.slow]


def test_quickstart_pytorch_on_deployment_engine(deployment, tmp_path):
    import torch  # the [dev] extra pins torch==2.13.0 (the CPU wheel) on Python 3.11

    sys.path.insert(0, str(EXAMPLE))  # the example's own package, as its ClientApp imports it
    try:
        from pytorchexample.task import Net, load_data, scores
    finally:
        sys.path.remove(str(EXAMPLE))
    from flwr_fedeval.keys import create

    ids = tmp_path / "ids"
    create(ids, [f"node-{k}" for k in range(NUM_NODES)])
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
    state = torch.load(out / "final_model.pt")
    net = Net()
    assert list(state) == list(net.state_dict()), list(state)  # the state_dict's names survived
    net.load_state_dict(state)
    y, s = [], []
    for k in range(NUM_NODES):
        _, _, x_test, y_test = load_data(k, NUM_NODES)
        y.append(y_test)
        s.append(scores(net, x_test))
    reference = roc_auc_score(np.concatenate(y), np.concatenate(s))
    assert results["fhe_contributors"] == NUM_NODES, results
    bound = results["fhe_resolution_bound"]
    assert 0 <= bound < 0.05, results
    assert abs(results["fhe_auc"] - reference) <= bound + 1e-6, (results, reference)
    assert 0.0 <= results["dp_auc"] <= 1.0, results
