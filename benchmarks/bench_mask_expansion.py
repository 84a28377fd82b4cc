"""Micro-benchmark of the pairwise-mask expansion (issue 12, item 1 of the sparse-mask work).

Measures, side by side in one run (CPU time, best of ``--repeat``):

* the raw keystream of one limb (k·n 32-bit words) from ChaCha20 and from
  AES-256-CTR (``cryptography``; AES-NI where the CPU has it): the PRG choice;
* :func:`flwr_fedeval.rlwe.masking.mask_plaintext` of a model-size plaintext
  (default 949,003 values, ``xmk-n4096-q108``) with 0 (fixed cost: copy and
  reduction), 1, 4 and M - 1 = 9 peers: the cost per pair.

Usage::

    python benchmarks/bench_mask_expansion.py [--length 949003] [--repeat 5]
        [--out benchmarks/results/bench_mask_expansion.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe import masking


def best_cpu(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        c = time.process_time()
        fn()
        best = min(best, time.process_time() - c)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="xmk-n4096-q108")
    ap.add_argument("--length", type=int, default=949_003)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_mask_expansion.json"))
    args = ap.parse_args(argv)
    params = rlwe.get_parameter_set(args.params)
    k = -(-args.length // params.n)
    words = k * params.n
    key = os.urandom(32)
    zeros, buf = bytes(4 * words), bytearray(4 * words + 16)

    def chacha():
        Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update_into(zeros, buf)

    def aes():
        Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update_into(zeros, buf)

    stream = {"chacha20_s": best_cpu(chacha, args.repeat), "aes256_ctr_s": best_cpu(aes, args.repeat)}
    plaintext = params.ring.zeros((k,))
    names = [f"node-{i}" for i in range(10)]
    pairs = {name: masking.new_mask_keypair() for name in names}
    ctx = masking.mask_context(b"\x00" * 32, 1)
    per_peers = {}
    for count in (0, 1, 4, 9):
        if count == 0:
            per_peers[count] = best_cpu(lambda: masking._masked(params, plaintext, []), args.repeat)
            continue
        peers = {name: pairs[name][1] for name in names[1 : count + 1]}
        per_peers[count] = best_cpu(lambda peers=peers: masking.mask_plaintext(
            params, plaintext, own_name=names[0], own_private=pairs[names[0]][0], peers=peers, context=ctx),
            args.repeat)
    per_pair = (per_peers[9] - per_peers[1]) / 8
    result = {"benchmark": "bench_mask_expansion", "params": params.name, "values": words,
              "limbs": params.limbs, "keystream_one_limb_cpu_s": stream,
              "mask_plaintext_cpu_s_by_peers": per_peers, "per_pair_cpu_s": per_pair,
              "load_avg_1min": os.getloadavg()[0]}
    print(f"{params.name}, {words} values x {params.limbs} limbs, best of {args.repeat} (CPU s):")
    print(f"  keystream of one limb: ChaCha20 {stream['chacha20_s'] * 1e3:.2f} ms, "
          f"AES-256-CTR {stream['aes256_ctr_s'] * 1e3:.2f} ms")
    for count, s in per_peers.items():
        print(f"  mask_plaintext with {count} peers: {s * 1e3:.1f} ms")
    print(f"  per pair: {per_pair * 1e3:.1f} ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
