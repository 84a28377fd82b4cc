"""strategies.collect: a lost node is given up when the SuperLink drops it, not at our step timeout (issue 16.3).

The in-process grid's time is simulated (``grid.clock``/``grid.sleep``): a 60 s
heartbeat and a 600 s step timeout take no real time.
"""

import time

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.strategies.base import FailureRecordingGrid, replies_by_node
from flwr_fedeval.strategies.collect import POLL_INTERVAL, FoldingGrid, Rejoin, collect, send_and_collect
from flwr_fedeval.testing import InProcessGrid

STEP_TIMEOUT = 600.0
HEARTBEAT = 60.0  # Flower: patience 2 x the SuperNode's 30 s heartbeat interval


def _app():
    app = ClientApp()

    @app.query("ping")
    def ping(msg, context):
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({"pong": ConfigRecord({"partition-id": pid})}), reply_to=msg)

    return app


def _ping(grid, nodes=None):
    return [Message(RecordDict({"q": ConfigRecord({"round": 3})}), dst_node_id=n, message_type="query.ping")
            for n in (grid.get_node_ids() if nodes is None else nodes)]


def _by_partition(grid, nodes):
    """A Rejoin ``prove`` by partition id (the identity before a roster exists)."""
    got = replies_by_node(msgs := _ping(grid, nodes), grid.send_and_receive(msgs))
    return {n: r.content["pong"]["partition-id"] for n, r in got.items() if not r.has_error()}


def _killer(grid, victim, **kw):
    """Fault hook: ``victim`` is killed (kill -9) while it works on its message."""
    def fault(node, msg, reply):
        if node == victim:
            grid.kill(node, **kw)
        return reply
    return fault


def test_node_that_leaves_the_node_list_is_given_up_at_once_not_at_the_step_timeout():
    grid = InProcessGrid(_app(), 3)
    victim = grid.node_ids[1]
    grid.fault = _killer(grid, victim, gone_after=HEARTBEAT)
    rec = FailureRecordingGrid(grid)
    t0 = time.perf_counter()
    got = rec.collect_replies(_ping(grid), timeout=STEP_TIMEOUT)
    assert time.perf_counter() - t0 < 5  # simulated time: no real waiting

    assert not got.timed_out
    assert HEARTBEAT <= got.seconds[victim] <= HEARTBEAT + POLL_INTERVAL  # detection ≤ heartbeat + one poll
    assert got.elapsed < STEP_TIMEOUT / 5
    (f,) = rec.failures
    assert (f.node, f.step, f.round, f.code) == (victim, "query.ping", 3, ReplyCode.NODE_GONE)
    assert f.summary.startswith("node left the SuperLink's node list after 6") and "timeout" not in f.reason
    assert f.to_json()["code_name"] == "NODE_GONE" and f.seconds_to_detect == got.seconds[victim]
    ok = [r for r in got.replies if not r.has_error()]
    assert sorted(r.metadata.src_node_id for r in ok) == sorted(n for n in grid.node_ids if n != victim)
    assert victim not in grid.get_node_ids()


def test_flowers_own_node_unavailable_reply_is_kept_when_the_superlink_sends_it():
    grid = InProcessGrid(_app(), 2)
    victim = grid.node_ids[0]
    grid.fault = _killer(grid, victim, gone_after=HEARTBEAT, superlink_error=True)
    rec = FailureRecordingGrid(grid)
    got = rec.collect_replies(_ping(grid), timeout=STEP_TIMEOUT)
    (f,) = rec.failures
    assert f.node == victim and f.code == ErrorCode.NODE_UNAVAILABLE and "heartbeat" in f.summary
    assert HEARTBEAT <= got.seconds[victim] <= HEARTBEAT + POLL_INTERVAL


def test_our_timeout_is_named_only_when_it_fired():
    grid = InProcessGrid(_app(), 2, fault=lambda n, m, r: None if n == victim else r)
    victim = grid.node_ids[1]  # alive and listed, but silent
    rec = FailureRecordingGrid(grid)
    got = rec.collect_replies(_ping(grid), timeout=STEP_TIMEOUT)
    assert got.timed_out == [victim] and got.seconds[victim] == pytest.approx(STEP_TIMEOUT)
    (f,) = rec.failures
    assert f.code == ReplyCode.TIMEOUT and f.reason == "no reply within our timeout of 600 s"
    assert f.seconds_to_detect == pytest.approx(STEP_TIMEOUT)


def test_restarted_node_is_taken_back_without_waiting_for_its_old_id():
    """kill -9 and restart 5 s later: the new node ID proves the old one's identity within a poll, the
    old ID is given up then (not after the 60 s heartbeat) and hidden from the node list."""
    grid = InProcessGrid(_app(), 3)
    victim, new = grid.node_ids[2], {}

    def fault(node, msg, reply):
        if node == victim and not new:
            new["id"] = grid.restart(node, back_after=5.0, gone_after=HEARTBEAT)
        return reply

    grid.fault = fault
    rec = FailureRecordingGrid(grid, rejoin=Rejoin(_by_partition, {n: i for i, n in enumerate(grid.node_ids)}))
    got = rec.collect_replies(_ping(grid), timeout=STEP_TIMEOUT)
    assert got.replaced == {victim: new["id"]}
    assert 5.0 <= got.seconds[victim] <= 5.0 + POLL_INTERVAL
    (f,) = rec.failures
    assert f.code == ReplyCode.NODE_REJOINED and f"back as node {new['id']}" in f.reason
    assert victim in grid.get_node_ids()  # Flower still lists the old ID (heartbeat not expired) ...
    assert sorted(rec.get_node_ids()) == sorted([*grid.node_ids[:2], new["id"]])  # ... we do not
    again = replies_by_node(msgs := _ping(rec), rec.send_and_receive(msgs, timeout=STEP_TIMEOUT))
    assert sorted(again) == sorted(rec.get_node_ids()) and not any(r.has_error() for r in again.values())
    assert again[new["id"]].content["pong"]["partition-id"] == 2


def test_without_a_proven_identity_the_new_id_does_not_replace_the_old_one():
    """Node IDs prove nothing: a newcomer that proves no identity (or another one) replaces no node;
    the old ID is given up only when it leaves the node list."""
    grid = InProcessGrid(_app(), 2)
    victim = grid.node_ids[0]
    grid.fault = lambda n, m, r: (grid.restart(n, back_after=1.0, gone_after=HEARTBEAT), r)[1] if (
        n == victim and len(grid.node_ids) == 2) else r
    rec = FailureRecordingGrid(grid, rejoin=Rejoin(lambda g, nodes: dict.fromkeys(nodes, "someone else"),
                                                   {n: i for i, n in enumerate(grid.node_ids)}))
    got = rec.collect_replies(_ping(grid), timeout=STEP_TIMEOUT)
    assert not got.replaced and got.seconds[victim] >= HEARTBEAT
    assert [f.code for f in rec.failures] == [ReplyCode.NODE_GONE]


def test_one_identity_counts_for_one_node_id():
    """Two node IDs proving one identity: the later proof replaces the earlier ID, never both kept."""
    seen = []

    def prove(grid, nodes):
        seen.extend(nodes)
        return dict.fromkeys(nodes, "node-1")

    rejoin = Rejoin(prove, {10: "node-1", 11: "node-2"}, ignore=[14])
    rejoin.learn(None, [10, 11, 12, 14])  # 14: refused before, never asked
    assert seen == [12] and rejoin.replaced == {10: 12}
    rejoin.learn(None, [10, 11, 12, 13])
    assert seen == [12, 13] and rejoin.replaced == {10: 12, 12: 13}
    rejoin.learn(None, [12, 13])  # nobody is asked twice
    assert seen == [12, 13]


def test_collect_over_a_plain_grid_and_a_message_the_superlink_did_not_accept():
    class Refusing(InProcessGrid):
        def push_messages(self, messages):
            ids = list(super().push_messages(messages))
            return [None, *ids[1:]]

    grid = Refusing(_app(), 2)
    msgs = _ping(grid)
    got = collect(grid, msgs, timeout=STEP_TIMEOUT)
    first = replies_by_node(msgs, got.replies)[msgs[0].metadata.dst_node_id]
    assert first.error.code == ReplyCode.NOT_DELIVERED and got.elapsed < STEP_TIMEOUT
    with pytest.raises(ValueError, match="poll_interval"):
        send_and_collect(grid, msgs, timeout=1.0, poll_interval=0)


def test_kill_and_restart_refuse_an_unknown_node():
    grid = InProcessGrid(_app(), 2)
    with pytest.raises(ValueError, match="unknown node"):
        grid.kill(12345)
    with pytest.raises(ValueError, match="unknown node"):
        grid.restart(12345)


class _SlowGrid:
    """Replies become available ``delay`` simulated seconds after the push (the in-process grid's
    replies are there at once); records the simulated time of every poll."""

    def __init__(self, inner, delay):
        self.inner, self.delay, self.now, self.polls = inner, delay, 0.0, []
        self._held = {}

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds

    def get_node_ids(self):
        return self.inner.get_node_ids()

    def push_messages(self, messages):
        return self.inner.push_messages(messages)

    def pull_messages(self, ids):
        self.polls.append(self.now)
        return list(self.inner.pull_messages(ids)) if self.now >= self.delay else []


@pytest.mark.parametrize("delay", [0.05, 0.3, 4.0])
def test_the_poll_adapts_a_fast_step_is_not_held_for_a_whole_interval(delay):
    from flwr_fedeval.strategies.collect import MIN_POLL_INTERVAL, POLL_BACKOFF

    grid = _SlowGrid(InProcessGrid(_app(), 3, {}), delay)
    got = send_and_collect(grid, _ping(grid), timeout=STEP_TIMEOUT)
    assert len(got.replies) == 3 and not got.timed_out
    # collected within one (backed-off) wait of the moment the replies were there, never a fixed 1 s later
    # (the waits so far sum to about 2x the last one: the overshoot is below half the delay + the first wait)
    assert delay <= got.elapsed <= delay + min(POLL_INTERVAL, delay * (POLL_BACKOFF - 1) + MIN_POLL_INTERVAL) + 1e-9
    waits = [b - a for a, b in zip(grid.polls, grid.polls[1:])]
    assert waits[0] == pytest.approx(MIN_POLL_INTERVAL) and max(waits) <= POLL_INTERVAL + 1e-12
    assert all(b >= a - 1e-12 for a, b in zip(waits, waits[1:]))  # backing off, never faster


def test_folding_grid_passes_every_reply_of_every_exchange_to_its_callback_then_to_the_exchange_own():
    """Flower's loop (``send_and_receive``) and a phase's exchange (``collect`` with ``on_reply``) over a
    FoldingGrid both run its callback once per reply; what the callback keeps is what the exchange's own
    ``on_reply`` sees and what the result holds."""
    grid = InProcessGrid(_app(), 3)
    folded, then = [], []

    def fold(reply):
        folded.append(int(reply.metadata.src_node_id))
        reply.content = RecordDict()  # kept without its content, as the train fold keeps a reply
        return reply

    def on_reply(reply):
        then.append((int(reply.metadata.src_node_id), len(reply.content)))
        return reply

    view = FoldingGrid(FailureRecordingGrid(grid), fold)
    replies = list(view.send_and_receive(_ping(grid), timeout=STEP_TIMEOUT))
    assert sorted(folded) == sorted(grid.node_ids) and all(len(r.content) == 0 for r in replies)
    folded.clear()
    got = collect(view, _ping(grid), timeout=STEP_TIMEOUT, on_reply=on_reply)
    assert sorted(folded) == sorted(grid.node_ids)
    assert sorted(then) == sorted((n, 0) for n in grid.node_ids)  # after the fold, on what it kept
    assert len(got.replies) == 3 and all(len(r.content) == 0 for r in got.replies)
