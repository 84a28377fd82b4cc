"""A SuperNode paused (SIGSTOP) during training on Flower's deployment engine (issue 16.6).

Starts a SuperLink and ``--nodes`` SuperNodes on 127.0.0.1 with TLS
(:class:`flwr_fedeval.testing.deployment.LocalDeployment`), runs the main job
(logreg, breast-cancer, ``--rounds`` rounds, plain FedAvg, plaintext AUC),
SIGSTOPs one SuperNode (and its ClientApp) as soon as round 1's training
starts, resumes it (SIGCONT) after ``--pause`` seconds, and reports what the
ServerApp recorded: the failure's code, reason and seconds to detect, and
whether the node took part again afterwards. Writes
``benchmarks/results/deployment_pause.json``.

    .venv/bin/python benchmarks/bench_deployment_pause.py [--nodes 3] [--pause 70] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from flwr_fedeval.keys import create
from flwr_fedeval.testing.deployment import LocalDeployment

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--pause", type=float, default=70.0, help="seconds the SuperNode stays stopped")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    out = ROOT / "benchmarks" / "results" / "deployment_pause.json"
    with tempfile.TemporaryDirectory() as tmp, LocalDeployment(tmp, bin_dir=Path(sys.executable).parent) as dep:
        tmp = Path(tmp)
        create(tmp / "ids", [f"node-{k}" for k in range(args.nodes)])
        roster = tmp / "ids" / "roster.json"
        dep.start_superlink()
        for k in range(args.nodes):
            dep.start_supernode(f"node-{k}", {"partition-id": k, "num-partitions": args.nodes,
                                              "fedeval-identity-key": f"{tmp}/ids/node-{k}.key",
                                              "fedeval-roster": str(roster)})
        ids = dep.wait_for_nodes([f"node-{k}" for k in range(args.nodes)])
        config = (f"num-server-rounds={args.rounds} local-epochs=1 model='logreg' dataset='breast-cancer' "
                  f"min-nodes=2 output-dir='{tmp}/out' fedeval-roster='{roster}'")
        dep.submit(ROOT, config)
        run_id = dep.run_id()
        deadline = time.monotonic() + 1800
        dep.wait_for_log("flwr-run", r"configure_train: Sampled", deadline)
        t_stop = time.monotonic()
        dep.kill("node-1", signal.SIGSTOP)
        time.sleep(args.pause)
        dep.kill("node-1", signal.SIGCONT)
        t_cont = time.monotonic()
        dep.wait_for_log("flwr-run", r"Results written to", deadline)
        status = dep.wait_finished(run_id, 120)
        (folder,) = [p.parent for p in (tmp / "out").glob("*/results.json")]
        result = json.loads((folder / "results.json").read_text())
        stream = dep.output("flwr-run")
    failures = [f for f in result["failures"] if str(f["node"]) == str(ids["node-1"])]
    report = {
        "nodes": args.nodes, "pause_s": args.pause, "rounds": args.rounds, "status": status,
        "paused_node": str(ids["node-1"]), "failures_of_paused_node": failures,
        "paused_node_in_final_auc": str(ids["node-1"]) in result["contributors"],
        "train_metrics": result["train_metrics"],
        "seconds_from_sigcont_to_end": round(time.monotonic() - t_cont, 1),
        "seconds_stopped": round(t_cont - t_stop, 1),
        "load_average": os.getloadavg(),
        "log_lines": [line for line in stream.splitlines() if "failure:" in line or "Sampled" in line],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "train_metrics"}, indent=2))
    return 0 if status == "finished:completed" else 1


if __name__ == "__main__":
    sys.exit(main())
