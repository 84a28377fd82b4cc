"""Tables I/II of the FHE AUC paper (Baykara et al. 2025) on UCI bank marketing.

Rows: global test size (10^2, 10^3, 10^4, full = 45,211) × N ∈ {25, 50, 100}
decision points × spacing (``--spacing linear|logit|both``: the paper's even
spacing and/or logit spacing, :func:`~flwr_fedeval.metrics.counts.decision_points`).
Columns: sklearn ``roc_auc_score``, TF ``keras.metrics.AUC(num_thresholds=1000)``
(TensorFlow imported lazily; "n/a" if absent), the plaintext trapezoid from
summed counts, the FHE AUC (semi-honest protocol of :mod:`flwr_fedeval.fhe.auc`
run end to end: every client encrypts its counts under the key holder's
context, the aggregator works on the context loaded from ``public_bytes``
only, a client decrypts; one evaluation per row, since the result is
deterministic up to CKKS noise, and |FHE − plaintext|), and DPAUC_Lap at ε = 1
and ε = 8 (per client, ε′ = ε/(4N)) as mean ± std over ``--runs`` runs, for
both server options (``no-clip`` = the FHE paper's numbers, ``clip-sort`` = the
DPAUC authors' code). 15 clients, IID and label-Dirichlet(``--alpha``)
partitions. One CKKS key set serves every row (it has enough slots for the
largest N; key generation is the slow part). The public bound on the pooled
rows is what the FHE phase uses: ``max_rows`` = the sum of the clients'
power-of-two test-size declarations (each client encrypts with its own
declaration as ``declared_rows``); the count encoding follows from it.
CKKS backend: ``FHE_BACKEND`` (default tenseal). Next to every AUC: its
certified resolution bound ``½q = ½·Σ_b p_b n_b/(P·N)``
(:func:`flwr_fedeval.metrics.auc.resolution_bound`; the FHE protocol
computes the same bound under encryption).

Scores: standardised logistic regression trained on 10^4 random rows; the
10^2..10^4 test sets are drawn from the other 35,211 rows; "full" scores every
row (it includes the training rows, which does not matter for comparing AUC
*computations* on the same scores).

``--reference-n`` (default 1000) adds FHE/plaintext-only rows (no DP) at a
larger N, to show where the 1e-3 target against sklearn is reachable.

Writes ``experiments/results/auc_tables.{csv,md,png}`` (and
``auc_tables_reference.csv``); ``--docs`` also publishes the tables and the
figure in ``docs/results.md`` (:func:`flwr_fedeval.reporting.publish`).
Usage: ``python experiments/auc_tables.py [--runs 100] [--spacing both]
[--data ../shared/data/bank-marketing/bank-full.csv] [--docs]``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from flwr_fedeval.data.bank_marketing import load_bank_marketing
from flwr_fedeval.dp import DPAUCLaplaceParams, dpauc_laplace_client, dpauc_laplace_server
from flwr_fedeval.fhe import auc as fhe_auc
from flwr_fedeval.fhe.backend import CKKSContext, CKKSParams, create_context, load_context
from flwr_fedeval.metrics.auc import auc_from_counts, resolution_bound
from flwr_fedeval.metrics.counts import ConfusionCounts, decision_points, threshold_counts
from flwr_fedeval.reporting import publish

REPO = Path(__file__).resolve().parents[1]

SIZES = (100, 1_000, 10_000, None)  # None = full data set
N_POINTS = (25, 50, 100)
EPSILONS = (1.0, 8.0)
CLIPPINGS = ("no-clip", "clip-sort")
SPACINGS = ("linear", "logit")
TARGET = 1e-3  # the bound on |FHE - sklearn|


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


class FHEKeys:
    """One CKKS key set for the whole table: key holder, another client, aggregator.

    The other clients load the secret context from bytes (as through
    :mod:`flwr_fedeval.keyshare`); the aggregator loads ``public_bytes`` only.
    """

    def __init__(self, max_points: int) -> None:
        t0 = time.perf_counter()
        self.params = CKKSParams.for_slots(max_points + 1)
        holder = create_context(params=self.params)
        self.client: CKKSContext = load_context(holder.secret_bytes())
        self.server: CKKSContext = load_context(holder.public_bytes())
        if self.server.is_private:
            raise RuntimeError("the aggregator's context must not hold the secret key")
        self.keygen_seconds = time.perf_counter() - t0

    def auc(self, counts: list[ConfusionCounts], client_sizes: list[int]) -> tuple[float, float, float, float]:
        """(AUC, its resolution bound, count scale K, seconds) of one semi-honest FHE evaluation."""
        t0 = time.perf_counter()
        declared = [0 if n <= 0 else 1 << (int(n) - 1).bit_length() for n in client_sizes]  # as the clients report
        cfg = fhe_auc.FHEAUCConfig(n_points=int(counts[0].tp.size), max_rows=max(sum(declared), 1))
        msgs = [fhe_auc.client_encrypt_counts(self.client, c, config=cfg, declared_rows=d)
                for c, d in zip(counts, declared)]
        result = fhe_auc.aggregate_auc(self.server, msgs, config=cfg)
        res = fhe_auc.client_decrypt_auc(self.client, result, config=cfg)
        return res.auc, res.resolution_bound, cfg.count_scale, time.perf_counter() - t0


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


def _err(a: float, b: float) -> float:
    return abs(a - b)


def _markdown(rows: list[dict], ref_rows: list[dict], args, keys: FHEKeys, stats: dict, elapsed: float) -> str:
    def pm(r, eps, c):
        return f"{r[f'dpauc_eps{eps:g}_{c}_mean']:.4g} ± {r[f'dpauc_eps{eps:g}_{c}_std']:.3g}"

    spacings = list(dict.fromkeys(r["spacing"] for r in rows))
    fhe_plain_max = max(r["fhe_minus_plain_abs"] for r in rows + ref_rows)
    tf_max = max(abs(r["tf_keras_1000"] - r["sklearn"]) for r in rows)
    qs = {sp: [2 * r["resolution_bound"] for r in rows if r["spacing"] == sp] for sp in spacings}
    q_range = ", ".join(f"{100 * min(v):.1f}–{100 * max(v):.1f} % ({sp})" for sp, v in qs.items())
    by_cell = {(r["partition"], r["test_size"], r["N"], r["spacing"]): r["resolution_bound"] for r in rows}
    cells = [k[:3] for k in by_cell if k[3] == "linear" and (*k[:3], "logit") in by_cell]
    n_pairs = len(cells)
    logit_worse = sum(by_cell[(*c, "logit")] > by_cell[(*c, "linear")] for c in cells)
    n_bound_ok = sum(r["resolution_bound"] <= TARGET for r in rows)
    bound_ok = all(r["plain_minus_sklearn_abs"] <= r["resolution_bound"] + 1e-12 for r in rows + ref_rows)
    fhe_bound_err = max(abs(r["fhe_resolution_bound"] - r["resolution_bound"]) for r in rows + ref_rows)
    lines = [
        "# AUC on bank marketing: sklearn, TF, plaintext, FHE, DPAUC_Lap",
        "",
        f"{args.clients} clients, {args.runs} runs per DP cell, logistic regression scores, decision-point spacing "
        f"{' and '.join(spacings)}. FHE = semi-honest protocol (`flwr_fedeval.fhe.auc`) run end to end, one evaluation "
        f"per row, backend `{keys.params.backend}` (n = {keys.params.poly_modulus_degree}, {keys.params.slot_count} "
        f"slots, one key set for all rows, key generation {keys.keygen_seconds:.1f} s); the count encoding is "
        "derived from `max_rows` = the sum of the clients' power-of-two size declarations. `|FHE−plain|` is the "
        f"CKKS error; `|FHE−skl|` is the error against sklearn (target ≤ {TARGET:g}, **bold** where missed); `½q` "
        "is the certified resolution bound of the trapezoid (`metrics.auc.resolution_bound`; q = fraction of "
        "positive–negative pairs between the same two decision points); the FHE protocol's own bound equals it "
        f"within {fhe_bound_err:.0e} in every row. "
        "`no-clip` = FHE paper's computation, `clip-sort` = DPAUC authors' code. ε is per client (ε′ = ε/(4N)). "
        f"Total runtime {elapsed:.0f} s.",
        "",
        "## Where FHE/plaintext is within 1e-3 of sklearn",
        "",
        f"|FHE − plaintext| ≤ {fhe_plain_max:.1e} in every row: the encryption adds nothing visible at this "
        "precision, so FHE misses the 1e-3 target exactly where the plaintext trapezoid misses it.",
        "",
    ]
    for part in dict.fromkeys(r["partition"] for r in rows):
        for sp in spacings:
            sel = [r for r in rows if r["partition"] == part and r["spacing"] == sp]
            miss = [r for r in sel if r["fhe_minus_sklearn_abs"] > TARGET]
            if not miss:
                lines.append(f"- {part}, {sp}: holds in all {len(sel)} rows "
                             f"(max |FHE−skl| = {max(r['fhe_minus_sklearn_abs'] for r in sel):.1e}).")
            else:
                desc = ", ".join(f"{r['test_size']}/N={r['N']} ({r['fhe_minus_sklearn_abs']:.1e})" for r in miss)
                lines.append(f"- {part}, {sp}: holds in {len(sel) - len(miss)} of {len(sel)} rows; "
                             f"missed at (size/N, |FHE−skl|) {desc}.")
    for part in dict.fromkeys(r["partition"] for r in ref_rows):
        for sp in spacings:
            sel = [r for r in ref_rows if r["partition"] == part and r["spacing"] == sp]
            if not sel:
                continue
            miss = [r for r in sel if r["fhe_minus_sklearn_abs"] > TARGET]
            verdict = ("holds at every size" if not miss else
                       "missed at " + ", ".join(f"{r['test_size']} ({r['fhe_minus_sklearn_abs']:.1e})" for r in miss))
            lines.append(f"- reference N={sel[0]['N']}, {part}, {sp}: {verdict}.")
    lines += [
        "",
        "The misses are a property of the trapezoid over N public decision points, not of the encryption. "
        "The trapezoid counts every positive–negative pair whose scores fall between the same two decision "
        "points as a tie (½), where `roc_auc_score` uses the exact order, so |trapezoid − sklearn| ≤ ½q"
        + (" (checked in every row below)" if bound_ok else " (VIOLATED in some row: check the counts)") + ". "
        f"With N ≤ {max(N_POINTS)} q is {q_range} on these scores, and the measured error is "
        f"{min(r['fhe_minus_sklearn_abs'] for r in rows):.0e}…{max(r['fhe_minus_sklearn_abs'] for r in rows):.0e}; "
        + (f"½q ≤ {TARGET:g} in {n_bound_ok} of {len(rows)} rows"
           + (", so in the rows where 1e-3 holds the within-bin errors partly cancel. " if n_bound_ok < len(rows)
              else ". "))
        + ("" if not n_pairs else
           f"Logit spacing (`logit_range` = 12) does not help here: its q is larger than the even spacing's in "
           f"{logit_worse} of {n_pairs} (partition, size, N) cells. The points span logit ±12 while "
           f"{100 * stats['frac_logit7']:.1f} % of the scores lie within logit ±7, and where positives and "
           f"negatives overlap (negatives' median score {stats['neg_median']:.2f}, positives' "
           f"{stats['pos_median']:.2f}) the even bins are the narrower ones. " if 2 * logit_worse > n_pairs else
           f"Logit spacing (`logit_range` = 12) has the smaller q in {n_pairs - logit_worse} of {n_pairs} "
           "(partition, size, N) cells. ")
        + ("The reference rows at larger N show the 1e-3 target is reached once q is small, with the same "
           "protocol and key set. " if ref_rows else "")
        + f"TF's 1000 linear thresholds are within {tf_max:.1e} of sklearn.",
        "",
    ]
    for part in dict.fromkeys(r["partition"] for r in rows):
        for sp in spacings:
            lines += [f"## {part}, {sp} spacing", "",
                      "| test size | N | sklearn | TF (1000) | plaintext | FHE | \\|FHE−plain\\| | \\|FHE−skl\\| | ½q "
                      "| DPAUC ε=1 no-clip | DPAUC ε=1 clip-sort | DPAUC ε=8 no-clip | DPAUC ε=8 clip-sort |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for r in rows:
                if r["partition"] != part or r["spacing"] != sp:
                    continue
                e = f"{r['fhe_minus_sklearn_abs']:.1e}"
                if r["fhe_minus_sklearn_abs"] > TARGET:
                    e = f"**{e}**"
                lines.append(
                    f"| {r['test_size']} | {r['N']} | {r['sklearn']:.4f} | {r['tf_keras_1000']:.4f} "
                    f"| {r['plaintext']:.4f} | {r['fhe']:.4f} | {r['fhe_minus_plain_abs']:.1e} | {e} "
                    f"| {r['resolution_bound']:.1e} | {pm(r, 1, 'no-clip')} | {pm(r, 1, 'clip-sort')} "
                    f"| {pm(r, 8, 'no-clip')} "
                    f"| {pm(r, 8, 'clip-sort')} |")
            lines.append("")
    if ref_rows:
        lines += [f"## Reference: FHE at N = {ref_rows[0]['N']} (no DP columns)", "",
                  "| partition | spacing | test size | sklearn | plaintext | FHE "
                  "| \\|FHE−plain\\| | \\|FHE−skl\\| | ½q |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in ref_rows:
            e = f"{r['fhe_minus_sklearn_abs']:.1e}"
            if r["fhe_minus_sklearn_abs"] > TARGET:
                e = f"**{e}**"
            lines.append(f"| {r['partition']} | {r['spacing']} | {r['test_size']} | {r['sklearn']:.4f} "
                         f"| {r['plaintext']:.4f} | {r['fhe']:.4f} | {r['fhe_minus_plain_abs']:.1e} | {e} "
                         f"| {r['resolution_bound']:.1e} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "bank-marketing" / "bank-full.csv"))
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--clients", type=int, default=15)
    ap.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration of the non-IID variant")
    ap.add_argument("--spacing", choices=(*SPACINGS, "both"), default="both",
                    help="decision-point spacing: the paper's even (linear) spacing, logit, or both")
    ap.add_argument("--reference-n", type=int, default=1000,
                    help="extra FHE/plaintext-only rows at this N (no DP) to show where the 1e-3 target is "
                         "reached; 0 = none")
    ap.add_argument("--out", default=str(REPO / "experiments" / "results"))
    ap.add_argument("--docs", nargs="?", const=str(REPO / "docs"),
                    help="also publish the tables and the figure in DOCS/results.md")
    args = ap.parse_args()
    spacings = SPACINGS if args.spacing == "both" else (args.spacing,)

    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    t_start = time.time()
    # Key set first (before TensorFlow is imported by tf_auc); reused by every row.
    keys = FHEKeys(max(*N_POINTS, args.reference_n))
    print(f"CKKS key set ({keys.params.backend}, {keys.params.slot_count} slots) in {keys.keygen_seconds:.1f} s",
          flush=True)
    X, y, _ = load_bank_marketing(args.data)
    rng = np.random.RandomState(0)
    perm = rng.permutation(y.size)
    train, rest = perm[:10_000], perm[10_000:]
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(X[train], y[train])
    scores = model.predict_proba(X)[:, 1]

    with np.errstate(divide="ignore"):
        logit = np.log(scores) - np.log1p(-scores)
    stats = {"neg_median": float(np.median(scores[y == 0])), "pos_median": float(np.median(scores[y == 1])),
             "frac_logit7": float(np.mean(np.abs(logit) <= 7))}
    rows, ref_rows = [], []
    cells = [(name, dirichlet, size) for name, dirichlet in (("iid", None), (f"dirichlet{args.alpha:g}", args.alpha))
             for size in SIZES]
    for partition_name, dirichlet, size in tqdm(cells, desc="auc_tables", unit="test set"):
        test = np.arange(y.size) if size is None else rng.choice(rest, size, replace=False)
        yt, st = y[test], scores[test]
        parts = partition(yt, args.clients, np.random.RandomState(1), dirichlet)
        sk = roc_auc_score(yt, st)
        tf = tf_auc(yt, st)
        for spacing in spacings:
            for n_points in N_POINTS:
                theta = decision_points(n_points, spacing=spacing)
                counts = [threshold_counts(yt[p], st[p], theta) for p in parts]
                plain = auc_from_counts(sum(counts[1:], counts[0]))
                fhe, fhe_bound, scale, fhe_s = keys.auc(counts, [p.size for p in parts])
                row = {"partition": partition_name, "spacing": spacing, "test_size": int(yt.size),
                       "N": n_points, "positives": int(yt.sum()), "sklearn": sk, "tf_keras_1000": tf,
                       "plaintext": plain, "fhe": fhe, "fhe_minus_plain_abs": _err(fhe, plain),
                       "fhe_minus_sklearn_abs": _err(fhe, sk), "plain_minus_sklearn_abs": _err(plain, sk),
                       "resolution_bound": resolution_bound(sum(counts)), "fhe_resolution_bound": fhe_bound,
                       "fhe_count_scale": scale, "fhe_seconds": fhe_s}
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
                tqdm.write(f"{partition_name:12s} {spacing:6s} size={yt.size:6d} N={n_points:3d} sklearn={sk:.4f} "
                           f"plain={plain:.4f} fhe={fhe:.6f} (|fhe-plain|={row['fhe_minus_plain_abs']:.1e}, "
                           f"{fhe_s:.2f} s) eps1 no-clip={row['dpauc_eps1_no-clip_mean']:.4g}"
                           f"±{row['dpauc_eps1_no-clip_std']:.3g} eps8 clip={row['dpauc_eps8_clip-sort_mean']:.4f}"
                           f"±{row['dpauc_eps8_clip-sort_std']:.3g}")
            if args.reference_n:
                theta = decision_points(args.reference_n, spacing=spacing)
                counts = [threshold_counts(yt[p], st[p], theta) for p in parts]
                plain = auc_from_counts(sum(counts[1:], counts[0]))
                fhe, fhe_bound, scale, fhe_s = keys.auc(counts, [p.size for p in parts])
                ref_rows.append({"partition": partition_name, "spacing": spacing, "test_size": int(yt.size),
                                 "N": args.reference_n, "sklearn": sk, "plaintext": plain, "fhe": fhe,
                                 "fhe_minus_plain_abs": _err(fhe, plain), "fhe_minus_sklearn_abs": _err(fhe, sk),
                                 "plain_minus_sklearn_abs": _err(plain, sk),
                                 "resolution_bound": resolution_bound(sum(counts)),
                                 "fhe_resolution_bound": fhe_bound, "fhe_count_scale": scale, "fhe_seconds": fhe_s})
                tqdm.write(f"{partition_name:12s} {spacing:6s} size={yt.size:6d} N={args.reference_n} (reference) "
                           f"plain={plain:.6f} fhe={fhe:.6f} |fhe-sklearn|={_err(fhe, sk):.1e}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import csv

    with open(out / "auc_tables.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if ref_rows:
        with open(out / "auc_tables_reference.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(ref_rows[0]))
            writer.writeheader()
            writer.writerows(ref_rows)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    dp_spacing = "linear" if "linear" in spacings else spacings[0]
    for spacing, style in zip(spacings, ("k.-", "b.-")):
        sel = [r for r in rows if r["partition"] == "iid" and r["N"] == 100 and r["spacing"] == spacing]
        sizes = [r["test_size"] for r in sel]
        ax.plot(sizes, [r["fhe_minus_sklearn_abs"] + 1e-12 for r in sel], style, label=f"FHE ({spacing})")
        ax.plot(sizes, [r["fhe_minus_plain_abs"] + 1e-12 for r in sel], style[0] + ":", marker="x",
                label=f"|FHE − plaintext| ({spacing})")
    sel = [r for r in rows if r["partition"] == "iid" and r["N"] == 100 and r["spacing"] == dp_spacing]
    sizes = [r["test_size"] for r in sel]
    for eps in EPSILONS:
        for c, style in zip(CLIPPINGS, ("--", "-")):
            ax.plot(sizes, [abs(r[f"dpauc_eps{eps:g}_{c}_mean"] - r["sklearn"]) + r[f"dpauc_eps{eps:g}_{c}_std"]
                            for r in sel], style, marker="o", label=f"DPAUC ε={eps:g} {c} ({dp_spacing})")
    ax.axhline(TARGET, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("global test size")
    ax.set_ylabel("|mean − sklearn| + std  (N=100, IID)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "auc_tables.png", dpi=120)
    elapsed = time.time() - t_start
    md = _markdown(rows, ref_rows, args, keys, stats, elapsed)
    (out / "auc_tables.md").write_text(md)
    print(f"wrote {out}/auc_tables.csv, .md, .png in {elapsed:.0f} s")
    if args.docs:
        title, body = md.split("\n", 1)
        body = body.replace("\n## ", "\n### ")  # subsections of the published section
        where = publish('auc-tables', title.lstrip('# ') + ' (experiments/auc_tables.py)', body, docs_dir=args.docs,
                        figures={'': fig})
        print(f"published {where}")
    plt.close(fig)


if __name__ == "__main__":
    main()
