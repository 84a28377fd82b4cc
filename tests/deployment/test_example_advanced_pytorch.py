"""``examples/advanced-pytorch`` runs as a Flower App on the deployment engine, and the same App with
one line of its ClientApp missing fails the run.

Flower's advanced-pytorch shape: the user's ``CustomFedAvg`` with its own ``start()`` (a checkpoint
and the metrics after every round, a learning-rate schedule) and a server-side ``evaluate_fn``,
wrapped in ``SecureAggregation``; then the FHE AUC (malicious protocol). One SuperLink and three
SuperNodes with TLS, every node with its roster identity. Checked:

* the run completes (Control API status); the strategy's own loop ran under secure aggregation:
  ``model_round_<r>.pt`` for every round, ``rounds.json`` with every round's train, client-side and
  server-side metrics (the train metrics carry ``num-clients``, which only the secure aggregation
  writes), and the last checkpoint is the saved final model;
* the FHE AUC equals ``roc_auc_score`` of the saved model on the pooled test splits within the
  certified resolution bound;
* then, on the same SuperLink and SuperNodes, a copy of the App without
  ``register_xmkckks_handlers(app)`` in its ClientApp: the run ends ``finished:failed`` (Control API
  status), and the SuperLink's status details (the ServerApp's exception) name the missing line.
  Before, such a run trained nothing, returned the initial model and ended ``finished:completed``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from deployment_support import BUDGET_S, check_example_aucs, import_example, run_example

from flwr_fedeval.testing.deployment import DeploymentError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "advanced-pytorch"
NUM_NODES = 3
ROUNDS = 2  # run_example's num-server-rounds
MISSING_LINE = "register_xmkckks_handlers(app)"

pytestmark = [pytest.mark.deployment, pytest.mark.slow]


def _miswired_copy(folder: Path) -> Path:
    """The example without ``register_xmkckks_handlers(app)`` (another version: a FAB of its own)."""
    app = folder / "advanced-pytorch-miswired"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__", "outputs"))
    client = app / "pytorch_example" / "client_app.py"
    lines = client.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if not ln.startswith(MISSING_LINE)]
    assert len(kept) == len(lines) - 1, "the example's ClientApp no longer has the line this test removes"
    client.write_text("".join(kept))
    project = app / "pyproject.toml"
    project.write_text(project.read_text().replace('version = "1.0.0"', 'version = "1.0.1"', 1))
    return app


def test_advanced_pytorch_on_deployment_engine_and_a_miswired_copy_fails(deployment, tmp_path):
    import torch  # the [dev] extra pins torch==2.13.0 (the CPU wheel) on Python 3.11

    t0 = time.monotonic()
    task = import_example(EXAMPLE, "pytorch_example.task")
    results, out = run_example(deployment, tmp_path, EXAMPLE, NUM_NODES)

    rounds = json.loads((out / "rounds.json").read_text())
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1)), rounds
    for r in rounds:
        assert r["train_metrics"]["num-clients"] == NUM_NODES, r  # aggregated under xMK-CKKS
        assert 0.0 <= r["evaluate_metrics_serverapp"]["accuracy"] <= 1.0, r  # evaluate_fn ran
        assert 0.0 <= r["evaluate_metrics_clientapp"]["eval_acc"] <= 1.0, r
    final = torch.load(out / "final_model.pt")
    for k in range(1, ROUNDS + 1):
        assert (out / f"model_round_{k}.pt").exists(), k
    last = torch.load(out / f"model_round_{ROUNDS}.pt")
    assert list(final) == list(last) == list(task.Net().state_dict())
    assert all(torch.equal(final[name], last[name]) for name in final)
    first = torch.load(out / "model_round_1.pt")
    assert any(not torch.equal(first[name], last[name]) for name in first)  # round 2 changed the model

    net = task.Net()
    net.load_state_dict(final)
    splits = [task.load_data(k, NUM_NODES) for k in range(NUM_NODES)]
    check_example_aucs(results, [y for *_, y in splits], [task.scores(net, x) for _, _, x, _ in splits], NUM_NODES)

    # The same SuperLink and SuperNodes, one short run of the App with a line of its ClientApp missing.
    miswired_out = tmp_path / "miswired-outputs"
    try:
        run = deployment.run(
            _miswired_copy(tmp_path),
            f"num-server-rounds=1 min-nodes={NUM_NODES} output-dir='{miswired_out}'",
            name="miswired",
            timeout=max(1.0, t0 + BUDGET_S - time.monotonic()),
        )
    except DeploymentError as exc:
        pytest.fail(f"{exc}\n{deployment.tails()}")
    assert run.status == "finished:failed", f"{run.status}\n{run.output}"
    details = deployment.runs()[run.run_id]["status-details"]  # the SuperLink's record of the exception
    assert MISSING_LINE in details, details
    assert not (miswired_out / "final_model.pt").exists()  # no model came out of it
