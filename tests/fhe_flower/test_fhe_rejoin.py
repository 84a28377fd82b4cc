"""FHE AUC phase with a restarted or lost SuperNode (issue 16.3; issue 22: no re-run over another node
set), over the serializing grid with simulated time."""

import secrets

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from identities import IDENTITY_DIR, ROSTER_PATH

from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.app.server_app import make_rejoin
from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.fhe.backend import default_backend
from flwr_fedeval.identity import Roster
from flwr_fedeval.protocol import ReplyCode, fhe_auc
from flwr_fedeval.strategies.base import FailureRecordingGrid, Failures
from flwr_fedeval.strategies.collect import POLL_INTERVAL
from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase, FHEPhaseFailedError
from flwr_fedeval.strategies.shapley_phase import discover_roles
from flwr_fedeval.testing import InProcessGrid

HEARTBEAT = 60.0
N = 30
BACKEND = default_backend()
RUN_CONFIG = {"share-auc-with-server": True, "identity-dir": IDENTITY_DIR}


@pytest.fixture(scope="module")
def arrays():
    return ArrayRecord(build_model(JobConfig()).get_weights())


def test_node_restarted_at_the_counts_step_fails_the_phase_without_a_rerun(arrays):
    """A client is killed while it encrypts its counts and restarted 5 s later under a new node ID: the
    old ID is given up once the new one proves the same roster identity (NODE_REJOINED, within a poll
    interval), and the phase fails naming it (issue 22: no re-run from step 1 over another node set,
    which gave the server two evaluations of one model; the clients refuse a second one anyway)."""
    new = {}

    def fault(node, msg, reply):
        if node == victim and msg.metadata.message_type == "evaluate.fhe_counts" and not new:
            new["id"] = inner.restart(node, back_after=5.0, gone_after=HEARTBEAT)
        return reply

    inner = InProcessGrid(client_app, 3, RUN_CONFIG, fault=fault)
    victim = inner.node_ids[1]
    grid = FailureRecordingGrid(inner)
    roster, partitions, identities = Roster.load(ROSTER_PATH), {}, {}
    discover_roles(grid, roster=roster, strict=False, partitions=partitions, identities=identities)
    grid.rejoin = make_rejoin(JobConfig(), roster, partitions, identities)

    phase = FHEAUCPhase(N, backend=BACKEND, protocol="malicious", roster=roster, timeout=600)
    with pytest.raises(FHEPhaseFailedError) as info:
        phase.run(grid, arrays)
    assert info.value.lost == [victim] and victim in info.value.failed
    assert [t for _, t, _ in inner.log].count("query.fhe_pubkey") == 3  # step 1 ran once: no re-run
    assert "query.fhe_result" not in [t for _, t, _ in inner.log]
    (f,) = grid.failures
    assert (f.node, f.step, f.code) == (victim, "evaluate.fhe_counts", ReplyCode.NODE_REJOINED)
    assert 5.0 <= f.seconds_to_detect <= 5.0 + POLL_INTERVAL and inner.now < HEARTBEAT


def test_semi_honest_client_lost_at_the_counts_step_fails_the_phase_at_the_heartbeat(arrays):
    """Semi-honest too: a listed participant lost at steps 3-4 makes the phase fail once Flower drops
    it (the result would not be over the signed participant list)."""
    inner = InProcessGrid(client_app, 3, RUN_CONFIG)
    victim = inner.node_ids[2]
    inner.fault = lambda n, m, r: (inner.kill(n, gone_after=HEARTBEAT), r)[1] if (
        n == victim and m.metadata.message_type == "evaluate.fhe_counts") else r
    grid = FailureRecordingGrid(inner)
    with pytest.raises(FHEPhaseFailedError) as info:
        FHEAUCPhase(N, backend=BACKEND, protocol="semi-honest", timeout=600).run(grid, arrays)
    assert info.value.lost == [victim]
    (f,) = grid.failures
    assert f.code == ReplyCode.NODE_GONE and HEARTBEAT <= f.seconds_to_detect <= HEARTBEAT + POLL_INTERVAL


def test_one_identity_under_two_node_ids_is_refused(arrays):
    """Two node IDs with the roster key of node-2: the honest server leaves both out at step 1; a deviating
    server that relays both to the key holder is refused by it."""
    configs = [{"partition-id": p, "num-partitions": 4} for p in (0, 1, 2, 2)]
    grid = InProcessGrid(client_app, 4, RUN_CONFIG, node_configs=configs)
    nodes = list(grid.node_ids)
    phase = FHEAUCPhase(N, backend=BACKEND, roster=Roster.load(ROSTER_PATH))
    session, failed = secrets.token_hex(16), Failures()
    keys = phase.collect_public_keys(grid, nodes, session, failed)
    assert sorted(keys) == sorted(nodes[:2]) and all("node-2" in failed[n].reason for n in nodes[2:])

    request = RecordDict({fhe_auc.REQUEST_KEY: ConfigRecord({"session": session})})
    signed = {}
    for node in nodes:
        (reply,) = grid.send_and_receive([Message(request, dst_node_id=node, message_type=fhe_auc.PUBKEY.message_type)])
        rec = reply.content[fhe_auc.PUBKEY_KEY]
        signed[node] = (rec["public-key"], rec["signer"], rec["signature"])
    assert [signed[n][1] for n in nodes] == ["node-0", "node-1", "node-2", "node-2"]
    peers = nodes[1:]
    content = RecordDict({
        fhe_auc.REQUEST_KEY: ConfigRecord({"session": session, "backend": BACKEND, "slots": phase.slots, "max-rows": 64,
                                        "protocol": phase.protocol}),
        fhe_auc.PEERS_KEY: ConfigRecord({str(n): signed[n][0] for n in peers}),
        fhe_auc.PEER_SIGNERS_KEY: ConfigRecord({str(n): signed[n][1] for n in peers}),
        fhe_auc.PEER_SIGNATURES_KEY: ConfigRecord({str(n): signed[n][2] for n in peers}),
    })
    (reply,) = grid.send_and_receive([Message(content, dst_node_id=nodes[0], message_type=fhe_auc.KEYGEN.message_type)])
    assert reply.has_error() and "node-2" in reply.error.reason and "twice" in reply.error.reason
