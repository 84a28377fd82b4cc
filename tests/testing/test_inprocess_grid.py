"""flwr_fedeval.testing.InProcessGrid: the public serializing grid and its fault hooks."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp.strategy import FedAvg

from flwr_fedeval.testing import InProcessGrid


def _app(bad_record: bool = False):
    app = ClientApp()

    @app.train()
    def train(msg, context):
        arrays = msg.content["arrays"].to_numpy_ndarrays()
        pid = int(context.node_config["partition-id"])
        new = [a + pid for a in arrays]
        metrics = MetricRecord({"num-examples": 10 * (pid + 1)})
        content = RecordDict({"arrays": ArrayRecord(new), "metrics": metrics})
        if bad_record:
            content["config"] = ConfigRecord({"n": 2**64 + 1})  # valid in Python, not on the wire
        return Message(content, reply_to=msg)

    @app.query("boom")
    def boom(msg, context):
        raise ValueError("test split of 1 sample cannot hold both classes")

    return app


def _start(grid, rounds=1):
    return FedAvg(fraction_evaluate=0.0, min_available_nodes=len(grid.node_ids)).start(
        grid=grid, initial_arrays=ArrayRecord([np.zeros(3, dtype=np.float32)]), num_rounds=rounds)


def test_fedavg_over_the_grid_matches_the_weighted_mean():
    grid = InProcessGrid(_app(), 3)
    result = _start(grid)
    expected = np.average([0, 1, 2], weights=[10, 20, 30])
    np.testing.assert_allclose(result.arrays.to_numpy_ndarrays()[0], expected, rtol=1e-6)
    assert [t for _, t, ok in grid.log] == ["train"] * 3 and all(ok for _, _, ok in grid.log)
    assert all(grid.bytes_up[n] > 0 and grid.bytes_down[n] > 0 for n in grid.node_ids)


def test_node_ids_are_unsigned_64_bit_as_in_deployment():
    grid = InProcessGrid(_app(), 4)
    assert len(set(grid.node_ids)) == 4
    assert all(0 < n < 2**64 for n in grid.node_ids)
    assert any(n >= 2**63 for n in grid.node_ids)  # int64 arrays of node IDs would overflow


def test_reply_that_does_not_serialize_fails_in_the_grid():
    """Simulation would pass this reply on; the wire format (sint64/uint64) cannot hold it."""
    grid = InProcessGrid(_app(bad_record=True), 2)
    with pytest.raises(ValueError, match="out of range"):
        _start(grid)


def test_client_exception_becomes_an_error_reply_with_flower_code():
    grid = InProcessGrid(_app(), 2)
    msgs = [Message(RecordDict(), dst_node_id=n, message_type="query.boom") for n in grid.node_ids]
    replies = list(grid.send_and_receive(msgs))
    assert len(replies) == 2 and all(r.has_error() for r in replies)
    assert all(r.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION for r in replies)
    assert "ValueError: test split of 1 sample" in replies[0].error.reason


def test_fault_hook_drops_a_reply_like_a_timeout():
    grid = InProcessGrid(_app(), 3)
    victim = grid.node_ids[2]
    grid.fault = lambda node, msg, reply: None if node == victim else reply
    result = _start(grid)
    # the dropped node (weight 30, update +2) is left out of the mean
    np.testing.assert_allclose(result.arrays.to_numpy_ndarrays()[0], np.average([0, 1], weights=[10, 20]),
                               rtol=1e-6)
    assert (victim, "train", False) in grid.log
