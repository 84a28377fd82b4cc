"""Secure Shapley values on BANK (Zheng et al., PVLDB 16(7) 2023, §7): plaintext vs HESV vs SecSV.

Setup as in the paper: UCI Bank Marketing, 48 one-hot features (min-max scaled
to [0, 1] with the public value ranges of the file), logistic regression with
2 outputs, 5 clients, Dirichlet(0.5) non-IID split (each client's partition
split 80/20 into its own train and test set), 10 FedAvg rounds (numpy SGD,
1 local epoch). FSVs use integer FedAvg weights (8-bit quantised example
counts, :func:`quantize_weights`) in every method, so all methods compute the
same quantity; the plaintext FSV with exact counts is reported next to it.

Blocks
------
* ``compare``: plaintext, HESV, SecSV and SecSV+SampleSkip on a test subset
  (``--subset`` samples, first ``--compare-rounds`` rounds): time, speedup over
  HESV, max |FSV − plaintext FSV|.
* ``full``: plaintext and SecSV+SampleSkip on the full test set, all rounds
  (``--full-all``: HESV and SecSV without SampleSkip as well).

Writes ``experiments/results/shapley_bank.{json,csv,png}``; ``--docs`` also
publishes the table and the chart in ``docs/results.md``
(:func:`flwr_fedeval.reporting.publish`).

Usage: ``python experiments/shapley_bank.py [path/to/bank-full.csv]``. The
reported run::

    python experiments/shapley_bank.py --binary-margin --model-bound 4 --data-frac-bits 9 \
        --skip-compare --full-all

(``--binary-margin``: the 2-class model is evaluated as the single row
``θ_1 − θ_0``, the same argmax decision with twice the samples per ciphertext.)
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from flwr_fedeval.data.bank_marketing import load_bank_marketing
from flwr_fedeval.data.partition import partition_indices
from flwr_fedeval.reporting import markdown_table, publish
from flwr_fedeval.shapley.fsv import federated_shapley
from flwr_fedeval.shapley.hesv import HESV
from flwr_fedeval.shapley.secsv import SecSV, SecSVParams, quantize_weights

ROOT = Path(__file__).resolve().parents[1]


def train_federated(clients, n_classes, rounds, *, lr=0.5, l2=1e-4, batch=64, seed=0):
    """FedAvg of softmax regression; returns the local models of every round."""
    rng = np.random.default_rng(seed)
    d = clients[0][0].shape[1]
    glob = np.zeros((n_classes, d + 1))
    history = []
    for _ in range(rounds):
        local = {}
        for i, (X, y) in enumerate(clients):
            th = glob.copy()
            order = rng.permutation(len(y))
            for s in range(0, len(y), batch):
                b = order[s:s + batch]
                z = X[b] @ th[:, :-1].T + th[:, -1]
                z -= z.max(axis=1, keepdims=True)
                p = np.exp(z)
                p /= p.sum(axis=1, keepdims=True)
                p[np.arange(len(b)), y[b]] -= 1.0
                g = np.hstack([p.T @ X[b], p.sum(axis=0)[:, None]]) / len(b)
                g[:, :-1] += l2 * th[:, :-1]
                th -= lr * g
            local[i] = th
        n = np.array([len(c[1]) for c in clients], dtype=float)
        glob = sum(n[i] * local[i] for i in local) / n.sum()
        history.append(local)
    return history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="?", default=str(ROOT.parent / "shared/data/bank-marketing/bank-full.csv"))
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--subset", type=int, default=1000, help="test samples of the compare block")
    ap.add_argument("--compare-rounds", type=int, default=10)
    ap.add_argument("--skip-full", action="store_true")
    ap.add_argument("--skip-compare", action="store_true")
    ap.add_argument("--full-all", action="store_true",
                    help="full block also runs HESV and SecSV without SampleSkip (~10 more minutes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "experiments/results"))
    ap.add_argument("--binary-margin", action="store_true",
                    help="evaluate θ_1 − θ_0 (1 output row, 2x samples per ciphertext) in HESV and SecSV")
    ap.add_argument("--model-bound", type=float, default=2.0,
                    help="public bound on |θ| (|θ_1 − θ_0| with --binary-margin); clients check it")
    ap.add_argument("--data-frac-bits", type=int, default=10)
    ap.add_argument("--docs", nargs="?", const=str(ROOT / "docs"),
                    help="also publish the table and the chart in DOCS/results.md")
    args = ap.parse_args()
    import logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    from sklearn.model_selection import train_test_split

    X, y, _ = load_bank_marketing(args.csv)
    X = X.astype(np.float64)
    lo, hi = X.min(axis=0), X.max(axis=0)
    X = (X - lo) / np.where(hi > lo, hi - lo, 1.0)
    parts = partition_indices(y, args.clients, method="dirichlet", alpha=0.5, seed=args.seed)
    train, test_idx, owners = [], [], []
    for c, rows in enumerate(parts):
        strat = y[rows] if np.bincount(y[rows], minlength=2).min() >= 2 else None
        tr, te = train_test_split(rows, test_size=0.2, random_state=args.seed + c, stratify=strat)
        train.append((X[tr], y[tr]))
        test_idx.append(te)
        owners.append(np.full(len(te), c))
    test_idx = np.concatenate(test_idx)
    owners = np.concatenate(owners)
    Xt, yt = X[test_idx], y[test_idx]
    counts = {c: len(train[c][1]) for c in range(args.clients)}
    print(f"train sizes {counts}, test sizes {np.bincount(owners).tolist()}, positives/test "
          f"{[int(yt[owners == c].sum()) for c in range(args.clients)]}")

    t0 = time.perf_counter()
    history = train_federated(train, 2, args.rounds, seed=args.seed)
    print(f"training {time.perf_counter() - t0:.1f}s; max |theta| "
          f"{max(np.abs(m).max() for r in history for m in r.values()):.2f}, max |theta_1 - theta_0| "
          f"{max(np.abs(m[1] - m[0]).max() for r in history for m in r.values()):.2f}")
    w = quantize_weights(counts, bits=6)
    # 2 limbs of 18 bits; 10 fractional bits each for data and model; |θ| <= model_bound (checked by clients);
    # |x| <= 1 (min-max scaled features; the library default bound is 16)
    params = SecSVParams(ring_bits=36, limb_bits=18, data_frac_bits=args.data_frac_bits, model_frac_bits=10,
                         weight_bits=6, model_bound=args.model_bound, feature_bound=1.0, max_clients=args.clients,
                         n_features=X.shape[1])

    rows, result = [], {"setup": {
        "clients": args.clients, "rounds": args.rounds, "alpha": 0.5, "test_size": int(len(yt)),
        "train_sizes": counts, "fedavg_weights_fsv": w, "secsv_params": {
            k: getattr(params, k) for k in ("ring_bits", "limb_bits", "data_frac_bits", "model_frac_bits",
                                            "weight_bits", "model_bound")}, "binary_margin": args.binary_margin,
        "subset": args.subset, "compare_rounds": args.compare_rounds,
        "ckks": {"N": params.ckks.poly_modulus_degree, "coeff_mod_bit_sizes": list(params.ckks.coeff_mod_bit_sizes),
                 "scale_bits": params.ckks.scale_bits}}}

    def record(block, method, res, seconds, ref, stats=None, cpu=None):
        err = float(np.abs(res.fsv - ref.fsv).max())
        row = {"block": block, "method": method, "seconds": round(seconds, 2),
               "cpu_seconds": None if cpu is None else round(cpu, 2), "max_abs_err": err,
               "fsv": [round(float(v), 6) for v in res.fsv],
               "evaluated_samples": int(res.evaluated_samples), "skipped_samples": int(res.skipped_samples)}
        if stats is not None:
            row.update(ct_pt=stats.ct_pt_mults, ct_ct=stats.ct_ct_mults, batches=stats.batches,
                       mbytes=round(stats.bytes_sent / 2**20, 1), setup_s=round(stats.setup_seconds, 2),
                       helper_fallbacks=stats.helper_fallbacks)
        rows.append(row)
        tqdm.write(f"[{block}] {method:14s} {seconds:8.1f}s (cpu {cpu or 0:.1f}s)  max|dFSV|={err:.2e}  "
                   f"fsv={np.round(res.fsv, 4).tolist()}")
        return row

    def secure_runs(block, Xb, yb, ob, R, ref, methods):
        th = ch = None
        for method in tqdm(methods, desc=f"shapley_bank ({block})", unit="method"):
            t, c = time.perf_counter(), time.process_time()
            if method == "HESV":
                h = HESV(Xb, yb, ob, n_classes=2, ckks=params.ckks, binary_margin=args.binary_margin)
                res, stats = h.run(R, w), h.stats
            else:
                s = SecSV(Xb, yb, ob, n_classes=2, params=params, binary_margin=args.binary_margin)
                res, stats = s.run(R, w, sample_skip=method == "SecSV+SS"), s.stats
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            row = record(block, method, res, wall, ref, stats, cpu)
            if method == "HESV":
                th, ch = wall, cpu
            if th is not None:
                row["speedup_vs_HESV"] = round(th / wall, 2)
                row["cpu_speedup_vs_HESV"] = round(ch / cpu, 2)

    # -- compare block ---------------------------------------------------
    rng = np.random.default_rng(args.seed + 99)
    sub = np.sort(rng.choice(len(yt), size=min(args.subset, len(yt)), replace=False))
    R = history[: args.compare_rounds]
    Xs, ys, os_ = Xt[sub], yt[sub], owners[sub]
    if not args.skip_compare:
        t = time.perf_counter()
        ref = federated_shapley(R, w, Xs, ys, n_classes=2)
        tp = time.perf_counter() - t
        record("compare", "plaintext", ref, tp, ref)
        t = time.perf_counter()
        r = federated_shapley(R, w, Xs, ys, n_classes=2, sample_skip=True)
        record("compare", "plaintext+SS", r, time.perf_counter() - t, ref)
        secure_runs("compare", Xs, ys, os_, R, ref, ["HESV", "SecSV", "SecSV+SS"])

    # -- full block --------------------------------------------------------
    if not args.skip_full:
        t = time.perf_counter()
        ref_full = federated_shapley(history, w, Xt, yt, n_classes=2)
        record("full", "plaintext", ref_full, time.perf_counter() - t, ref_full)
        exact = federated_shapley(history, counts, Xt, yt, n_classes=2)
        result["plaintext_exact_counts_fsv"] = exact.fsv.tolist()
        result["max_abs_diff_quantised_vs_exact_weights"] = float(np.abs(exact.fsv - ref_full.fsv).max())
        secure_runs("full", Xt, yt, owners, history, ref_full,
                    ["HESV", "SecSV", "SecSV+SS"] if args.full_all else ["SecSV+SS"])

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result["rows"] = rows
    (out / "shapley_bank.json").write_text(json.dumps(result, indent=2, default=str))
    keys = ["block", "method", "seconds", "cpu_seconds", "speedup_vs_HESV", "cpu_speedup_vs_HESV", "max_abs_err",
            "evaluated_samples", "skipped_samples", "ct_pt", "ct_ct", "batches", "mbytes", "setup_s",
            "helper_fallbacks", "fsv"]
    with open(out / "shapley_bank.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        wr.writeheader()
        for r in rows:
            wr.writerow(r)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        blocks = [b for b in ("compare", "full") if any(r["block"] == b for r in rows)]
        fig, axes = plt.subplots(1, len(blocks), figsize=(5.5 * len(blocks), 4), squeeze=False)
        for ax, block in zip(axes[0], blocks):
            br = [r for r in rows if r["block"] == block]
            width = 0.8 / max(1, len(br))
            for j, r in enumerate(br):
                ax.bar(np.arange(args.clients) + j * width, r["fsv"], width, label=r["method"])
            ax.set_xticks(np.arange(args.clients) + 0.4 - width / 2)
            ax.set_xticklabels([f"client {c}" for c in range(args.clients)])
            ax.set_title(f"BANK FSVs ({block}: {'subset ' + str(len(sub)) if block == 'compare' else 'full test'})")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "shapley_bank.png", dpi=120)
    except ImportError:
        fig = None
        print("matplotlib not installed: no chart")
    print(f"wrote {out}/shapley_bank.json, .csv, .png")
    if args.docs:
        def fmt(v, spec):
            return "–" if v is None else format(v, spec)

        table = markdown_table(
            ["block", "method", "wall s", "CPU s", "speedup vs HESV (wall / CPU)", "max |FSV − plaintext|",
             "batches", "pairs evaluated / skipped", "FSVs"],
            [[r["block"], r["method"], fmt(r["seconds"], ".1f"), fmt(r["cpu_seconds"], ".1f"),
              f"{r['speedup_vs_HESV']:.2f}× / {r['cpu_speedup_vs_HESV']:.2f}×" if "speedup_vs_HESV" in r else "–",
              f"{r['max_abs_err']:.1e}", r.get("batches", "–"),
              f"{r['evaluated_samples']:,} / {r['skipped_samples']:,}", ", ".join(f"{v:+.4f}" for v in r["fsv"])]
             for r in rows], align="llrrrrrrl")
        body = (f"BANK ({X.shape[1]} features, min-max), logistic regression, {args.clients} clients, "
                f"Dirichlet(0.5), {args.rounds} FedAvg rounds; full test set {len(yt):,} samples"
                + ("" if args.skip_compare else f", compare block on {len(sub)} samples") + "; FedAvg weights "
                "quantised to 6 bits in every method"
                + (f" (the plaintext FSVs with exact example counts differ by ≤ "
                   f"{result['max_abs_diff_quantised_vs_exact_weights']:.4f})"
                   if "max_abs_diff_quantised_vs_exact_weights" in result else "") + ". CKKS n = "
                f"{params.ckks.poly_modulus_degree}. All methods in one run, one after the other.\n\n" + table)
        where = publish('shapley-bank', 'Secure Shapley values on BANK (experiments/shapley_bank.py)', body,
                        docs_dir=args.docs, figures={'': fig} if fig is not None else None)
        print(f"published {where}")


if __name__ == "__main__":
    main()
