"""Per-client cost of the DP AUC client steps at |Θ| = 1000 (issue 6: <= 5 ms).

Times, per client, side by side:

* DPAUC_Lap client step (Laplace noise on 4·|Θ| counts) with the vectorised
  sampler and with diffprivlib's scalar ``Laplace.randomise``;
* the exact threshold counts that precede it (``metrics.counts.threshold_counts``);
* RR label flipping (vectorised vs diffprivlib ``Binary``) for the client's samples;
* FedAUC_Lap client step (local alpha and adaptive β).

Usage: ``python benchmarks/bench_dp.py [--samples 3000] [--repeats 50] [--docs]``.
Writes ``benchmarks/results/bench_dp.json``; ``--docs`` also publishes the
table in ``docs/results.md`` (:func:`flwr_fedeval.reporting.publish`).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
from diffprivlib import BudgetAccountant
from tqdm import tqdm

from flwr_fedeval.dp import (
    DPAUCLaplaceParams,
    FedAUCLaplaceParams,
    RandomizedResponseParams,
    dpauc_laplace_client,
    fedauc_laplace_client,
    randomize_labels,
)
from flwr_fedeval.metrics.counts import decision_points, threshold_counts
from flwr_fedeval.reporting import markdown_table, publish

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _time(fn, repeats: int) -> dict:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    t = np.array(times) * 1e3
    return {"median_ms": float(np.median(t)), "p90_ms": float(np.percentile(t, 90)), "repeats": repeats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thresholds", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=3000, help="test samples of one client (bank-marketing/15)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_dp.json"))
    ap.add_argument("--docs", nargs="?", const=str(DOCS), help="also publish the table in DOCS/results.md")
    args = ap.parse_args()

    rng = np.random.RandomState(0)
    y = rng.randint(0, 2, args.samples)
    s = rng.random_sample(args.samples)
    theta = decision_points(args.thresholds)
    counts = threshold_counts(y, s, theta)
    ranks = np.sort(rng.choice(45211, args.samples, replace=False)).astype(np.float64)
    lap = DPAUCLaplaceParams(1.0, args.thresholds)
    rr = RandomizedResponseParams(1.0)
    client_rng = np.random.RandomState(1)  # one RandomState per client, reused across steps

    def accountant():
        return BudgetAccountant(epsilon=float("inf"), delta=1.0)

    few = max(3, args.repeats // 10)  # the scalar paths are slow
    steps = {
        "threshold_counts": (lambda: threshold_counts(y, s, theta), args.repeats),
        "dpauc_laplace_client_vectorised": (
            lambda: dpauc_laplace_client(counts, lap, accountant=accountant(), random_state=client_rng),
            args.repeats),
        "dpauc_laplace_client_diffprivlib_scalar": (
            lambda: dpauc_laplace_client(counts, lap, accountant=accountant(), random_state=client_rng,
                                         sampler="diffprivlib"), few),
        "rr_flip_vectorised": (lambda: randomize_labels(y, rr, random_state=client_rng), args.repeats),
        "rr_flip_diffprivlib_scalar": (
            lambda: randomize_labels(y, rr, random_state=client_rng, sampler="diffprivlib"), few),
        "fedauc_laplace_client_local_alpha": (
            lambda: fedauc_laplace_client(ranks, y, FedAUCLaplaceParams(1.0, allocation="alpha"),
                                          random_state=client_rng),
            args.repeats),
        "fedauc_laplace_client_adaptive": (
            lambda: fedauc_laplace_client(ranks, y, FedAUCLaplaceParams(1.0, allocation="orthogonal", beta="adaptive"),
                                          random_state=client_rng), args.repeats),
    }
    results = {name: _time(fn, n) for name, (fn, n) in tqdm(steps.items(), desc="bench_dp", unit="step")}
    v = results["dpauc_laplace_client_vectorised"]["median_ms"]
    sc = results["dpauc_laplace_client_diffprivlib_scalar"]["median_ms"]
    report = {
        "benchmark": "bench_dp",
        "thresholds": args.thresholds,
        "client_samples": args.samples,
        "results": results,
        "speedup_vectorised_over_scalar_laplace": sc / v,
        "dpauc_client_total_ms": v + results["threshold_counts"]["median_ms"],
        "target_ms": 5.0,
        "meets_target": v + results["threshold_counts"]["median_ms"] <= 5.0,
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    for name, r in results.items():
        print(f"{name:45s} {r['median_ms']:9.3f} ms (p90 {r['p90_ms']:.3f})")
    print(f"vectorised/scalar speed-up: {report['speedup_vectorised_over_scalar_laplace']:.0f}x; "
          f"DPAUC client total {report['dpauc_client_total_ms']:.3f} ms (target 5 ms) -> {out}")
    if args.docs:
        table = markdown_table(["client step", "median ms", "p90 ms", "repeats"],
                               [[name, f"{r['median_ms']:.3f}", f"{r['p90_ms']:.3f}", r["repeats"]]
                                for name, r in results.items()], align="lrrr")
        body = (f"Per-client cost at |Θ| = {args.thresholds} decision points, {args.samples} test samples "
                f"(medians, one process, side by side). DPAUC_Lap client step + threshold counts: "
                f"**{report['dpauc_client_total_ms']:.2f} ms** (target ≤ 5 ms: "
                f"{'met' if report['meets_target'] else 'missed'}); vectorised Laplace draw "
                f"{report['speedup_vectorised_over_scalar_laplace']:.0f}× faster than diffprivlib's scalar "
                f"`randomise` (same distribution, tested draw for draw).\n\n" + table)
        where = publish('bench-dp', 'DP AUC client cost (benchmarks/bench_dp.py)', body, docs_dir=args.docs)
        print(f"published {where}")


if __name__ == "__main__":
    main()
