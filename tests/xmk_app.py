"""The numpy-only xMK-CKKS ClientApp and plaintext references shared by tests/secagg.

Clients of partition p add a fixed pseudo-random update (test data, not key
material) to the global weights and report ``10 + 7p`` examples.
"""

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from identities import IDENTITY_DIR

from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod

RUN_CONFIG = {"fedeval-identity-dir": IDENTITY_DIR}
SHAPES = [(30, 20), (20,), (20, 7), (7,)]  # 1,047 weights: one n=4096 polynomial


def update(partition_id, round_):
    rng = np.random.default_rng(1000 * partition_id + round_)
    return [rng.uniform(-1, 1, s).astype(np.float32) for s in SHAPES]


def num_examples(partition_id):
    return 10 + 7 * partition_id


def make_app():
    app = ClientApp()
    register_xmkckks_handlers(app)

    @app.train(mods=[xmkckks_mod])
    def train(msg, context):
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        w = msg.content["arrays"].to_numpy_ndarrays()
        new = [a + d for a, d in zip(w, update(pid, rnd))]
        metrics = MetricRecord({"train-loss": float(pid), "num-examples": num_examples(pid)})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    return app


def initial():
    rng = np.random.default_rng(7)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def plain_fedavg(weights, partitions, round_):
    """Plaintext weighted FedAvg of the weights the clients actually return."""
    n = np.array([num_examples(p) for p in partitions], dtype=np.float64)
    client_weights = [flat([w + d for w, d in zip(weights, update(p, round_))]) for p in partitions]
    return np.sum([ni * w for ni, w in zip(n, client_weights)], axis=0) / n.sum()


def flat(arrays):
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def run(grid, strategy, rounds=1):
    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(initial()),
        num_rounds=rounds,
        train_config=ConfigRecord({}),
    )
