"""xMK-CKKS FedAvg with a lost and a restarted SuperNode (issue 16.3): early detection and rejoin.

Over the serializing in-process grid with simulated time: Flower's heartbeat
(60 s) and our step timeout (600 s) cost no real time, and the recorded
``seconds_to_detect`` are the simulated seconds a deployment would see.
"""

import time

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from identities import ROSTER_PATH
from xmk_app import RUN_CONFIG, flat, initial, make_app, plain_fedavg, run

from flwr_fedeval.app.server_app import make_rejoin
from flwr_fedeval.app.task import JobConfig
from flwr_fedeval.clients.shapley_handlers import role_reply
from flwr_fedeval.identity import Roster
from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.protocol.xmk import QUERY_XMK_KEYGEN, QUERY_XMK_REVEAL, XMK_CONFIG_KEY
from flwr_fedeval.rlwe import keyset
from flwr_fedeval.strategies.base import FailureRecordingGrid
from flwr_fedeval.strategies.collect import POLL_INTERVAL
from flwr_fedeval.strategies.shapley_phase import discover_roles
from flwr_fedeval.strategies.xmk_fedavg import RoundAborted, XMKFedAvg
from flwr_fedeval.testing import InProcessGrid

STEP_TIMEOUT = 600.0
HEARTBEAT = 60.0


def _app():
    """The numpy xMK-CKKS ClientApp plus the signed role reply every node of the main App has."""
    app = make_app()

    @app.query("fedeval_role")
    def role(msg, context):
        cfg = context.node_config
        return role_reply(msg, "client", context, (int(cfg["partition-id"]), int(cfg["num-partitions"])))

    return app


def _grid_with_rejoin(inner):
    """As the main ServerApp wires it: roles and identities proven before round 1, then a Rejoin."""
    grid = FailureRecordingGrid(inner)
    roster, partitions, identities = Roster.load(ROSTER_PATH), {}, {}
    discover_roles(grid, roster=roster, strict=False, partitions=partitions, identities=identities)
    assert sorted(identities.values()) == [f"node-{i}" for i in range(len(inner.node_ids))]
    grid.rejoin = make_rejoin(JobConfig(), roster, partitions, identities)
    return grid, partitions


def _strategy(n):
    return XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=n, max_abs_value=1e4,
                     step_timeout=STEP_TIMEOUT)


def test_restarted_node_is_left_out_of_the_round_at_once_and_joins_the_next():
    """Node of partition 2 is killed during round-1 training (before its upload) and restarted 5 s later under
    a new node ID: its signed identity proves it is node-2, the old ID is given up then (not after the 60 s
    heartbeat) and left out of the signed contributor set; round 1 completes over the other three without a
    retry (issue 21: no client trains twice on one model), and the new ID takes part in round 2."""
    new = {}

    def fault(node, msg, reply):
        if node == victim and msg.metadata.message_type == "train" and not new:
            new["id"] = inner.restart(node, back_after=5.0, gone_after=HEARTBEAT)
        return reply

    inner = InProcessGrid(_app(), 4, RUN_CONFIG, fault=fault)
    victim = inner.node_ids[2]
    grid, partitions = _grid_with_rejoin(inner)
    strategy = _strategy(4)
    t0 = time.perf_counter()
    result = run(grid, strategy, rounds=2)
    assert time.perf_counter() - t0 < 60  # simulated waits

    assert result.train_metrics_clientapp[1]["num-clients"] == 3
    assert result.train_metrics_clientapp[2]["num-clients"] == 4
    (f,) = grid.failures
    assert (f.node, f.round, f.step, f.code) == (victim, 1, "train", ReplyCode.NODE_REJOINED)
    assert 5.0 <= f.seconds_to_detect <= 5.0 + POLL_INTERVAL
    assert f"back as node {new['id']}" in f.reason and "node-2" in f.reason
    assert partitions[new["id"]] == (2, 4)  # the harness's reference knows the restarted node's partition
    assert victim not in grid.get_node_ids() and new["id"] in grid.get_node_ids()
    assert not strategy.aborted_attempts
    assert [(rnd, set(failed)) for rnd, failed in strategy.left_out] == [(1, {victim})]
    assert new["id"] in strategy.key_sets[1]["nodes"]
    assert inner.now < HEARTBEAT  # the round never waited for the heartbeat of the old ID


def test_without_identities_the_old_id_is_given_up_at_the_heartbeat_after_its_upload():
    """No Rejoin (XMKFedAvg over a bare grid): a member restarted after its upload (at the contributor step)
    is given up when Flower drops its old ID from the node list (NODE_GONE, about 60 s, not the 600 s step
    timeout); the round completes over all three contributors, decrypted by the other two (t = 2)."""
    new = {}

    def fault(node, msg, reply):
        if node == victim and msg.metadata.message_type == "query.xmk_contributors" and not new:
            new["id"] = inner.restart(node, back_after=5.0, gone_after=HEARTBEAT)
        return reply

    inner = InProcessGrid(_app(), 3, RUN_CONFIG, fault=fault)
    victim = inner.node_ids[0]
    strategy = _strategy(3)
    result = run(inner, strategy)
    got = flat(result.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - plain_fedavg(initial(), [0, 1, 2], 1))) <= 1e-6
    assert not strategy.aborted_attempts
    (rnd, lost), = strategy.lost_after_upload
    assert rnd == 1 and f"code {int(ReplyCode.NODE_GONE)}" in lost[victim]
    assert "left the SuperLink's node list after 6" in lost[victim]
    assert HEARTBEAT <= inner.now < STEP_TIMEOUT / 5


def test_killed_node_is_recorded_as_gone_at_the_heartbeat_not_at_the_step_timeout():
    inner = InProcessGrid(_app(), 3, RUN_CONFIG)
    victim = inner.node_ids[1]
    inner.fault = lambda n, m, r: (inner.kill(n, gone_after=HEARTBEAT), r)[1] if (
        n == victim and m.metadata.message_type == "query.xmk_reveal") else r
    grid = FailureRecordingGrid(inner)
    result = run(grid, _strategy(3))
    got = flat(result.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - plain_fedavg(initial(), [0, 2], 1))) <= 1e-6
    (f,) = grid.failures
    assert (f.node, f.step, f.code) == (victim, "query.xmk_reveal", ReplyCode.NODE_GONE)
    assert HEARTBEAT <= f.seconds_to_detect <= HEARTBEAT + POLL_INTERVAL < STEP_TIMEOUT
    assert f.to_json()["code_name"] == "NODE_GONE"


def test_one_identity_under_two_node_ids_in_one_key_set_is_refused():
    """Two node IDs holding the same roster key (node-2): the honest server leaves both out of the key
    set; a deviating server that relays both commitments anyway is refused by every client."""
    configs = [{"partition-id": p, "num-partitions": 4} for p in (0, 1, 2, 2)]
    inner = InProcessGrid(_app(), 4, RUN_CONFIG, node_configs=configs)
    strategy = _strategy(4)
    from flwr.app import ArrayRecord

    from flwr_fedeval.strategies.xmk_fedavg import _RoundState

    strategy._round = _RoundState(1, ArrayRecord(initial()), ConfigRecord({"server-round": 1}), inner)
    with pytest.raises(RoundAborted) as info:
        strategy.commit(list(inner.node_ids))
    assert set(info.value.failed) == set(inner.node_ids[2:]) and "node-2" in info.value.failed[inner.node_ids[3]]

    # The deviating server: one key-set id, every commitment relayed, node-2 listed twice.
    from flwr_fedeval import rlwe

    seed = rlwe.new_public_seed()
    key_id = keyset.key_set_id(strategy.params, seed)
    request = ConfigRecord({"params": strategy.params.name, "seed-a": seed, "key-id": key_id, "round": 1})
    commits = []
    for node in inner.node_ids:
        msg = Message(RecordDict({XMK_CONFIG_KEY: request}), dst_node_id=node, message_type=QUERY_XMK_KEYGEN)
        (reply,) = inner.send_and_receive([msg])
        rec = reply.content[XMK_CONFIG_KEY]
        commits.append((rec["signer"], rec["commitment"], rec["signature"]))
    assert [c[0] for c in commits] == ["node-0", "node-1", "node-2", "node-2"]
    assert commits[2][1] != commits[3][1]  # two distinct, validly signed commitments of one identity
    reveal = ConfigRecord({"key-id": key_id, "round": 1, "signers": [c[0] for c in commits],
                           "commitments": [c[1] for c in commits], "signatures": [c[2] for c in commits],
                           "mask-degree": 0, "scale-bits": 20, "max-abs-value": 1e4, "threshold": 3,
                           "limbs": 4, "decryption-attempts": 2, "bulk": "ckks", "fractional-bits": 0})
    for node in inner.node_ids:
        msg = Message(RecordDict({XMK_CONFIG_KEY: reveal}), dst_node_id=node, message_type=QUERY_XMK_REVEAL)
        (reply,) = inner.send_and_receive([msg])
        assert reply.has_error() and "node-2" in reply.error.reason and "twice" in reply.error.reason
