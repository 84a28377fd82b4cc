"""xMK-CKKS FedAvg under faults (issue 16): the true reason of every failure, recorded per step."""

import numpy as np
from flwr.app import Error, Message
from flwr.common.constant import ErrorCode
from xmk_app import RUN_CONFIG, flat, initial, make_app, plain_fedavg, run

from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.strategies.base import FailureRecordingGrid, replies_by_node
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid


def _superlink_error(msg, reason):
    """An error reply as the SuperLink sends it for a lost node: its sender is the SuperLink (0), not the node."""
    reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason=reason), reply_to=msg)
    reply.metadata.__dict__["_src_node_id"] = 0
    return reply


def test_every_failure_keeps_its_true_reason_and_is_recorded_per_step():
    """Round 1 of 4 nodes: node 1 is reported offline by the SuperLink at key generation (Flower's code
    and reason kept, no timeout named), node 2's contributor-set reply never comes (our timeout) after its
    upload. The round is re-keyed once (before anyone trained) and completes over nodes 0, 2 and 3, exactly,
    decrypted by nodes 0 and 3 (t = 2 of 3): a loss after the upload costs no retry (issue 21)."""
    victims = {}

    def fault(node, msg, reply):
        kind = msg.metadata.message_type
        if node == victims["offline"] and kind == "query.xmk_keygen":
            return _superlink_error(msg, "Node 1 is offline (no heartbeat within 60 s)")
        if node == victims["silent"] and kind == "query.xmk_contributors":
            return None
        return reply

    inner = InProcessGrid(make_app(), 4, RUN_CONFIG, fault=fault)
    victims.update(offline=inner.node_ids[1], silent=inner.node_ids[2])
    grid = FailureRecordingGrid(inner)
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=4, max_abs_value=1e4,
                         step_timeout=30)
    result = run(grid, strategy)

    got = flat(result.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - plain_fedavg(initial(), [0, 2, 3], 1))) <= 1e-6

    # The strategy names Flower's reason for the offline node, our timeout only for the silent one.
    reasons = {n: r for _, exc in strategy.aborted_attempts for n, r in exc.failed.items()}
    reasons.update({n: r for _, lost in strategy.lost_after_upload for n, r in lost.items()})
    assert "offline" in reasons[victims["offline"]] and "timeout" not in reasons[victims["offline"]]
    assert f"code {ErrorCode.NODE_UNAVAILABLE}" in reasons[victims["offline"]]
    assert "timeout" in reasons[victims["silent"]]

    records = {(f.node, f.round, f.step): f for f in grid.failures}
    assert set(records) == {(victims["offline"], 1, "query.xmk_keygen"),
                            (victims["silent"], 1, "query.xmk_contributors")}
    offline = records[(victims["offline"], 1, "query.xmk_keygen")]
    assert offline.code == ErrorCode.NODE_UNAVAILABLE and "offline" in offline.summary
    assert offline.to_json()["code_name"] == "flwr:NODE_UNAVAILABLE"
    silent = records[(victims["silent"], 1, "query.xmk_contributors")]
    assert silent.code == ReplyCode.TIMEOUT and silent.reason == "no reply within our timeout of 30 s"
    assert all(f.seconds_to_detect is not None and f.seconds_to_detect >= 0 for f in grid.failures)


def test_clientapp_exception_is_recorded_with_flowers_code():
    def fault(node, msg, reply):
        if node == grid_nodes[0] and msg.metadata.message_type == "train":
            raise_in_app.append(node)
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="ValueError: bad split"),
                           reply_to=msg)
        return reply

    raise_in_app = []
    inner = InProcessGrid(make_app(), 3, RUN_CONFIG, fault=fault)
    grid_nodes = [inner.node_ids[0]]
    grid = FailureRecordingGrid(inner)
    run(grid, XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=3, max_abs_value=1e4))
    (f,) = grid.failures
    assert (f.node, f.round, f.step, f.code) == (grid_nodes[0], 1, "train", ErrorCode.CLIENT_APP_RAISED_EXCEPTION)
    assert f.summary == "ValueError: bad split"


def test_replies_are_matched_to_requests_by_message_id_not_sender():
    inner = InProcessGrid(make_app(), 2, RUN_CONFIG, fault=lambda n, m, r: _superlink_error(m, "gone"))
    msgs = [Message(content=__import__("flwr").app.RecordDict(), dst_node_id=n, message_type="query.xmk_keygen")
            for n in inner.node_ids]
    got = replies_by_node(msgs, inner.send_and_receive(msgs))
    assert set(got) == set(inner.node_ids)
    assert all(r.metadata.src_node_id == 0 and r.has_error() for r in got.values())
