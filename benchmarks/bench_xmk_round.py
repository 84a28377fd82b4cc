"""Round time and upload of XMKFedAvg vs Flower's SecAgg+ and plain FedAvg, side by side in one run.

One training round with M clients over the serializing in-process grid
(:class:`~flwr_fedeval.testing.InProcessGrid`: every message through Flower's
protobuf serialization, clients and server one after the other in this
process), numpy-only clients that add a fixed update to a model of the seed
CNN's size (default 949,002 float32 weights in four tensors), three ways:

* **plain**: Flower's ``FedAvg`` (Message API);
* **secagg+**: Flower's ``SecAggPlusWorkflow`` in the legacy ``DefaultWorkflow``
  with ``secaggplus_mod`` on the clients (Bell et al. 2020): ``num_shares`` =
  min(M, k + 1) with k XMKFedAvg's default mask degree (the same number of
  neighbours), ``reconstruction_threshold`` = num_shares // 2 + 1, Flower's
  defaults otherwise (``clipping_range`` 8, ``quantization_range`` 2^22);
* **xmk** (KAHE bulk mode, the default) and **xmk-ckks** (``bulk="ckks"``: every weight under
  xMK-CKKS): :class:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg` with the real
  client handlers and roster identities (the test roster), default settings
  (parameter set, compact L', mask degree, threshold), re-keying every round.

Reported per (M, variant), median over ``--repeat`` interleaved rounds (after ``--warmup``
uncounted rounds of each variant: one-time table building and caches): CPU
seconds of the whole round (all clients and the server: ``time.process_time``,
less sensitive than wall time to other jobs on a shared machine) and wall
seconds, bytes uploaded per client (every serialized reply), max |error| of the
new global model against the exact float64 weighted mean, and for xmk the
server-side seconds of each protocol step (``XMKFedAvg.timer``, client calls
included) and the CPU seconds per client message type; per M the KAHE sum's
worst-case error bound M·2^-22 (stated) and its error on the same updates
against float64 (measured, :func:`kahe_sum_error`), and the load average.

    python benchmarks/bench_xmk_round.py [--clients 5 10] [--params 949002] [--repeat 2] [--warmup 1]
        [--out benchmarks/results/bench_xmk_round.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod
from flwr_fedeval.rlwe import masking
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid, throwaway_identities

ROOT = Path(__file__).resolve().parent.parent


def _shapes(num_params: int) -> list[tuple[int, ...]]:
    big = num_params // 4
    return [(big,), (big,), (big,), (num_params - 3 * big,)]


def _update(pid: int, shapes) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 + pid)  # test data, not key material
    return [rng.uniform(-1e-2, 1e-2, s).astype(np.float32) for s in shapes]


def _examples(pid: int) -> int:
    return 10 + pid


def _expected(shapes, clients: int) -> np.ndarray:
    n = np.array([_examples(p) for p in range(clients)], dtype=np.float64)
    ups = [np.concatenate([u.ravel() for u in _update(p, shapes)]).astype(np.float64) for p in range(clients)]
    return np.sum([ni * u for ni, u in zip(n, ups)], axis=0) / n.sum()


class _Timed:
    """Wraps a ClientApp: CPU seconds per message type."""

    def __init__(self, app) -> None:
        self.app = app
        self.cpu: dict[str, float] = defaultdict(float)

    def __call__(self, msg: Message, context: Context) -> Message:
        c0 = time.process_time()
        try:
            return self.app(msg, context)
        finally:
            self.cpu[msg.metadata.message_type] += time.process_time() - c0


def _message_app(shapes, secure: bool) -> ClientApp:
    app = ClientApp()
    if secure:
        register_xmkckks_handlers(app)

    @app.train(mods=[xmkckks_mod] if secure else [])
    def train(msg, context):
        pid = int(context.node_config["partition-id"])
        w = msg.content["arrays"].to_numpy_ndarrays()
        new = [a + d for a, d in zip(w, _update(pid, shapes))]
        metrics = MetricRecord({"num-examples": _examples(pid)})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    return app


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([a.ravel() for a in arrays]).astype(np.float64)


def run_plain(shapes, clients: int) -> dict:
    from flwr.serverapp.strategy import FedAvg

    app = _Timed(_message_app(shapes, secure=False))
    grid = InProcessGrid(app, clients, {})
    strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=clients, min_available_nodes=clients)
    w0 = [np.zeros(s, dtype=np.float32) for s in shapes]
    c0, t0 = time.process_time(), time.perf_counter()
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(w0), num_rounds=1, train_config=ConfigRecord({}))
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "bytes_up_per_client": max(grid.bytes_up.values()),
        "new_model": _flat(result.arrays.to_numpy_ndarrays()),
        "client_cpu_s": dict(app.cpu),
    }


def run_secaggplus(shapes, clients: int) -> dict:
    """Flower's SecAgg+ (legacy workflow and mod), one round."""
    from flwr.client import ClientApp as LegacyClientApp
    from flwr.client import NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg as LegacyFedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    class Client(NumPyClient):
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def fit(self, parameters, config):
            return [a + d for a, d in zip(parameters, _update(self.pid, shapes))], _examples(self.pid), {}

    def client_fn(context: Context):
        return Client(int(context.node_config["partition-id"])).to_client()

    app = _Timed(LegacyClientApp(client_fn=client_fn, mods=[secaggplus_mod]))
    grid = InProcessGrid(app, clients, {})
    final: dict[str, list[np.ndarray]] = {}

    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    class Keep(LegacyFedAvg):
        def aggregate_fit(self, server_round, results, failures):
            params, metrics = super().aggregate_fit(server_round, results, failures)
            if params is not None:
                final["w"] = parameters_to_ndarrays(params)
            return params, metrics

    w0 = [np.zeros(s, dtype=np.float32) for s in shapes]
    strategy = Keep(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=clients,
        min_available_clients=clients,
        initial_parameters=ndarrays_to_parameters(w0),
    )
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=1), strategy=strategy)
    shares = min(clients, masking.DEFAULT_MASK_DEGREE + 1)  # as many neighbours as XMKFedAvg's mask graph
    workflow = DefaultWorkflow(
        fit_workflow=SecAggPlusWorkflow(num_shares=shares, reconstruction_threshold=shares // 2 + 1)
    )
    c0, t0 = time.process_time(), time.perf_counter()
    workflow(grid, legacy)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "bytes_up_per_client": max(grid.bytes_up.values()),
        "new_model": _flat(final["w"]),
        "client_cpu_s": dict(app.cpu),
    }


def run_xmk(shapes, clients: int, bulk: str = "kahe") -> dict:
    app = _Timed(_message_app(shapes, secure=True))
    grid = InProcessGrid(app, clients, {"fedeval-identity-dir": throwaway_identities(clients)})
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=clients, min_available_nodes=clients, bulk=bulk)
    w0 = [np.zeros(s, dtype=np.float32) for s in shapes]
    c0, t0 = time.process_time(), time.perf_counter()
    result = strategy.start(
        grid=grid, initial_arrays=ArrayRecord(w0), num_rounds=1, train_config=ConfigRecord({}), timeout=3600
    )
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    steps: dict[str, float] = defaultdict(float)
    for name, seconds in strategy.timer.timings:
        steps[name] += seconds
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "bytes_up_per_client": max(grid.bytes_up.values()),
        "new_model": _flat(result.arrays.to_numpy_ndarrays()),
        "client_cpu_s": dict(app.cpu),
        "server_steps_wall_s": dict(steps),
        "parameter_set": strategy.params.name,
        "limbs": strategy.protocol.limbs_for(clients, strategy.protocol.scale_bits_for(clients)),
    }


def run_xmk_ckks(shapes, clients: int) -> dict:
    return run_xmk(shapes, clients, bulk="ckks")


def kahe_sum_error(shapes, clients: int) -> dict:
    """The KAHE sum's worst-case error bound (stated) and its error on this benchmark's updates (measured).

    XMKFedAvg's default KAHE set for a key set of M members (B = ``max_abs_value`` = 2^16, F =
    ``fractional_bits`` = 21): every client's x_i = round(2^F clip(n_i·Δw_i, ±B)) is exact in the sum, so
    |decoded Σ − Σ n_i·Δw_i| ≤ M 2^-(F+1) = M·2^-22 (:attr:`~flwr_fedeval.rlwe.kahe.KaheParameters.max_sum_error`;
    no value is clipped here). Measured: the M updates encrypted under fresh keys, summed, decoded with the
    key sum, against the float64 sum of n_i·Δw_i.
    """
    from flwr_fedeval.rlwe import kahe

    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=clients, min_available_nodes=clients)
    params = strategy.protocol.kahe_for(clients)
    seed = kahe.public_seed(b"bench_xmk_round", 1)
    ups = [_examples(p) * np.concatenate([u.ravel() for u in _update(p, shapes)]).astype(np.float64)
           for p in range(clients)]
    keys = [kahe.sample_key(params) for _ in range(clients)]
    total = kahe.KaheSum(params, seed, ups[0].size)
    for key, up, p in zip(keys, ups, range(clients)):
        total.add(kahe.encrypt(params, seed, key, up, np.array([_examples(p), 0])).to_bytes())
    sums, integers = total.decode(np.sum(keys, axis=0))
    exact = np.sum(ups, axis=0)
    return {"bound_of_sum": params.max_sum_error, "bound_of_sum_formula": "M * 2^-(F+1)",
            "bound_of_mean": params.max_sum_error / float(sum(_examples(p) for p in range(clients))),
            "max_error_of_sum": float(np.max(np.abs(sums - exact))), "num_examples": int(integers[0]),
            "max_abs_value": strategy.protocol.max_abs_value, "fractional_bits": params.fractional_bits,
            "kahe_primes": list(params.primes)}


RUNNERS = {"plain": run_plain, "secagg+": run_secaggplus, "xmk": run_xmk, "xmk-ckks": run_xmk_ckks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--params", type=int, default=949_002)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1,
                    help="rounds per variant and M run first and not counted (one-time table building, caches)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_xmk_round.json"))
    ap.add_argument("--variants", nargs="+", default=list(RUNNERS), choices=list(RUNNERS))
    args = ap.parse_args(argv)
    runners = {name: RUNNERS[name] for name in args.variants}
    logging.getLogger("flwr").setLevel(logging.ERROR)
    shapes = _shapes(args.params)
    rows = []
    for m in args.clients:
        expected = _expected(shapes, m)
        runs: dict[str, list[dict]] = defaultdict(list)
        for _ in range(args.warmup):
            for runner in runners.values():
                runner(shapes, m)
        for _ in range(args.repeat):  # interleaved: each variant sees the same load
            for name, runner in runners.items():
                res = runner(shapes, m)
                res["max_error_of_mean"] = float(np.max(np.abs(res.pop("new_model") - expected)))
                runs[name].append(res)
        row: dict = {"clients": m, "params": args.params, "load_average_before": list(os.getloadavg())}
        for name, rs in runs.items():
            row[name] = {
                "cpu_s_median": statistics.median(r["cpu_s"] for r in rs),
                "wall_s_median": statistics.median(r["wall_s"] for r in rs),
                "runs": rs,
            }
        for name in ("xmk", "xmk-ckks"):
            if name in row and "secagg+" in row:
                row[f"{name}_over_secaggplus_cpu"] = row[name]["cpu_s_median"] / row["secagg+"]["cpu_s_median"]
        if "secagg+" in row and "plain" in row:
            row["secaggplus_over_plain_cpu"] = row["secagg+"]["cpu_s_median"] / row["plain"]["cpu_s_median"]
        if "xmk" in row:
            row["xmk_kahe_sum_error"] = kahe_sum_error(shapes, m)
        row["load_average_after"] = list(os.getloadavg())
        rows.append(row)
        print(
            f"M={m}: "
            + ", ".join(
                f"{k} {row[k]['cpu_s_median']:.2f} s CPU "
                f"({row[k]['runs'][0]['bytes_up_per_client'] / 2**20:.1f} MiB up, "
                f"err {row[k]['runs'][0]['max_error_of_mean']:.1e})"
                for k in runners
            )
            + "".join(
                f"; {k} / secagg+ = {row[f'{k}_over_secaggplus_cpu']:.2f}"
                for k in ("xmk", "xmk-ckks")
                if f"{k}_over_secaggplus_cpu" in row
            ),
            flush=True,
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bench_xmk_round.py " + " ".join(sys.argv[1:] if argv is None else argv)
    Path(args.out).write_text(json.dumps({"command": command, "rows": rows}, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
