"""FHE AUC at any data size (issue 15.1): error vs plaintext from 9,049 to 9,049,000 rows.

The same 9,049 scores (fixed synthetic set: labels ~ Bernoulli(½), scores
``clip(N(0.35 + 0.3·y, 0.2), 0, 1)``) tiled ×1, ×50, ×1000 over 5 clients,
N = 100 linear decision points, every library default (the count encoding
is derived from the public pooled bound ``max_rows`` = the true pooled size).
For each size and protocol (semi-honest, malicious with S = 4) it records
``|AUC_FHE − AUC_plain|`` (the plaintext counts-AUC of
:func:`flwr_fedeval.metrics.auc.auc_from_counts`), the resolution bound's
error, the client's CKKS error estimate and the wall-clock seconds, over
``--repeats`` runs (fresh keys and randomness per run). JSON to
``benchmarks/results/fhe_auc_scale_<backend>.json`` and a Markdown table on stdout;
``--docs`` also publishes the table in ``docs/results.md``
(:func:`flwr_fedeval.reporting.publish`).

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fhe_auc_scale.py
    FHE_BACKEND=openfhe PYTHONPATH=. .venv-openfhe/bin/python benchmarks/bench_fhe_auc_scale.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np

from flwr_fedeval.testing.scores import tiled_counts

ROOT = Path(__file__).resolve().parents[1]

try:
    from tqdm import tqdm

    _write = tqdm.write
except ImportError:  # a side venv without tqdm
    def tqdm(iterable, **_):
        return iterable

    _write = print


def main() -> None:
    from flwr_fedeval.fhe import auc as fa
    from flwr_fedeval.fhe import auc_malicious as am
    from flwr_fedeval.fhe.backend import create_context, default_backend, load_context
    from flwr_fedeval.metrics.auc import auc_with_bound

    ap = argparse.ArgumentParser()
    ap.add_argument("--factors", default="1,50,1000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--docs", nargs="?", const=str(ROOT / "docs"), help="also publish the table in DOCS/results.md")
    args = ap.parse_args()
    backend = default_backend()
    rows_out = []
    for factor in tqdm([int(f) for f in args.factors.split(",")], desc="bench_fhe_auc_scale", unit="size"):
        counts = tiled_counts(factor)
        tot = sum(counts)
        rows = tot.n_positive + tot.n_negative
        ref = auc_with_bound(tot)
        for protocol in ("semi-honest", "malicious"):
            errs, berrs, ests, secs = [], [], [], []
            for _ in range(args.repeats):
                if protocol == "semi-honest":
                    cfg = fa.FHEAUCConfig(n_points=100, max_rows=rows)
                    params = fa.ckks_params_for(backend, 102, rows)
                else:
                    cfg = am.MaliciousAUCConfig(n_points=100, max_rows=rows)
                    params = fa.ckks_params_for(backend, am.required_slots(100, cfg.n_splits), rows)
                ctx = create_context(params=params)
                server = load_context(ctx.public_bytes())
                t0 = time.perf_counter()
                if protocol == "semi-honest":
                    msgs = [fa.client_encrypt_counts(ctx, c, config=cfg) for c in counts]
                    res = fa.client_decrypt_auc(ctx, fa.aggregate_auc(server, msgs, config=cfg), config=cfg)
                else:
                    seed = am.new_seed()
                    msgs = [am.client_encrypt_counts_malicious(ctx, c, config=cfg, seed=seed, party_index=i,
                                                               n_parties=len(counts)) for i, c in enumerate(counts)]
                    res = am.client_decrypt_auc_malicious(ctx, am.aggregate_auc_malicious(server, msgs, config=cfg),
                                                          config=cfg, seed=seed, n_parties=len(counts))
                secs.append(time.perf_counter() - t0)
                errs.append(abs(res.auc - ref.auc))
                berrs.append(abs(res.resolution_bound - ref.resolution_bound))
                ests.append(res.ckks_error)
            rows_out.append({"rows": rows, "protocol": protocol, "backend": backend, "count_scale": cfg.count_scale,
                             "auc_plain": ref.auc, "resolution_bound": ref.resolution_bound,
                             "max_abs_error": max(errs), "max_bound_error": max(berrs),
                             "max_error_estimate": max(ests), "median_seconds": float(np.median(secs)),
                             "repeats": args.repeats})
            _write(json.dumps(rows_out[-1]))
    out = ROOT / "benchmarks" / "results" / f"fhe_auc_scale_{backend}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows_out}, indent=1))
    from flwr_fedeval.reporting import markdown_table, publish

    table = markdown_table(
        ["pooled rows", "protocol", "backend", "K", "max abs error", "bound error", "error estimate", "s"],
        [[f"{r['rows']:,}", r["protocol"], r["backend"], f"{r['count_scale']:g}", f"{r['max_abs_error']:.1e}",
          f"{r['max_bound_error']:.1e}", f"{r['max_error_estimate']:.1e}", f"{r['median_seconds']:.2f}"]
         for r in rows_out], align="rllrrrrr")
    print("\n" + table)
    if args.docs:
        body = ("|AUC_FHE − AUC_plain| over the same 9,049 synthetic scores tiled to each size (5 clients, N = 100, "
                f"every library default, max over {args.repeats} runs with fresh keys), the resolution bound's "
                "error, the client's CKKS error estimate and the median seconds of one evaluation.\n\n" + table)
        section = "fhe-auc-scale" if backend == "tenseal" else f"fhe-auc-scale-{backend}"
        title = f"FHE AUC at any data size, {backend} (benchmarks/bench_fhe_auc_scale.py)"
        print(f"published {publish(section, title, body, docs_dir=args.docs)}")


if __name__ == "__main__":
    main()
