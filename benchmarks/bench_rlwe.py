"""Benchmark of the xMK-CKKS secure aggregation in ``flwr_fedeval.rlwe``.

For a model-size update vector (default 949,002 weights plus one slot for the
example count n_i) and M = 3 and 10 clients, times keygen, encrypt, server
sum, partial decrypt and combine+decode, reports the bytes of one
ciphertext / share / public key, and prints -- measured side by side in this
run -- the ratio to plaintext float32 aggregation of the same vectors and the
speed of the NTT and FFT products against a schoolbook negacyclic product.

Usage::

    python benchmarks/bench_rlwe.py [--params xmk-n4096-q93] [--clients 3 10]
        [--length 949002] [--repeat 3] [--out benchmarks/results/bench_rlwe.json] [--docs]

``--docs`` also publishes the table in ``docs/results.md``
(:func:`flwr_fedeval.reporting.publish`).

Targets (issue 3): encrypt <= 1.0 s per client, ciphertext <= 4x float32
bytes, partial decrypt <= 0.5 s, server sum of 10 clients <= 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe.ring import find_ntt_primes, get_ring, schoolbook_negacyclic
from flwr_fedeval.rlwe.sampling import RandomStream, ternary, uniform_mod_q

_CPU: dict[str, float] = {}


def _timeit(fn, repeat: int, label: str | None = None) -> tuple[float, object]:
    """Median wall time of ``repeat`` calls and the last result.

    With ``label``, the median CPU time of this process is kept in ``_CPU``
    (less sensitive to other jobs on a shared machine than wall time).
    """
    times, cpu, out = [], [], None
    for _ in range(repeat):
        c, t = time.process_time(), time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    if label:
        _CPU[label] = statistics.median(cpu)
    return statistics.median(times), out


def bench_products(repeat: int) -> dict:
    """NTT and exact-FFT products vs the schoolbook reference at n = 1024 (3 limbs)."""
    n = 1024
    ring = get_ring(n, find_ntt_primes(n, 31, 3))
    rng = RandomStream()
    x = uniform_mod_q(ring.primes, n, (), rng)
    y = uniform_mod_q(ring.primes, n, (), rng)
    s = ternary((n,), rng)
    t_school, ref = _timeit(
        lambda: np.stack([schoolbook_negacyclic(x[i], y[i], p) for i, p in enumerate(ring.primes)]),
        repeat,
    )
    t_ntt, got = _timeit(lambda: ring.mul(x, y), repeat)
    assert np.array_equal(got, ref)
    t_fft, got2 = _timeit(lambda: ring.mul_small(s, y), repeat)
    assert np.array_equal(got2, ring.mul(ring.from_signed(s), y))
    # batched: 232 polynomials x 3 limbs at n = 4096, as for one model
    big = get_ring(4096, rlwe.DEFAULT_PARAMETER_SET.primes)
    X = uniform_mod_q(big.primes, 4096, (232,), rng)
    t_ntt_batch, _ = _timeit(lambda: big.ntt(X), 1)
    V = ternary((232, 4096), rng)
    t_fft_batch, _ = _timeit(lambda: big.mul_small(V, X), 1)
    return {
        "n": n,
        "limbs": 3,
        "schoolbook_s": t_school,
        "ntt_mul_s": t_ntt,
        "fft_small_mul_s": t_fft,
        "ntt_speedup_vs_schoolbook": t_school / t_ntt,
        "fft_speedup_vs_schoolbook": t_school / t_fft,
        "batch_232x3x4096_forward_ntt_s": t_ntt_batch,
        "batch_232x3x4096_fft_small_mul_s": t_fft_batch,
    }


def bench_round(params: rlwe.ParameterSet, M: int, length: int, repeat: int) -> dict:
    """One aggregation round with M clients (times are medians over clients/repeats)."""
    data_rng = np.random.default_rng(M)  # benchmark data only, not key material
    n_i = data_rng.integers(100, 10_000, size=M).astype(np.float64)
    updates = [data_rng.normal(0.0, 0.01, size=length) for _ in range(M)]
    vectors = [np.append(u * c, c) for u, c in zip(updates, n_i)]  # n_i * dw, then n_i
    max_abs = max(float(np.max(np.abs(v))) for v in vectors)
    scale_bits = rlwe.max_scale_bits(params, num_clients=M, max_abs_value=max_abs)
    budget = rlwe.check_noise_budget(
        params, num_clients=M, scale_bits=scale_bits, max_abs_value=max_abs
    )

    a = rlwe.expand_a(params, rlwe.new_public_seed())
    t0 = time.perf_counter()
    keys = [rlwe.keygen(params, a) for _ in range(M)]
    t_keygen = (time.perf_counter() - t0) / M
    pk = rlwe.aggregate_public_keys([b for _, b in keys])

    def enc(i: int) -> rlwe.Ciphertext:
        return rlwe.encrypt_vector(
            params, pk, a, vectors[i], scale_bits=scale_bits, num_clients=M
        )

    t0 = time.perf_counter()
    cts = [enc(0)]
    t_first_encrypt = time.perf_counter() - t0
    enc_times = []
    for i in range(1, M):
        t0 = time.perf_counter()
        cts.append(enc(i))
        enc_times.append(time.perf_counter() - t0)
    t_enc_again, _ = _timeit(lambda: enc(0), repeat, "encrypt_cpu_s")
    enc_times.append(t_enc_again)

    t_ser, ct_bytes = _timeit(lambda: cts[0].to_bytes(), repeat)
    t_deser, _ = _timeit(lambda: rlwe.Ciphertext.from_bytes(ct_bytes, params), repeat)
    t_sum, total = _timeit(lambda: rlwe.add_ciphertexts(cts), repeat, "server_sum_cpu_s")

    pdec_times, shares = [], []
    for sk, _ in keys:
        t0 = time.perf_counter()
        shares.append(rlwe.partial_decrypt(params, sk, total.c1, num_clients=M))
        pdec_times.append(time.perf_counter() - t0)
    _timeit(
        lambda: rlwe.partial_decrypt(params, keys[0][0], total.c1, num_clients=M),
        repeat,
        "partial_decrypt_cpu_s",
    )
    t_comb, agg = _timeit(
        lambda: rlwe.combine_and_decode(
            params, total.c0, shares, length + 1, scale_bits=scale_bits
        ),
        repeat,
        "combine_decode_cpu_s",
    )

    # plaintext float32 aggregation of the same vectors, same run
    v32 = [v.astype(np.float32) for v in vectors]
    t_plain, plain = _timeit(lambda: np.sum(np.stack(v32), axis=0, dtype=np.float32), repeat)
    exact = np.sum(vectors, axis=0)
    mean_secure = agg[:-1] / agg[-1]
    mean_exact = exact[:-1] / exact[-1]
    float32_bytes = 4 * (length + 1)

    enc_med = statistics.median(enc_times)
    pdec_med = statistics.median(pdec_times)
    share_bytes = len(shares[0].to_bytes())
    return {
        "num_clients": M,
        "length": length + 1,
        "scale_bits": scale_bits,
        "max_abs_value": max_abs,
        "noise_budget_headroom_bits": budget.headroom_bits,
        "worst_case_abs_error_of_sum": budget.error_bound,
        "measured_max_abs_error_of_sum": float(np.max(np.abs(agg - exact))),
        "measured_max_abs_error_of_weighted_mean": float(
            np.max(np.abs(mean_secure - mean_exact))
        ),
        "float32_sum_max_abs_error": float(np.max(np.abs(plain.astype(np.float64) - exact))),
        "keygen_s": t_keygen,
        "encrypt_first_call_s": t_first_encrypt,
        "encrypt_s": enc_med,
        "serialize_ciphertext_s": t_ser,
        "deserialize_ciphertext_s": t_deser,
        "server_sum_s": t_sum,
        "partial_decrypt_s": pdec_med,
        "combine_decode_s": t_comb,
        "plaintext_float32_sum_s": t_plain,
        **dict(_CPU),
        "ciphertext_bytes": len(ct_bytes),
        "share_bytes": share_bytes,
        "public_key_bytes": len(pk.to_bytes()),
        "float32_bytes": float32_bytes,
        "ciphertext_to_float32_bytes": len(ct_bytes) / float32_bytes,
        "share_to_float32_bytes": share_bytes / float32_bytes,
        "server_sum_to_plaintext_sum": t_sum / t_plain,
        "secure_round_to_plaintext_sum": (t_sum + t_comb) / t_plain,
        "targets": {
            "encrypt_le_1s": enc_med <= 1.0,
            "ciphertext_le_4x_float32": len(ct_bytes) <= 4 * float32_bytes,
            "partial_decrypt_le_0.5s": pdec_med <= 0.5,
            "server_sum_le_0.5s": t_sum <= 0.5 if M == 10 else None,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default=rlwe.DEFAULT_PARAMETER_SET.name)
    ap.add_argument("--clients", type=int, nargs="+", default=[3, 10])
    ap.add_argument("--length", type=int, default=949_002)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_rlwe.json"))
    ap.add_argument("--docs", nargs="?", const=str(Path(__file__).resolve().parents[1] / "docs"),
                    help="also publish the table in DOCS/results.md")
    args = ap.parse_args(argv)
    params = rlwe.get_parameter_set(args.params)

    result = {
        "benchmark": "bench_rlwe",
        "params": args.params,
        "n": params.n,
        "limbs": params.limbs,
        "log2_q": params.log2_q,
        "he_standard_bound_log2_q": params.security_bound_log2_q,
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpu_count": os.cpu_count(),
            "load_avg_1min": os.getloadavg()[0],
        },
        "products": bench_products(args.repeat),
        "rounds": [bench_round(params, M, args.length, args.repeat)
                   for M in tqdm(args.clients, desc="bench_rlwe", unit="client count")],
    }

    p = result["products"]
    print(f"parameter set {args.params}: n={params.n}, L={params.limbs}, log2 q={params.log2_q:.2f}")
    print(
        f"n=1024 x 3 limbs: schoolbook {p['schoolbook_s'] * 1e3:.2f} ms, "
        f"NTT {p['ntt_mul_s'] * 1e3:.2f} ms ({p['ntt_speedup_vs_schoolbook']:.1f}x), "
        f"FFT-small {p['fft_small_mul_s'] * 1e3:.2f} ms ({p['fft_speedup_vs_schoolbook']:.1f}x)"
    )
    for r in result["rounds"]:
        print(
            f"M={r['num_clients']:>2} len={r['length']} scale=2^{r['scale_bits']}: "
            f"keygen {r['keygen_s'] * 1e3:.1f} ms | encrypt {r['encrypt_s']:.3f} s "
            f"(first {r['encrypt_first_call_s']:.3f} s) | sum {r['server_sum_s']:.3f} s | "
            f"pdec {r['partial_decrypt_s']:.3f} s | combine+decode {r['combine_decode_s']:.3f} s"
        )
        print(
            f"      CPU time: encrypt {r['encrypt_cpu_s']:.3f} s | sum {r['server_sum_cpu_s']:.3f} s"
            f" | pdec {r['partial_decrypt_cpu_s']:.3f} s | combine+decode "
            f"{r['combine_decode_cpu_s']:.3f} s"
        )
        print(
            f"      bytes: ct {r['ciphertext_bytes'] / 1e6:.2f} MB "
            f"({r['ciphertext_to_float32_bytes']:.2f}x float32), share "
            f"{r['share_bytes'] / 1e6:.2f} MB ({r['share_to_float32_bytes']:.2f}x); "
            f"plaintext float32 sum {r['plaintext_float32_sum_s'] * 1e3:.1f} ms -> "
            f"server sum {r['server_sum_to_plaintext_sum']:.0f}x, "
            f"sum+combine {r['secure_round_to_plaintext_sum']:.0f}x"
        )
        print(
            f"      error: sum {r['measured_max_abs_error_of_sum']:.3g} "
            f"(worst-case bound {r['worst_case_abs_error_of_sum']:.3g}), weighted mean "
            f"{r['measured_max_abs_error_of_weighted_mean']:.3g}; float32 sum "
            f"{r['float32_sum_max_abs_error']:.3g}; targets {r['targets']}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    if args.docs:
        _publish(args, params, result)
    return 0


def _publish(args: argparse.Namespace, params: rlwe.ParameterSet, result: dict) -> None:
    from flwr_fedeval.reporting import markdown_table, publish

    rows = [[r["num_clients"], f"{r['keygen_s'] * 1e3:.0f} ms", f"{r['encrypt_s']:.2f} s ({r['encrypt_cpu_s']:.2f})",
             f"{r['server_sum_s']:.2f} s ({r['server_sum_cpu_s']:.2f})",
             f"{r['partial_decrypt_s']:.2f} s ({r['partial_decrypt_cpu_s']:.2f})",
             f"{r['combine_decode_s']:.2f} s ({r['combine_decode_cpu_s']:.2f})",
             f"{r['ciphertext_bytes'] / 1e6:.2f} MB = {r['ciphertext_to_float32_bytes']:.2f}× float32",
             f"{r['share_bytes'] / 1e6:.2f} MB", f"{r['measured_max_abs_error_of_weighted_mean']:.1e}",
             f"{r['server_sum_to_plaintext_sum']:.0f}× / {r['secure_round_to_plaintext_sum']:.0f}×"]
            for r in result["rounds"]]
    table = markdown_table(["M", "keygen / client", "encrypt / client (CPU)", "server sum (CPU)",
                            "partial decrypt / client (CPU)", "combine + decode (CPU)", "ciphertext", "share",
                            "max error of the weighted mean", "sum / sum+combine vs float32 sum"],
                           rows, align="rrrrrrrrrr")
    p = result["products"]
    body = (f"Parameter set `{args.params}` (n = {params.n}, {params.limbs} limbs, log2 q = {params.log2_q:.1f} ≤ "
            f"{params.security_bound_log2_q}: 128-bit), {args.length:,} values + n_i per client"
            f"{' (the seed CNN)' if args.length == 949_002 else ''}, medians of {args.repeat}; "
            "wall time with CPU time in brackets (shared machine). Targets: encrypt "
            "≤ 1 s, partial decrypt ≤ 0.5 s, server sum of 10 clients ≤ 0.5 s, ciphertext ≤ 4× float32. "
            f"Products at n = 1024 × 3 limbs: NTT {p['ntt_speedup_vs_schoolbook']:.1f}×, exact FFT "
            f"{p['fft_speedup_vs_schoolbook']:.1f}× the schoolbook product.\n\n" + table)
    where = publish('bench-rlwe', 'xMK-CKKS aggregation cost (benchmarks/bench_rlwe.py)', body, docs_dir=args.docs)
    print(f"published {where}")


if __name__ == "__main__":
    raise SystemExit(main())
