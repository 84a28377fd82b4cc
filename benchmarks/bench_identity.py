"""Cost of node authentication in the FHE AUC phase (issue 12: <= 0.1 s at 100 clients).

One run, side by side, JSON out (``benchmarks/results/identity.json``):

1. **The phase at ``--clients`` clients** (default 100) over the serializing
   in-process grid with the real FHE AUC handlers (synthetic test scores, no
   TensorFlow), the server holding the roster: every call of the signing and
   verification functions is timed (process CPU time and wall clock), split
   by who runs it (server, key holder, other clients). Everything runs in one
   process here, so the sum over all clients is an upper bound; what a real
   deployment waits for is the **critical path**: the server's verifications
   (step 1 and the key holder's key) + the key holder's key-set check and
   its own signature + one client's signature and one verification (the
   clients run in parallel).
2. **Per-operation cost** on P-256 (the key type we create) and P-384
   (Flower's example curve), median of ``--repeats``, and the critical path
   at 100 clients they imply.

The phase time without authentication is the phase time minus the time
spent in the authentication functions (they are the only additions).

Usage::

    .venv/bin/python benchmarks/bench_identity.py [--clients 100] [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
BUDGET_S = 0.1


def _op_costs(repeats: int) -> dict:
    from cryptography.hazmat.primitives.asymmetric import ec

    from flwr_fedeval.identity import NodeIdentity, Roster, sign_key, verify_key

    out = {}
    for curve in (ec.SECP256R1(), ec.SECP384R1()):
        ident = NodeIdentity("node-0", ec.generate_private_key(curve))
        roster = Roster.from_identities([ident])
        stmt = dict(protocol="fhe-auc", session="0" * 32, round=0, role="client", key=b"k" * 32)
        sig = sign_key(ident, **stmt)
        t_sign, t_verify = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            sign_key(ident, **stmt)
            t_sign.append(time.perf_counter() - t)
            t = time.perf_counter()
            verify_key(roster, "node-0", sig, **stmt)
            t_verify.append(time.perf_counter() - t)
        sign, verify = statistics.median(t_sign), statistics.median(t_verify)
        n = 100
        critical = (n + 1) * verify + (n - 1) * verify + 2 * sign + verify
        out[curve.name] = {"sign_s": sign, "verify_s": verify, "critical_path_100_clients_s": critical}
    return out


def _phase(n_clients: int, n_points: int) -> dict:
    from flwr.app import ArrayRecord, Context, Message
    from flwr.clientapp import ClientApp

    from flwr_fedeval import identity
    from flwr_fedeval.clients import fhe_handlers
    from flwr_fedeval.keys import create
    from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase
    from flwr_fedeval.testing import InProcessGrid

    def data(context: Context):
        rng = np.random.default_rng(int(context.node_config["partition-id"]))
        y = rng.integers(0, 2, 60)
        return y, np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1)

    app = ClientApp()
    where = {"who": "server"}

    def as_client(handler):
        def run(msg: Message, context: Context) -> Message:
            where["who"] = "key holder" if msg.metadata.message_type == "query.fhe_keygen" else "client"
            try:
                return handler(msg, context)
            finally:
                where["who"] = "server"
        return run

    app.query("fhe_pubkey")(as_client(lambda m, c: fhe_handlers.pubkey(m, c, 60)))
    app.query("fhe_keygen")(as_client(fhe_handlers.keygen))
    app.evaluate("fhe_counts")(as_client(lambda m, c: fhe_handlers.encrypt_counts(m, c, *data(c))))
    app.query("fhe_result")(as_client(fhe_handlers.decrypt_result))

    spent: dict[str, list[float]] = defaultdict(list)
    calls: dict[str, int] = defaultdict(int)
    sign, verify = identity.NodeIdentity.sign, identity.Roster.verify

    def timed(fn, kind):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[f"{where['who']} {kind}"].append(time.perf_counter() - t)
                calls[f"{where['who']} {kind}"] += 1
        return wrapper

    identity.NodeIdentity.sign = timed(sign, "sign")
    identity.Roster.verify = timed(verify, "verify")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            create(tmp, [f"node-{i}" for i in range(n_clients)])
            grid = InProcessGrid(app, n_clients, {"fedeval-identity-dir": tmp, "fedeval-share-auc": True})
            roster = identity.Roster.load(Path(tmp) / "roster.json")
            phase = FHEAUCPhase(n_points, share_auc_with_server=True, min_nodes=2, roster=roster)
            t = time.perf_counter()
            result = phase.run(grid, ArrayRecord())
            wall = time.perf_counter() - t
    finally:
        identity.NodeIdentity.sign, identity.Roster.verify = sign, verify
    totals = {k: sum(v) for k, v in spent.items()}
    per_client = lambda kind: statistics.median(spent[f"client {kind}"]) if spent[f"client {kind}"] else 0.0
    critical = (totals.get("server verify", 0.0) + totals.get("key holder verify", 0.0)
                + totals.get("key holder sign", 0.0) + per_client("sign") + per_client("verify"))
    auth_total = sum(totals.values())
    return {
        "clients": n_clients, "decision_points": n_points, "auc": result.auc,
        "contributors": len(result.contributors),
        "phase_wall_s": wall, "phase_wall_without_auth_s": wall - auth_total,
        "auth_total_all_nodes_sequential_s": auth_total,
        "auth_critical_path_s": critical,
        "auth_seconds_by_party": totals, "auth_calls_by_party": dict(calls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    ops = _op_costs(args.repeats)
    phase = _phase(args.clients, args.points)
    out = {
        "benchmark": "identity (node authentication) in the FHE AUC phase",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average_1m": os.getloadavg()[0]},
        "budget_s": BUDGET_S,
        "per_operation": ops,
        "phase": phase,
        "within_budget": phase["auth_critical_path_s"] <= BUDGET_S,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "identity.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
