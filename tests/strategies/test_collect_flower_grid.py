"""send_and_collect over Flower's own in-memory Grid and SuperLink link state (real heartbeat bookkeeping).

The link state is the one the SuperLink uses: a node whose heartbeat expired
leaves ``get_node_ids()`` and its pending messages get Flower's
``NODE_UNAVAILABLE`` reply. With a 1 s heartbeat interval (patience 2:
offline after 2 s) the step gives the silent node up before its timeout, not
at it. How soon Flower expires a node is Flower's timing: the test asserts only
that the node was given up before our timeout and with which code. Runs on both
ends of the supported flwr range.
"""

import threading
import time

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode

from flwr_fedeval._compat import FLWR_VERSION, Run, set_serverapp_identity
from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.strategies.base import FailureRecordingGrid

HEARTBEAT_INTERVAL = 1.0  # seconds; Flower's default is 30 s
TIMEOUT = 8.0  # far above the 2 s expiry, so a loaded machine's scheduling delays cannot reach it


def _flower_grid(num_nodes):
    """Flower's InMemoryGrid over an InMemoryLinkState, set up as flwr's simulation does."""
    import secrets

    from flwr.common.constant import NOOP_ACCOUNT_NAME, NOOP_FLWR_AID
    from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager

    if FLWR_VERSION >= (1, 31):
        from flwr.superlink.grid import InMemoryGrid
    else:
        from flwr.server.grid import InMemoryGrid

    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    state = factory.state()
    run = Run.create_empty(run_id=7)
    run.primary_task_id = 11
    if FLWR_VERSION >= (1, 31):
        from flwr.supercore.constant import NOOP_FEDERATION_ID

        run.federation_id = NOOP_FEDERATION_ID
    else:
        from flwr.supercore.constant import NOOP_FEDERATION

        run.federation = NOOP_FEDERATION
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[11] = Task(task_id=11, run_id=run.run_id)
    nodes = []
    for _ in range(num_nodes):
        node = state.create_node(NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, secrets.token_bytes(32),
                                 heartbeat_interval=HEARTBEAT_INTERVAL)
        state.acknowledge_node_heartbeat(node_id=node, heartbeat_interval=HEARTBEAT_INTERVAL)
        nodes.append(node)
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    set_serverapp_identity(run_id=run.run_id, task_id=11)  # what the runtime sets in a ServerApp process
    return grid, state, nodes


def test_node_whose_heartbeat_expires_is_given_up_at_once_over_flowers_grid():
    grid, state, nodes = _flower_grid(3)
    victim, alive = nodes[0], nodes[1:]
    stop = threading.Event()

    def heartbeats():  # the two live SuperNodes keep sending heartbeats; the victim was killed
        while not stop.is_set():
            for n in alive:
                state.acknowledge_node_heartbeat(node_id=n, heartbeat_interval=HEARTBEAT_INTERVAL)
            time.sleep(HEARTBEAT_INTERVAL / 4)

    thread = threading.Thread(target=heartbeats, daemon=True)
    thread.start()
    try:
        assert sorted(grid.get_node_ids()) == sorted(nodes)
        rec = FailureRecordingGrid(grid)
        msgs = [Message(RecordDict({"q": ConfigRecord({"round": 1})}), dst_node_id=n, message_type="query.ping")
                for n in nodes]
        t0 = time.monotonic()
        got = rec.collect_replies(msgs, timeout=TIMEOUT)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        thread.join()

    assert victim not in grid.get_node_ids() and sorted(got.timed_out) == sorted(alive)
    assert got.seconds[victim] < TIMEOUT  # given up when Flower expired it, not at our timeout
    assert elapsed >= TIMEOUT  # the live (silent) nodes were waited for until the timeout
    by_node = {f.node: f for f in rec.failures}
    # Flower's own reply for the offline node (or, if the node list was read first, ours) — never TIMEOUT.
    assert by_node[victim].code in (ErrorCode.NODE_UNAVAILABLE, ReplyCode.NODE_GONE)
    assert all(by_node[n].code == ReplyCode.TIMEOUT for n in alive)
