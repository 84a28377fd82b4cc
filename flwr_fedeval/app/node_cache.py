"""What a node loads, kept for the life of its process (one run at a time).

Flower's simulation engine runs many messages, of many nodes, in one
long-lived process per worker; before this cache every message reloaded the
client's data, rebuilt its Keras model and rescored its test split (~3.9 s per
message, most of a 100-client FHE phase). The deployment engine starts a
process per message: there this cache is empty every time; what carries over
between a node's messages of a run is the labels and scores kept in
``context.state`` (:mod:`flwr_fedeval.clients.local_scores`).

Keys: the run id (a message of another run empties the whole cache), the
validated :class:`~flwr_fedeval.app.task.JobConfig` (frozen, so hashable),
the partition, and for scores a SHA-256 digest of the global model's weights
as received, so that new weights are never scored with old ones.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context

from flwr_fedeval.app.task import JobConfig, build_model, clear_data_cache, load_client_data
from flwr_fedeval.data.partition import ClientSplit

__all__ = ["NodeCache", "weights_digest"]


def weights_digest(arrays: ArrayRecord) -> bytes:
    """SHA-256 over every array's name, dtype, shape and bytes, in record order."""
    h = hashlib.sha256()
    for name, array in arrays.items():
        h.update(name.encode())
        h.update(str(array.dtype).encode())
        h.update(str(tuple(array.shape)).encode())
        h.update(array.data)
    return h.digest()


class _Model:
    """One compiled model plus its state right after construction (optimizer, RNG)."""

    def __init__(self, cfg: JobConfig) -> None:
        from flwr_fedeval.clients.keras_adapter import KerasModelAdapter

        self.adapter = KerasModelAdapter(build_model(cfg))
        model = self.adapter.model
        model.optimizer.build(model.trainable_variables)
        weights = {id(v) for v in model.weights}
        # Optimizer slots/iterations and the layers' seed-generator states: what a
        # freshly built model starts training from (the weights come with each message).
        self._initial = [(v, np.array(v.numpy())) for v in model.optimizer.variables]
        self._initial += [(v, np.array(v.numpy())) for v in model.variables if id(v) not in weights]
        self.loaded: bytes | None = None  # digest of the weights now in the model

    def load(self, arrays: ArrayRecord, digest: bytes) -> None:
        if digest != self.loaded:
            self.adapter.set_weights(arrays.to_numpy_ndarrays())
            self.loaded = digest

    def reset_training_state(self) -> None:
        for variable, value in self._initial:
            variable.assign(value)
        self.loaded = None  # training changes the weights


class NodeCache:
    """Per-process cache of configs, client splits, models and test scores.

    Parameters
    ----------
    max_scores : int, default=512
        Score vectors kept (oldest dropped first); one per (partition, weights).
    """

    def __init__(self, *, max_scores: int = 512) -> None:
        self.max_scores = max_scores
        self.run_id: int | None = None
        self._configs: dict[tuple[Any, ...], JobConfig] = {}
        self._splits: dict[tuple[Any, ...], ClientSplit] = {}
        self._models: dict[JobConfig, _Model] = {}
        self._scores: OrderedDict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        """Forget everything (also the pooled data and partitionings of :mod:`flwr_fedeval.app.task`)."""
        self._configs.clear()
        self._splits.clear()
        self._models.clear()
        self._scores.clear()
        clear_data_cache()

    def config(self, context: Context) -> JobConfig:
        """The validated config of ``context``'s run (a new run id empties the cache first).

        Raises
        ------
        ConfigError
            From :meth:`JobConfig.from_run_config`.
        """
        run_id = int(context.run_id)
        if run_id != self.run_id:
            self.clear()
            self.run_id = run_id
        key = tuple(sorted(context.run_config.items()))
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = self._configs[key] = JobConfig.from_run_config(dict(context.run_config))
        return cfg

    def split(self, cfg: JobConfig, partition_id: int, num_partitions: int) -> ClientSplit:
        """This client's train/test split (:func:`~flwr_fedeval.app.task.load_client_data`), loaded once."""
        key = (cfg, partition_id, num_partitions)
        split = self._splits.get(key)
        if split is None:
            self.misses += 1
            split = self._splits[key] = load_client_data(cfg, partition_id, num_partitions)
        else:
            self.hits += 1
        return split

    def model(self, cfg: JobConfig, arrays: ArrayRecord, *, for_training: bool = False) -> Any:
        """The :class:`KerasModelAdapter` of ``cfg`` holding ``arrays``, built once per process.

        ``for_training``: also restore the optimizer and random-generator
        state of a freshly built model, so no state leaks between messages.
        """
        entry = self._models.get(cfg)
        if entry is None:
            entry = self._models[cfg] = _Model(cfg)
        if for_training:
            entry.reset_training_state()
        entry.load(arrays, weights_digest(arrays))
        return entry.adapter

    def scores(self, cfg: JobConfig, partition_id: int, num_partitions: int, arrays: ArrayRecord,
               compute: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """``compute()`` once per (config, partition, global weights); copies are returned."""
        key = (cfg, partition_id, num_partitions, weights_digest(arrays))
        hit = self._scores.get(key)
        if hit is None:
            self.misses += 1
            hit = compute()
            self._scores[key] = hit
            while len(self._scores) > self.max_scores:
                self._scores.popitem(last=False)
        else:
            self.hits += 1
            self._scores.move_to_end(key)
        return hit[0].copy(), hit[1].copy()
