"""One full XMKFedAvg round at scale: M clients × P parameters, every reply made when pulled (issue 21).

Issue 21's "Done when": one round of 100 clients × 11.7M parameters (ResNet-18's 11,689,512) completes on
this machine (24 GiB). One :class:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg` training round —
key generation, reveal, Shamir shares, train (every client encrypts its own update: no reused
ciphertexts), contributor set, threshold partial decryption, decoding — with the real client handlers
(:func:`~flwr_fedeval.clients.xmkckks.register_xmkckks_handlers`, ``xmkckks_mod``) and real roster
identities (a fresh roster of M nodes made with :func:`flwr_fedeval.keys.create`, default node policy),
over :class:`~flwr_fedeval.testing.LazyInProcessGrid`: every message through Flower's protobuf
serialization, as :class:`~flwr_fedeval.testing.InProcessGrid`, but a client runs only when the server
pulls its reply, ``--per-pull`` (default 1) per pull, so the grid holds no reply: the server's
polling loop folds each ``train`` reply into its running sum as it arrives.

Clients are numpy-only: client p adds a fixed pseudo-random update (uniform in ±0.01, test data
from ``np.random``, not key material) to the zero global model and reports ``10 + p`` examples. The
exact float64 weighted mean is kept on the side as a running sum (one float64 vector, not every
update), outside the clients' timed CPU.

Recorded (JSON ``--out``): wall and CPU seconds of the whole round; per server step
(``XMKFedAvg.timer``, wall and CPU; the ``train`` exchange is inside Flower's ``Strategy.start``,
before step 2, so it is listed as "train exchange (clients' train)"); the clients' CPU per message
type (sum and max over clients); process peak RSS (``resource.getrusage``, the whole process:
the server, the grid and one client at a time); with ``--trace``, the ``tracemalloc`` peak of the
server side (the server and the grid's serialization: the peak is read before and reset after each
client call, so a client's own working memory is left out, what it returns is counted); bytes up
and down per client (serialized messages; max and mean); the most reply contents alive at once
(:attr:`~flwr_fedeval.testing.LazyInProcessGrid.max_alive`); max |error| of the decrypted weighted
mean against the exact float64 mean.

Issue 21's configuration (estimated ~53 CPU minutes and ~4 GiB peak RSS from the M = 12 run at 11.7M; see
docs/results.md; the coordinator schedules it)::

    nice python benchmarks/bench_xmk_100.py --clients 100 --params 11689512 --trace --docs

Small runs (seconds to minutes)::

    python benchmarks/bench_xmk_100.py --clients 5 --params 949002 --out /tmp/b5.json
    python benchmarks/bench_xmk_100.py --clients 12 --params 11689512 --out /tmp/b12.json

``--docs`` also publishes the table in ``docs/results.md`` (:func:`flwr_fedeval.reporting.publish`);
``--from-json FILE --docs`` publishes an earlier run's JSON without running anything.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import resource
import tempfile
import time
import tracemalloc
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod
from flwr_fedeval.keys import create
from flwr_fedeval.reporting import markdown_table, provenance, publish
from flwr_fedeval.strategies.base import StepTimer
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import LazyInProcessGrid

GIB = 2.0**30
MIB = 2.0**20
RESNET18 = 11_689_512
TITLE = "xMK-CKKS round at scale: M clients × P parameters (benchmarks/bench_xmk_100.py)"


def _round_bench():
    """``benchmarks/bench_xmk_round.py`` as a module: the same model shapes, updates and example counts."""
    spec = importlib.util.spec_from_file_location("bench_xmk_round", Path(__file__).with_name("bench_xmk_round.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_ROUND = _round_bench()
_shapes, _update, _examples = _ROUND._shapes, _ROUND._update, _ROUND._examples


class _CPUStepTimer(StepTimer):
    """``XMKFedAvg.timer`` that also records the process CPU seconds of each step."""

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.cpu: list[tuple[str, float]] = []

    @contextmanager
    def step(self, name: str):
        c0 = time.process_time()
        try:
            with super().step(name):
                yield
        finally:
            self.cpu.append((name, time.process_time() - c0))


class _Side:
    """The exact float64 weighted sum of the clients' updates, kept as they train (not timed as theirs)."""

    def __init__(self, num_params: int) -> None:
        self.total = np.zeros(num_params, dtype=np.float64)
        self.examples = 0
        self.cpu = 0.0

    def add(self, n: int, update: list[np.ndarray]) -> None:
        c0 = time.process_time()
        offset = 0
        for u in update:
            self.total[offset:offset + u.size] += n * u.ravel().astype(np.float64)
            offset += u.size
        self.examples += n
        self.cpu += time.process_time() - c0


class _Timed:
    """Wraps a ClientApp: CPU seconds per (message type, node); with tracing on, keeps the server-side
    traced peak (read before each client call, reset after it)."""

    def __init__(self, app, side: _Side, trace: bool) -> None:
        self.app, self.side, self.trace = app, side, trace
        self.cpu: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.server_peak = 0

    def __call__(self, msg: Message, context: Context) -> Message:
        if self.trace:
            self.server_peak = max(self.server_peak, tracemalloc.get_traced_memory()[1])
        side0 = self.side.cpu
        c0 = time.process_time()
        try:
            return self.app(msg, context)
        finally:
            spent = time.process_time() - c0 - (self.side.cpu - side0)
            self.cpu[msg.metadata.message_type][int(context.node_id)] += spent
            if self.trace:
                tracemalloc.reset_peak()


def _client_app(shapes, side: _Side) -> ClientApp:
    app = ClientApp()
    register_xmkckks_handlers(app)

    @app.train(mods=[xmkckks_mod])
    def train(msg, context):
        pid = int(context.node_config["partition-id"])
        w = msg.content["arrays"].to_numpy_ndarrays()
        update = _update(pid, shapes)
        new = [a + d for a, d in zip(w, update)]
        del w
        side.add(_examples(pid), update)
        del update
        return Message(RecordDict({"arrays": ArrayRecord(new),
                                   "metrics": MetricRecord({"num-examples": _examples(pid)})}), reply_to=msg)

    return app


def run(clients: int, num_params: int, *, per_pull: int = 1, trace: bool = False,
        identity_dir: str | None = None) -> dict:
    """One XMKFedAvg round of ``clients`` clients at ``num_params`` float32 weights; the measurements.

    Raises
    ------
    RuntimeError
        If the round did not produce a new global model.
    """
    shapes = _shapes(num_params)
    with tempfile.TemporaryDirectory(prefix="fedeval-bench100-") as tmp:
        ids = identity_dir or str(Path(tmp) / "ids")
        if identity_dir is None:
            create(ids, [f"node-{i}" for i in range(clients)])
        side = _Side(num_params)
        app = _Timed(_client_app(shapes, side), side, trace)
        grid = LazyInProcessGrid(app, clients, {"fedeval-identity-dir": ids}, per_pull=per_pull)
        strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=clients, min_available_nodes=clients)
        strategy.timer = _CPUStepTimer("XMKFedAvg")
        w0 = ArrayRecord([np.zeros(s, dtype=np.float32) for s in shapes])
        if trace:
            tracemalloc.start()
        c0, t0 = time.process_time(), time.perf_counter()
        result = strategy.start(grid=grid, initial_arrays=w0, num_rounds=1, train_config=ConfigRecord({}),
                                timeout=24 * 3600)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        if trace:
            app.server_peak = max(app.server_peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    del w0
    if result.arrays is None:
        raise RuntimeError("the round produced no global model")
    new = np.concatenate([a.ravel() for a in result.arrays.to_numpy_ndarrays()]).astype(np.float64)
    del result
    if new.size != num_params:
        raise RuntimeError(f"the round returned {new.size} weights, expected {num_params}")
    err = float(np.max(np.abs(new - side.total / side.examples)))
    del new
    steps_wall: dict[str, float] = defaultdict(float)
    steps_cpu: dict[str, float] = defaultdict(float)
    for name, s in strategy.timer.timings:
        steps_wall[name] += s
    for name, s in strategy.timer.cpu:
        steps_cpu[name] += s
    outside = "train exchange and Flower's loop (outside the steps)"
    steps_wall[outside] = wall - sum(steps_wall.values())
    steps_cpu[outside] = cpu - sum(steps_cpu.values())
    client_cpu = {t: {"sum_s": sum(v.values()), "max_s": max(v.values()), "clients": len(v)}
                  for t, v in app.cpu.items()}
    up, down = list(grid.bytes_up.values()), list(grid.bytes_down.values())
    return {
        "clients": clients, "params": num_params, "per_pull": per_pull,
        "parameter_set": strategy.params.name,
        "wall_s": wall, "cpu_s": cpu,
        "server_steps_wall_s": dict(steps_wall), "server_steps_cpu_s": dict(steps_cpu),
        "client_cpu_s": client_cpu,
        "clients_cpu_s": sum(v["sum_s"] for v in client_cpu.values()),
        "side_sum_cpu_s": side.cpu,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
        "server_traced_peak_gib": app.server_peak / GIB if trace else None,
        "bytes_up_per_client_max": max(up), "bytes_up_per_client_mean": sum(up) / len(up),
        "bytes_down_per_client_max": max(down), "bytes_down_per_client_mean": sum(down) / len(down),
        "max_reply_contents_alive": grid.max_alive, "max_alive_by_type": dict(grid.max_alive_by_type),
        "max_replies_per_pull": grid.max_replies_per_pull,
        "max_error_of_mean": err,
    }


def _docs_body(rows: list[dict]) -> str:
    table = markdown_table(
        ["M", "params", "wall s", "CPU s", "clients' train CPU (sum, max) s", "clients' pdec CPU (sum, max) s",
         "peak RSS GiB", "server traced peak GiB", "up / client MiB", "down / client MiB", "max err"],
        [[r["clients"], f"{r['params']:,}", f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}",
          _sum_max(r, "train"), _sum_max(r, "query.xmk_pdec"), f"{r['peak_rss_gib']:.2f}",
          "" if r["server_traced_peak_gib"] is None else f"{r['server_traced_peak_gib']:.2f}",
          f"{r['bytes_up_per_client_max'] / MIB:.1f}", f"{r['bytes_down_per_client_max'] / MIB:.1f}",
          f"{r['max_error_of_mean']:.1e}"] for r in rows], align="rrrrrrrrrrr")
    steps = markdown_table(
        ["M", "params", *sorted({s for r in rows for s in r["server_steps_wall_s"]})],
        [[r["clients"], f"{r['params']:,}", *(f"{r['server_steps_wall_s'].get(s, 0):.1f} / "
                                              f"{r['server_steps_cpu_s'].get(s, 0):.1f}"
                                              for s in sorted({s for q in rows for s in q["server_steps_wall_s"]}))]
         for r in rows])
    return ("One `XMKFedAvg` training round (key generation, reveal, Shamir shares, train, contributor set, "
            "threshold partial decryption, decoding) with the real client handlers and a fresh roster of M "
            "identities, every client encrypting its own update, over `LazyInProcessGrid` (Flower's "
            "serialization; a client runs when its reply is pulled, one per pull, so the server folds each "
            "reply as it arrives and the grid holds none). Clients and server one after the other in one "
            "process; CPU s is the whole process (server and clients). Peak RSS is the whole process; the "
            "server's traced peak (`tracemalloc`) leaves out each client's working memory. Max err: the "
            "decrypted weighted mean against the exact float64 mean.\n\n" + table
            + "\n\nServer steps (`XMKFedAvg.timer`, wall / CPU s; step 1 includes the clients' key "
            "generation, reveal and shares, step 3 their partial decryptions; the train exchange, outside the "
            "steps, the clients' training and encryption):\n\n" + steps)


def _sum_max(row: dict, message_type: str) -> str:
    c = row["client_cpu_s"].get(message_type)
    return "" if c is None else f"{c['sum_s']:.1f}, {c['max_s']:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100])
    ap.add_argument("--params", type=int, default=RESNET18)
    ap.add_argument("--per-pull", type=int, default=1, help="most client replies made per pull")
    ap.add_argument("--trace", action="store_true", help="tracemalloc peak of the server side (slower)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_xmk_100.json"))
    ap.add_argument("--docs", nargs="?", const=str(Path(__file__).resolve().parents[1] / "docs"),
                    help="also publish the table in DOCS/results.md")
    ap.add_argument("--from-json", help="publish (--docs) the rows of this earlier --out file; run nothing")
    args = ap.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        run_info = saved.get("provenance", {})
        note = (f"*Published from `{args.from_json}`: the run itself was measured {run_info.get('date', '?')} "
                f"on {run_info.get('machine', '?')}, commit {run_info.get('commit', '?')}.*\n\n")
        command = saved["command"]
        if "--docs" not in command:  # the runs, then this publication
            command += f"; python benchmarks/bench_xmk_100.py --from-json {args.from_json} --docs"
        where = publish("bench-xmk-100", TITLE, note + _docs_body(saved["rows"]), command=command,
                        docs_dir=args.docs or str(Path(__file__).resolve().parents[1] / "docs"))
        print(f"published {where}")
        return 0
    logging.getLogger("flwr").setLevel(logging.ERROR)
    rows: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for m in args.clients:
        row = run(m, args.params, per_pull=args.per_pull, trace=args.trace)
        rows.append(row)
        print(f"M={m} P={args.params:,}: wall {row['wall_s']:.1f} s, CPU {row['cpu_s']:.1f} s, peak RSS "
              f"{row['peak_rss_gib']:.2f} GiB, up {row['bytes_up_per_client_max'] / MIB:.1f} MiB/client, "
              f"max err {row['max_error_of_mean']:.1e}, replies alive <= {row['max_reply_contents_alive']}",
              flush=True)
        info = provenance()
        out.write_text(json.dumps({"benchmark": "bench_xmk_100", "command": info["command"], "provenance": info,
                                   "rows": rows},
                                  indent=1) + "\n")  # after every M: a long run keeps what it measured
    print(f"wrote {out}")
    if args.docs:
        where = publish("bench-xmk-100", TITLE, _docs_body(rows), docs_dir=args.docs)
        print(f"published {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
