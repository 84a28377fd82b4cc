"""The main job on Flower's deployment engine, with TLS, over 127.0.0.1.

One SuperLink and three SuperNodes are started as real processes (Flower
1.41 command line tools from this project's venv), the Flower App in the repo
root is submitted with ``flwr run <repo> <connection>`` against the
SuperLink's Control API: it trains a logistic regression for one round and
runs the SecSV phase, with a fourth SuperNode (``fedeval-role="shapley-aux"``)
as the auxiliary server, left out of training. (xMK-CKKS and the FHE AUC phase
on the deployment engine, with node crashes: ``test_deployment_faults.py``.)

Node identities (issue 12): every node gets its own signing key and the
roster through its node config (``fedeval-identity-key``, ``fedeval-roster``;
``python -m flwr_fedeval.keys create``); the ServerApp gets only the roster
(run config ``fedeval-roster``). A fifth SuperNode runs with a key of its own
that the roster does not list (and a roster of its own that does): it is
refused — left out of training and of the phase, named in the results —
and the run completes with the three data clients.

The processes are started and torn down by
:class:`flwr_fedeval.testing.deployment.LocalDeployment` (TLS with a throwaway
CA, one FLWR_HOME per process, every process's log in the test's tmp dir; the
fixture asserts that no process is left running). On flwr >= 1.41 every
SuperNode trusts only the deployment's publisher key (``--trusted-entities``)
and the App's FAB is submitted signed through the local app registry
(refusals: ``test_fab_trust.py``).

Flower 1.41 facts this relies on (read from its source and ``--help``):

* the SuperLink serves the Fleet, Control and Runtime (ServerAppIo) APIs over
  HTTPS on ONE ``--host``/``--port`` (``--fleet-api-address`` and
  ``--control-api-address`` are deprecated); TLS via ``--ssl-ca-certfile``,
  ``--ssl-certfile``, ``--ssl-keyfile`` for all of them;
* ``--isolation subprocess`` (the default) makes the SuperLink start a
  ``flower-superexec`` (found on PATH, started in a *new session*) that
  launches one ``flwr-serverapp`` per run; each SuperNode likewise starts a
  ``flower-superexec`` that launches one ``flwr-clientapp`` per message;
* the CLI addresses a SuperLink by a named connection in
  ``$FLWR_HOME/config.toml`` (``address``, ``root-certificates``: absolute).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from deployment_support import BUDGET_S

from flwr_fedeval.testing.deployment import DeploymentError, FlwrRun, LocalDeployment

REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_NODES = 3
# BUDGET_S bounds the whole test; the SecSV run took 460 s on the 2-core dev machine under load
# (load average ~8).
SHAPLEY_RUN_CONFIG = (
    "num-server-rounds=1 local-epochs=5 learning-rate=0.01 model='logreg' shapley='secsv' "
    "num-decision-points=20 min-nodes=3 dataset='breast-cancer'"
)

pytestmark = [pytest.mark.deployment, pytest.mark.slow]


def _completed(dep: LocalDeployment, run_config: str, name: str, deadline: float) -> str:
    """``flwr run`` against the deployment; returns the run id after checking its status (Control API)."""
    try:
        run: FlwrRun = dep.run(REPO_ROOT, run_config, name=name, timeout=max(1.0, deadline - time.monotonic()))
    except DeploymentError as exc:
        pytest.fail(str(exc))
    assert run.run_id, f"no run id in the CLI output\n{run.output}\n{dep.tails()}"
    assert run.status == "finished:completed", f"{name}: {run.status}\n{dep.tails()}"
    return run.run_id


def test_shapley_on_deployment_engine_with_tls(deployment, tmp_path):
    """Three data SuperNodes, one auxiliary server (``fedeval-role="shapley-aux"``) and an intruder:
    one logreg round + the SecSV phase (multi-round FSVs are checked over the in-process grid,
    tests/shapley_flower)."""
    dep = deployment
    t0 = time.monotonic()
    deadline = t0 + BUDGET_S
    # One signing key per node and the federation's roster; the intruder has its own key and roster.
    from flwr_fedeval.keys import create

    ids, other = tmp_path / "ids", tmp_path / "intruder-ids"
    create(ids, [f"node-{k}" for k in range(NUM_NODES)] + ["aux"])
    create(other, ["intruder"])
    roster = ids / "roster.json"

    try:
        dep.start_superlink()  # Fleet + Control + ServerAppIo APIs over TLS
        for k in range(NUM_NODES):
            dep.start_supernode(f"supernode-{k}", {
                "partition-id": k, "num-partitions": NUM_NODES,
                "fedeval-identity-key": f"{ids}/node-{k}.key", "fedeval-roster": str(roster)})
        aux_id = dep.start_supernode(f"supernode-{NUM_NODES}", {
            "fedeval-role": "shapley-aux", "fedeval-identity-key": f"{ids}/aux.key", "fedeval-roster": str(roster)})
        dep.start_supernode(f"supernode-{NUM_NODES + 1}", {   # not in the federation's roster
            "partition-id": 0, "num-partitions": NUM_NODES,
            "fedeval-identity-key": f"{other}/intruder.key", "fedeval-roster": f"{other}/roster.json"})
        dep.wait_for_nodes([f"supernode-{k}" for k in range(NUM_NODES + 2)])  # registered over TLS
    except DeploymentError as exc:
        pytest.fail(str(exc))
    t_up = time.monotonic() - t0

    # The SecSV phase, with A on its own SuperNode (a process per message, state in the SuperNode).
    out_dir = tmp_path / "outputs-shapley"
    t1 = time.monotonic()
    _completed(dep,
                          f"{SHAPLEY_RUN_CONFIG} output-dir='{out_dir}' fedeval-roster='{roster}'",
                          "flwr-run-shapley", deadline)
    t_shapley = time.monotonic() - t1
    if dep.signs_fabs:  # the nodes trust only the publisher key; the App's FAB came signed, via the registry
        assert dep.registry is not None and dep.registry.fetches == [dep.build(REPO_ROOT).app_spec]
    (result_file,) = list(out_dir.glob("*/results.json"))
    shapley_result = json.loads(result_file.read_text())
    # the intruder was refused (not in the roster) and left out of training and the phase
    (refused,) = shapley_result["refused_nodes"].values()
    assert "unknown signer 'intruder'" in refused, shapley_result["refused_nodes"]
    sv = shapley_result["shapley"]
    assert len(sv["clients"]) == 3 and sv["aux_node"] not in sv["clients"] and sv["rounds"] == [1], sv
    assert int(sv["aux_node"]) == aux_id, (sv["aux_node"], aux_id)  # the SuperNode with fedeval-role
    full = sv["utilities"][-1]["-".join(map(str, sorted(sv["clients"])))]
    assert sum(sv["fsv"].values()) == pytest.approx(full - 0.5, abs=1e-9)
    print(
        f"deployment run: processes up in {t_up:.1f} s, Shapley run {t_shapley:.1f} s (FSV {sv['fsv']})"
    )
