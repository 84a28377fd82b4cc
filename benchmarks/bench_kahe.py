"""KAHE alone (no Flower): client encrypt + pack, server fold per client, decode once.

For each model size (``--params``, default 949,002 and 11,689,512 weights) and number of clients M
(``--clients``, default 5, 10, 100), with the parameter set :func:`~flwr_fedeval.rlwe.kahe.kahe_parameters`
(M) (B = 2^16, F = 21, n = 4096): every client samples a fresh key, encrypts its update
(:func:`~flwr_fedeval.rlwe.kahe.encrypt`) and packs it (``to_bytes``); the server folds each reply as it
arrives (:meth:`~flwr_fedeval.rlwe.kahe.KaheSum.add`, the reply dropped afterwards: at most one reply is
held) and decodes once with the exact key sum (:meth:`~flwr_fedeval.rlwe.kahe.KaheSum.decode`; in the
protocol the key sum comes from the key capsules, not measured here).

Reported per (size, M): seconds per client for encrypt and pack (median and min over the clients),
fold per client (median, min), decode (once), wall time (``time.perf_counter``) and CPU time of the
process (``time.process_time``) for each; bits per coefficient, bytes per reply, upload ratio against
float32 (reply bytes / 4 bytes per weight); the max |decoded sum − float64 sum| against the stated
worst case M 2^-(F+1); the server's running sum in bytes.

    python benchmarks/bench_kahe.py [--params 949002 11689512] [--clients 5 10 100]
        [--out benchmarks/results/bench_kahe.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from flwr_fedeval.rlwe import kahe


def _update(pid: int, size: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + pid)  # test data, not key material
    return rng.uniform(-1e-2, 1e-2, size).astype(np.float32)


def _timed(fn, *args):
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - w, time.process_time() - c


def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def run(size: int, clients: int) -> dict:
    params = kahe.kahe_parameters(clients)
    seed = kahe.public_seed(b"bench-kahe transcript", 1)
    acc = kahe.KaheSum(params, seed, size)
    ref = np.zeros(size, dtype=np.float64)
    key_sum = np.zeros(params.n, dtype=np.int64)
    enc_w, enc_c, pack_w, pack_c, fold_w, fold_c = [], [], [], [], [], []
    reply_bytes = 0
    for pid in range(clients):
        values = _update(pid, size)
        ref += values
        key = kahe.sample_key(params)
        key_sum += key
        ints = np.array([10 + pid, kahe.count_clipped(params, values)], dtype=np.int64)
        ct, w, c = _timed(kahe.encrypt, params, seed, key, values, ints)
        enc_w.append(w)
        enc_c.append(c)
        data, w, c = _timed(ct.to_bytes)
        pack_w.append(w)
        pack_c.append(c)
        del ct
        reply_bytes = len(data)
        _, w, c = _timed(acc.add, data)
        fold_w.append(w)
        fold_c.append(c)
        del data
    (sums, ints), dec_w, dec_c = _timed(acc.decode, key_sum)
    err = float(np.max(np.abs(sums - ref)))
    expected_ints = [sum(10 + pid for pid in range(clients)), 0]
    row = {
        "params": size,
        "clients": clients,
        "primes": list(params.primes),
        "bits_per_coefficient": params.bits_per_coefficient,
        "log2_modulus": float(np.log2(float(params.modulus))),
        "delta": params.delta,
        "blocks": params.num_blocks(size),
        "reply_bytes": reply_bytes,
        "upload_ratio_vs_float32": reply_bytes / (4 * size),
        "encrypt_s": _stats(enc_w),
        "encrypt_cpu_s": _stats(enc_c),
        "pack_s": _stats(pack_w),
        "pack_cpu_s": _stats(pack_c),
        "client_total_s_median": statistics.median(a + b for a, b in zip(enc_w, pack_w)),
        "fold_s_per_client": _stats(fold_w),
        "fold_cpu_s_per_client": _stats(fold_c),
        "decode_s": dec_w,
        "decode_cpu_s": dec_c,
        "server_sum_bytes": acc.residues.nbytes,
        "max_error_of_sum": err,
        "max_sum_error_bound": params.max_sum_error,
        "integers_exact": bool(list(ints) == expected_ints),
    }
    print(
        f"{size} weights, M={clients}: {params.bits_per_coefficient} bits/coef "
        f"({row['upload_ratio_vs_float32']:.3f}x float32), client enc {row['encrypt_s']['median'] * 1e3:.0f} ms + "
        f"pack {row['pack_s']['median'] * 1e3:.0f} ms, fold {row['fold_s_per_client']['median'] * 1e3:.0f} ms, "
        f"decode {dec_w * 1e3:.0f} ms, err {err:.1e} (bound {params.max_sum_error:.1e})",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=int, nargs="+", default=[949_002, 11_689_512])
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 10, 100])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_kahe.json"))
    args = ap.parse_args(argv)
    rows = [run(size, m) for size in args.params for m in args.clients]
    meta = {"python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
