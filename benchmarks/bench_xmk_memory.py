"""Server peak memory of one secure-aggregation round vs plain FedAvg (issue 21, item 3: fold, don't hold).

Measures, side by side in one run, the traced peak (``tracemalloc``; numpy's buffers are traced) of the
*server's* aggregation at ResNet-18 size (11,689,512 float32 parameters by default) for M clients:

* ``xmk_fold``: :class:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg`'s own code: the M ``train`` replies
  are pulled one per poll and folded into the running sum as each arrives
  (:meth:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg.fold_train_reply`, then
  :meth:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg.sum_ciphertexts`), then the t = floor(M/2) + 1
  threshold decryption shares are folded into C0 + Σ D_j the same way, the M self-masks are removed
  (:meth:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg.partial_decryptions`), then the sum is decoded;
* ``xmk_hold`` (only for M <= ``--hold-max``, it grows with M): the pre-issue-21 path, every reply
  held, then every ciphertext parsed and summed at once;
* ``plain_fedavg``: Flower's ``FedAvg.aggregate_train`` over the M replies (Flower's loop holds them all).

The replies are made by a fake grid when pulled (one real ciphertext and one share, made once, are reused
as every client's: the server's cost does not depend on their values), so the grid itself holds none:
what is measured is the server's aggregation, the messages it keeps included. Each pulled reply is handed
over as a deserializing grid hands it over: its records built once before tracing (the client's
``to_record`` is not the server's work), every array's bytes copied into a buffer of its own when pulled
(the reply in flight, traced). Each row also gives the wall and CPU seconds of the server's aggregation.

Usage::

    python benchmarks/bench_xmk_memory.py [--params 11689512] [--clients 2 10 50] [--hold-max 2]
        [--out benchmarks/results/bench_xmk_memory.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
import tracemalloc
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from flwr_fedeval import rlwe
from flwr_fedeval.protocol import xmk
from flwr_fedeval.rlwe import compact, keyset, threshold
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
            record = ArrayRecord({name: Array(dtype=a.dtype, shape=a.shape, stype=a.stype,
                                              data=np.frombuffer(a.data, dtype=np.uint8).tobytes())
                                  for name, a in record.items()})
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=int, default=11_689_512)
    ap.add_argument("--clients", type=int, nargs="+", default=[2, 10, 50])
    ap.add_argument("--hold-max", type=int, default=2)
    ap.add_argument("--parameter-set", default=rlwe.DEFAULT_PARAMETER_SET.name)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_xmk_memory.json"))
    args = ap.parse_args(argv)

    set_serverapp_identity(run_id=1)  # what the ServerApp runtime sets; Message() reads it
    params = rlwe.get_parameter_set(args.parameter_set)
    shapes = _shapes(args.params)
    length = args.params + 1
    arrays = ArrayRecord([np.zeros(s, dtype=np.float32) for s in shapes])
    t0 = time.perf_counter()
    a = rlwe.expand_a(params, rlwe.new_public_seed())
    secret, public = rlwe.keygen(params, a)
    scale_bits = rlwe.max_scale_bits(params, num_clients=max(args.clients), max_abs_value=2.0**16)
    values = np.linspace(-1, 1, length)
    ct = rlwe.encrypt(params, public, a, rlwe.encode(params, values, scale_bits=scale_bits,
                                                     num_clients=max(args.clients)))
    # the compact wire format (issue 21 item 4): c0 and the share at L' limbs, c1 at L
    limbs = compact.compact_limbs(params, num_clients=max(args.clients), scale_bits=scale_bits, max_abs_value=2.0**16)
    ct_bytes = compact.compress_ciphertext(ct, limbs).to_bytes()
    share_bytes = compact.compress_decryption_share(
        params, rlwe.partial_decrypt(params, secret, ct.c1, num_clients=max(args.clients)), limbs).to_bytes()
    del ct, secret, a
    setup_s = time.perf_counter() - t0
    print(f"setup (one ciphertext of {length:,} values: {len(ct_bytes) / 2**20:.1f} MiB): {setup_s:.1f} s",
          flush=True)

    train_reply = xmk.TrainReply(ct_bytes, MetricRecord({"train-loss": 0.5})).to_record()
    pdec_replies = {m: xmk.PdecReply(share_bytes, (bytes(threshold.BYTES_SHARE_SIZE),) * m, ()).to_record()
                    for m in args.clients}

    def xmk_reply(msg: Message, m: int) -> RecordDict:  # the request is not parsed: that is the client's work
        if msg.metadata.message_type == xmk.PDEC.message_type:
            return _delivered(pdec_replies[m])  # every member contributed: m seed shares
        return _delivered(train_reply)

    def strategy_for(m: int, grid) -> XMKFedAvg:
        strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=m,
                             parameter_set=params.name, scale_bits=scale_bits)
        state = _RoundState(1, arrays, ConfigRecord({"server-round": 1}), grid)
        nodes = tuple(range(1, m + 1))
        names = tuple(f"client-{i}" for i in nodes)
        seed = bytes(32)
        protocol = strategy.protocol
        signed = KeySetParameters(params.name, keyset.key_set_id(params, seed), seed, 1, m, protocol.mask_degree,
                                  scale_bits, protocol.max_abs_value, threshold.min_threshold(m), limbs,
                                  protocol.decryption_attempts, "ckks", 0)
        state.key_set = _KeySet(signed, nodes, names, (b"",) * m, (b"",) * m, (b"",) * m, b"\0" * 32)
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
        state.running = None
        try:
            strategy.decode(plaintext, len(contributors))
        except RoundAborted:  # the benchmark's shares and seeds are not the real ones: the sum does not decode
            pass
        return len(replies)

    def hold(m: int):
        grid = _LazyGrid(lambda msg: xmk_reply(msg, m))
        strategy = strategy_for(m, grid)
        replies = collect(grid, strategy._round.sent, timeout=None).replies  # every reply kept
        cts = [compact.CompactCiphertext.from_bytes(xmk.TrainReply.from_record(r.content).ciphertext, params, limbs)
               for r in replies]
        compact.add_compact_ciphertexts(cts)
        return len(cts)

    def plain(m: int):
        grid = _LazyGrid(lambda msg: _delivered(plain_reply))
        msgs = [Message(RecordDict(), dst_node_id=n, message_type="train") for n in range(1, m + 1)]
        replies = collect(grid, msgs, timeout=None).replies  # Flower's loop holds every reply
        agg, _ = FedAvg().aggregate_train(1, replies)
        return len(agg)

    rng = np.random.default_rng(0)  # test data, not key material
    plain_reply = RecordDict({"arrays": ArrayRecord([rng.standard_normal(s, dtype=np.float32) for s in shapes]),
                              "metrics": MetricRecord({"num-examples": 10})})

    def write(rows: list[dict]) -> None:
        out = {"benchmark": "bench_xmk_memory", "parameters": args.params, "parameter_set": params.name,
               "ciphertext_mib": round(len(ct_bytes) / 2**20, 1), "share_mib": round(len(share_bytes) / 2**20, 1),
               "python": platform.python_version(), "machine": platform.machine(), "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")

    rows: list[dict] = []
    for m in args.clients:
        for name, fn in (("plain_fedavg", plain), ("xmk_fold", fold), ("xmk_hold", hold)):
            if name == "xmk_hold" and m > args.hold_max:
                continue
            peak, seconds, cpu, _ = _peak(lambda fn=fn, m=m: fn(m))
            rows.append({"clients": m, "method": name, "peak_gib": round(peak, 3), "seconds": round(seconds, 1),
                         "cpu_seconds": round(cpu, 1)})
            print(rows[-1], flush=True)
            write(rows)  # after every row: a long run keeps what it measured
    by = {(r["clients"], r["method"]): r["peak_gib"] for r in rows}
    for m in args.clients:
        by_m = {k[1]: v for k, v in by.items() if k[0] == m}
        if "xmk_fold" in by_m and "plain_fedavg" in by_m:
            print(f"M={m}: xmk_fold / plain_fedavg = {by_m['xmk_fold'] / by_m['plain_fedavg']:.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
