"""KAHE bulk mode (the default) and CKKS bulk mode of XMKFedAvg over the serializing in-process grid.

The update travels under key-additive RLWE with a fresh key per round; only the key travels under
threshold xMK-CKKS (the key capsule). Both modes give weighted FedAvg of what the clients return.
"""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from identities import IDENTITY_DIR
from xmk_app import flat, initial, make_app, num_examples, plain_fedavg, run

from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod
from flwr_fedeval.protocol.xmk import XMK_CAPSULE_KEY, XMK_CIPHERTEXT_KEY
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid

RUN_CONFIG = {"fedeval-identity-dir": IDENTITY_DIR}


def _strategy(num_nodes, **kw):
    return XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=num_nodes, max_abs_value=1e4,
                     **kw)


@pytest.mark.parametrize("bulk", ["kahe", "ckks"])
def test_round_equals_plaintext_weighted_fedavg_in_both_modes(bulk):
    replies = []

    def spy(node, msg, reply):
        if msg.metadata.message_type == "train":
            replies.append(reply)
        return reply

    grid = InProcessGrid(make_app(), 5, RUN_CONFIG, fault=spy)
    strategy = _strategy(5, bulk=bulk)
    result = run(grid, strategy)
    assert not strategy.aborted_attempts
    got = flat(result.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - plain_fedavg(initial(), range(5), 1))) <= 1e-6
    assert result.train_metrics_clientapp[1]["num-examples"] == sum(num_examples(p) for p in range(5))
    assert len(replies) == 5
    for reply in replies:
        assert XMK_CIPHERTEXT_KEY in reply.content
        assert (XMK_CAPSULE_KEY in reply.content) == (bulk == "kahe")
        assert "num-examples" not in reply.content["metrics"]


def test_default_is_kahe():
    assert XMKFedAvg().protocol.bulk == "kahe"
    with pytest.raises(ValueError, match="bulk"):
        XMKFedAvg(bulk="plain")


def _counter_app(step):
    """Clients that add ``step`` to an int64 step counter and 0.5 to a float weight, every round."""
    app = ClientApp()
    register_xmkckks_handlers(app)

    @app.train(mods=[xmkckks_mod])
    def train(msg, context):
        weights, counter = msg.content["arrays"].to_numpy_ndarrays()
        new = [weights + np.float32(0.5), counter + np.int64(step)]
        metrics = MetricRecord({"num-examples": 3 + int(context.node_config["partition-id"])})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    return app


@pytest.mark.parametrize("bulk", ["kahe", "ckks"])
def test_integer_tensors_come_out_rounded_not_truncated(bulk):
    """A BatchNorm-like num_batches_tracked (int64) that every client advances by 3 per round is 9 after
    3 rounds (its mean has a rounding error of either sign; truncation gave 7 or 8)."""
    grid = InProcessGrid(_counter_app(3), 3, RUN_CONFIG)
    strategy = _strategy(3, bulk=bulk)
    initial_arrays = ArrayRecord([np.zeros(5, dtype=np.float32), np.zeros(1, dtype=np.int64)])
    result = strategy.start(grid=grid, initial_arrays=initial_arrays, num_rounds=3, train_config=ConfigRecord({}))
    assert not strategy.aborted_attempts
    weights, counter = result.arrays.to_numpy_ndarrays()
    assert counter.dtype == np.int64 and int(counter[0]) == 9
    assert np.allclose(weights, 1.5, atol=1e-6)


def test_clipped_values_are_counted_in_total_only():
    """Every |n_i·Δw| beyond the bound is clipped on the client; the server learns only the total."""
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    # n_i·Δw is up to (10 + 7p)·1: a bound of 5 clips a share of every client's values
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=3, max_abs_value=5.0)
    result = run(grid, strategy)
    assert not strategy.aborted_attempts
    # n_i travels in an integer slot: never clipped, exact (CKKS mode clips it with the values)
    assert result.train_metrics_clientapp[1]["num-examples"] == sum(num_examples(p) for p in range(3))
    from xmk_app import update

    expected = sum(int(np.count_nonzero(np.abs(num_examples(p) * flat(update(p, 1))) > 5.0)) for p in range(3))
    assert expected > 0
    assert strategy.clipped_values == [(1, expected)]


def test_a_0d_integer_tensor_survives_as_an_array():
    """PyTorch's BatchNorm ``num_batches_tracked`` is a 0-d int64 tensor: after a round it is still a 0-d
    int64 array (a numpy scalar cannot go into Flower's ``Array``), rounded."""
    from flwr_fedeval.weights import WeightLayout

    layout = WeightLayout.of([np.zeros(2, np.float32), np.zeros((), np.int64)])
    weights, counter = layout.unflatten(np.array([0.5, 1.5, 2.9999999]))
    assert isinstance(counter, np.ndarray) and counter.shape == () and counter.dtype == np.int64
    assert int(counter) == 3

    app = ClientApp()
    register_xmkckks_handlers(app)

    @app.train(mods=[xmkckks_mod])
    def train(msg, context):
        w, c = msg.content["arrays"].to_numpy_ndarrays()
        new = [w + np.float32(0.5), np.asarray(c + 3, dtype=np.int64)]
        metrics = MetricRecord({"num-examples": 3 + int(context.node_config["partition-id"])})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    strategy = _strategy(3)
    result = strategy.start(grid=InProcessGrid(app, 3, RUN_CONFIG), num_rounds=2, train_config=ConfigRecord({}),
                            initial_arrays=ArrayRecord([np.zeros(5, np.float32), np.zeros((), np.int64)]))
    assert not strategy.aborted_attempts
    _, counter = result.arrays.to_numpy_ndarrays()
    assert counter.shape == () and counter.dtype == np.int64 and int(counter) == 6
