"""Fail fast and say why (issue 23 item 4), over the serializing in-process grid with the real handlers.

A configuration refusal (``NOT_CONFIGURED``: no identity, a run config looser than the node's policy)
stops the run at the step that met it, with :class:`NodeNotConfigured` naming the keys to set; no
other attempt and no later round is sent. And no step of a round waits a whole poll interval when
the replies are there at once (the adaptive poll of :mod:`flwr_fedeval.strategies.collect`).
"""

from __future__ import annotations

import time

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from identities import IDENTITY_DIR
from xmk_app import make_app, run

from flwr_fedeval.protocol import NotConfigured, ReplyCode, config_keys_of, error_reply
from flwr_fedeval.strategies import XMKFedAvg
from flwr_fedeval.strategies.base import NodeNotConfigured, ReadableFedAvg
from flwr_fedeval.strategies.collect import MIN_POLL_INTERVAL, POLL_INTERVAL
from flwr_fedeval.testing import InProcessGrid

RUN_CONFIG = {"fedeval-identity-dir": IDENTITY_DIR}


def _strategy(num_nodes: int) -> XMKFedAvg:
    return XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=num_nodes, min_available_nodes=num_nodes,
                     max_abs_value=1e4)


def test_not_configured_reason_carries_its_keys():
    exc = NotConfigured("no key", keys=("node config fedeval-identity-key", "run config fedeval-identity-dir"))
    assert exc.code == ReplyCode.NOT_CONFIGURED
    assert config_keys_of(f"IdentityNotConfigured: {exc}") == exc.keys
    assert config_keys_of("ValueError: something else [nodes 1, 2]") == ()
    with pytest.raises(ValueError, match="keys"):
        NotConfigured("no key", keys=())


def test_a_node_without_identity_stops_the_run_in_round_1_naming_the_key():
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    lost = grid.node_ids[1]
    grid.contexts[lost].run_config["fedeval-identity-dir"] = ""  # this node has no identity at all
    with pytest.raises(NodeNotConfigured) as info:
        run(grid, _strategy(3), rounds=3)
    err = info.value
    assert list(err.failures) == [lost]
    assert err.failures[lost].code == int(ReplyCode.NOT_CONFIGURED)
    assert "run config fedeval-identity-dir" in err.keys and "node config fedeval-identity-key" in err.keys
    # one key-generation request per node, then nothing: no retry, no training, no round 2
    sent = [mtype for _, mtype, _ in grid.log]
    assert sent and set(sent) == {"query.xmk_keygen"} and len(sent) == 3


def test_a_run_config_looser_than_the_node_policy_stops_the_dp_phase():
    from flwr_fedeval.app.client_app import app as client_app
    from flwr_fedeval.strategies import DPAUCLaplacePhase

    grid = InProcessGrid(client_app, 3, {"identity-dir": IDENTITY_DIR, "dp-epsilon": 8.0})  # the demo's name
    arrays = _demo_model()
    with pytest.raises(NodeNotConfigured) as info:
        DPAUCLaplacePhase(3, epsilon=8.0).run(grid, arrays)
    assert sorted(info.value.failures) == sorted(grid.node_ids)
    assert "node config fedeval-dp-epsilon" in info.value.keys
    assert "run config fedeval-dp-epsilon" in info.value.keys


def _demo_model() -> ArrayRecord:
    from flwr_fedeval.app.task import JobConfig, build_model

    return ArrayRecord(build_model(JobConfig()).get_weights())


def test_flower_loop_stops_at_a_configuration_refusal_of_a_train_reply():
    """A ClientApp of the user's (Flower's train loop, ReadableFedAvg) that refuses for its configuration."""
    app = ClientApp()

    @app.train()
    def train(msg, context):
        if int(context.node_config["partition-id"]) == 0:
            return error_reply(msg, NotConfigured("no data path", keys=("node config data-path",)), "train")
        metrics = MetricRecord({"num-examples": 5})
        return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": metrics}), reply_to=msg)

    grid = InProcessGrid(app, 2)
    strategy = ReadableFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=2)
    with pytest.raises(NodeNotConfigured) as info:
        strategy.start(grid=grid, initial_arrays=ArrayRecord(_demo_model_small()), num_rounds=3,
                       train_config=ConfigRecord({}))
    assert info.value.keys == ("node config data-path",)
    assert [m for _, m, _ in grid.log] == ["train"] * 2  # round 1 only


def _demo_model_small():
    import numpy as np

    return [np.zeros((2, 2), np.float32)]


class _CountingGrid(InProcessGrid):
    """The in-process grid whose replies come ``delay`` simulated seconds after each push, with every
    poll wait recorded (its time is simulated: nothing really sleeps)."""

    def __init__(self, *args, delay: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay, self.ready_at, self.sleeps = delay, 0.0, []

    def push_messages(self, messages):
        self.ready_at = self.now + self.delay
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        return super().pull_messages(message_ids) if self.now >= self.ready_at else []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(float(seconds))
        super().sleep(seconds)


def test_a_round_waits_no_whole_poll_interval_for_fast_replies(monkeypatch):
    """Replies 50 ms after each push: every step of an xMK-CKKS round polls after tens of
    milliseconds and backs off; no wait is a whole :data:`POLL_INTERVAL` (a fixed 1 s poll fails this)."""
    real: list[float] = []
    monkeypatch.setattr(time, "sleep", lambda s: real.append(s))  # a real sleep anywhere would be counted
    delay = 0.05
    grid = _CountingGrid(make_app(), 3, RUN_CONFIG, delay=delay)
    result = run(grid, _strategy(3), rounds=1)
    assert len(result.arrays) > 0 and any(m == "train" for _, m, _ in grid.log)
    assert grid.sleeps and min(grid.sleeps) == pytest.approx(MIN_POLL_INTERVAL)
    assert max(grid.sleeps) < 2 * delay < POLL_INTERVAL, grid.sleeps
    assert real == []
