"""Cost of SecSV's zero test on BANK (issue 22, item 3: SecSV on BANK, 5 clients, 10 rounds, <= 3 min).

One run, side by side, JSON out (``benchmarks/results/secsv_zero_test.json``): the same
local models, test set and fixed-point parameters as ``experiments/shapley_bank.py`` (UCI Bank
Marketing, 48 features min-max scaled, 5 clients, Dirichlet(0.5), 10 FedAvg rounds, binary
margin layout, SampleSkip), evaluated by the all-in-one-process runner
:class:`flwr_fedeval.shapley.secsv.SecSV`

1. with the zero test (:mod:`flwr_fedeval.shapley.zerotest`: P opens ``r·(Ŷ − Y)``), and
2. with the paper's opening (Algorithm 4 steps 11–14: P opens ``Ŷ − Y``),

reporting wall time, the time spent in the comparison (``compare_seconds``), bytes, and the
largest |FSV difference| between the two and to the plaintext FSVs. Also the cost of the
signatures the Flower phase adds against a deviating P (per operation, P-256, times the number
of signed models, signed jobs and checks of this run).

Usage::

    .venv/bin/python benchmarks/bench_secsv.py [path/to/bank-full.csv] [--rounds 10] [--clients 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np

from flwr_fedeval.shapley.fsv import federated_shapley
from flwr_fedeval.shapley.secsv import SecSV, SecSVParams, quantize_weights

ROOT = Path(__file__).resolve().parents[1]


def _shapley_bank():
    """``experiments/shapley_bank.py`` as a module: the benchmark uses its data split and training."""
    spec = importlib.util.spec_from_file_location("shapley_bank", ROOT / "experiments/shapley_bank.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _signature_costs(repeats: int) -> dict[str, float]:
    """Median seconds of one P-256 signature and one verification over a key statement."""
    import tempfile

    from flwr_fedeval.identity import NodeIdentity, Roster, sign_key, verify_key
    from flwr_fedeval.keys import create

    with tempfile.TemporaryDirectory() as tmp:
        create(Path(tmp) / "ids", ["node-0"])
        ident = NodeIdentity.load(Path(tmp) / "ids" / "node-0.key")
        roster = Roster.load(Path(tmp) / "ids" / "roster.json")
    kw = dict(protocol="secsv-products", session="s", round=1, role="aux", key=os.urandom(32))
    sign, verify = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        sig = sign_key(ident, **kw)
        sign.append(time.perf_counter() - t)
        t = time.perf_counter()
        verify_key(roster, "node-0", sig, **kw)
        verify.append(time.perf_counter() - t)
    return {"sign_s": statistics.median(sign), "verify_s": statistics.median(verify)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="?", default=str(ROOT.parent / "shared/data/bank-marketing/bank-full.csv"))
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-bound", type=float, default=4.0)
    ap.add_argument("--data-frac-bits", type=int, default=9)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/secsv_zero_test.json"))
    args = ap.parse_args()

    bank = _shapley_bank()
    train, Xt, yt, owners = bank.load_bank(args.csv, args.clients, args.seed)
    history = bank.train_federated(train, 2, args.rounds, seed=args.seed)
    counts = {c: len(train[c][1]) for c in range(args.clients)}
    w = quantize_weights(counts, bits=6)
    # the parameters of experiments/shapley_bank.py's reported run (--binary-margin --model-bound 4
    # --data-frac-bits 9): 2 limbs of 18 bits
    params = SecSVParams(ring_bits=36, limb_bits=18, data_frac_bits=args.data_frac_bits, model_frac_bits=10,
                         weight_bits=6, model_bound=args.model_bound, feature_bound=1.0, max_clients=args.clients,
                         n_features=Xt.shape[1])
    ref = federated_shapley(history, w, Xt, yt, n_classes=2)
    runs = {}
    for name, zero_test in (("zero test (r·(Ŷ − Y) opened)", True), ("paper (Ŷ − Y opened)", False)):
        s = SecSV(Xt, yt, owners, n_classes=2, params=params, binary_margin=True, zero_test=zero_test)
        t, c = time.perf_counter(), time.process_time()
        res = s.run(history, w, sample_skip=True)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        runs[name] = {"zero_test": zero_test, "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
                      "compare_seconds": round(s.stats.compare_seconds, 3), "batches": s.stats.batches,
                      "evaluated_samples": s.stats.evaluated_samples, "skipped_samples": s.stats.skipped_samples,
                      "mbytes": round(s.stats.bytes_sent / 2**20, 1),
                      "max_abs_err_vs_plaintext": float(np.abs(res.fsv - ref.fsv).max()),
                      "fsv": [round(float(v), 6) for v in res.fsv]}
        print(f"{name:32s} {wall:7.1f} s (cpu {cpu:.1f}), comparison {s.stats.compare_seconds:.3f} s, "
              f"max|FSV - plaintext| {runs[name]['max_abs_err_vs_plaintext']:.1e}")
    zt, paper = runs["zero test (r·(Ŷ − Y) opened)"], runs["paper (Ŷ − Y opened)"]
    sig = _signature_costs(200)
    n_models = sum(len(r) for r in history)
    n_jobs = zt["batches"]
    # Flower phase: each client signs its model of a round, A verifies it; A signs every job, the
    # helper verifies it (sequential worst case: everything on one critical path).
    sig_total = n_models * (sig["sign_s"] + sig["verify_s"]) + n_jobs * (sig["sign_s"] + sig["verify_s"])
    result = {
        "setup": {"clients": args.clients, "rounds": args.rounds, "test_size": int(len(yt)),
                  "binary_margin": True, "sample_skip": True, "ring_bits": params.ring_bits,
                  "limb_bits": params.limb_bits, "machine": platform.platform(), "cpus": os.cpu_count(),
                  "load_average": os.getloadavg()},
        "runs": runs,
        "zero_test_added_seconds": round(zt["seconds"] - paper["seconds"], 2),
        "zero_test_added_cpu_seconds": round(zt["cpu_seconds"] - paper["cpu_seconds"], 2),
        "note": "wall times on a shared machine vary with its load (setup.load_average); the CPU seconds of "
                "this process and the comparison time are the comparable figures",
        "zero_test_added_compare_seconds": round(zt["compare_seconds"] - paper["compare_seconds"], 3),
        "max_abs_fsv_diff_zero_test_vs_paper": float(np.abs(np.array(zt["fsv"]) - np.array(paper["fsv"])).max()),
        "signatures": {**{k: round(v * 1e6, 1) for k, v in {"sign_us": sig["sign_s"],
                                                             "verify_us": sig["verify_s"]}.items()},
                       "signed_models": n_models, "signed_jobs": n_jobs, "seconds_total": round(sig_total, 3)},
        "macs": "not built (see README, Threat model: SecSV)",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2, ensure_ascii=False))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
