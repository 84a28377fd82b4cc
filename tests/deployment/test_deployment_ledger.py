"""The node privacy ledger outlives runs and a SuperLink restart, on Flower's deployment engine.

A SuperLink and three SuperNodes (TLS, roster identities made by ``python -m flwr_fedeval.keys
create``, which also writes each node's ledger beside its key; the default node policy: one DP
evaluation at ε = 1 in the node's life) run the main job twice:

1. run A: one xMK-CKKS secure-aggregation round from the seeded initial model, then DPAUC_Lap on the
   trained model (Laplace noise on the counts: every evaluation spends ε; DPAUC_RR's permanent
   randomized response would answer again for free, with the same flips). It completes; each node's
   ledger holds the initial model as trained on and ε = 1 spent (read from the ledger files, as
   ``python -m flwr_fedeval.keys ledger`` prints them);
2. the SuperLink is killed (SIGKILL, with its ServerApp) and restarted on the same database; the
   SuperNodes, never restarted, reconnect. A new run is a fresh ``context.state`` on every node:
   nothing of run A is left there;
3. run B: the same run config, hence the same initial model. Every node refuses to train on it
   (``ALREADY_CONTRIBUTED``: the ledger, not the run, remembers), and the DP evaluation of this run's
   model — another model than run A evaluated — is refused by every node (``BUDGET_EXHAUSTED``):
   its ε is spent. The ledgers are unchanged by run B: no second model, no second spend.

Nothing here reads a Flower log: statuses come from the SuperLink's Control API, the rest from the
run folders and the ledger files.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from deployment_support import BUDGET_S

from flwr_fedeval.ledger import NodeLedger
from flwr_fedeval.testing.deployment import DeploymentError

REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_NODES = 3
RUN_CONFIG = (
    "num-server-rounds=1 local-epochs=1 model='logreg' dataset='breast-cancer' seed=42 "
    f"secure-aggregation='xmkckks' auc-method='dpauc-laplace' min-nodes={NUM_NODES}"
)

pytestmark = [pytest.mark.deployment, pytest.mark.slow]


def _results(out: Path) -> dict:
    (path,) = out.glob("*/results.json")
    return json.loads(path.read_text())


def _codes(result: dict, step_part: str) -> dict[str, set[str]]:
    """Per node, the reply codes of the failures recorded at steps whose name contains ``step_part``."""
    codes: dict[str, set[str]] = {}
    for f in result.get("failures", []):
        if step_part in str(f.get("step", "")):
            codes.setdefault(str(f["node"]), set()).add(str(f.get("code_name")))
    return codes


def test_the_ledger_refuses_a_trained_model_and_a_spent_budget_after_a_superlink_restart(deployment, tmp_path):
    dep = deployment
    deadline = time.monotonic() + BUDGET_S
    from flwr_fedeval.keys import create

    ids = tmp_path / "ids"
    create(ids, [f"node-{k}" for k in range(NUM_NODES)])
    ledgers = [NodeLedger(ids / f"node-{k}.ledger.sqlite") for k in range(NUM_NODES)]
    assert all(not lg.summary().trained and not lg.summary().epsilon for lg in ledgers)
    roster = ids / "roster.json"
    out_a, out_b = tmp_path / "outputs-a", tmp_path / "outputs-b"
    try:
        dep.start_superlink()
        for k in range(NUM_NODES):
            dep.start_supernode(f"node-{k}", {
                "partition-id": k, "num-partitions": NUM_NODES,
                "fedeval-identity-key": f"{ids}/node-{k}.key", "fedeval-roster": str(roster)})
        node_ids = dep.wait_for_nodes(NUM_NODES)
        run_a = dep.run(REPO_ROOT, f"{RUN_CONFIG} output-dir='{out_a}' fedeval-roster='{roster}'",
                        name="run-a", timeout=max(1.0, deadline - time.monotonic()))
        assert run_a.status == "finished:completed", f"{run_a.status}\n{run_a.output[-4000:]}\n{dep.tails()}"

        dep.kill("superlink")  # SIGKILL: the SuperLink and whatever it started
        dep.start_superlink()
        dep.wait_for_nodes(list(node_ids), timeout=max(1.0, deadline - time.monotonic()))
        run_b = dep.run(REPO_ROOT, f"{RUN_CONFIG} output-dir='{out_b}' fedeval-roster='{roster}'",
                        name="run-b", timeout=max(1.0, deadline - time.monotonic()))
    except DeploymentError as exc:
        pytest.fail(f"{exc}\n{dep.tails()}")

    result_a = _results(out_a)
    assert result_a["train_metrics"]["1"]["num-clients"] == NUM_NODES, result_a["train_metrics"]
    assert result_a["federated_auc"] is not None and 0.0 <= result_a["federated_auc"] <= 1.0, result_a
    after_a = [lg.summary() for lg in ledgers]
    for s in after_a:
        assert s.trained == {"train": 1}, s
        ((spent, _left, spends),) = s.epsilon.values()
        assert spent == pytest.approx(1.0) and spends == 1, s

    # run B: every node refuses the model it trained on in run A, and the DP evaluation (its ε is spent)
    assert run_b.status.startswith("finished:"), f"{run_b.status}\n{run_b.output[-4000:]}\n{dep.tails()}"
    result_b = _results(out_b)
    nodes = {str(i) for i in node_ids.values()}
    train_codes = _codes(result_b, "train")
    assert set(train_codes) == nodes and all("ALREADY_CONTRIBUTED" in c for c in train_codes.values()), (
        result_b.get("failures"))
    assert result_b.get("federated_auc") is None, result_b
    budget_refused = {str(n) for n in (result_b.get("auc_details") or {}).get("budget_refused", [])}
    budget_codes = {n for n, c in _codes(result_b, "").items() if "BUDGET_EXHAUSTED" in c}
    assert budget_refused | budget_codes == nodes, (result_b.get("failures"), result_b.get("auc_details"))
    # nothing more was given: the same model once, the same single spend
    assert [lg.summary().trained for lg in ledgers] == [s.trained for s in after_a]
    assert [lg.summary().epsilon for lg in ledgers] == [s.epsilon for s in after_a]
