"""Cost of one node-ledger request at 100,000 recorded models (:mod:`flwr_fedeval.ledger`).

A node opens its ledger once per message (:func:`flwr_fedeval.clients.ledger.node_ledger`) and
makes one or two calls, each its own ``BEGIN IMMEDIATE`` transaction committed with
``synchronous = FULL`` (an fsync of the WAL). This measures, per request, open + the call, on a
ledger that already holds ``--models`` trained models and as many evaluated ones (filled in one
transaction through SQLite directly, which is setup, not what is measured):

* ``record_training`` of a new model (what the xMK client does before its update leaves);
* ``record_training`` of a recorded model (refused: a deviating server's replay);
* ``record_evaluation`` of a new model; ``spend_epsilon``; ``trained`` (a read, no lock).

A write is durable only once the disk says so: each write request costs one or two ``fsync`` of
the write-ahead log (the first commit of a new connection syncs twice), so the benchmark also
measures one ``fsync`` of a 4 KiB write in the same folder, the floor on this disk.

Writes ``benchmarks/results/bench_ledger.json``; the target is <= 5 ms per request.

    .venv/bin/python benchmarks/bench_ledger.py [--models 100000] [--repeats 300]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from flwr_fedeval.ledger import AlreadyGiven, NodeLedger

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 5.0


def _h(tag: str, i: int) -> bytes:
    return hashlib.sha256(f"{tag} {i}".encode()).digest()


def fill(path: Path, models: int) -> None:
    """``models`` trained and ``models`` evaluated models, in one transaction (row counts kept)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    db.executemany(
        "INSERT INTO trained VALUES (?, 'train', '2025-01-01T00:00:00+00:00')",
        ((_h("trained", i),) for i in range(models)),
    )
    db.executemany(
        "INSERT INTO evaluations VALUES (?, 'FHE AUC', 1, '2025-01-01T00:00:00+00:00')",
        ((_h("evaluated", i),) for i in range(models)),
    )
    db.execute("UPDATE row_counts SET count = ? WHERE name IN ('trained', 'evaluations')", (models,))
    db.execute("COMMIT")
    db.close()


def measure(fn, repeats: int) -> dict[str, float]:
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1e3)
    a = np.array(times)
    return {
        "median_ms": float(np.median(a)),
        "p95_ms": float(np.percentile(a, 95)),
        "max_ms": float(a.max()),
        "repeats": repeats,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--dir", default=None, help="folder for the ledger (default: a temporary one under /tmp)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "node-0.ledger.sqlite"
        NodeLedger.create(path)
        fill(path, args.models)

        def new_model(i):
            NodeLedger(path).record_training(_h("new", i))

        def replay(i):
            try:
                NodeLedger(path).record_training(_h("trained", i))
            except AlreadyGiven:
                return
            raise AssertionError("a recorded model was granted")

        def evaluation(i):
            NodeLedger(path).record_evaluation(_h("new-eval", i), "DPAUC_RR", 1)

        def epsilon(i):
            NodeLedger(path).spend_epsilon("test-set", 1e-6, 1.0)

        def read(i):
            NodeLedger(path).trained(_h("trained", i))

        probe = open(Path(tmp) / "fsync-probe", "wb")  # noqa: SIM115 (closed below)

        def fsync(i):
            probe.write(b"x" * 4096)
            probe.flush()
            os.fsync(probe.fileno())

        results = {
            name: measure(fn, args.repeats)
            for name, fn in [
                ("fsync of 4 KiB (the disk's floor)", fsync),
                ("record_training (new model)", new_model),
                ("record_training (replay, refused)", replay),
                ("record_evaluation (new model)", evaluation),
                ("spend_epsilon", epsilon),
                ("trained (read)", read),
            ]
        }
        probe.close()
        size = path.stat().st_size
    out = {
        "command": "benchmarks/bench_ledger.py " + " ".join(sys.argv[1:]),
        "models": args.models,
        "target_ms": TARGET_MS,
        "ledger_bytes": size,
        "sqlite": sqlite3.sqlite_version,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "results": results,
        "meets_target": all(r["median_ms"] <= TARGET_MS for r in results.values()),
        "note": "write requests cost one or two fsyncs of the WAL; compare with the fsync row",
    }
    target = ROOT / "benchmarks" / "results" / "bench_ledger.json"
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(f"ledger with {args.models:,} trained + {args.models:,} evaluated models ({size / 2**20:.1f} MiB)")
    print(f"{'request (open + call)':<36} {'median ms':>10} {'p95 ms':>8} {'max ms':>8}")
    for name, r in results.items():
        print(f"{name:<36} {r['median_ms']:>10.3f} {r['p95_ms']:>8.3f} {r['max_ms']:>8.3f}")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
