"""Checkpoint after every completed round, and resume (DESIGN.md §8): a library feature.

:func:`train_with_checkpoints` runs any strategy's ``start`` (``XMKFedAvg``,
``SecureAggregation``, Flower's own) and writes, after every completed training
round, under ``folder/checkpoint/``:

``model-round-<r>.npz``
    The global model after round ``r`` (every round's is kept unless
    ``keep="last"``): one array per entry of the ``ArrayRecord``, named
    ``"0"``, ``"1"``, ... in its order (``numpy.load`` reads it; no pickles).
``state.json``
    ``format`` (``"flwr-fedeval-checkpoint/1"``), ``round`` (the last completed
    round), ``num_rounds``, ``config_sha256`` (SHA-256 of the run config as
    sorted JSON, without ``resume-from`` and ``output-dir``), ``model_file``,
    ``model_sha256`` (of the ``.npz`` bytes), ``arrays`` (``key``, ``shape``,
    ``dtype`` per array), ``strategy`` (class, re-key policy, aborted attempts
    so far: round, step, nodes — never key material) and ``written_utc``.

Both are written atomically (temporary file in the same folder, ``fsync``,
``os.replace``): the model first, then ``state.json``, which names it; a crash
between the two leaves the previous, complete checkpoint. With ``keep="last"``
older model files are removed after the new ``state.json`` is in place.

A server-side ``evaluate_fn`` (Flower's, e.g. :meth:`FHEAUCPhase.evaluate_fn
<flwr_fedeval.strategies.base.EvaluationPhase.evaluate_fn>`) composes: it is
called after each round's checkpoint with the true round number, and its
metrics are in ``Result.evaluate_metrics_serverapp`` under that number.

A run with ``resume-from = '<run folder>'`` loads the checkpoint, checks it
against the run (config hash, array keys, shapes and dtypes against the
model the run builds, the model file's hash) and continues with round
``round + 1``; anything that does not match is refused with
:class:`CheckpointError`. No key material is saved: the xMK-CKKS strategy of
the resumed run generates new key sets (a partial decryption is never
repeated for a ciphertext).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

__all__ = ["CheckpointError", "Checkpoint", "KEEP_CHOICES", "config_hash", "load_checkpoint", "train_with_checkpoints",
           "write_checkpoint"]

FORMAT = "flwr-fedeval-checkpoint/1"
#: Run-config keys that may differ between a run and its resumption.
EXCLUDED_KEYS = ("resume-from", "output-dir")
CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.json"
#: ``keep`` of :func:`train_with_checkpoints`: every round's model, or the last one only.
KEEP_CHOICES = ("all", "last")


class CheckpointError(ValueError):
    """A checkpoint is missing, damaged, or does not belong to this run."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: the last completed ``round``, the global model after it, ``state.json``."""

    round: int
    arrays: ArrayRecord
    state: dict[str, Any]


def config_hash(run_config: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the run config as sorted JSON, without :data:`EXCLUDED_KEYS`."""
    kept = {str(k): v for k, v in run_config.items() if k not in EXCLUDED_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _array_specs(arrays: ArrayRecord) -> list[dict[str, Any]]:
    return [{"key": k, "shape": list(a.shape), "dtype": str(np.dtype(a.dtype))}
            for k, a in zip(arrays.keys(), arrays.to_numpy_ndarrays())]


def strategy_state(strategy: Any) -> dict[str, Any]:
    """What ``state.json`` keeps of the strategy: its class, re-key policy, aborted attempts and the
    IDs and members of the key sets used so far (public values; no key material)."""
    out: dict[str, Any] = {"class": type(strategy).__name__}
    protocol = getattr(strategy, "protocol", None)
    if protocol is not None:
        out["rekey"] = protocol.rekey
        out["key_material"] = "none saved: every resumed round generates a new key set"
    if hasattr(strategy, "aborted_attempts"):
        out["aborted_attempts"] = [{"round": r, "step": e.step, "nodes": sorted(int(n) for n in e.failed)}
                                   for r, e in strategy.aborted_attempts]
    if hasattr(strategy, "key_sets"):
        out["key_sets"] = [dict(k) for k in strategy.key_sets]
    if hasattr(strategy, "contributor_sets"):
        out["contributor_sets"] = [dict(k) for k in strategy.contributor_sets]
    return out


def write_checkpoint(folder: str | Path, server_round: int, arrays: ArrayRecord, *,
                     run_config: Mapping[str, Any], num_rounds: int,
                     strategy: dict[str, Any] | None = None, keep: str = "all") -> Path:
    """Write the checkpoint of ``server_round`` under ``folder/checkpoint/`` (atomically); with
    ``keep="last"`` the older model files are removed, with ``"all"`` every round's stays.

    Raises
    ------
    ValueError
        ``keep`` is not one of :data:`KEEP_CHOICES`.

    Returns
    -------
    Path
        The ``state.json`` written.
    """
    if keep not in KEEP_CHOICES:
        raise ValueError(f"keep must be one of {KEEP_CHOICES}, got {keep!r}")
    ck = Path(folder) / CHECKPOINT_DIR
    ck.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    by_key: dict[str, Any] = {str(i): a for i, a in enumerate(arrays.to_numpy_ndarrays())}
    np.savez(buf, **by_key)
    data = buf.getvalue()
    model_file = f"model-round-{server_round:04d}.npz"
    _atomic_write(ck / model_file, data)
    state = {
        "format": FORMAT,
        "round": int(server_round),
        "num_rounds": int(num_rounds),
        "config_sha256": config_hash(run_config),
        "model_file": model_file,
        "model_sha256": hashlib.sha256(data).hexdigest(),
        "arrays": _array_specs(arrays),
        "strategy": strategy or {},
        "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _atomic_write(ck / STATE_FILE, json.dumps(state, indent=2).encode())
    if keep == "last":
        for old in ck.glob("model-round-*.npz"):
            if old.name != model_file:
                old.unlink(missing_ok=True)
    return ck / STATE_FILE


def load_checkpoint(folder: str | Path, *, run_config: Mapping[str, Any], like: ArrayRecord) -> Checkpoint:
    """Load and check the checkpoint of a run folder (or of its ``checkpoint/`` folder).

    Parameters
    ----------
    folder : str or Path
        The ``resume-from`` folder.
    run_config : mapping
        This run's config (its hash must equal the checkpoint's).
    like : ArrayRecord
        The model this run builds: keys, shapes and dtypes must match.

    Raises
    ------
    CheckpointError
        No checkpoint, a damaged one (bad JSON, format, model hash), another
        run config, or a model of other keys, shapes or dtypes.
    """
    ck = Path(folder).expanduser()
    if (ck / CHECKPOINT_DIR / STATE_FILE).is_file():
        ck = ck / CHECKPOINT_DIR
    path = ck / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"resume-from '{folder}': no checkpoint ({CHECKPOINT_DIR}/{STATE_FILE}) found; "
                              "give the run folder of the interrupted run (the one holding results and checkpoint/)")
    try:
        state = json.loads(path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {state.get('format')!r}, expected {FORMAT!r}")
    want = config_hash(run_config)
    if state.get("config_sha256") != want:
        raise CheckpointError(
            f"{path}: the checkpoint belongs to another run config (hash {str(state.get('config_sha256'))[:12]}..., "
            f"this run {want[:12]}...); resume with exactly the interrupted run's config "
            f"(only {', '.join(EXCLUDED_KEYS)} may differ)")
    model = ck / str(state.get("model_file", ""))
    if not model.is_file():
        raise CheckpointError(f"{path}: model file {model.name!r} is missing")
    data = model.read_bytes()
    if hashlib.sha256(data).hexdigest() != state.get("model_sha256"):
        raise CheckpointError(f"{model}: SHA-256 does not match state.json (damaged or replaced)")
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        loaded = [npz[str(i)] for i in range(len(npz.files))]
    specs = state.get("arrays", [])
    got = [{"key": s.get("key"), "shape": list(a.shape), "dtype": str(a.dtype)} for s, a in zip(specs, loaded)]
    expected = _array_specs(like)
    if len(loaded) != len(specs) or got != specs:
        raise CheckpointError(f"{model}: arrays do not match state.json's shapes/dtypes")
    if got != expected:
        diff = next(f"{g} vs this run's {e}" for g, e in zip(got + [None] * len(expected), expected) if g != e) \
            if len(got) <= len(expected) else f"{len(got)} arrays vs this run's {len(expected)}"
        raise CheckpointError(f"{path}: the saved model does not match this run's model (key/shape/dtype: {diff})")
    rnd = state.get("round")
    if not isinstance(rnd, int) or rnd < 1:
        raise CheckpointError(f"{path}: round {rnd!r} is not a completed round >= 1")
    return Checkpoint(rnd, ArrayRecord({k: Array(a) for k, a in zip(like.keys(), loaded)}), state)


class _ResumedRounds:
    """A strategy seen by Flower's ``Strategy.start`` with its rounds shifted by ``offset``.

    ``start`` counts rounds from 1; after a resume from round ``offset`` the
    strategy (and the clients: ``server-round`` in the train config, ``round``
    in the xMK requests) see ``offset + 1, offset + 2, ...``.
    """

    def __init__(self, strategy: Strategy, offset: int) -> None:
        self._strategy = strategy
        self._offset = offset

    def __getattr__(self, name: str) -> Any:
        return getattr(self._strategy, name)

    def configure_train(self, server_round: int, *args: Any, **kwargs: Any) -> Any:
        return self._strategy.configure_train(server_round + self._offset, *args, **kwargs)

    def aggregate_train(self, server_round: int, *args: Any, **kwargs: Any) -> Any:
        return self._strategy.aggregate_train(server_round + self._offset, *args, **kwargs)

    def configure_evaluate(self, server_round: int, *args: Any, **kwargs: Any) -> Any:
        return self._strategy.configure_evaluate(server_round + self._offset, *args, **kwargs)

    def aggregate_evaluate(self, server_round: int, *args: Any, **kwargs: Any) -> Any:
        return self._strategy.aggregate_evaluate(server_round + self._offset, *args, **kwargs)


def train_with_checkpoints(strategy: Strategy, grid: Grid, initial_arrays: ArrayRecord, *, num_rounds: int,
                           run_config: Mapping[str, Any], folder: str | Path, resume_from: str | Path | None = None,
                           train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
                           evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
                           keep: str = "all", timeout: float = 3600) -> Result:
    """``strategy.start`` for ``num_rounds`` rounds, checkpointing after each completed round.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        Any strategy (``XMKFedAvg``, ``SecureAggregation``, Flower's); its ``start`` runs the rounds.
    grid : flwr.serverapp.Grid
    initial_arrays : ArrayRecord
        The initial model (with ``resume_from``: only its keys, shapes and dtypes are used).
    num_rounds : int
        Total rounds of the run (a resumed run runs the rest).
    run_config : mapping
        The run config; its hash (without ``resume-from`` and ``output-dir``) binds the checkpoint.
    folder : str or Path
        The run folder; the checkpoint goes to ``folder/checkpoint/``.
    resume_from : str or Path, optional
        A run folder whose checkpoint to continue after (:func:`load_checkpoint`).
    train_config, evaluate_config, timeout
        As Flower's ``Strategy.start``.
    evaluate_fn : callable, optional
        Flower's server-side ``evaluate_fn(server_round, arrays) -> MetricRecord | None``, called after
        each round's checkpoint is written, with the true round number (round 0, the initial model,
        only in a run that is not resumed); its metrics are in ``Result.evaluate_metrics_serverapp``.
    keep : {"all", "last"}, default="all"
        Keep every round's model file, or only the last one's.

    Returns
    -------
    flwr.serverapp.strategy.Result
        With the rounds run here under their true numbers.

    Raises
    ------
    CheckpointError
        From :func:`load_checkpoint`.
    ValueError
        ``keep`` is not one of :data:`KEEP_CHOICES`.
    """
    if keep not in KEEP_CHOICES:
        raise ValueError(f"keep must be one of {KEEP_CHOICES}, got {keep!r}")
    offset, arrays = 0, initial_arrays
    if resume_from:
        ck = load_checkpoint(resume_from, run_config=run_config, like=initial_arrays)
        offset, arrays = ck.round, ck.arrays
        log(INFO, "Resuming from %s: round %d of %d completed; continuing with round %d (new key sets)",
            resume_from, ck.round, num_rounds, ck.round + 1)

    def checkpoint(server_round: int, round_arrays: ArrayRecord) -> MetricRecord | None:
        if server_round > 0:
            path = write_checkpoint(folder, server_round + offset, round_arrays, run_config=run_config,
                                    num_rounds=num_rounds, strategy=strategy_state(strategy), keep=keep)
            log(INFO, "checkpoint: round %d written to %s", server_round + offset, path.parent)
        elif offset:  # the resumed checkpoint's model was evaluated in the interrupted run
            return None
        return None if evaluate_fn is None else evaluate_fn(server_round + offset, round_arrays)

    # Flower's start() logs the class name: the view carries the strategy's ("Starting XMKFedAvg strategy").
    view = type(type(strategy).__name__, (_ResumedRounds,), {})(strategy, offset)
    # the view is the strategy for everything but the round numbers (``__getattr__``): not a Strategy subclass,
    # so that ``start`` (the strategy's own, unbound) runs on it with the strategy's attributes and methods
    result = type(strategy).start(cast(Strategy, view), grid=grid, initial_arrays=arrays,
                                  num_rounds=max(0, num_rounds - offset), timeout=timeout,
                                  train_config=train_config, evaluate_config=evaluate_config,
                                  evaluate_fn=checkpoint)
    if result.arrays is None or len(result.arrays) == 0:  # no round run here changed the model
        result.arrays = arrays
    for name in ("train_metrics_clientapp", "evaluate_metrics_clientapp", "evaluate_metrics_serverapp"):
        hist = getattr(result, name)
        shifted = {r + offset: v for r, v in hist.items()}
        hist.clear()
        hist.update(shifted)
    return result
