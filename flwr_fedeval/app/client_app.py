"""The main job's ClientApp: local training, local evaluation, threshold counts.

Every handler gets what it needs from ``context``; per-node secrets live in
``context.state``. What a node *loads* (config, data split, model, test
scores of a global model) is kept in a per-process :class:`NodeCache`, keyed
by run id, config, partition and a digest of the weights: the simulation
engine reuses a process for many messages, the deployment engine starts a
fresh one per message (where the cache is simply empty). Across processes,
``evaluate`` leaves the test scores of its model in ``context.state`` for the
AUC phases of that model (:mod:`flwr_fedeval.clients.local_scores`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fedeval.app.harness import positive_scores
from flwr_fedeval.app.node_cache import NodeCache
from flwr_fedeval.app.task import JobConfig, library_run_config
from flwr_fedeval.clients import fhe_handlers
from flwr_fedeval.clients.auc_handlers import register_auc_handlers, register_dp_handlers
from flwr_fedeval.clients.local_scores import remember_test_scores
from flwr_fedeval.clients.shapley_handlers import register_shapley_handlers, shapley_record_mod
from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod
from flwr_fedeval.data.partition import ClientSplit
from flwr_fedeval.protocol import ARRAYS_KEY, CONFIG_KEY, METRICS_KEY, array_record, config_field

if TYPE_CHECKING:
    from flwr_fedeval.clients.keras_adapter import KerasModelAdapter

#: The next handler (or mod) of a Flower mod.
CallNext = Callable[[Message, Context], Message]


def library_names_mod(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Hand every handler the run config with the library's ``fedeval-`` names of this App's short
    keys (:func:`~flwr_fedeval.app.task.library_run_config`); the node's state is the same object."""
    return call_next(msg, dataclasses.replace(context, run_config=library_run_config(dict(context.run_config))))


app = ClientApp(mods=[library_names_mod])
#: This process's loaded data, models and scores (see :mod:`flwr_fedeval.app.node_cache`).
CACHE = NodeCache()
register_xmkckks_handlers(app)  # query.xmk_keygen, query.xmk_reveal, query.xmk_pdec (secure aggregation)


def _aux_partition(context: Context) -> int:
    return int(context.run_config.get("shapley-aux-partition-id", -1))


def node_role(context: Context) -> str:
    """``"shapley-aux"`` for the auxiliary server of the Shapley phase, else ``"client"``.

    The node config's ``fedeval-role`` decides (deployment: ``flower-supernode
    --node-config 'fedeval-role="shapley-aux"'``); in simulation, where nodes
    only get a partition id, run config ``shapley-aux-partition-id`` names it.
    """
    if "fedeval-role" in context.node_config:
        return str(context.node_config["fedeval-role"])
    aux = _aux_partition(context)
    if aux >= 0 and int(context.node_config.get("partition-id", -1)) == aux:
        return "shapley-aux"
    return "client"


def _partition(context: Context) -> tuple[int, int]:
    """This data client's ``(partition id, number of data partitions)``.

    With ``shapley-aux-partition-id`` set, that simulation node holds no data
    and the others are renumbered ``0..num-partitions-2``.
    """
    if node_role(context) != "client":
        raise ValueError(f"this node is the auxiliary server of the Shapley phase ({node_role(context)!r}): "
                         "it holds no data and does not train or evaluate")
    try:
        pid, num = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as exc:
        raise ValueError(
            "node config must define 'partition-id' and 'num-partitions' "
            "(simulation sets them; on a SuperNode pass --node-config "
            "\"partition-id=0 num-partitions=3\")"
        ) from exc
    aux = _aux_partition(context)
    if 0 <= aux < num and "fedeval-role" not in context.node_config:
        return (pid - 1 if pid > aux else pid), num - 1
    return pid, num


def _setup(msg: Message, context: Context, *,
           for_training: bool = False) -> tuple[JobConfig, ClientSplit, KerasModelAdapter]:
    cfg = CACHE.config(context)
    pid, num = _partition(context)
    data = CACHE.split(cfg, pid, num)
    adapter: KerasModelAdapter = CACHE.model(cfg, array_record(msg.content, ARRAYS_KEY), for_training=for_training)
    return cfg, data, adapter


def _shapley_mod(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Keep the local models (:func:`shapley_record_mod`) only in runs with ``shapley != "none"``."""
    if CACHE.config(context).shapley == "none":
        return call_next(msg, context)
    return shapley_record_mod(msg, context, call_next)


@app.train(mods=[xmkckks_mod, _shapley_mod])
def train(msg: Message, context: Context) -> Message:
    """Train the received global model on the local train split."""
    cfg, data, adapter = _setup(msg, context, for_training=True)
    config = msg.content.config_records.get(CONFIG_KEY, ConfigRecord())
    epochs = config_field(config, CONFIG_KEY, "local-epochs", int) if "local-epochs" in config else cfg.local_epochs
    import keras

    keras.utils.set_random_seed(cfg.seed)  # the same shuffles whatever this process ran before
    history = adapter.model.fit(
        data.x_train, data.y_train, epochs=epochs, batch_size=cfg.batch_size, verbose=0
    )
    metrics = MetricRecord(
        {
            "train-loss": float(history.history["loss"][-1]),
            "train-acc": float(history.history["accuracy"][-1]),
            "num-examples": int(len(data.y_train)),
        }
    )
    reply = RecordDict({ARRAYS_KEY: ArrayRecord(adapter.get_weights()), METRICS_KEY: metrics})
    return Message(content=reply, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on the local test split.

    Also keeps the split's scores under this model for the run (an AUC phase of the same model
    then loads neither data nor model: :mod:`flwr_fedeval.clients.local_scores`)."""
    cfg, data, adapter = _setup(msg, context)
    loss, acc = adapter.model.evaluate(data.x_test, data.y_test, verbose=0)
    remember_test_scores(msg, context, data.y_test, positive_scores(cfg, adapter, data.x_test))
    metrics = MetricRecord(
        {"eval-loss": float(loss), "eval-acc": float(acc), "num-examples": int(len(data.y_test))}
    )
    return Message(content=RecordDict({METRICS_KEY: metrics}), reply_to=msg)


def local_test_scores(msg: Message, context: Context) -> tuple[np.ndarray, np.ndarray]:
    """Labels and positive-class scores of this client's test split under the
    global model in ``msg`` (every evaluation phase starts from these).

    Returns
    -------
    y_true : ndarray of shape (n_test,), dtype int64
    y_score : ndarray of shape (n_test,), dtype float64, in [0, 1]
        Computed once per process for each (partition, global weights); with
        logit-spaced decision points, from the pre-softmax logit margin
        (:func:`flwr_fedeval.app.harness.positive_scores`).
    """
    cfg = CACHE.config(context)
    pid, num = _partition(context)

    def compute() -> tuple[np.ndarray, np.ndarray]:
        cfg_, data, adapter = _setup(msg, context)
        return data.y_test, positive_scores(cfg_, adapter, data.x_test)

    return CACHE.scores(cfg, pid, num, array_record(msg.content, ARRAYS_KEY), compute)


def local_test_labels(context: Context) -> np.ndarray:
    """Labels of this client's test split (no model needed), int64 of shape (n_test,)."""
    pid, num = _partition(context)
    return CACHE.split(CACHE.config(context), pid, num).y_test


# --- plaintext AUC and DP AUC baselines (flwr_fedeval.clients.auc_handlers, dp_handlers) ---
register_auc_handlers(app, test_scores=local_test_scores)  # evaluate.threshold_counts
# evaluate.dpauc_laplace, evaluate.dpauc_rr, evaluate.fedauc_scores, evaluate.fedauc_stats; diffprivlib is
# imported on the first DP request only (~2 s per process)
register_dp_handlers(app, test_scores=local_test_scores, test_labels=local_test_labels)


# --- FHE AUC (flwr_fedeval.clients.fhe_handlers; DESIGN.md §4) ---------------
fhe_handlers.register_fhe_handlers(app, test_scores=local_test_scores, test_labels=local_test_labels)


# --- secure Shapley values (flwr_fedeval.clients.shapley_handlers) -----------
def _shapley_test_set(context: Context) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of this client's test split (shared with the two servers)."""
    pid, num = _partition(context)
    data = CACHE.split(CACHE.config(context), pid, num)
    return data.x_test.reshape(len(data.y_test), -1), data.y_test


register_shapley_handlers(app, test_set=_shapley_test_set, role=node_role,
                          partition=lambda c: _partition(c) if node_role(c) == "client" else None)
