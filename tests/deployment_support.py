"""Shared by the deployment-engine tests (tests/deployment): where Flower's tools are, the time budget,
and running an example App (examples/) end to end."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Hard bound per test (start-up and every run). Overridable for slower hosts.
BUDGET_S = float(os.environ.get("FEDEVAL_DEPLOYMENT_BUDGET_S", 25 * 60))


def bin_dir() -> Path:
    """The venv's bin dir: the repo's ``.venv/bin``, else ``sys.executable``'s."""
    for candidate in (REPO_ROOT / ".venv" / "bin", Path(sys.executable).parent):
        if (candidate / "flower-superlink").exists():
            return candidate
    pytest.fail("flower-superlink not found in .venv/bin (run scripts/bootstrap.sh)")


#: The node policy the examples' READMEs ask their nodes for (``--policy`` of ``flwr_fedeval.keys
#: create``, issue 22): report the FHE AUC, answer both phases of the one global model, at ε = 8.
EXAMPLE_POLICY = {"fedeval-share-auc": True, "fedeval-dp-epsilon": 8.0, "fedeval-evaluations-per-model": 2}


def import_example(example: Path, module: str) -> ModuleType:
    """Import ``module`` of an example App the way its ClientApp does (the example's folder on the path)."""
    sys.path.insert(0, str(example))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(example))


def run_example(deployment, tmp_path: Path, example: Path, num_nodes: int = 3, rounds: int = 2) -> tuple[dict, Path]:
    """``flwr run`` an example on one SuperLink and ``num_nodes`` SuperNodes (TLS, roster identities
    with :data:`EXAMPLE_POLICY`) for ``rounds`` rounds; fails the test unless the run is
    ``finished:completed`` (Control API status). Returns the run's ``results.json`` and its output folder."""
    from flwr_fedeval.keys import create
    from flwr_fedeval.testing.deployment import DeploymentError

    ids = tmp_path / "ids"
    create(ids, [f"node-{k}" for k in range(num_nodes)], policy=EXAMPLE_POLICY)
    deadline = time.monotonic() + BUDGET_S
    out = tmp_path / "outputs"
    try:
        deployment.start_superlink()
        for k in range(num_nodes):
            deployment.start_supernode(f"supernode-{k}", {
                "partition-id": k, "num-partitions": num_nodes,
                "fedeval-identity-key": f"{ids}/node-{k}.key", "fedeval-roster": f"{ids}/roster.json"})
        deployment.wait_for_nodes(num_nodes)
        run = deployment.run(example, f"num-server-rounds={rounds} min-nodes={num_nodes} output-dir='{out}'",
                             timeout=max(1.0, deadline - time.monotonic()))
    except DeploymentError as exc:
        pytest.fail(f"{exc}\n{deployment.tails()}")
    assert run.status == "finished:completed", f"{run.status}\n{run.output}\n{deployment.tails()}"
    return json.loads((out / "results.json").read_text()), out


def check_example_aucs(results: dict, labels: list, scores: list, num_nodes: int = 3) -> None:
    """The FHE AUC of ``results.json`` equals ``roc_auc_score`` of the final model's ``scores`` on the
    pooled test ``labels`` (one array per node) within the certified resolution bound; every node
    contributed; the DP AUC, for an example that runs DPAUC_Lap (``dp_auc`` in ``results.json``), is in [0, 1]."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    reference = roc_auc_score(np.concatenate(labels), np.concatenate(scores))
    assert results["fhe_contributors"] == num_nodes, results
    bound = results["fhe_resolution_bound"]
    assert 0 <= bound < 0.05, results
    assert abs(results["fhe_auc"] - reference) <= bound + 1e-6, (results, reference)
    if "dp_auc" in results:
        assert 0.0 <= results["dp_auc"] <= 1.0, results
