"""Plaintext and DP AUC phases: the members sign who takes part (issue 22, item 1).

Nodes with roster identities (``identity-dir``) over the serializing in-process grid, the real
client handlers; the server holds no roster key. An honest run carries the members' signed list;
a deviating server that skips the join step, drops a node from the list, forges or replays a
signature, or shows a list below a node's floor is refused by the clients before anything leaves
them.
"""

from __future__ import annotations

import math

import pytest
from flwr.app import ArrayRecord, Message
from identities import IDENTITY_DIR, node_configs

from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.identity import NodeIdentity
from flwr_fedeval.protocol import auc, dp_auc
from flwr_fedeval.strategies.auc_phase import PlaintextAUCPhase, join_participants, with_model
from flwr_fedeval.strategies.dp_phases import DPAUCLaplacePhase, FedAUCRRPhase
from flwr_fedeval.testing import InProcessGrid

N = 20
RUN_CONFIG = {"identity-dir": IDENTITY_DIR, "dp-epsilon": 1.0}


@pytest.fixture(scope="module")
def arrays():
    return ArrayRecord(build_model(JobConfig()).get_weights())


def _grid(num_nodes=3, **policy):
    return InProcessGrid(client_app, num_nodes, RUN_CONFIG, node_configs=node_configs(num_nodes, **policy))


@pytest.mark.parametrize("phase", [PlaintextAUCPhase(N), DPAUCLaplacePhase(N, epsilon=1.0), FedAUCRRPhase(epsilon=1.0)],
                         ids=lambda p: p.method)
def test_honest_run_carries_the_members_signed_list(arrays, phase):
    seen = []

    def spy(node, msg, reply):
        if msg.metadata.message_type.startswith("evaluate.") and auc.PARTICIPANTS_KEY in msg.content:
            seen.append(auc.SignedParticipants.from_content(msg.content).names)
        return reply

    grid = _grid()
    grid.fault = spy
    result = phase.run(grid, arrays)
    assert result.contributors == sorted(grid.node_ids) and math.isfinite(result.auc)
    assert seen == [("node-0", "node-1", "node-2")] * 3


def _request(step, phase, arrays, listed):
    if step is auc.JOIN:
        return with_model(arrays, "arrays", auc.ThresholdCountsRequest(phase.thresholds, listed)), \
            auc.THRESHOLD_COUNTS.message_type
    return with_model(arrays, "arrays", dp_auc.DPAUCRequest(phase.thresholds, 1.0, listed)), \
        dp_auc.DPAUC_LAPLACE.message_type


@pytest.mark.parametrize("step", [auc.JOIN, dp_auc.DP_JOIN], ids=["plain", "dpauc-laplace"])
@pytest.mark.parametrize("forgery", ["no-list", "node-dropped", "forged-signature", "replayed", "below-floor"])
def test_clients_refuse_a_list_the_members_did_not_sign(arrays, step, forgery):
    grid = _grid(fedeval_min_clients=3) if forgery == "below-floor" else _grid()
    phase = PlaintextAUCPhase(N) if step is auc.JOIN else DPAUCLaplacePhase(N)
    phase._start_run()
    nodes = sorted(grid.node_ids)
    earlier = join_participants(phase, grid, nodes, step)[0] if forgery == "replayed" else None
    listed, joined = join_participants(phase, grid, nodes, step)
    assert joined == nodes and len(listed.names) == 3
    if forgery == "no-list":
        listed = None
    elif forgery == "node-dropped":      # node-2 kept out of the list it is asked to evaluate under
        listed = auc.SignedParticipants(listed.session, listed.names[:2], listed.signatures[:2])
    elif forgery == "forged-signature":  # a fourth member the server signs for itself
        fake = auc.sign_join(NodeIdentity.generate("node-3"), listed.session)
        listed = auc.SignedParticipants.of(listed.session, [*(auc.JoinReply(n, s) for n, s in
                                                              zip(listed.names, listed.signatures)), fake])
    elif forgery == "replayed":          # the members' list of an earlier session
        listed = earlier
    else:                                # two members only, below the nodes' floor of 3
        listed = auc.SignedParticipants(listed.session, listed.names[:2], listed.signatures[:2])
    by_partition = {grid.contexts[n].node_config["partition-id"]: n for n in nodes}  # node-i: partition i
    targets = {"node-dropped": [by_partition[2]], "below-floor": [by_partition[0], by_partition[1]]}.get(forgery,
                                                                                                        nodes)
    content, message_type = _request(step, phase, arrays, listed)
    replies = grid.send_and_receive([Message(content, dst_node_id=n, message_type=message_type) for n in targets])
    match = {"no-list": "no signed participant list", "node-dropped": "does not list this node",
             "forged-signature": "participant list refused", "replayed": "not the one this node joined",
             "below-floor": "at least 3"}[forgery]
    assert len(replies) == len(targets)
    for reply in replies:
        assert reply.has_error() and match in reply.error.reason, reply.error.reason
    for node in targets:
        assert "fedeval-policy.evaluated" not in grid.contexts[node].state  # nothing evaluated


def test_without_identities_there_is_no_list_and_nothing_to_check(arrays):
    """Nodes configured without a roster identity reply to the join step unsigned; the phase runs
    without a list (as before issue 22), and such a node has nothing to check it against."""
    grid = InProcessGrid(client_app, 3, {})
    phase = PlaintextAUCPhase(N)
    phase._start_run()
    listed, joined = join_participants(phase, grid, sorted(grid.node_ids), auc.JOIN)
    assert listed is None and joined == sorted(grid.node_ids)
    assert PlaintextAUCPhase(N).run(grid, arrays).contributors == sorted(grid.node_ids)
