"""Tables 4/6 of Walskaar et al. 2023: local training vs plain FL vs HE (xMK-CKKS) FL.

The seed CNN (``build_seed_cnn``, 949,002 parameters) on the chest X-rays of
``../shared/data/chest-xray`` (task ``covid-vs-normal`` = the paper's 124 COVID
vs 500 normal; ``--task pneumonia-vs-normal`` is the cleaner alternative),
for 2, 3, 5 (and optionally 10) clients, IID partitions, each client with its
own train/test split (``load_client_data``). Three modes, same seed, same
total number of epochs:

* ``local``: every client trains alone on its own train split for
  ``rounds × local-epochs`` epochs and is scored on its own test split
  (the paper reports the mean over clients).
* ``plain``: Flower ``FedAvg`` (``make_strategy`` with secure-aggregation "none").
* ``he``: ``XMKFedAvg`` (secure-aggregation "xmkckks").

Both FL modes call the real ``strategy.start(...)`` over the serializing
``tests/inprocess_grid.InProcessGrid`` with the real ``client_app`` of the
main job; only the strategy differs. Reported for every run:

* accuracy, precision, recall, F1 of the positive class (threshold 0.5 on
  ``KerasModelAdapter.predict_scores``; scikit-learn) on the pooled client
  test splits (FL: the final global model; local: every client's own model
  on its own split, concatenated) and as the mean over clients;
* wall time (all clients run one after the other in this process) and CPU
  time per run and per round, plus an estimate with clients in parallel
  (server time + the slowest client of every message batch); the HE/plain
  round-time ratio;
* peak memory of the server and of the clients, measured separately:
  ``tracemalloc`` (Python and numpy allocations; TensorFlow's own buffers are
  NOT seen by it) and the increase of the process resident set (VmHWM, reset
  through ``/proc/self/clear_refs`` around every step; includes TensorFlow),
  plus the process peak RSS. Server = everything outside client calls
  (strategy, aggregation, key handling, message (de)serialization of the grid);
  client = one ClientApp call (train, evaluate, key generation, partial
  decryption) — the maximum over calls.
* a determinism check: TF training is deterministic for a fixed seed here,
  so plain and HE FL start round 2 from the same clients' models and the
  round-1 global models differ only by float32 rounding (plain FedAvg sums in
  float32) and the CKKS encoding error; compared with the exact float64
  weighted mean of the plain run's round-1 client models.

Every (mode, clients) run is a separate subprocess (clean TF state and peak
RSS); its JSON goes to ``experiments/results/covid_cnn_runs/`` and its log next
to it. Writes ``experiments/results/covid_cnn.{csv,json,md,png}``.

Usage::

    .venv/bin/python experiments/covid_cnn.py [--clients 2 3 5] [--rounds 3] [--local-epochs 2]
        [--task covid-vs-normal] [--modes local plain he] [--resume] [--aggregate-only]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # inprocess_grid (a test helper, imported in place)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODES = ("local", "plain", "he")
MODE_LABEL = {"local": "Local", "plain": "Plain FL", "he": "HE FL (xMK-CKKS)"}
MB = 1024.0 * 1024.0
DEFAULT_DATA = REPO.parent / "shared" / "data" / "chest-xray"

# --------------------------------------------------------------------------- memory


def _proc_rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes (Linux)."""
    rss = hwm = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the peak RSS (VmHWM) to the current RSS
        return True
    except OSError:
        return False


class MemoryTracker:
    """Peak memory of nested frames, by role (``server``, ``client``, ``harness``).

    tracemalloc: a frame's peak is measured above the traced memory in use
    when the frame starts; what a nested call leaves allocated (e.g. the reply
    messages the server receives) counts for the frame.
    RSS: the largest growth of the process high-water mark (VmHWM) within one
    uninterrupted stretch of the frame (re-based after every nested call), so
    memory TensorFlow keeps after a client call is not charged to the server.
    A nested frame of another role (a client call inside a server step, a
    harness snapshot) is cut out of its parent: the tracemalloc peak and the
    VmHWM are reset around it. A nested frame of the same role counts for its
    parent too.
    """

    def __init__(self, use_tracemalloc: bool) -> None:
        self.py = use_tracemalloc
        self.rss_ok = _reset_hwm()
        self.stack: list[dict[str, Any]] = []
        self.peaks: dict[tuple[str, str], dict[str, float]] = {}
        self.process_peak_rss = _proc_rss()[1]

    def _read(self) -> tuple[int, int, int, int]:
        cur, peak = tracemalloc.get_traced_memory() if self.py else (0, 0)
        rss, hwm = _proc_rss()
        return cur, peak, rss, hwm

    def _reset(self) -> None:
        if self.py:
            tracemalloc.reset_peak()
        if self.rss_ok:
            self.process_peak_rss = max(self.process_peak_rss, _proc_rss()[1])
            _reset_hwm()

    def _fold_top(self) -> None:
        if self.stack:
            _, peak, _, hwm = self._read()
            top = self.stack[-1]
            top["py_max"] = max(top["py_max"], peak)
            top["rss_excess"] = max(top["rss_excess"], hwm - top["rss_base"])
            top["rss_max"] = max(top["rss_max"], hwm)

    @contextmanager
    def frame(self, role: str, label: str):
        self._fold_top()
        self._reset()
        cur, _, rss, _ = self._read()
        self.stack.append(dict(role=role, label=label, py_base=cur, py_max=cur, rss_base=rss, rss_excess=0,
                               rss_max=rss))
        try:
            yield
        finally:
            self._fold_top()
            f = self.stack.pop()
            rec = self.peaks.setdefault((role, label), dict(calls=0, py_mb=0.0, rss_delta_mb=0.0, rss_mb=0.0))
            rec["calls"] += 1
            rec["py_mb"] = max(rec["py_mb"], (f["py_max"] - f["py_base"]) / MB)
            rec["rss_delta_mb"] = max(rec["rss_delta_mb"], f["rss_excess"] / MB)
            rec["rss_mb"] = max(rec["rss_mb"], f["rss_max"] / MB)
            if self.stack and self.stack[-1]["role"] == role:
                parent = self.stack[-1]
                parent["py_max"] = max(parent["py_max"], f["py_max"])
                parent["rss_excess"] = max(parent["rss_excess"], f["rss_excess"])
            self._reset()
            if self.stack:  # the parent resumes: new RSS stretch
                self.stack[-1]["rss_base"] = _proc_rss()[0]

    def role_peak(self, role: str) -> dict[str, float | None]:
        recs = [v for (r, _), v in self.peaks.items() if r == role]
        if not recs:
            return {"py_mb": None, "rss_delta_mb": None, "rss_mb": None}
        return {
            "py_mb": max(v["py_mb"] for v in recs) if self.py else None,
            "rss_delta_mb": max(v["rss_delta_mb"] for v in recs) if self.rss_ok else None,
            "rss_mb": max(v["rss_mb"] for v in recs) if self.rss_ok else None,
        }

    def process_peak_mb(self) -> float:
        # ru_maxrss alone would be wrong here: resetting VmHWM also resets it.
        ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(ru, self.process_peak_rss, _proc_rss()[1]) / MB


# --------------------------------------------------------------------------- timing


class RoundClock:
    """Wall and CPU time per FL round, split into client calls and the rest."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, Any]] = []
        self.cur: dict[str, Any] | None = None
        self._batch: list[float] | None = None

    def start_round(self) -> None:
        self.cur = dict(t0=time.perf_counter(), c0=time.process_time(), client_wall=0.0, client_cpu=0.0,
                        excluded_wall=0.0, excluded_cpu=0.0, batch_max=[], calls={}, steps={})

    def end_round(self) -> None:
        c = self.cur
        if c is None:
            return
        wall = time.perf_counter() - c.pop("t0") - c["excluded_wall"]
        cpu = time.process_time() - c.pop("c0") - c["excluded_cpu"]
        c.update(round=len(self.rounds) + 1, wall_s=wall, cpu_s=cpu, server_wall_s=wall - c["client_wall"],
                 parallel_est_s=wall - c["client_wall"] + sum(c["batch_max"]))
        self.rounds.append(c)
        self.cur = None

    def begin_batch(self) -> None:
        self._batch = []

    def end_batch(self) -> None:
        if self.cur is not None and self._batch:
            self.cur["batch_max"].append(max(self._batch))
        self._batch = None

    def client_call(self, kind: str, wall: float, cpu: float) -> None:
        if self._batch is not None:
            self._batch.append(wall)
        if self.cur is not None:
            self.cur["client_wall"] += wall
            self.cur["client_cpu"] += cpu
            rec = self.cur["calls"].setdefault(kind, dict(n=0, wall_s=0.0, cpu_s=0.0))
            rec["n"] += 1
            rec["wall_s"] += wall
            rec["cpu_s"] += cpu

    def server_step(self, name: str, wall: float, cpu: float) -> None:
        if self.cur is not None:
            rec = self.cur["steps"].setdefault(name, dict(wall_s=0.0, cpu_s=0.0))
            rec["wall_s"] += wall
            rec["cpu_s"] += cpu

    def exclude(self, wall: float, cpu: float) -> None:
        if self.cur is not None:
            self.cur["excluded_wall"] += wall
            self.cur["excluded_cpu"] += cpu


# --------------------------------------------------------------------------- metrics


def binary_metrics(y_true: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """Accuracy, precision, recall, F1 of class 1 at threshold 0.5 (scikit-learn)."""
    from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score

    y_true = np.asarray(y_true, dtype=np.int64)
    pred = (np.asarray(scores) >= 0.5).astype(np.int64)
    return {
        "accuracy": float(accuracy_score(y_true, pred)),
        "precision": float(precision_score(y_true, pred, zero_division=0)),
        "recall": float(recall_score(y_true, pred, zero_division=0)),
        "f1": float(f1_score(y_true, pred, zero_division=0)),
        "n": int(y_true.size),
        "positives": int(y_true.sum()),
        "predicted_positive": int(pred.sum()),
    }


METRIC_KEYS = ("accuracy", "precision", "recall", "f1")


def summarize(per_client: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """Pooled metrics over all (y, score) pairs and the mean of per-client metrics."""
    clients = [binary_metrics(y, s) for y, s in per_client]
    pooled = binary_metrics(np.concatenate([y for y, _ in per_client]), np.concatenate([s for _, s in per_client]))
    mean = {k: float(np.mean([c[k] for c in clients])) for k in METRIC_KEYS}
    return {"pooled": pooled, "mean_over_clients": mean, "per_client": clients}


# --------------------------------------------------------------------------- one run (child process)


def job_config(args: argparse.Namespace, num_clients: int, mode: str):
    from flwr_fedeval.app.task import JobConfig

    cfg = JobConfig(
        num_server_rounds=args.rounds,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        min_nodes=num_clients,
        seed=args.seed,
        dataset="chest-xray",
        data_dir=str(Path(args.data_dir).resolve()),
        xray_task=args.task,
        image_size=args.image_size,
        partitioning="iid",
        test_fraction=args.test_fraction,
        secure_aggregation="xmkckks" if mode == "he" else "none",
        xmk_parameter_set=args.xmk_parameter_set,
        xmk_max_abs_value=args.xmk_max_abs_value,
    )
    cfg.validate()
    return cfg


def _save_arrays(path: Path, arrays: list[np.ndarray], **extra: Any) -> None:
    np.savez(path, *arrays, **extra)


def _load_arrays(path: Path) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    with np.load(path) as z:
        arrays = [z[f"arr_{i}"] for i in range(sum(k.startswith("arr_") for k in z.files))]
        extra = {k: z[k] for k in z.files if not k.startswith("arr_")}
    return arrays, extra


def run_local(cfg, n: int, tracker: MemoryTracker) -> dict[str, Any]:
    from flwr_fedeval.app.task import build_model, load_client_data
    from flwr_fedeval.clients.keras_adapter import KerasModelAdapter

    epochs = cfg.num_server_rounds * cfg.local_epochs
    per_client, times = [], []
    for pid in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        with tracker.frame("client", "local-train"):
            data = load_client_data(cfg, pid, n)
            model = build_model(cfg)
            model.fit(data.x_train, data.y_train, epochs=epochs, batch_size=cfg.batch_size, verbose=0)
            scores = KerasModelAdapter(model).predict_scores(data.x_test)
        times.append({"client": pid, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                      "num_train": int(len(data.y_train)), "num_test": int(len(data.y_test))})
        per_client.append((data.y_test, scores))
        print(f"  local client {pid}: {times[-1]['wall_s']:.1f} s", flush=True)
    return {
        "metrics": summarize(per_client),
        "wall_s": sum(t["wall_s"] for t in times),
        "cpu_s": sum(t["cpu_s"] for t in times),
        "parallel_est_s": max(t["wall_s"] for t in times),
        "clients": times,
    }


def run_fl(cfg, n: int, mode: str, tracker: MemoryTracker, run_dir: Path, tag: str) -> dict[str, Any]:
    from flwr.app import ArrayRecord, ConfigRecord
    from inprocess_grid import InProcessGrid

    from flwr_fedeval.app.client_app import app as client_app
    from flwr_fedeval.app.server_app import make_strategy
    from flwr_fedeval.app.task import build_model

    clock = RoundClock()

    class MeasuredClientApp:
        """The real ClientApp, timed and memory-framed per call."""

        def __call__(self, msg, context):
            kind = msg.metadata.message_type
            t0, c0 = time.perf_counter(), time.process_time()
            with tracker.frame("client", kind):
                reply = client_app(msg, context)
            clock.client_call(kind, time.perf_counter() - t0, time.process_time() - c0)
            return reply

    class MeasuredGrid(InProcessGrid):
        """InProcessGrid that marks message batches (for the parallel-clients estimate)."""

        def push_messages(self, messages):
            clock.begin_batch()
            try:
                return super().push_messages(messages)
            finally:
                clock.end_batch()

    def spy(node, msg, reply):
        # Plain run: keep the round-1 client models on disk (exact float64 reference).
        if mode == "plain" and msg.metadata.message_type == "train" and len(clock.rounds) == 0 \
                and not reply.has_error():
            t0, c0 = time.perf_counter(), time.process_time()
            with tracker.frame("harness", "reference-dump"):
                _save_arrays(run_dir / f"{tag}-r1-client{node}.npz", reply.content["arrays"].to_numpy_ndarrays(),
                             num_examples=int(reply.content["metrics"]["num-examples"]))
            clock.exclude(time.perf_counter() - t0, time.process_time() - c0)
        return reply

    def snapshot(server_round: int, arrays):
        clock.end_round()
        with tracker.frame("harness", "snapshot"):
            _save_arrays(run_dir / f"{tag}-round{server_round}.npz", arrays.to_numpy_ndarrays())
        if server_round < cfg.num_server_rounds:
            clock.start_round()
        return None

    run_config = {k: v for k, v in cfg.as_dict().items()}
    grid = MeasuredGrid(MeasuredClientApp(), n, run_config, fault=spy)
    strategy = make_strategy(cfg)
    for name in ("configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate"):
        def wrapped(*a, _fn=getattr(strategy, name), _name=name, **kw):
            t0, c0 = time.perf_counter(), time.process_time()
            with tracker.frame("server", _name):
                out = _fn(*a, **kw)
                if _name.startswith("configure"):
                    out = list(out)
            clock.server_step(_name, time.perf_counter() - t0, time.process_time() - c0)
            return out
        setattr(strategy, name, wrapped)

    initial = ArrayRecord(build_model(cfg).get_weights())
    t0, c0 = time.perf_counter(), time.process_time()
    with tracker.frame("server", "strategy.start"):
        result = strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=cfg.num_server_rounds,
            train_config=ConfigRecord({"local-epochs": cfg.local_epochs}),
            evaluate_fn=snapshot,
        )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    aborted = [{"round": r, "step": e.step, "failed": {str(k): v for k, v in e.failed.items()}}
               for r, e in getattr(strategy, "aborted_attempts", [])]
    return {
        "wall_s": wall,
        "rounds_wall_s": sum(r["wall_s"] for r in clock.rounds),
        "cpu_s": cpu,
        "parallel_est_s": sum(r["parallel_est_s"] for r in clock.rounds),
        "rounds": clock.rounds,
        "rounds_completed": sorted(int(k) for k in result.train_metrics_clientapp),
        "train_metrics": {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()},
        "evaluate_metrics": {int(r): dict(m) for r, m in result.evaluate_metrics_clientapp.items()},
        "aborted_attempts": aborted,
        "bytes_up": int(sum(grid.bytes_up.values())),
        "bytes_down": int(sum(grid.bytes_down.values())),
        "message_types": sorted({t for _, t, _ in grid.log}),
    }


def child_main(args: argparse.Namespace) -> None:
    mode, n = args._run.split(":")
    n = int(n)
    run_dir = Path(args.out) / "covid_cnn_runs"
    tag = f"{mode}-n{n}"
    from flwr_fedeval.app.task import build_model, load_client_data, load_pooled_data
    from flwr_fedeval.clients.keras_adapter import KerasModelAdapter

    cfg = job_config(args, n, mode)
    load_pooled_data(cfg)  # decode the images once, before anything is measured
    splits = [load_client_data(cfg, i, n) for i in range(n)]
    build_model(cfg)  # import TF and build once (warm-up, not measured)
    load_avg_start = os.getloadavg()
    tracker = MemoryTracker(args.tracemalloc)
    if args.tracemalloc:
        tracemalloc.start()
    t0 = time.perf_counter()
    if mode == "local":
        res = run_local(cfg, n, tracker)
    else:
        res = run_fl(cfg, n, mode, tracker, run_dir, tag)
    total = time.perf_counter() - t0
    if args.tracemalloc:
        tracemalloc.stop()

    if mode != "local":  # score the global model of every round (not timed)
        adapter = KerasModelAdapter(build_model(cfg))
        per_round = {}
        for r in range(cfg.num_server_rounds + 1):
            arrays, _ = _load_arrays(run_dir / f"{tag}-round{r}.npz")
            adapter.set_weights(arrays)
            per_round[r] = summarize([(s.y_test, adapter.predict_scores(s.x_test)) for s in splits])
        res["metrics"] = per_round[cfg.num_server_rounds]
        res["metrics_per_round"] = {r: {"pooled": m["pooled"], "mean_over_clients": m["mean_over_clients"]}
                                    for r, m in per_round.items()}
    res.update(
        mode=mode,
        num_clients=n,
        settings=settings_of(args),
        total_wall_s=total,
        memory={
            "server": tracker.role_peak("server"),
            "client": tracker.role_peak("client"),
            "by_step": {f"{r}:{lbl}": v for (r, lbl), v in tracker.peaks.items()},
            "process_peak_rss_mb": tracker.process_peak_mb(),
            "tracemalloc": bool(args.tracemalloc),
            "rss_reset_ok": tracker.rss_ok,
        },
        split_sizes=[{"train": int(len(s.y_train)), "test": int(len(s.y_test)),
                      "test_positives": int(s.y_test.sum())} for s in splits],
        load_avg_start=load_avg_start,
        load_avg_end=os.getloadavg(),
    )
    (run_dir / f"{tag}.json").write_text(json.dumps(_jsonable(res), indent=1))


# --------------------------------------------------------------------------- parent: runs and tables


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in ("task", "rounds", "local_epochs", "batch_size", "learning_rate", "seed",
                                         "image_size", "test_fraction", "xmk_parameter_set", "xmk_max_abs_value",
                                         "tracemalloc")} | {"data_dir": str(Path(args.data_dir).resolve())}


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def child_argv(args: argparse.Namespace, mode: str, n: int) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--_run", f"{mode}:{n}", "--out", str(args.out),
            "--data-dir", str(args.data_dir), "--task", args.task, "--rounds", str(args.rounds),
            "--local-epochs", str(args.local_epochs), "--batch-size", str(args.batch_size),
            "--learning-rate", repr(args.learning_rate), "--seed", str(args.seed),
            "--image-size", str(args.image_size), "--test-fraction", repr(args.test_fraction),
            "--xmk-parameter-set", args.xmk_parameter_set, "--xmk-max-abs-value", repr(args.xmk_max_abs_value)]
    if not args.tracemalloc:
        argv.append("--no-tracemalloc")
    return argv


def determinism_check(run_dir: Path, n: int, rounds: int) -> dict[str, Any] | None:
    """Plain vs HE global models per round, and round 1 vs the exact float64 weighted mean."""
    if not (run_dir / f"plain-n{n}-round1.npz").exists() or not (run_dir / f"he-n{n}-round1.npz").exists():
        return None

    def flat(path: Path) -> np.ndarray:
        arrays, _ = _load_arrays(path)
        return np.concatenate([a.astype(np.float64).ravel() for a in arrays])

    out: dict[str, Any] = {"max_abs_diff_he_vs_plain": {}}
    for r in range(rounds + 1):
        p, h = run_dir / f"plain-n{n}-round{r}.npz", run_dir / f"he-n{n}-round{r}.npz"
        if p.exists() and h.exists():
            out["max_abs_diff_he_vs_plain"][r] = float(np.max(np.abs(flat(p) - flat(h))))
    refs = sorted(run_dir.glob(f"plain-n{n}-r1-client*.npz"))
    if len(refs) == n:
        total, weight = None, 0.0
        for path in refs:
            arrays, extra = _load_arrays(path)
            ni = float(extra["num_examples"])
            v = np.concatenate([a.astype(np.float64).ravel() for a in arrays]) * ni
            total = v if total is None else total + v
            weight += ni
        exact = total / weight
        for name in ("plain", "he"):
            err = np.abs(flat(run_dir / f"{name}-n{n}-round1.npz") - exact)
            out[f"round1_{name}_vs_exact64_max_abs"] = float(err.max())
        out["round1_float32_rounding_of_exact64_max_abs"] = float(
            np.max(np.abs(exact.astype(np.float32).astype(np.float64) - exact)))
        out["max_abs_weight_round1"] = float(np.abs(exact).max())
    out["round1_identical_weights_fraction"] = float(
        np.mean(flat(run_dir / f"plain-n{n}-round1.npz") == flat(run_dir / f"he-n{n}-round1.npz")))
    return out


def fmt(v: Any, nd: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def build_rows(runs: dict[tuple[str, int], dict]) -> list[dict[str, Any]]:
    rows = []
    for (mode, n), r in sorted(runs.items(), key=lambda kv: (kv[0][1], MODES.index(kv[0][0]))):
        m = r["metrics"]
        rounds = r.get("rounds") or []
        row = {
            "clients": n,
            "mode": mode,
            **{f"pooled_{k}": m["pooled"][k] for k in METRIC_KEYS},
            **{f"mean_{k}": m["mean_over_clients"][k] for k in METRIC_KEYS},
            "wall_s": r["rounds_wall_s"] if mode != "local" else r["wall_s"],
            "cpu_s": r["cpu_s"],
            "parallel_est_s": r["parallel_est_s"],
            "round_wall_mean_s": float(np.mean([x["wall_s"] for x in rounds])) if rounds else None,
            "round_cpu_mean_s": float(np.mean([x["cpu_s"] for x in rounds])) if rounds else None,
            "round_parallel_est_mean_s": float(np.mean([x["parallel_est_s"] for x in rounds])) if rounds else None,
            "server_py_peak_mb": r["memory"]["server"]["py_mb"],
            "server_rss_delta_mb": r["memory"]["server"]["rss_delta_mb"],
            "client_py_peak_mb": r["memory"]["client"]["py_mb"],
            "client_rss_delta_mb": r["memory"]["client"]["rss_delta_mb"],
            "process_peak_rss_mb": r["memory"]["process_peak_rss_mb"],
            "bytes_up_mb": r.get("bytes_up", 0) / MB if mode != "local" else None,
            "bytes_down_mb": r.get("bytes_down", 0) / MB if mode != "local" else None,
            "rounds_completed": len(r.get("rounds_completed", [])) if mode != "local" else None,
            "aborted_attempts": len(r.get("aborted_attempts", [])) if mode != "local" else None,
            "load_avg_1min": r["load_avg_start"][0],
        }
        rows.append(row)
    return rows


def ratios(rows: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    out = {}
    by = {(r["mode"], r["clients"]): r for r in rows}
    for n in sorted({r["clients"] for r in rows}):
        p, h = by.get(("plain", n)), by.get(("he", n))
        if p and h and p["round_wall_mean_s"] and h["round_wall_mean_s"]:
            out[n] = {
                "round_wall": h["round_wall_mean_s"] / p["round_wall_mean_s"],
                "round_cpu": h["round_cpu_mean_s"] / p["round_cpu_mean_s"],
                "round_parallel_est": h["round_parallel_est_mean_s"] / p["round_parallel_est_mean_s"],
                "accuracy_diff_points": 100 * (h["pooled_accuracy"] - p["pooled_accuracy"]),
                "f1_diff_points": 100 * (h["pooled_f1"] - p["pooled_f1"]),
            }
    return out


def markdown(rows, rat, det, settings, meta) -> str:
    head = ("| clients | mode | acc | prec | rec | F1 | acc (mean/client) | F1 (mean/client) | wall s | round s "
            "| round CPU s | server py MB | server ΔRSS MB | client py MB | client ΔRSS MB | peak RSS MB |")
    lines = [
        "# covid_cnn: local vs plain FL vs HE FL (Walskaar et al. 2023, Tables 4/6)",
        "",
        f"Task `{settings['task']}`, seed CNN {settings['image_size']}×{settings['image_size']}, "
        f"{settings['rounds']} rounds × {settings['local_epochs']} local epochs "
        f"(local: {settings['rounds'] * settings['local_epochs']} epochs), batch {settings['batch_size']}, "
        f"lr {settings['learning_rate']}, seed {settings['seed']}, IID, test fraction {settings['test_fraction']} "
        f"per client; HE: {settings['xmk_parameter_set']}, max |n·Δw| {settings['xmk_max_abs_value']:g}.",
        f"Machine: {meta['machine']}; run {meta['started']}, {meta['runtime_min']:.1f} min in total.",
        "",
        "acc/prec/rec/F1: positive class, threshold 0.5, pooled client test splits (FL: final global model; "
        "local: each client's own model on its own split). 'mean/client': mean over clients (the paper's local "
        "numbers). wall s: FL rounds (local: all clients' training) run one client after the other in one "
        "process; round s: mean FL round (train + federated evaluate).",
        "",
        head,
        "|" + "|".join(["---"] * (head.count("|") - 1)) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join([
            str(r["clients"]), MODE_LABEL[r["mode"]], fmt(r["pooled_accuracy"]), fmt(r["pooled_precision"]),
            fmt(r["pooled_recall"]), fmt(r["pooled_f1"]), fmt(r["mean_accuracy"]), fmt(r["mean_f1"]),
            fmt(r["wall_s"], 1), fmt(r["round_wall_mean_s"], 1), fmt(r["round_cpu_mean_s"], 1),
            fmt(r["server_py_peak_mb"], 1), fmt(r["server_rss_delta_mb"], 1), fmt(r["client_py_peak_mb"], 1),
            fmt(r["client_rss_delta_mb"], 1), fmt(r["process_peak_rss_mb"], 0),
        ]) + " |")
    lines += ["", "## HE vs plain FL", "",
              "| clients | round wall ratio | round CPU ratio | ratio, clients in parallel (est.) "
              "| Δ accuracy (points) | Δ F1 (points) |", "|---|---|---|---|---|---|"]
    for n, q in rat.items():
        lines.append(f"| {n} | {q['round_wall']:.2f}× | {q['round_cpu']:.2f}× | {q['round_parallel_est']:.2f}× "
                     f"| {q['accuracy_diff_points']:+.2f} | {q['f1_diff_points']:+.2f} |")
    if det:
        lines += ["", "## Determinism: HE vs plain global models", "",
                  "| clients | round 1: max \\|plain − exact64\\| | round 1: max \\|HE − exact64\\| | "
                  "round 1: weights equal in HE and plain | max \\|HE − plain\\| per round |", "|---|---|---|---|---|"]
        for n, d in det.items():
            if d is None:
                continue
            per = ", ".join(f"r{r}: {v:.1e}" for r, v in d["max_abs_diff_he_vs_plain"].items())
            e = {k: (f"{d[k]:.1e}" if d.get(k) is not None else "n/a")
                 for k in ("round1_plain_vs_exact64_max_abs", "round1_he_vs_exact64_max_abs")}
            lines.append(f"| {n} | {e['round1_plain_vs_exact64_max_abs']} | {e['round1_he_vs_exact64_max_abs']} | "
                         f"{100 * d['round1_identical_weights_fraction']:.1f} % | {per} |")
        rnd = [d.get("round1_float32_rounding_of_exact64_max_abs") for d in det.values() if d]
        rnd_txt = f" Rounding exact64 to float32 alone changes a weight by up to {max(rnd):.1e}." if all(rnd) else ""
        lines += ["", "exact64 = float64 weighted mean of the plain run's round-1 client models (TF training is "
                  "deterministic for a fixed seed, so both FL runs train identical round-1 client models)."
                  + rnd_txt + " Later rounds start from these slightly different models."]
    lines += ["", "## Memory (how it is measured)", "",
              "All nodes run in one process. server = everything outside ClientApp calls (strategy steps, "
              "aggregation, HE key and ciphertext handling, message (de)serialization of the grid); client = one "
              "ClientApp call, maximum over calls. 'py MB': tracemalloc peak above the memory in use at the start "
              "of the step, the server's including the replies it holds (Python and numpy allocations; "
              "TensorFlow's tensors and kernels are NOT tracked). "
              "'ΔRSS MB': largest growth of the process resident set (VmHWM, reset around every step) within one "
              "uninterrupted stretch of a step; includes TensorFlow, but memory TF keeps cached from an earlier "
              "call is not counted again (the first training call of a process shows the largest growth). "
              "'peak RSS MB': the whole process (TF runtime, all clients' data, server), "
              "not comparable with the paper's per-process numbers.",
              "",
              "Times: 2 shared cores (load average given per run in the JSON); wall times are noisy, CPU time "
              "(whole process, all threads) less so. 'clients in parallel (est.)' = server time + the slowest "
              "client of every message batch."]
    return "\n".join(lines) + "\n"


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({r["clients"] for r in rows})
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    by = {(r["mode"], r["clients"]): r for r in rows}
    panels = [("pooled_accuracy", "Accuracy (pooled test)"), ("pooled_f1", "F1, positive class (pooled test)"),
              ("wall_s", "Wall time of the run (s)"), ("round_wall_mean_s", "Mean FL round wall time (s)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    width = 0.8 / max(1, len(modes))
    x = np.arange(len(ns))
    colors = {"local": "#999999", "plain": "#1f77b4", "he": "#d62728"}
    for ax, (key, title) in zip(axes, panels):
        for k, mode in enumerate(modes):
            vals = [by[(mode, n)][key] if (mode, n) in by and by[(mode, n)][key] is not None else np.nan for n in ns]
            bars = ax.bar(x + (k - (len(modes) - 1) / 2) * width, vals, width, label=MODE_LABEL[mode],
                          color=colors[mode])
            ax.bar_label(bars, fmt="%.2f" if "s" not in key[-2:] else "%.0f", fontsize=6)
        ax.set_xticks(x, [str(n) for n in ns])
        ax.set_xlabel("clients")
        ax.set_title(title, fontsize=9)
        if key.startswith("pooled"):
            ax.set_ylim(0, 1.05)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(modes), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def parent_main(args: argparse.Namespace) -> None:
    out = Path(args.out)
    run_dir = out / "covid_cnn_runs"
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t_all = time.perf_counter()
    settings = settings_of(args)
    runs: dict[tuple[str, int], dict] = {}
    for n in args.clients:
        for mode in args.modes:
            path = run_dir / f"{mode}-n{n}.json"
            if (args.resume or args.aggregate_only) and path.exists():
                old = json.loads(path.read_text())
                if old.get("settings") == json.loads(json.dumps(settings)):
                    runs[(mode, n)] = old
                    print(f"[{mode} n={n}] reusing {path.name}", flush=True)
                    continue
            if args.aggregate_only:
                continue
            for stale in run_dir.glob(f"{mode}-n{n}-*.npz"):
                stale.unlink()
            print(f"[{mode} n={n}] running ... (log: {run_dir / f'{mode}-n{n}.log'})", flush=True)
            t0 = time.perf_counter()
            with open(run_dir / f"{mode}-n{n}.log", "w") as log_fh:
                proc = subprocess.run(child_argv(args, mode, n), stdout=log_fh, stderr=subprocess.STDOUT)
            if proc.returncode != 0 or not path.exists():
                print(f"[{mode} n={n}] FAILED (exit {proc.returncode}); see the log", flush=True)
                continue
            runs[(mode, n)] = res = json.loads(path.read_text())
            m = res["metrics"]["pooled"]
            print(f"[{mode} n={n}] done in {time.perf_counter() - t0:.0f} s: acc {m['accuracy']:.3f} "
                  f"F1 {m['f1']:.3f}", flush=True)
    if not runs:
        sys.exit("no runs")
    rows = build_rows(runs)
    rat = ratios(rows)
    det = {n: determinism_check(run_dir, n, args.rounds) for n in args.clients
           if ("plain", n) in runs and ("he", n) in runs}
    meta = {
        "started": started,
        "runtime_min": (time.perf_counter() - t_all) / 60,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "command": " ".join([Path(sys.executable).name, "experiments/covid_cnn.py", *sys.argv[1:]]),
    }
    try:
        import flwr
        import tensorflow as tf

        meta["versions"] = {"flwr": flwr.__version__, "tensorflow": tf.__version__, "numpy": np.__version__}
    except ImportError:  # pragma: no cover
        pass
    with open(out / "covid_cnn.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "covid_cnn.json").write_text(json.dumps(_jsonable({
        "settings": settings, "meta": meta, "rows": rows, "he_vs_plain": rat, "determinism": det,
        "runs": {f"{m}-n{n}": r for (m, n), r in runs.items()},
    }), indent=1))
    md = markdown(rows, rat, det, settings, meta)
    (out / "covid_cnn.md").write_text(md)
    plot(rows, out / "covid_cnn.png")
    print()
    print(md)
    print(f"Wrote {out / 'covid_cnn.csv'}, .json, .md, .png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[2, 3, 5])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--task", choices=("covid-vs-normal", "pneumonia-vs-normal"), default="covid-vs-normal")
    ap.add_argument("--data-dir", default=str(DEFAULT_DATA))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--learning-rate", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--test-fraction", type=float, default=0.2)
    ap.add_argument("--xmk-parameter-set", default="xmk-n4096-q108")
    ap.add_argument("--xmk-max-abs-value", type=float, default=65536.0)
    ap.add_argument("--no-tracemalloc", dest="tracemalloc", action="store_false",
                    help="skip tracemalloc (faster; RSS is still measured)")
    ap.add_argument("--out", default=str(REPO / "experiments" / "results"))
    ap.add_argument("--resume", action="store_true", help="reuse finished runs with the same settings")
    ap.add_argument("--aggregate-only", action="store_true", help="only rebuild the tables from finished runs")
    ap.add_argument("--_run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._run:
        child_main(args)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()
