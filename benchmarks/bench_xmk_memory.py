"""Server peak memory of one secure-aggregation round vs plain FedAvg: fold, don't hold.

Measures, side by side in one run, the traced peak (``tracemalloc``; numpy's buffers are traced) of the
*server's* aggregation at ResNet-18 size (11,689,512 float32 parameters by default) for M clients:

* ``xmk_fold``: :class:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg`'s own code, in the mode of ``--bulk``
  (default ``kahe``, XMKFedAvg's default): the M ``train`` replies are pulled one per poll and folded as each
  arrives (:meth:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg.fold_train_reply`, then
  :meth:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg.sum_ciphertexts`), then the t = floor(M/2) + 1
  threshold decryption shares are folded into C0 + Σ D_j the same way, the M self-masks are removed
  (:meth:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg.partial_decryptions`), then the sum is decoded
  into the new global model (:meth:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg.decode`).
  KAHE mode: the KAHE ciphertexts go into the uint32 KAHE sum (L × blocks × n), the key capsules (one
  polynomial each) into the capsule sum, whose threshold decryption gives K_C; the KAHE sum is then
  decoded range by range. ``bulk="ckks"``: every weight under xMK-CKKS (the running sum at L' limbs);
* ``xmk_hold`` (CKKS mode only, only for M <= ``--hold-max``, it grows with M): every reply held, then every
  ciphertext parsed and summed at once (the path before folding);
* ``plain_fedavg``: Flower's ``FedAvg.aggregate_train`` over the M replies (Flower's loop holds them all).

KAHE mode decodes in full: one real KAHE ciphertext (values uniform in [-1, 1], integer slots [1, 0]) under
a real key k is every client's, so the KAHE sum is M·c and decodes with K_C = M·k. The capsules' threshold
decryption is run on stand-in shares (its cost and memory are the server's, the values are not), so the key
sum the honest decryptors would give, M·k, is substituted where the server rounds it
(:func:`flwr_fedeval.rlwe.kahe.round_key_sum`, patched for the run); every other step is the strategy's.
The row's ``max_error_of_mean`` is the new model's largest deviation from the float64 values (the mean of M
equal updates), within 2^-(F+1) (the quantisation, F = ``fractional_bits``) if the decoding is right.

The replies are made by a fake grid when pulled (one real ciphertext and one share, made once, are reused
as every client's: the server's cost does not depend on their values), so the grid itself holds none:
what is measured is the server's aggregation, the messages it keeps included. Each pulled reply is handed
over as a deserializing grid hands it over: its records built once before tracing (the client's
``to_record`` is not the server's work), every array's bytes copied into a buffer of its own when pulled
(the reply in flight, traced). Each row also gives the wall and CPU seconds of the server's aggregation.

Usage::

    python benchmarks/bench_xmk_memory.py [--params 11689512] [--clients 2 10 50] [--bulk kahe|ckks]
        [--hold-max 2] [--out benchmarks/results/bench_xmk_memory_kahe.json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from flwr_fedeval import rlwe
from flwr_fedeval.protocol import xmk
from flwr_fedeval.rlwe import compact, kahe, keyset, threshold
from flwr_fedeval.secagg import KeySetParameters
from flwr_fedeval.strategies.collect import collect
from flwr_fedeval.strategies.xmk_fedavg import RoundAborted, XMKFedAvg, _KeySet, _RoundState
from flwr_fedeval.testing.grid import set_serverapp_identity

GIB = 2.0**30


def _delivered(template: RecordDict) -> RecordDict:
    """``template`` as a grid hands over a pulled message: every array's bytes in a buffer of its own
    (one allocation per array, as Flower's deserialization of a pulled message makes), the rest shared.
    The templates are made before tracing: what a client's ``to_record`` allocates is not the server's."""
    out = RecordDict()
    for key, record in template.items():
        if isinstance(record, ArrayRecord):
            record = ArrayRecord(
                {
                    name: Array(
                        dtype=a.dtype,
                        shape=a.shape,
                        stype=a.stype,
                        data=np.frombuffer(a.data, dtype=np.uint8).tobytes(),
                    )
                    for name, a in record.items()
                }
            )
        out[key] = record
    return out


class _LazyGrid:
    """Answers each pushed message when pulled, one reply per pull, making the reply only then."""

    def __init__(self, make_reply) -> None:
        self.make_reply = make_reply
        self.pending: dict[str, Message] = {}
        self.count = 0
        self.nodes: list[int] = []

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            self.count += 1
            mid = f"m{self.count}"
            msg.metadata.__dict__["_message_id"] = mid
            self.pending[mid] = msg
            self.nodes.append(int(msg.metadata.dst_node_id))
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        for mid in ids:
            if mid in self.pending:
                msg = self.pending.pop(mid)
                reply = Message(self.make_reply(msg), reply_to=msg)
                reply.metadata.__dict__["_message_id"] = "r" + mid
                return [reply]
        return []

    def get_node_ids(self):
        return self.nodes

    def clock(self):
        return 0.0

    def sleep(self, seconds):
        pass


def _shapes(num_params: int) -> list[tuple[int, ...]]:
    """A few layers adding up to ``num_params`` (the server's cost depends on the total only)."""
    big = num_params // 4
    return [(big,), (big,), (big,), (num_params - 3 * big,)]


def _peak(fn) -> tuple[float, float, float, object]:
    """(traced peak in GiB, wall seconds, CPU seconds of this process, fn's result)."""
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / GIB, seconds, cpu, out


@contextlib.contextmanager
def _key_sum(true_sum: np.ndarray):
    """Substitute the key sum honest decryptors would give for the rounding of the stand-in decryption."""
    original = kahe.round_key_sum

    def substitute(approx):
        if np.asarray(approx).shape != true_sum.shape:  # the strategy hands over the decrypted capsule sum
            raise ValueError(f"key sum of shape {np.asarray(approx).shape}, expected {true_sum.shape}")
        return true_sum.copy()

    kahe.round_key_sum = substitute
    try:
        yield
    finally:
        kahe.round_key_sum = original


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=int, default=11_689_512)
    ap.add_argument("--clients", type=int, nargs="+", default=[2, 10, 50])
    ap.add_argument("--bulk", choices=("kahe", "ckks"), default="kahe")
    ap.add_argument("--hold-max", type=int, default=2)
    ap.add_argument("--parameter-set", default=rlwe.DEFAULT_PARAMETER_SET.name)
    ap.add_argument("--out", default=None, help="default benchmarks/results/bench_xmk_memory_<bulk>.json")
    args = ap.parse_args(argv)
    out_path = Path(args.out or Path(__file__).parent / "results" / f"bench_xmk_memory_{args.bulk}.json")

    set_serverapp_identity(run_id=1)  # what the ServerApp runtime sets; Message() reads it
    params = rlwe.get_parameter_set(args.parameter_set)
    shapes = _shapes(args.params)
    arrays = ArrayRecord([np.zeros(s, dtype=np.float32) for s in shapes])
    transcript = b"\0" * 32  # the benchmark's key set (the strategy derives the KAHE seed from it)
    rng = np.random.default_rng(0)  # test data, not key material
    values = rng.uniform(-1.0, 1.0, args.params)

    def new_strategy(m: int) -> XMKFedAvg:
        return XMKFedAvg(
            fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=m, parameter_set=params.name, bulk=args.bulk
        )

    def capsule_or_ckks(m: int, length: int) -> tuple[bytes, bytes, int, int]:
        """(compact ciphertext bytes, compact decryption share bytes, scale bits, L') of ``length`` values."""
        strategy = new_strategy(m)
        scale_bits = strategy.protocol.scale_bits_for(m)
        limbs = strategy.protocol.limbs_for(m, scale_bits)
        a = rlwe.expand_a(params, rlwe.new_public_seed())
        secret, public = rlwe.keygen(params, a)
        plain = np.linspace(-1, 1, length) * strategy.protocol.ckks_bound(m)
        ct = rlwe.encrypt(params, public, a, rlwe.encode(params, plain, scale_bits=scale_bits, num_clients=m))
        share = compact.compress_decryption_share(
            params, rlwe.partial_decrypt(params, secret, ct.c1, num_clients=m), limbs
        ).to_bytes()
        return compact.compress_ciphertext(ct, limbs).to_bytes(), share, scale_bits, limbs

    # every reply's bytes made before tracing (what a client's to_record allocates is not the server's)
    setups: dict[int, dict] = {}
    t0 = time.perf_counter()
    for m in args.clients:
        setup: dict = {}
        if args.bulk == "kahe":
            kp = new_strategy(m).protocol.kahe_for(m)
            key = kahe.sample_key(kp)
            ct = kahe.encrypt(kp, kahe.public_seed(transcript, 1), key, values, np.array([1, 0]))
            bulk_bytes = ct.to_bytes()
            del ct
            caps, share, scale_bits, limbs = capsule_or_ckks(m, params.n)
            setup.update(kahe=kp, key_sum=m * key, capsule=caps)
            reply = xmk.TrainReply(bulk_bytes, MetricRecord({"train-loss": 0.5}), caps, b"signature")
        else:
            bulk_bytes, share, scale_bits, limbs = capsule_or_ckks(m, args.params + 1)
            setup.update(kahe=None)
            reply = xmk.TrainReply(bulk_bytes, MetricRecord({"train-loss": 0.5}))
        setup.update(
            train=reply.to_record(),
            scale_bits=scale_bits,
            limbs=limbs,
            bulk_mib=len(bulk_bytes) / 2**20,
            share_mib=len(share) / 2**20,
            pdec=xmk.PdecReply(share, (bytes(threshold.BYTES_SHARE_SIZE),) * m, ()).to_record(),
        )
        setups[m] = setup
        del bulk_bytes, reply
        print(
            f"setup M={m} ({args.bulk}: reply {setup['bulk_mib']:.1f} MiB, share {setup['share_mib']:.2f} MiB)",
            flush=True,
        )
    print(f"setup: {time.perf_counter() - t0:.1f} s", flush=True)

    def xmk_reply(msg: Message, m: int) -> RecordDict:  # the request is not parsed: that is the client's work
        if msg.metadata.message_type == xmk.PDEC.message_type:
            return _delivered(setups[m]["pdec"])  # every member contributed: m seed shares
        return _delivered(setups[m]["train"])

    def strategy_for(m: int, grid) -> XMKFedAvg:
        setup = setups[m]
        strategy = new_strategy(m)
        state = _RoundState(1, arrays, ConfigRecord({"server-round": 1}), grid)
        nodes = tuple(range(1, m + 1))
        names = tuple(f"client-{i}" for i in nodes)
        protocol = strategy.protocol
        seed = b"\0" * 32
        signed = KeySetParameters(params.name, keyset.key_set_id(params, seed), seed, 1, m, protocol.mask_degree,
                                  setup["scale_bits"], protocol.max_abs_value, threshold.min_threshold(m),
                                  setup["limbs"], protocol.decryption_attempts, args.bulk,
                                  protocol.fractional_bits if args.bulk == "kahe" else 0)
        state.key_set = _KeySet(signed, nodes, names, (b"",) * m, (b"",) * m, (b"",) * m, transcript)
        state.sent = [Message(RecordDict(), dst_node_id=n, message_type=xmk.TRAIN.message_type) for n in nodes]
        strategy._round = state
        return strategy

    def fold(m: int):
        grid = _LazyGrid(lambda msg: xmk_reply(msg, m))
        strategy = strategy_for(m, grid)
        state = strategy._round
        replies = collect(grid, state.sent, timeout=None, on_reply=strategy.fold_train_reply).replies
        total, _, contributors = strategy.sum_ciphertexts(replies)
        c0, c1 = total.c0, total.c1  # C0' (the accumulator) and C1's bytes (sent as is)
        del total
        signatures = dict.fromkeys(state.key_set.names, b"")  # the clients check them; the server only relays
        plaintext = strategy.partial_decryptions(c0, c1, contributors, signatures)  # t shares, M self-masks removed
        del c0, c1
        if args.bulk == "kahe":
            with _key_sum(setups[m]["key_sum"]):
                new, total_examples = strategy.decode(plaintext, len(contributors))
            del plaintext
            state.running = None  # the server party of the round (its KAHE sum)
            err = float(np.max(np.abs(np.concatenate([a.ravel() for a in new.to_numpy_ndarrays()]) - values)))
            return {"num_examples": total_examples, "max_error_of_mean": err}
        try:
            strategy.decode(plaintext, len(contributors))
        except RoundAborted:  # the benchmark's shares and seeds are not the real ones: the sum does not decode
            pass
        return {}

    def hold(m: int):
        grid = _LazyGrid(lambda msg: xmk_reply(msg, m))
        strategy = strategy_for(m, grid)
        replies = collect(grid, strategy._round.sent, timeout=None).replies  # every reply kept
        limbs = setups[m]["limbs"]
        cts = [
            compact.CompactCiphertext.from_bytes(xmk.TrainReply.from_record(r.content).ciphertext, params, limbs)
            for r in replies
        ]
        compact.add_compact_ciphertexts(cts)
        return {}

    def plain(m: int):
        grid = _LazyGrid(lambda msg: _delivered(plain_reply))
        msgs = [Message(RecordDict(), dst_node_id=n, message_type="train") for n in range(1, m + 1)]
        replies = collect(grid, msgs, timeout=None).replies  # Flower's loop holds every reply
        FedAvg().aggregate_train(1, replies)
        return {}

    plain_reply = RecordDict(
        {
            "arrays": ArrayRecord([rng.standard_normal(s, dtype=np.float32) for s in shapes]),
            "metrics": MetricRecord({"num-examples": 10}),
        }
    )

    def write(rows: list[dict]) -> None:
        out = {
            "benchmark": "bench_xmk_memory",
            "bulk": args.bulk,
            "parameters": args.params,
            "parameter_set": params.name,
            "reply_mib": {m: round(s["bulk_mib"], 1) for m, s in setups.items()},
            "share_mib": {m: round(s["share_mib"], 3) for m, s in setups.items()},
            "kahe_sum_mib": {
                m: round(s["kahe"].limbs * s["kahe"].num_blocks(args.params) * s["kahe"].n * 4 / 2**20, 1)
                for m, s in setups.items()
                if s["kahe"] is not None
            },
            "command": "python benchmarks/bench_xmk_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "load_average_at_start": load_at_start,
            "load_average_at_end": list(os.getloadavg()),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "rows": rows,
        }
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(out, indent=2) + "\n")

    load_at_start = list(os.getloadavg())
    rows: list[dict] = []
    for m in args.clients:
        for name, fn in (("plain_fedavg", plain), ("xmk_fold", fold), ("xmk_hold", hold)):
            if name == "xmk_hold" and (m > args.hold_max or args.bulk == "kahe"):
                continue
            peak, seconds, cpu, extra = _peak(lambda fn=fn, m=m: fn(m))
            rows.append(
                {
                    "clients": m,
                    "method": name,
                    "peak_gib": round(peak, 3),
                    "seconds": round(seconds, 1),
                    "cpu_seconds": round(cpu, 1),
                    **extra,
                }
            )
            print(rows[-1], flush=True)
            write(rows)  # after every row: a long run keeps what it measured
    by = {(r["clients"], r["method"]): r["peak_gib"] for r in rows}
    for m in args.clients:
        by_m = {k[1]: v for k, v in by.items() if k[0] == m}
        if "xmk_fold" in by_m and "plain_fedavg" in by_m:
            ratio = by_m["xmk_fold"] / by_m["plain_fedavg"]
            for r in rows:
                if r["clients"] == m and r["method"] == "xmk_fold":
                    r["over_plain_fedavg"] = round(ratio, 2)
            print(f"M={m}: xmk_fold / plain_fedavg = {ratio:.2f}")
    write(rows)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
