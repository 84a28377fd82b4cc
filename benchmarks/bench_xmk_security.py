"""Cost of authentication and masks in an xMK-CKKS round (issue 12), side by side in one run.

Runs, in this process and interleaved ``--repeat`` times, the protocol work
of one secure-aggregation round with M clients on a model-size vector
(default 949,002 weights plus the example count, M = 10, the FedAvg default
parameter set ``xmk-n4096-q108``), in three variants:

* **baseline** -- the round before issue 12: keygen (Eq. 1), every client
  parses and sums the relayed shares, encodes, encrypts (Eq. 6), serializes;
  the server parses and sums (Eq. 3); every client parses C1 and partially
  decrypts (Eq. 7); the server combines and decodes (Eq. 5);
* **complete** -- the same plus what issue 12 adds: an X25519 mask key per
  client, the signed commitment (ECDSA P-384, the roster key format) and its
  check by every client (M signatures each), the key-set transcript signed
  and checked (M more), every opening checked against its commitment, the
  pairwise zero-sum mask over the complete graph (M - 1 AES-256-CTR
  expansions per client, Bonawitz et al. 2017) added to the plaintext, the
  canonical C1 check;
* **default** -- the same with the mask graph of the default degree k
  (:data:`flwr_fedeval.rlwe.masking.DEFAULT_MASK_DEGREE`, SecAgg+, Bell et
  al. 2020): k expansions per client, the graph derived from the transcript.

Both variants run every client one after the other, so the totals are the
CPU time of the whole round (all clients and the server). Flower's message
serialization is not included, which makes this ratio an upper bound.

Then (``--grid-repeat``, default 2) one real :class:`XMKFedAvg` round over
the serializing in-process grid (Flower's protobuf serialization of every
message included, numpy-only clients that add a fixed update), with the
current code (**complete** graph and **default** degree) and with the
signatures and masks switched off
(**ablated**: signing and verification stubbed, ``mask_plaintext`` the
identity; the reveal round trip stays, its time is reported on its own).

The ratios use CPU time (``time.process_time``), less sensitive than wall
time to other jobs on a shared machine; wall times are reported too.

Usage::

    python benchmarks/bench_xmk_security.py [--clients 10] [--length 949002]
        [--repeat 3] [--out benchmarks/results/bench_xmk_security.json] [--docs]

``--docs`` also publishes the table in ``docs/results.md``
(:func:`flwr_fedeval.reporting.publish`).

Target (issue 12): default / baseline - 1 <= 10 %. On a loaded machine the
ratio of the two totals is noisy (it is reported per repeat); the sum of the
stages the secure round adds, over the baseline, is the steadier figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from flwr_fedeval import rlwe
from flwr_fedeval.identity import NodeIdentity, Roster
from flwr_fedeval.reporting import markdown_table, publish
from flwr_fedeval.rlwe import keyset, masking

TARGET = 0.10


class Clock:
    """CPU and wall seconds per stage of one round."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)

    def __call__(self, stage: str, fn, *args, **kwargs):
        c, w = time.process_time(), time.perf_counter()
        out = fn(*args, **kwargs)
        self.cpu[stage] += time.process_time() - c
        self.wall[stage] += time.perf_counter() - w
        return out


def _common_tail(clock, params, M, scale_bits, length, vectors, plaintext_of, joint_of, a, secrets, check_c1):
    """Encrypt, server sum, partial decryptions, combine: the same in both variants."""
    ct_bytes = []
    for i in range(M):
        pt = clock("encode", rlwe.encode, params, vectors[i], scale_bits=scale_bits, num_clients=M)
        pt = plaintext_of(i, pt)
        ct = clock("encrypt", rlwe.encrypt, params, joint_of(i), a, pt)
        ct_bytes.append(clock("serialize ciphertext", ct.to_bytes))
    cts = [clock("server: parse ciphertexts", rlwe.Ciphertext.from_bytes, b, params) for b in ct_bytes]
    total = clock("server: sum (Eq. 3)", rlwe.add_ciphertexts, cts)
    c1_bytes = clock("server: serialize C1", rlwe.polys_to_bytes, params, total.c1)
    share_bytes = []
    for i in range(M):
        c1 = clock("parse C1", check_c1, c1_bytes, total.num_polys)
        d = clock("partial decryption (Eq. 7)", rlwe.partial_decrypt, params, secrets[i], c1, num_clients=M)
        share_bytes.append(clock("serialize share", d.to_bytes))
    shares = [clock("server: parse shares", rlwe.DecryptionShare.from_bytes, b, params) for b in share_bytes]
    return clock("server: combine + decode (Eq. 5)", rlwe.combine_and_decode, params, total.c0, shares, length,
                 scale_bits=scale_bits)


def baseline_round(params, vectors, scale_bits, a):
    """The pre-issue-12 round: no signatures, no commitments, no masks."""
    clock, M, length = Clock(), len(vectors), vectors[0].size
    keys = [clock("keygen (Eq. 1)", rlwe.keygen, params, a) for _ in range(M)]
    share_bytes = [clock("serialize b_i", pk.to_bytes) for _, pk in keys]
    joint = []
    for _ in range(M):  # every client parses and sums the relayed shares itself
        pks = [clock("parse + sum shares", rlwe.PublicKey.from_bytes, b, params) for b in share_bytes]
        joint.append(clock("parse + sum shares", rlwe.aggregate_public_keys, pks))
    decoded = _common_tail(
        clock, params, M, scale_bits, length, vectors, lambda i, pt: pt, lambda i: joint[i], a,
        [sk for sk, _ in keys], lambda data, k: rlwe.polys_from_bytes(data, params),
    )
    return clock, decoded


def secure_round(params, vectors, scale_bits, seed_a, a, identities, roster, mask_degree):
    """The issue-12 round: signed commit-then-reveal key set, pairwise masks (graph of ``mask_degree``),
    canonical C1."""
    clock, M, length = Clock(), len(vectors), vectors[0].size
    kid, rnd = keyset.key_set_id(params, seed_a), 1
    members = []
    for ident in identities:  # step 1a: keys, mask key, signed commitment
        sk, pk = clock("keygen (Eq. 1)", rlwe.keygen, params, a)
        x, X = clock("+ mask key (X25519)", masking.new_mask_keypair)
        share = clock("serialize b_i", pk.to_bytes)
        h = clock("+ commitment + signature", keyset.commitment, kid, share, X)
        sig = clock("+ commitment + signature", keyset.sign_commitment, ident, key_id=kid, round_=rnd, commitment_=h)
        members.append((ident, sk, share, x, X, h, sig))
    entries = [(m[0].name, m[5], m[6]) for m in members]
    transcripts = {}
    for ident, _, _, _, _, h, _ in members:  # step 1b: every client checks every commitment
        checked = clock("+ check M commitments", keyset.check_commitments, roster, entries, key_id=kid, round_=rnd,
                        own_name=ident.name, own_commitment=h, floor=2)
        t = clock("+ transcript + signature", keyset.transcript_digest, params, key_id=kid, seed_a=seed_a,
                  round_=rnd, members=checked, mask_degree=mask_degree)
        transcripts[ident.name] = (checked, t, clock("+ transcript + signature", keyset.sign_transcript, ident,
                                                    key_id=kid, round_=rnd, digest=t))
    openings = {m[0].name: (m[2], m[4]) for m in members}
    tsigs = {name: v[2] for name, v in transcripts.items()}
    joint, peers = [], []
    for ident, *_ in members:  # step 2 (checks): openings against commitments, transcript signatures
        checked, t, _ = transcripts[ident.name]
        b, keys = clock("parse + sum shares", keyset.open_key_set, params, key_id=kid, members=checked,
                        openings=openings)
        clock("+ check M transcript signatures", keyset.check_transcript_signatures, roster, tsigs,
              members=[n for n, _ in checked], key_id=kid, round_=rnd, digest=t)
        graph = clock("+ mask graph", masking.mask_neighbours, [n for n, _ in checked], mask_degree, t)
        joint.append(b)
        peers.append({name: keys[name] for name in graph[ident.name]})

    def masked(i, pt):
        ident, _, _, x, *_ = members[i]
        ctx = masking.mask_context(transcripts[ident.name][1], rnd)
        return clock("+ pairwise mask (k PRGs)", masking.mask_plaintext, params, pt, own_name=ident.name,
                     own_private=x, peers=peers[i], context=ctx)

    decoded = _common_tail(
        clock, params, M, scale_bits, length, vectors, masked, lambda i: joint[i], a,
        [m[1] for m in members], lambda data, k: rlwe.polys_from_bytes(data, params, count=k),
    )
    return clock, decoded


def grid_round(length: int, num_clients: int, identity_dir: str, ablate: bool, mask_degree: int) -> dict:
    """CPU/wall seconds of one XMKFedAvg round over the serializing grid, and its step timings."""
    from contextlib import ExitStack
    from unittest import mock

    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    import flwr_fedeval.clients.xmkckks as client_module
    from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod
    from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
    from flwr_fedeval.testing import InProcessGrid

    app = ClientApp()
    register_xmkckks_handlers(app)

    @app.train(mods=[xmkckks_mod])
    def train(msg, context):
        w = msg.content["arrays"].to_numpy_ndarrays()
        new = [a + np.float32(0.001 * (1 + int(context.node_config["partition-id"]))) for a in w]
        metrics = MetricRecord({"num-examples": 100})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    logging.getLogger("flwr").setLevel(logging.WARNING)
    grid = InProcessGrid(app, num_clients, {"fedeval-identity-dir": identity_dir},
                         node_configs=[{"partition-id": i, "num-partitions": num_clients,
                                        "fedeval-xmk-mask-degree": mask_degree} for i in range(num_clients)])
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=num_clients, min_available_nodes=num_clients,
                         max_abs_value=2.0**16, mask_degree=mask_degree)
    with ExitStack() as stack:
        if ablate:
            stack.enter_context(mock.patch.object(keyset, "sign_key", lambda *a, **k: b"unsigned"))
            stack.enter_context(mock.patch.object(keyset, "verify_key", lambda *a, **k: None))
            stack.enter_context(mock.patch.object(client_module.masking, "mask_plaintext",
                                                  lambda params, plaintext, **kw: plaintext))
        c, w = time.process_time(), time.perf_counter()
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord([np.zeros(length, np.float32)]),
                                num_rounds=1, train_config=ConfigRecord({}))
        cpu, wall = time.process_time() - c, time.perf_counter() - w
    got = result.arrays.to_numpy_ndarrays()[0]
    expected = np.float32(0.001) * (num_clients + 1) / 2
    if strategy.aborted_attempts or float(np.max(np.abs(got - expected))) > 1e-6:
        raise RuntimeError(f"grid round failed: {strategy.aborted_attempts}")
    return {"cpu_s": cpu, "wall_s": wall, "steps_wall_s": dict(strategy.timer.timings)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="xmk-n4096-q108")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--length", type=int, default=949_002)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--grid-repeat", type=int, default=2, help="real XMKFedAvg rounds per variant (0: skip)")
    ap.add_argument("--mask-degree", type=int, default=masking.DEFAULT_MASK_DEGREE,
                    help="degree of the sparse mask graph measured next to the complete one")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_xmk_security.json"))
    ap.add_argument("--docs", nargs="?", const=str(Path(__file__).resolve().parents[1] / "docs"),
                    help="also publish the table in DOCS/results.md")
    args = ap.parse_args(argv)
    params = rlwe.get_parameter_set(args.params)
    M = args.clients

    data = np.random.default_rng(M)  # benchmark data only, not key material
    n_i = data.integers(100, 10_000, size=M).astype(np.float64)
    vectors = [np.append(data.normal(0.0, 0.01, size=args.length) * c, c) for c in n_i]
    max_abs = max(float(np.max(np.abs(v))) for v in vectors)
    scale_bits = rlwe.max_scale_bits(params, num_clients=M, max_abs_value=max_abs)
    identities = [NodeIdentity.generate(f"node-{i}") for i in range(M)]
    roster = Roster.from_identities(identities)
    exact = np.sum(vectors, axis=0)

    degree = args.mask_degree
    variants = {"baseline": None, "complete": 0, "default": degree}
    runs = {v: [] for v in variants}
    errors = {}
    for _ in tqdm(range(args.repeat), desc="bench_xmk_security", unit="repeat"):
        seed_a = rlwe.new_public_seed()
        a = rlwe.expand_a(params, seed_a)
        for variant, k in variants.items():
            if k is None:
                clock, decoded = baseline_round(params, vectors, scale_bits, a)
            else:
                clock, decoded = secure_round(params, vectors, scale_bits, seed_a, a, identities, roster, k)
            runs[variant].append(clock)
            errors[variant] = float(np.max(np.abs(decoded - exact)))

    def summary(clocks):
        stages = list(clocks[0].cpu)
        return {
            "cpu_s": statistics.median(sum(c.cpu.values()) for c in clocks),
            "wall_s": statistics.median(sum(c.wall.values()) for c in clocks),
            "stages_cpu_s": {s: statistics.median(c.cpu[s] for c in clocks) for s in stages},
        }

    base = summary(runs["baseline"])
    result = {
        "benchmark": "bench_xmk_security",
        "params": params.name,
        "num_clients": M,
        "length": args.length + 1,
        "scale_bits": scale_bits,
        "repeat": args.repeat,
        "mask_degree_default": degree,
        "mask_degree_default_graph": masking.graph_degree(degree, M),
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpu_count": os.cpu_count(),
            "load_avg_1min": os.getloadavg()[0],
        },
        "baseline": base,
        "max_abs_error_of_sum": errors,
    }
    print(f"{params.name}, M = {M}, {args.length + 1} values, median of {args.repeat} (CPU seconds, whole round):")
    print(f"  baseline {base['cpu_s']:.2f} s (wall {base['wall_s']:.2f} s)")
    rows = [["baseline (xMK-CKKS as in the paper, no defences)", f"{base['cpu_s']:.2f}", f"{base['wall_s']:.2f}", ""]]
    for variant in ("complete", "default"):
        sec = summary(runs[variant])
        k = masking.graph_degree(variants[variant], M)
        overhead = sec["cpu_s"] / base["cpu_s"] - 1.0
        paired = [s_ / b_ - 1.0 for s_, b_ in zip((sum(c.cpu.values()) for c in runs[variant]),
                                                  (sum(c.cpu.values()) for c in runs["baseline"]))]
        added = {s: v for s, v in sec["stages_cpu_s"].items() if s.startswith("+")}
        added_share = sum(added.values()) / base["cpu_s"]
        result[variant] = {**sec, "graph_degree": k, "added_stages_cpu_s": added, "overhead_cpu": overhead,
                           # the added stages alone over the baseline: less sensitive to other jobs
                           "overhead_cpu_added_stages": added_share, "overhead_cpu_per_repeat": paired,
                           "overhead_wall": sec["wall_s"] / base["wall_s"] - 1.0,
                           "target_met_added_stages": added_share <= TARGET}
        label = "complete graph" if variant == "complete" else f"default degree {variants[variant]}"
        print(f"  {label} (k = {k}): {sec['cpu_s']:.2f} s, overhead {100 * overhead:.1f} % (per repeat "
              f"{', '.join(f'{100 * p:.1f}' for p in paired)} %); added stages alone {sum(added.values()):.3f} s "
              f"= {100 * added_share:.1f} %")
        for stage, seconds in added.items():
            print(f"    {stage:<36} {seconds:.3f} s  ({100 * seconds / base['cpu_s']:.1f} %)")
        rows.append([f"{label}, k = {k} (signed commit-reveal, masks, checks)", f"{sec['cpu_s']:.2f}",
                     f"{sec['wall_s']:.2f}", f"{100 * overhead:+.1f} % (added stages {100 * added_share:.1f} %)"])
        rows.append([f"  of which pairwise mask ({k} PRGs per client)",
                     f"{added.get('+ pairwise mask (k PRGs)', 0.0):.3f}", "", ""])
    print("  max |error| of the sum: " + ", ".join(f"{v} {e:.3g}" for v, e in errors.items()))
    if args.grid_repeat:
        import tempfile

        from flwr_fedeval.keys import create

        grid_variants = {"ablated": (True, 0), "complete": (False, 0), "default": (False, degree)}
        with tempfile.TemporaryDirectory() as tmp:
            create(Path(tmp) / "ids", [f"node-{i}" for i in range(M)])
            grid_runs = {v: [] for v in grid_variants}
            for _ in range(args.grid_repeat):
                for variant, (ablate, k) in grid_variants.items():
                    grid_runs[variant].append(grid_round(args.length, M, str(Path(tmp) / "ids"), ablate, k))
        g = {v: {"cpu_s": statistics.median(r["cpu_s"] for r in runs_),
                 "wall_s": statistics.median(r["wall_s"] for r in runs_),
                 "steps_wall_s": runs_[-1]["steps_wall_s"]} for v, runs_ in grid_runs.items()}
        for v in ("complete", "default"):
            g[v]["overhead_cpu"] = g[v]["cpu_s"] / g["ablated"]["cpu_s"] - 1.0
            g[v]["overhead_cpu_per_repeat"] = [s_["cpu_s"] / a_["cpu_s"] - 1.0
                                               for s_, a_ in zip(grid_runs[v], grid_runs["ablated"])]
            g[v]["overhead_wall"] = g[v]["wall_s"] / g["ablated"]["wall_s"] - 1.0
        result["grid_round"] = g
        print(f"  XMKFedAvg round over the serializing grid (median of {args.grid_repeat}, CPU s): ablated "
              f"{g['ablated']['cpu_s']:.2f}; " + "; ".join(
                  f"{v} {g[v]['cpu_s']:.2f} ({100 * g[v]['overhead_cpu']:+.1f} %, per repeat "
                  f"{', '.join(f'{100 * p:.1f}' for p in g[v]['overhead_cpu_per_repeat'])} %)"
                  for v in ("complete", "default")))
    met = result["default"]["target_met_added_stages"]
    print(f"  target overhead <= {100 * TARGET:.0f} % at the default degree (added stages): "
          f"{'met' if met else 'NOT met'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    if args.docs:
        if args.grid_repeat:
            g = result["grid_round"]
            rows.append([f"XMKFedAvg over the serializing grid, defences off (median of {args.grid_repeat})",
                         f"{g['ablated']['cpu_s']:.2f}", f"{g['ablated']['wall_s']:.2f}", ""])
            for v in ("complete", "default"):
                rows.append([f"XMKFedAvg over the grid, {v}", f"{g[v]['cpu_s']:.2f}", f"{g[v]['wall_s']:.2f}",
                             f"{100 * g[v]['overhead_cpu']:+.1f} %"])
        table = markdown_table(["round", "CPU s", "wall s", "overhead (CPU)"], rows, align="lrrr")
        body = (f"`{params.name}`, M = {M} clients, {args.length + 1:,} values per client, median of {args.repeat} "
                "whole rounds (all clients and the server in one process, Flower serialization not included), "
                "side by side in one run: no defences, the complete mask graph (Bonawitz et al. 2017) and the "
                f"default degree k = {degree} (SecAgg+, Bell et al. 2020). The sum of the stages the defences "
                "add, over the baseline, is the steadier figure on a loaded machine; target ≤ "
                f"{100 * TARGET:.0f} % at the default degree: {'met' if met else 'NOT met'}. "
                "Max |error| of the sum: " + ", ".join(f"{v} {e:.3g}" for v, e in errors.items()) + ".\n\n" + table)
        where = publish('bench-xmk-security', 'xMK-CKKS security overhead (benchmarks/bench_xmk_security.py)', body,
                        docs_dir=args.docs)
        print(f"published {where}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
