"""Tables 4/6 of Walskaar et al. 2023: local training vs plain FL vs HE (xMK-CKKS) FL.

The seed CNN (``build_seed_cnn``; 949,002 parameters at 128×128, 129,802 at
the 64×64 used here) on the chest X-rays of ``../shared/data/chest-xray``
(task ``covid-vs-normal`` = the paper's 124 COVID vs 500 normal;
``--task pneumonia-vs-normal`` is the cleaner alternative), for 2, 3, 5 and
10 clients, IID partitions, each client with its own train/test split.
Three modes, same seed, same total number of epochs:

* ``local``: every client trains alone on its own train split for
  ``rounds × local-epochs`` epochs and is scored on its own test split;
* ``plain``: Flower's ``FedAvg``;
* ``he``: ``XMKFedAvg`` (xMK-CKKS secure aggregation).

Every (mode, clients) cell is run for several seeds (``--seeds``, default
0 1 2); a seed fixes the partition, the train/test splits, the initial model
and the shuffles, so the tables report mean ± sample std over seeds (one run
of 2 clients differs from another by its training trajectory alone).

Training schedule (defaults; ``DEFAULT_SCHEDULE``): 64×64 px images,
10 rounds × 2 local epochs, batch 16, Adam lr 3e-4, IID partitions, no class
weights. Why: the earlier schedule (128 px, 4 rounds × 2 epochs, batch 32)
left a 5-client model ~8 optimizer steps per round on ~100 images, and
both FL models of 5 clients predicted the majority class (recall 0.04 and
0). More optimizer steps fix it: with batch 16 a client takes twice the
steps per epoch, and 10 rounds give the averaged model 20 epochs of the
clients' progress (which of the three changes matters most was not
isolated: each trial costs minutes of the shared cores). 64 px cuts the seed CNN's dense layer 9× (the
whole model 7.3×), so a round costs ~4× less CPU on the 2 shared cores and
the xMK-CKKS ciphertexts shrink by the same 7.3×; the architecture is the
paper's (three 5×5 conv blocks, Dense(200)), only the input is smaller.
Measured with one seed before the full table (plain FL, IID): 5 clients
acc 0.952 / recall 0.875 (majority-class rate 0.80), 10 clients acc 0.938 /
recall 0.962 at 64 px, 10 × 2 epochs, batch 16; 6 rounds × 1 epoch gave
0.912 / recall 0.54 at 5 clients. Class weighting is not needed at these
settings and would be a new ClientApp option, so it is not used.

Why lr 3e-4 and not Keras's 1e-3: at 1e-3 the final global model's test
accuracy swings by 3-5 points from round to round, and plain and HE FL,
whose global models differ by ~1e-7 (CKKS rounding) after round 1, drift
apart chaotically (max |HE − plain| per weight 1.1 after 10 rounds at 3
clients, seed 0): their final accuracies then differ by up to 5.6 points
(3 clients, seed 0: plain 0.905, HE 0.960) for reasons that have nothing to
do with the encryption. At 3e-4 the same run drifts 18× less (max |HE −
plain| 0.06), swings ≤ 2 points per round late in training, and reaches
plain 0.952 / HE 0.944 (last-3-rounds mean equal). The 1e-3 runs are not in the
repository: ``--learning-rate 1e-3`` reproduces them.

Both FL modes call ``strategy.start(...)`` (the strategy of the main job,
``make_strategy``) over the serializing in-process grid
(:class:`flwr_fedeval.testing.InProcessGrid`) with the main job's ClientApp;
only the strategy differs. Reported per run, and over seeds in the tables:

* accuracy, precision, recall, F1 of the positive class at threshold 0.5 and
  ROC AUC of the positive-class scores (scikit-learn) on the pooled client
  test splits (FL: final global model; local: every client's own model on
  its own split), the mean over clients, and the majority-class rate of the
  same test splits (the accuracy of a model that learnt nothing);
* wall and CPU time per run and per FL round (all clients run one after the
  other in this process), an estimate with clients in parallel (server time +
  the slowest client of every message batch), the HE/plain ratios, and the
  server-side time of each xMK-CKKS protocol step (``XMKFedAvg.timer``, the
  client calls made inside the step removed);
* memory: ``tracemalloc`` peaks (Python and numpy; TensorFlow's buffers are
  not seen; off with ``--no-tracemalloc``) of the largest ClientApp call and
  of the server code between client calls, and the process peak RSS
  (``resource``, includes TensorFlow);
* a determinism check: TF training is deterministic for a fixed seed, so
  plain and HE FL train identical round-1 client models; their round-1
  global models are compared with the exact float64 weighted mean.

Every (mode, clients, seed) run is a subprocess (clean TF state, its own peak
RSS) that writes ``<out>/covid_cnn_runs/<mode>-n<clients>-s<seed>.json`` and
a log; runs are done seed-major (every cell's first seed before any second
seed), ``--resume`` reuses the finished runs with the same settings, and
``--aggregate-only`` rebuilds the tables from the runs that exist, listing
the missing (clients, mode, seed) runs. The parent writes
``<out>/covid_cnn.{json,md,png}`` and, with ``--docs``, the section
``covid-cnn`` (``covid-cnn-pneumonia`` for the other task) of
``docs/results.md`` (:mod:`flwr_fedeval.reporting`).

Usage::

    python experiments/covid_cnn.py [--clients 2 3 5 10] [--seeds 0 1 2] [--rounds 10] [--local-epochs 2]
        [--image-size 64] [--batch-size 16] [--task covid-vs-normal] [--modes local plain he]
        [--no-tracemalloc] [--out DIR] [--resume] [--aggregate-only] [--docs]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from flwr_fedeval.reporting import machine_description, markdown_table, publish

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "chest-xray"
MODES = ("local", "plain", "he")
MODE_LABEL = {"local": "Local", "plain": "Plain FL", "he": "HE FL (xMK-CKKS)"}
METRIC_KEYS = ("accuracy", "precision", "recall", "f1", "auc")
MB = 2.0**20
#: The training schedule (see the module docstring for why).
DEFAULT_SCHEDULE = {"rounds": 10, "local_epochs": 2, "batch_size": 16, "learning_rate": 3e-4, "image_size": 64}


# --------------------------------------------------------------------------- metrics


def binary_metrics(y_true: np.ndarray, scores: np.ndarray) -> dict[str, float | None]:
    """Accuracy, precision, recall, F1 of class 1 at threshold 0.5 and ROC AUC of the scores (scikit-learn).

    ``y_true`` and ``scores`` have shape (n,); ``scores`` is the positive-class
    probability. ``auc`` is ``None`` when ``y_true`` holds one class only
    (undefined, not 0.5); ``majority_rate`` is the accuracy of always
    predicting the more frequent class of ``y_true``.
    """
    from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score, roc_auc_score

    y_true = np.asarray(y_true, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    pred = (scores >= 0.5).astype(np.int64)
    positives = int(y_true.sum())
    return {"accuracy": float(accuracy_score(y_true, pred)),
            "precision": float(precision_score(y_true, pred, zero_division=0)),
            "recall": float(recall_score(y_true, pred, zero_division=0)),
            "f1": float(f1_score(y_true, pred, zero_division=0)),
            "auc": float(roc_auc_score(y_true, scores)) if 0 < positives < y_true.size else None,
            "majority_rate": max(positives, y_true.size - positives) / y_true.size,
            "n": int(y_true.size), "positives": positives, "predicted_positive": int(pred.sum())}


def summarize(per_client: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """Pooled metrics over all (y, score) pairs and the mean of the per-client metrics."""
    clients = [binary_metrics(y, s) for y, s in per_client]
    pooled = binary_metrics(np.concatenate([y for y, _ in per_client]), np.concatenate([s for _, s in per_client]))
    return {"pooled": pooled, "per_client": clients,
            "mean_over_clients": {k: _mean([c[k] for c in clients]) for k in METRIC_KEYS}}


def _mean(values: list[float | None]) -> float | None:
    """Mean of the defined values (``None`` = undefined, e.g. the AUC of a one-class split); ``None`` if none."""
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None


# --------------------------------------------------------------------------- one run (child process)


class Meter:
    """Times and tracemalloc peaks of ClientApp calls and of the server code between them.

    Per FL round (between two ``evaluate_fn`` calls of the strategy): wall and
    CPU time, the client calls by message type, the slowest client of every
    message batch, and the strategy's own step timings (``timer.timings`` of
    :class:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg`) added in the round.
    """

    def __init__(self, trace: bool) -> None:
        self.trace = trace
        self.timer = None  # the strategy's StepTimer, if it has one (see ``watch``)
        self.client_wall_total = 0.0
        self.step_client_s: list[float] = []  # client seconds inside each entry of ``timer.timings``
        self.rounds: list[dict[str, Any]] = []
        self.cur: dict[str, Any] | None = None
        self.batch: list[float] | None = None
        self.server_peak = self.client_peak = 0
        if trace:
            tracemalloc.start()
        self._base = self._traced()[0]

    def _traced(self) -> tuple[int, int]:
        return tracemalloc.get_traced_memory() if self.trace else (0, 0)

    def _peak_since_reset(self) -> int:
        _, peak = self._traced()
        if self.trace:
            tracemalloc.reset_peak()
        return peak

    def client_call(self, fn, kind: str):
        """Run one client call; its time counts for the round, its memory for the client peak."""
        self.server_peak = max(self.server_peak, self._peak_since_reset() - self._base)
        start = self._traced()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return fn()
        finally:
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            self.client_wall_total += wall
            self.client_peak = max(self.client_peak, self._peak_since_reset() - start)
            if self.batch is not None:
                self.batch.append(wall)
            if self.cur is not None:
                self.cur["client_wall_s"] += wall
                self.cur["client_cpu_s"] += cpu
                calls = self.cur["client_calls"].setdefault(kind, {"n": 0, "wall_s": 0.0, "cpu_s": 0.0})
                calls["n"] += 1
                calls["wall_s"] += wall
                calls["cpu_s"] += cpu

    def watch(self, timer) -> None:
        """Time the client calls inside every step of the strategy's ``StepTimer`` (its server side = the rest)."""
        from contextlib import contextmanager

        self.timer, timed = timer, timer.step

        @contextmanager
        def step(name: str):
            before = self.client_wall_total
            try:
                with timed(name):
                    yield
            finally:
                self.step_client_s.append(self.client_wall_total - before)

        timer.step = step

    def round_boundary(self, last: bool) -> None:
        """End the current FL round (if any) and start the next one unless ``last``."""
        now, cpu = time.perf_counter(), time.process_time()
        timings = self.timer.timings if self.timer is not None else []
        if self.cur is not None:
            c = self.cur
            c["wall_s"], c["cpu_s"] = now - c.pop("t0"), cpu - c.pop("c0")
            c["parallel_est_s"] = c["wall_s"] - c["client_wall_s"] + sum(c.pop("batch_max"))
            c["round"] = len(self.rounds) + 1
            c["strategy_steps_s"], c["server_steps_s"] = {}, {}
            start = c.pop("timings_start")
            for (name, seconds), client_s in zip(timings[start:], self.step_client_s[start:]):
                c["strategy_steps_s"][name] = c["strategy_steps_s"].get(name, 0.0) + seconds
                c["server_steps_s"][name] = c["server_steps_s"].get(name, 0.0) + seconds - client_s
            self.rounds.append(c)
        self.cur = None if last else {"t0": now, "c0": cpu, "client_wall_s": 0.0, "client_cpu_s": 0.0,
                                      "batch_max": [], "client_calls": {}, "timings_start": len(timings)}

    def memory(self) -> dict[str, float | None]:
        self.server_peak = max(self.server_peak, self._peak_since_reset() - self._base)
        if self.trace:
            tracemalloc.stop()
        return {"server_py_mb": self.server_peak / MB if self.trace else None,
                "client_py_mb": self.client_peak / MB if self.trace else None,
                "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_tag(mode: str, num_clients: int, seed: int) -> str:
    """File stem of one run: ``<mode>-n<clients>-s<seed>``."""
    return f"{mode}-n{num_clients}-s{seed}"


def job_config(args: argparse.Namespace, num_clients: int, mode: str, seed: int):
    from flwr_fedeval.app.task import JobConfig

    cfg = JobConfig(num_server_rounds=args.rounds, local_epochs=args.local_epochs, batch_size=args.batch_size,
                    learning_rate=args.learning_rate, min_nodes=num_clients, seed=seed, dataset="chest-xray",
                    data_dir=str(Path(args.data_dir).resolve()), xray_task=args.task, image_size=args.image_size,
                    partitioning="iid", test_fraction=args.test_fraction,
                    secure_aggregation="xmkckks" if mode == "he" else "none",
                    xmk_parameter_set=args.xmk_parameter_set, xmk_max_abs_value=args.xmk_max_abs_value)
    cfg.validate()
    return cfg


def run_local(cfg, n: int, meter: Meter, progress) -> dict[str, Any]:
    from flwr_fedeval.app.task import build_model, load_client_data
    from flwr_fedeval.clients.keras_adapter import KerasModelAdapter

    def train(pid: int):
        data = load_client_data(cfg, pid, n)
        model = build_model(cfg)
        model.fit(data.x_train, data.y_train, epochs=cfg.num_server_rounds * cfg.local_epochs,
                  batch_size=cfg.batch_size, verbose=0)
        return data.y_test, KerasModelAdapter(model).predict_scores(data.x_test)

    per_client, times = [], []
    for pid in tqdm(range(n), desc=f"local n={n}", unit="client", **progress):
        t0, c0 = time.perf_counter(), time.process_time()
        per_client.append(meter.client_call(lambda pid=pid: train(pid), "local-train"))
        times.append({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0})
    return {"metrics": summarize(per_client), "wall_s": sum(t["wall_s"] for t in times),
            "cpu_s": sum(t["cpu_s"] for t in times), "parallel_est_s": max(t["wall_s"] for t in times),
            "clients": times}


def run_fl(cfg, n: int, mode: str, meter: Meter, run_dir: Path, progress) -> dict[str, Any]:
    from flwr.app import ArrayRecord, ConfigRecord

    from flwr_fedeval.app.client_app import app as client_app
    from flwr_fedeval.app.server_app import make_strategy
    from flwr_fedeval.app.task import build_model
    from flwr_fedeval.testing import InProcessGrid

    tag = run_tag(mode, n, cfg.seed)

    def measured_app(msg, context):
        return meter.client_call(lambda: client_app(msg, context), msg.metadata.message_type)

    class BatchGrid(InProcessGrid):
        """Marks each batch of messages (for the clients-in-parallel estimate)."""

        def push_messages(self, messages):
            meter.batch = []
            try:
                return super().push_messages(messages)
            finally:
                if meter.cur is not None and meter.batch:
                    meter.cur["batch_max"].append(max(meter.batch))
                meter.batch = None

    def keep_round1_client_models(node, msg, reply):
        # Plain run: the round-1 client models are the exact float64 reference of the determinism check.
        if mode == "plain" and msg.metadata.message_type == "train" and not meter.rounds and not reply.has_error():
            np.savez(run_dir / f"{tag}-r1-client{node}.npz", *reply.content["arrays"].to_numpy_ndarrays(),
                     num_examples=int(reply.content["metrics"]["num-examples"]))
        return reply

    bar = tqdm(total=cfg.num_server_rounds, desc=f"{mode} n={n}", unit="round", **progress)

    def snapshot(server_round: int, arrays):
        meter.round_boundary(last=server_round == cfg.num_server_rounds)
        np.savez(run_dir / f"{tag}-round{server_round}.npz", *arrays.to_numpy_ndarrays())
        bar.update(1 if server_round else 0)
        return None

    run_config = cfg.as_dict()
    if mode == "he":  # xMK-CKKS clients sign their key-set messages: keys and roster of the simulated nodes
        from flwr_fedeval.keys import create

        ids = run_dir / f"{tag}-identities"
        shutil.rmtree(ids, ignore_errors=True)
        create(ids, [f"node-{i}" for i in range(n)])
        run_config["identity-dir"] = str(ids)
    grid = BatchGrid(measured_app, n, run_config, fault=keep_round1_client_models)
    strategy = make_strategy(cfg)
    if getattr(strategy, "timer", None) is not None:
        meter.watch(strategy.timer)
    t0, c0 = time.perf_counter(), time.process_time()
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(build_model(cfg).get_weights()),
                            num_rounds=cfg.num_server_rounds,
                            train_config=ConfigRecord({"local-epochs": cfg.local_epochs}), evaluate_fn=snapshot)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    bar.close()
    return {"wall_s": wall, "cpu_s": cpu, "rounds": meter.rounds,
            "rounds_wall_s": sum(r["wall_s"] for r in meter.rounds),
            "parallel_est_s": sum(r["parallel_est_s"] for r in meter.rounds),
            "rounds_completed": sorted(int(k) for k in result.train_metrics_clientapp),
            "aborted_attempts": [{"round": r, "step": e.step, "failed": {str(k): v for k, v in e.failed.items()}}
                                 for r, e in getattr(strategy, "aborted_attempts", [])],
            "bytes_up": int(sum(grid.bytes_up.values())),
            "bytes_down": int(sum(grid.bytes_down.values()))}


def child_main(args: argparse.Namespace) -> None:
    mode, n, seed = args._run.split(":")
    n, seed = int(n), int(seed)
    tag = run_tag(mode, n, seed)
    run_dir = Path(args.out) / "covid_cnn_runs"
    progress = {"file": os.fdopen(os.dup(2), "w"), "position": 1, "leave": False}  # the terminal, not the log
    log = os.open(run_dir / f"{tag}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    from flwr_fedeval.app.task import build_model, load_client_data, load_pooled_data
    from flwr_fedeval.clients.keras_adapter import KerasModelAdapter

    cfg = job_config(args, n, mode, seed)
    load_pooled_data(cfg)  # decode the images once, before anything is measured
    splits = [load_client_data(cfg, i, n) for i in range(n)]
    build_model(cfg)  # import TF and build once (warm-up, not measured)
    load_start = os.getloadavg()
    meter = Meter(args.tracemalloc)
    t0 = time.perf_counter()
    if mode == "local":
        res = run_local(cfg, n, meter, progress)
    else:
        res = run_fl(cfg, n, mode, meter, run_dir, progress)
    total = time.perf_counter() - t0
    res["memory"] = meter.memory()
    if mode != "local":  # score the global model of every round (not timed)
        adapter = KerasModelAdapter(build_model(cfg))
        per_round = {}
        for r in range(cfg.num_server_rounds + 1):
            with np.load(run_dir / f"{tag}-round{r}.npz") as z:
                adapter.set_weights([z[f"arr_{i}"] for i in range(len(z.files))])
            per_round[r] = summarize([(s.y_test, adapter.predict_scores(s.x_test)) for s in splits])
        res["metrics"] = per_round[cfg.num_server_rounds]
        res["metrics_per_round"] = {r: {k: m[k] for k in ("pooled", "mean_over_clients")}
                                    for r, m in per_round.items()}
    res.update(mode=mode, num_clients=n, seed=seed, settings=settings_of(args), total_wall_s=total,
               split_sizes=[{"train": int(len(s.y_train)), "test": int(len(s.y_test)),
                             "test_positives": int(s.y_test.sum())} for s in splits],
               load_avg_start=load_start, load_avg_end=os.getloadavg())
    (run_dir / f"{tag}.json").write_text(json.dumps(res, indent=1, default=float))


# --------------------------------------------------------------------------- parent: runs and tables


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("task", "rounds", "local_epochs", "batch_size", "learning_rate", "image_size", "test_fraction",
            "xmk_parameter_set", "xmk_max_abs_value", "tracemalloc")
    return {k: getattr(args, k) for k in keys} | {"data_dir": str(Path(args.data_dir).resolve())}


def _flat(path: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    with np.load(path) as z:
        arrays = [z[f"arr_{i}"] for i in range(sum(k.startswith("arr_") for k in z.files))]
        return (np.concatenate([a.astype(np.float64).ravel() for a in arrays]),
                {k: z[k] for k in z.files if not k.startswith("arr_")})


def determinism_check(run_dir: Path, n: int, seed: int, rounds: int) -> dict[str, Any]:
    """max |HE − plain| of the global model per round; round 1 of both against the exact float64 mean."""
    plain, he = run_tag("plain", n, seed), run_tag("he", n, seed)
    out: dict[str, Any] = {"max_abs_diff_he_vs_plain": {
        r: float(np.max(np.abs(_flat(run_dir / f"{plain}-round{r}.npz")[0]
                               - _flat(run_dir / f"{he}-round{r}.npz")[0]))) for r in range(rounds + 1)}}
    refs = [_flat(p) for p in sorted(run_dir.glob(f"{plain}-r1-client*.npz"))]
    if len(refs) == n:
        weights = np.array([float(extra["num_examples"]) for _, extra in refs])
        exact = sum(w * v for w, (v, _) in zip(weights, refs)) / weights.sum()
        for name, tag in (("plain", plain), ("he", he)):
            out[f"round1_{name}_vs_exact64"] = float(np.max(np.abs(_flat(run_dir / f"{tag}-round1.npz")[0] - exact)))
        out["float32_rounding_of_exact64"] = float(np.max(np.abs(exact.astype(np.float32) - exact)))
    return out


#: Per-run numbers averaged over seeds (``metrics`` = pooled test metrics of the final model).
ROW_KEYS = (*(f"pooled_{k}" for k in METRIC_KEYS), "last3_accuracy", "last3_auc", "mean_accuracy", "mean_f1",
            "majority_rate", "wall_s", "cpu_s",
            "round_wall_s", "round_cpu_s", "round_parallel_s", "server_py_mb", "client_py_mb",
            "process_peak_rss_mb")


def run_row(r: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one run (one mode, client count and seed)."""
    rounds = r.get("rounds") or []
    pooled = r["metrics"]["pooled"]

    def mean(key: str) -> float | None:
        return float(np.mean([x[key] for x in rounds])) if rounds else None

    # FL: the global models of the last 3 rounds (the final model's accuracy swings by a few points round to round)
    last3 = [m["pooled"] for _, m in sorted(r.get("metrics_per_round", {}).items(), key=lambda kv: int(kv[0]))][-3:]

    return {"clients": r["num_clients"], "mode": r["mode"], "seed": r["seed"],
            **{f"pooled_{k}": pooled.get(k) for k in METRIC_KEYS},
            "last3_accuracy": _mean([m["accuracy"] for m in last3]), "last3_auc": _mean([m.get("auc") for m in last3]),
            "mean_accuracy": r["metrics"]["mean_over_clients"]["accuracy"],
            "mean_f1": r["metrics"]["mean_over_clients"]["f1"], "majority_rate": pooled["majority_rate"],
            "wall_s": r["rounds_wall_s"] if r["mode"] != "local" else r["wall_s"], "cpu_s": r["cpu_s"],
            "round_wall_s": mean("wall_s"), "round_cpu_s": mean("cpu_s"), "round_parallel_s": mean("parallel_est_s"),
            **r["memory"], "aborted_attempts": len(r.get("aborted_attempts", [])),
            "load_avg_1min": r["load_avg_start"][0]}


def mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof = 1) of the defined values; std ``None`` below 2 values."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return float(np.mean(vals)), (float(np.std(vals, ddof=1)) if len(vals) > 1 else None)


def build_rows(runs: dict[tuple[str, int, int], dict]) -> list[dict[str, Any]]:
    """One row per (clients, mode): every ``ROW_KEYS`` entry as ``(mean, std)`` over the seeds measured."""
    per_run = [run_row(r) for r in runs.values()]
    rows = []
    for n, mode in sorted({(x["clients"], x["mode"]) for x in per_run}, key=lambda k: (k[0], MODES.index(k[1]))):
        group = sorted((x for x in per_run if (x["clients"], x["mode"]) == (n, mode)), key=lambda x: x["seed"])
        rows.append({"clients": n, "mode": mode, "seeds": [x["seed"] for x in group],
                     "aborted_attempts": sum(x["aborted_attempts"] for x in group),
                     **{k: mean_std([x[k] for x in group]) for k in ROW_KEYS}})
    return rows


def he_vs_plain(runs: dict[tuple[str, int, int], dict]) -> dict[int, dict[str, Any]]:
    """Per client count, over the seeds with both an HE and a plain run: HE − plain (points) and HE / plain time."""
    out = {}
    for n in sorted({k[1] for k in runs}):
        seeds = sorted(s for (m, c, s) in runs if m == "he" and c == n and ("plain", n, s) in runs)
        if not seeds:
            continue
        pairs = [(run_row(runs[("plain", n, s)]), run_row(runs[("he", n, s)])) for s in seeds]

        def diff(key, pairs=pairs):
            return mean_std([100 * (h[key] - p[key]) if None not in (h[key], p[key]) else None for p, h in pairs])

        def ratio(key, pairs=pairs):
            return mean_std([h[key] / p[key] if p[key] else None for p, h in pairs])

        out[n] = {"seeds": seeds, "majority_rate": mean_std([p["majority_rate"] for p, _ in pairs]),
                  "plain_accuracy": mean_std([p["pooled_accuracy"] for p, _ in pairs]),
                  "he_accuracy": mean_std([h["pooled_accuracy"] for _, h in pairs]),
                  **{f"{k}_points": diff(f"pooled_{k}") for k in ("accuracy", "f1", "auc")},
                  "last3_accuracy_points": diff("last3_accuracy"),
                  **{f"{k}_ratio": ratio(f"round_{k}_s") for k in ("wall", "cpu", "parallel")}}
    return out


def fmt(v: Any, spec: str = ".3f") -> str:
    return "–" if v is None else format(v, spec)


def pm(v: tuple[float | None, float | None], spec: str = ".3f", unit: str = "") -> str:
    """``mean ± std`` (just the mean when there is one seed)."""
    mean, std = v
    if mean is None:
        return "–"
    return format(mean, spec) + unit + ("" if std is None else " ± " + format(std, spec.lstrip("+")) + unit)


def coverage(runs, clients, modes, seeds) -> list[list[Any]]:
    """Per client count and mode: the seeds measured and the seeds still missing."""
    return [[n, MODE_LABEL[m], " ".join(str(s) for s in seeds if (m, n, s) in runs) or "none",
             " ".join(str(s) for s in seeds if (m, n, s) not in runs) or "none"] for n in clients for m in modes]


def markdown(rows, rat, det, he_steps, settings, cov) -> str:
    s = settings
    missing = sum(row[3] != "none" for row in cov)
    lines = [
        f"Task `{s['task']}`, seed CNN at {s['image_size']}×{s['image_size']} px, {s['rounds']} rounds × "
        f"{s['local_epochs']} local epochs (local: {s['rounds'] * s['local_epochs']} epochs alone), batch "
        f"{s['batch_size']}, Adam lr {s['learning_rate']}, IID partitions, test fraction {s['test_fraction']} per "
        f"client; HE: `{s['xmk_parameter_set']}`, max |n·Δw| {s['xmk_max_abs_value']:g}. Every cell is the mean ± "
        "sample std over the seeds measured (column 'seeds'); a seed fixes the partition, the train/test splits, "
        "the initial model and the shuffles. acc…AUC: positive class, threshold 0.5 (AUC: of the scores), pooled "
        "client test splits (FL: final global model; local: each client's own model on its own split); "
        "'acc/client': mean over clients. All clients run one after the other in one process on the shared "
        "cores; 'round s': mean FL round (train + federated evaluate). Memory: 'py MB' = tracemalloc peak "
        "(Python/numpy, TensorFlow not seen) of the server code between client calls and of the largest "
        "ClientApp call; 'peak RSS' = the whole run process (TensorFlow, all clients' data)."
        + ("" if s["tracemalloc"] else " These runs had tracemalloc off (`--no-tracemalloc`: times without its "
           "overhead), so only the peak RSS is measured."),
        "",
        ("**Every requested run is measured.**" if not missing else
         f"**Partial table: {missing} of {len(cov)} (clients, mode) cells still miss seeds** (listed below); "
         "the numbers shown are over the seeds measured only."),
        "",
        markdown_table(["clients", "mode", "seeds measured", "seeds missing"], cov, align="rlll"),
        "",
        markdown_table(
            ["clients", "mode", "seeds", "acc", "prec", "rec", "F1", "AUC", "acc/client", "round s", "round CPU s",
             "server py MB", "client py MB", "peak RSS MB"],
            [[r["clients"], MODE_LABEL[r["mode"]], " ".join(map(str, r["seeds"])),
              *(pm(r[f"pooled_{k}"]) for k in METRIC_KEYS), pm(r["mean_accuracy"]), pm(r["round_wall_s"], ".1f"),
              pm(r["round_cpu_s"], ".1f"), pm(r["server_py_mb"], ".0f"), pm(r["client_py_mb"], ".0f"),
              pm(r["process_peak_rss_mb"], ".0f")] for r in rows], align="rll" + "r" * 11),
    ]
    if rat:
        lines += ["", "HE vs plain FL over the seeds with both runs (Δ = HE − plain, points; time ratios HE / plain, "
                  "'parallel' = server time + the slowest client of every batch, estimated); 'majority' = accuracy "
                  "of always predicting the majority class on the same pooled test splits; 'Δ acc, last 3' = "
                  "the difference of the test accuracy averaged over the global models of the last 3 rounds:", "",
                  markdown_table(
                      ["clients", "seeds", "majority", "plain acc", "HE acc", "Δ acc", "Δ acc, last 3", "Δ F1",
                       "Δ AUC", "round wall ×", "round CPU ×", "parallel ×"],
                      [[n, " ".join(map(str, q["seeds"])), pm(q["majority_rate"]), pm(q["plain_accuracy"]),
                        pm(q["he_accuracy"]), pm(q["accuracy_points"], "+.2f"),
                        pm(q["last3_accuracy_points"], "+.2f"), pm(q["f1_points"], "+.2f"),
                        pm(q["auc_points"], "+.2f"), pm(q["wall_ratio"], ".2f"), pm(q["cpu_ratio"], ".2f"),
                        pm(q["parallel_ratio"], ".2f")] for n, q in rat.items()], align="rlrrrrrrrrrr")]
    if he_steps:
        lines += ["", "xMK-CKKS steps per round, wall s, mean over rounds and seeds: server side of each protocol "
                  "step (`XMKFedAvg.timer`, the client calls inside it removed) and one client's calls:", "",
                  markdown_table(["clients", *(f"server: {step}" for step in he_steps["steps"]),
                                  "client: train (incl. encryption)", "client: partial decryption"],
                                 [[n, *(fmt(v, ".2f") for v in vals)] for n, vals in he_steps["rows"].items()],
                                 align="r" * (3 + len(he_steps["steps"])))]
    if det:
        lines += ["", "Determinism (max |difference| per weight of the global models; exact64 = float64 weighted "
                  "mean of the plain run's round-1 client models, which the HE run trains identically):", "",
                  markdown_table(["clients", "seed", "round 1: plain − exact64", "round 1: HE − exact64",
                                  "exact64 rounded to float32", "final round: HE − plain"],
                                 [[n, seed, fmt(d.get("round1_plain_vs_exact64"), ".1e"),
                                   fmt(d.get("round1_he_vs_exact64"), ".1e"),
                                   fmt(d.get("float32_rounding_of_exact64"), ".1e"),
                                   fmt(list(d["max_abs_diff_he_vs_plain"].values())[-1], ".1e")]
                                  for (n, seed), d in det.items()], align="rrrrrr")]
    return "\n".join(lines) + "\n"


def he_step_means(runs: dict[tuple[str, int, int], dict]) -> dict[str, Any]:
    """Mean seconds per round of every xMK-CKKS step (server side) and of one client's calls, per client count."""
    steps: list[str] = []
    for r in runs.values():
        for x in r.get("rounds") or []:
            steps += [name for name in x.get("server_steps_s", {}) if name not in steps]
    rows = {}
    for n in sorted({n for (mode, n, _) in runs if mode == "he"}):
        rounds = [rd for (mode, c, _), r in runs.items() if mode == "he" and c == n for rd in r.get("rounds") or []]

        def mean(get, rounds=rounds):
            return _mean([get(x) for x in rounds])

        def per_call(kind):
            return lambda x: (x["client_calls"][kind]["wall_s"] / x["client_calls"][kind]["n"]
                              if kind in x["client_calls"] else None)

        rows[n] = [*(mean(lambda x, step=step: x.get("server_steps_s", {}).get(step)) for step in steps),
                   mean(per_call("train")), mean(per_call("query.xmk_pdec"))]
    return {"steps": steps, "rows": rows}


def plot(rows, rat, task: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({r["clients"] for r in rows})
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    by = {(r["mode"], r["clients"]): r for r in rows}
    positive = task.split("-vs-")[0]
    panels = [("pooled_accuracy", "accuracy (pooled test)"), ("pooled_f1", f"F1, {positive} (pooled test)"),
              ("pooled_auc", "ROC AUC (pooled test)"), ("round_cpu_s", "mean FL round CPU time (s)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.2))
    width = 0.8 / len(modes)
    colors = {"local": "#999999", "plain": "#1f77b4", "he": "#d62728"}
    for ax, (key, title) in zip(axes, panels):
        for k, mode in enumerate(modes):
            cells = [by[(mode, n)][key] if (mode, n) in by else (None, None) for n in ns]
            vals = [np.nan if m is None else m for m, _ in cells]
            errs = [0.0 if s is None else s for _, s in cells]
            ax.bar(np.arange(len(ns)) + (k - (len(modes) - 1) / 2) * width, vals, width, yerr=errs, capsize=2,
                   label=MODE_LABEL[mode], color=colors[mode])
        if key == "pooled_accuracy":
            for i, n in enumerate(ns):
                if n in rat and rat[n]["majority_rate"][0] is not None:
                    ax.hlines(rat[n]["majority_rate"][0], i - 0.45, i + 0.45, colors="k", linestyles=":",
                              label="majority class" if i == 0 else None)
        ax.set_xticks(np.arange(len(ns)), [str(n) for n in ns])
        ax.set_xlabel("clients")
        ax.set_title(title, fontsize=9)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


def load_runs(run_dir: Path, settings: dict[str, Any], clients, modes, seeds) -> dict[tuple[str, int, int], dict]:
    """The finished runs of the requested grid whose settings equal ``settings`` (others are ignored)."""
    runs = {}
    for seed in seeds:
        for n in clients:
            for mode in modes:
                path = run_dir / f"{run_tag(mode, n, seed)}.json"
                if path.exists() and (r := json.loads(path.read_text())).get("settings") == settings:
                    runs[(mode, n, seed)] = r
    return runs


def regenerate_command(argv: list[str]) -> str:
    """The command line that (re)generates the published section: this one, resuming, without --aggregate-only."""
    import shlex

    args = [a for a in argv if a not in ("--aggregate-only", "--resume")]
    return shlex.join(["python", "experiments/covid_cnn.py", *args, "--resume"])


def parent_main(args: argparse.Namespace, argv: list[str]) -> None:
    out = Path(args.out)
    run_dir = out / "covid_cnn_runs"
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = json.loads(json.dumps(settings_of(args)))
    runs = load_runs(run_dir, settings, args.clients, args.modes, args.seeds) \
        if (args.resume or args.aggregate_only) else {}
    for mode, n, seed in runs:
        print(f"[{run_tag(mode, n, seed)}] reusing {run_tag(mode, n, seed)}.json")
    # seed-major: the first seed of every (clients, mode) is measured before the second seed of any
    todo = [] if args.aggregate_only else [(m, n, s) for s in args.seeds for n in args.clients for m in args.modes
                                          if (m, n, s) not in runs]
    clash = [run_tag(*k) for k in todo if (p := run_dir / f"{run_tag(*k)}.json").exists()
             and json.loads(p.read_text()).get("settings") != settings]
    if clash:  # never overwrite measured runs of other settings (another task, schedule or data folder)
        sys.exit(f"{run_dir} holds runs with other settings ({', '.join(clash[:3])}...): use another --out")
    for mode, n, seed in tqdm(todo, desc="covid_cnn", unit="run", position=0):
        tag = run_tag(mode, n, seed)
        for stale in run_dir.glob(f"{tag}-*.npz"):
            stale.unlink()
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, "--_run", f"{mode}:{n}:{seed}"])
        path = run_dir / f"{tag}.json"
        if proc.returncode != 0 or not path.exists():
            tqdm.write(f"[{tag}] FAILED (exit {proc.returncode}); see {run_dir / f'{tag}.log'}")
            continue
        runs[(mode, n, seed)] = json.loads(path.read_text())
        m = runs[(mode, n, seed)]["metrics"]["pooled"]
        tqdm.write(f"[{tag}] acc {m['accuracy']:.3f} F1 {m['f1']:.3f} AUC {fmt(m['auc'])}")
    if not runs:
        sys.exit("no runs")
    rows = build_rows(runs)
    rat = he_vs_plain(runs)
    det = {(n, s): determinism_check(run_dir, n, s, args.rounds) for (m, n, s) in sorted(runs)
           if m == "he" and ("plain", n, s) in runs}
    he_steps = he_step_means(runs)
    cov = coverage(runs, args.clients, args.modes, args.seeds)
    (out / "covid_cnn.json").write_text(json.dumps(
        {"settings": settings, "seeds": args.seeds, "machine": machine_description(), "rows": rows,
         "he_vs_plain": rat, "he_server_steps": he_steps, "coverage": cov,
         "determinism": {f"{n}-s{s}": d for (n, s), d in det.items()},
         "runs": {run_tag(m, n, s): r for (m, n, s), r in runs.items()}}, indent=1, default=float))
    md = markdown(rows, rat, det, he_steps, settings, cov)
    (out / "covid_cnn.md").write_text(md)
    fig = plot(rows, rat, args.task)
    fig.savefig(out / "covid_cnn.png", dpi=100)
    print(md)
    print(f"wrote {out / 'covid_cnn.json'}, .md, .png")
    if args.docs:
        title = (f"COVID CNN ({args.task}): local vs plain FL vs HE FL (experiments/covid_cnn.py; "
                 "Walskaar et al. 2023, Tables 4/6)")
        name = "covid-cnn" if args.task == "covid-vs-normal" else "covid-cnn-pneumonia"
        path = publish(name, title, md, docs_dir=args.docs, figures={"": fig}, command=regenerate_command(argv))
        print(f"published {path}")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[2, 3, 5, 10])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                    help="one run per (mode, clients, seed); the tables report mean ± std over the seeds")
    ap.add_argument("--task", choices=("covid-vs-normal", "pneumonia-vs-normal"), default="covid-vs-normal")
    ap.add_argument("--data-dir", default=str(DEFAULT_DATA))
    ap.add_argument("--rounds", type=int, default=DEFAULT_SCHEDULE["rounds"])
    ap.add_argument("--local-epochs", type=int, default=DEFAULT_SCHEDULE["local_epochs"])
    ap.add_argument("--batch-size", type=int, default=DEFAULT_SCHEDULE["batch_size"])
    ap.add_argument("--learning-rate", type=float, default=DEFAULT_SCHEDULE["learning_rate"])
    ap.add_argument("--image-size", type=int, default=DEFAULT_SCHEDULE["image_size"])
    ap.add_argument("--test-fraction", type=float, default=0.2)
    ap.add_argument("--xmk-parameter-set", default="xmk-n4096-q108")
    ap.add_argument("--xmk-max-abs-value", type=float, default=65536.0)
    ap.add_argument("--no-tracemalloc", dest="tracemalloc", action="store_false",
                    help="skip tracemalloc (faster; the peak RSS is still measured)")
    ap.add_argument("--out", default=str(REPO / "experiments" / "results"))
    ap.add_argument("--resume", action="store_true", help="reuse finished runs with the same settings")
    ap.add_argument("--aggregate-only", action="store_true",
                    help="only rebuild the tables from the finished runs; the missing ones are listed as missing")
    ap.add_argument("--docs", nargs="?", const=str(REPO / "docs"),
                    help="also publish the tables and the figure in DOCS/results.md")
    ap.add_argument("--_run", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds) or len(set(args.clients)) != len(args.clients):
        ap.error("--seeds and --clients must not repeat a value")
    if min(args.clients) < 2:
        ap.error("--clients: FL needs at least 2 clients")
    if args._run:
        child_main(args)
    else:
        parent_main(args, argv)


if __name__ == "__main__":
    main()
