"""Tables I/II of the FHE AUC paper (Baykara et al. 2025) on UCI bank marketing.

Rows: global test size (10^2, 10^3, 10^4, full = 45,211) × N ∈ {25, 50, 100}
decision points. Columns: sklearn ``roc_auc_score``, TF
``keras.metrics.AUC(num_thresholds=1000)`` (TensorFlow imported lazily; "n/a" if
absent), the plaintext trapezoid from summed counts (what FHE computes; the FHE
column will replace it once the FHE phase lands), and DPAUC_Lap at ε = 1 and
ε = 8 (per client, ε′ = ε/(4N)) as mean ± std over ``--runs`` runs, for both
server options (``no-clip`` = the FHE paper's numbers, ``clip-sort`` = the DPAUC
authors' code). 15 clients, IID and label-Dirichlet(``--alpha``) partitions.

Scores: standardised logistic regression trained on 10^4 random rows; the
10^2..10^4 test sets are drawn from the other 35,211 rows; "full" scores every
row (it includes the training rows, which does not matter for comparing AUC
*computations* on the same scores).

Writes ``experiments/results/auc_tables.{csv,md,png}``.
Usage: ``python experiments/auc_tables.py [--runs 100] [--data ../shared/data/bank-marketing/bank-full.csv]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flwr_fedeval.data.bank_marketing import load_bank_marketing  # noqa: E402
from flwr_fedeval.dp import DPAUCLaplaceParams, dpauc_laplace_client, dpauc_laplace_server  # noqa: E402
from flwr_fedeval.fhe.counts import decision_points, threshold_counts  # noqa: E402
from flwr_fedeval.metrics.auc import auc_from_counts  # noqa: E402

SIZES = (100, 1_000, 10_000, None)  # None = full data set
N_POINTS = (25, 50, 100)
EPSILONS = (1.0, 8.0)
CLIPPINGS = ("no-clip", "clip-sort")


def tf_auc(y: np.ndarray, s: np.ndarray) -> float:
    try:
        import os

        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import keras
    except ImportError:  # pragma: no cover - TF optional
        return float("nan")
    m = keras.metrics.AUC(num_thresholds=1000)
    m.update_state(y.astype("float32"), s.astype("float32"))
    return float(m.result())


def partition(y: np.ndarray, n_clients: int, rng: np.random.RandomState, dirichlet: float | None) -> list[np.ndarray]:
    """IID split, or per-class Dirichlet(α) proportions (label skew); every client gets >= 1 sample."""
    idx = rng.permutation(y.size)
    if dirichlet is None:
        return np.array_split(idx, n_clients)
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    for label in (0, 1):
        members = idx[y[idx] == label]
        cuts = (np.cumsum(rng.dirichlet([dirichlet] * n_clients)) * members.size).astype(int)[:-1]
        for k, chunk in enumerate(np.split(members, cuts)):
            parts[k].extend(chunk.tolist())
    for k in range(n_clients):  # no empty client (keeps N clients meaningful)
        if not parts[k]:
            donor = max(range(n_clients), key=lambda j: len(parts[j]))
            parts[k].append(parts[donor].pop())
    return [np.asarray(p, dtype=np.int64) for p in parts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "bank-marketing" / "bank-full.csv"))
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--clients", type=int, default=15)
    ap.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration of the non-IID variant")
    ap.add_argument("--out", default=str(REPO / "experiments" / "results"))
    args = ap.parse_args()

    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    t_start = time.time()
    X, y, _ = load_bank_marketing(args.data)
    rng = np.random.RandomState(0)
    perm = rng.permutation(y.size)
    train, rest = perm[:10_000], perm[10_000:]
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(X[train], y[train])
    scores = model.predict_proba(X)[:, 1]

    rows = []
    for partition_name, dirichlet in (("iid", None), (f"dirichlet{args.alpha:g}", args.alpha)):
        for size in SIZES:
            test = np.arange(y.size) if size is None else rng.choice(rest, size, replace=False)
            yt, st = y[test], scores[test]
            parts = partition(yt, args.clients, np.random.RandomState(1), dirichlet)
            sk = roc_auc_score(yt, st)
            tf = tf_auc(yt, st)
            for n_points in N_POINTS:
                theta = decision_points(n_points)
                counts = [threshold_counts(yt[p], st[p], theta) for p in parts]
                plain = auc_from_counts(sum(counts[1:], counts[0]))
                row = {"partition": partition_name, "test_size": int(yt.size), "N": n_points,
                       "positives": int(yt.sum()), "sklearn": sk, "tf_keras_1000": tf, "plaintext": plain}
                for eps in EPSILONS:
                    params = DPAUCLaplaceParams(eps, n_points)
                    vals = {c: [] for c in CLIPPINGS}
                    for run in range(args.runs):
                        noisy = [dpauc_laplace_client(c, params, random_state=(run * 1000 + k) * 7 + int(eps))
                                 for k, c in enumerate(counts)]
                        for c in CLIPPINGS:
                            vals[c].append(dpauc_laplace_server(noisy, clipping=c, epsilon=eps).auc)
                    for c in CLIPPINGS:
                        v = np.asarray(vals[c])
                        row[f"dpauc_eps{eps:g}_{c}_mean"] = float(np.nanmean(v))
                        row[f"dpauc_eps{eps:g}_{c}_std"] = float(np.nanstd(v))
                rows.append(row)
                print(f"{partition_name:12s} size={yt.size:6d} N={n_points:3d} sklearn={sk:.4f} "
                      f"plain={plain:.4f} eps1 no-clip={row['dpauc_eps1_no-clip_mean']:.4g}"
                      f"±{row['dpauc_eps1_no-clip_std']:.3g} eps8 clip={row['dpauc_eps8_clip-sort_mean']:.4f}"
                      f"±{row['dpauc_eps8_clip-sort_std']:.3g}", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import csv

    with open(out / "auc_tables.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    def pm(r, eps, c):
        return f"{r[f'dpauc_eps{eps:g}_{c}_mean']:.4g} ± {r[f'dpauc_eps{eps:g}_{c}_std']:.3g}"

    lines = [
        "# AUC on bank marketing: plaintext vs DPAUC_Lap",
        "",
        f"{args.clients} clients, {args.runs} runs per DP cell, logistic regression scores, linear decision points. "
        "`no-clip` = FHE paper's computation, `clip-sort` = DPAUC authors' code. ε is per client (ε′ = ε/(4N)).",
        "",
    ]
    for partition_name in dict.fromkeys(r["partition"] for r in rows):
        lines += [f"## {partition_name}", "",
                  "| test size | N | sklearn | TF (1000) | plaintext | DPAUC ε=1 no-clip | DPAUC ε=1 clip-sort "
                  "| DPAUC ε=8 no-clip | DPAUC ε=8 clip-sort |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            if r["partition"] != partition_name:
                continue
            lines.append(
                f"| {r['test_size']} | {r['N']} | {r['sklearn']:.4f} | {r['tf_keras_1000']:.4f} | {r['plaintext']:.4f} "
                f"| {pm(r, 1, 'no-clip')} | {pm(r, 1, 'clip-sort')} | {pm(r, 8, 'no-clip')} | {pm(r, 8, 'clip-sort')} |")
        lines.append("")
    (out / "auc_tables.md").write_text("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    sel = [r for r in rows if r["partition"] == "iid" and r["N"] == 100]
    sizes = [r["test_size"] for r in sel]
    ax.plot(sizes, [abs(r["plaintext"] - r["sklearn"]) + 1e-12 for r in sel], "k.-", label="plaintext")
    for eps in EPSILONS:
        for c, style in zip(CLIPPINGS, ("--", "-")):
            ax.plot(sizes, [abs(r[f"dpauc_eps{eps:g}_{c}_mean"] - r["sklearn"]) + r[f"dpauc_eps{eps:g}_{c}_std"]
                            for r in sel], style, marker="o", label=f"DPAUC ε={eps:g} {c}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("global test size")
    ax.set_ylabel("|mean − sklearn| + std  (N=100, IID)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "auc_tables.png", dpi=120)
    print(f"wrote {out}/auc_tables.csv, .md, .png in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
