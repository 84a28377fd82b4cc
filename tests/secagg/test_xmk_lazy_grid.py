"""A full XMKFedAvg round over LazyInProcessGrid: nodes run when pulled, at most k replies alive (issue 21, M = 100)."""

import numpy as np
import pytest
from flwr.app import Message, MetricRecord, RecordDict
from xmk_app import RUN_CONFIG, flat, initial, make_app, plain_fedavg, run

from flwr_fedeval.protocol import xmk
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import LazyInProcessGrid


@pytest.mark.parametrize("per_pull", [1, 2])
def test_round_completes_with_the_exact_mean_and_at_most_k_replies_alive(per_pull):
    m = 4
    grid = LazyInProcessGrid(make_app(), m, RUN_CONFIG, per_pull=per_pull)
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=m, min_available_nodes=m)
    result = run(grid, strategy)
    np.testing.assert_allclose(flat(result.arrays.to_numpy_ndarrays()), plain_fedavg(initial(), range(m), 1),
                               rtol=0, atol=1e-6)
    assert grid.max_replies_per_pull <= per_pull
    assert 1 <= grid.max_alive <= per_pull  # the server folds or strips each reply before the next pull
    assert grid.max_alive_by_type[xmk.TRAIN.message_type] <= per_pull
    assert all(grid.bytes_up[n] > 0 and grid.bytes_down[n] > 0 for n in grid.node_ids)


def test_alive_counts_replies_a_caller_keeps():
    """The count can fail: a caller that keeps every reply's content is seen keeping them."""
    def echo(msg, context):
        return Message(RecordDict({"metrics": MetricRecord({"node": context.node_config["partition-id"]})}),
                       reply_to=msg)

    grid = LazyInProcessGrid(echo, 3, per_pull=1)
    ids = list(grid.push_messages(
        [Message(RecordDict(), dst_node_id=n, message_type="query") for n in grid.node_ids]))
    kept = []
    while len(kept) < 3:
        got = list(grid.pull_messages(ids))
        assert len(got) == 1  # one node run per pull
        kept += got
    assert grid.max_alive == grid.alive == 3
    del kept, got
    assert grid.alive == 0


def test_nodes_run_only_when_pulled():
    grid = LazyInProcessGrid(make_app(), 2, RUN_CONFIG)
    ids = list(grid.push_messages(
        [Message(RecordDict(), dst_node_id=n, message_type=xmk.KEYGEN.message_type) for n in grid.node_ids]))
    assert grid.log == [] and set(grid.bytes_down.values()) == {0}
    assert len(list(grid.pull_messages(ids[:1]))) == 1
    assert [entry[0] for entry in grid.log] == grid.node_ids[:1]


def test_per_pull_must_be_positive():
    with pytest.raises(ValueError, match="per_pull"):
        LazyInProcessGrid(make_app(), 2, RUN_CONFIG, per_pull=0)
