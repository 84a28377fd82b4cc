"""FHE AUC: who takes part and what leaves a node (issue 22, items 1, 2, 5), against a deviating server.

The server plays the phase by hand over the serializing in-process grid with the real client
handlers and roster identities (it holds no roster key): it forges the party count and index,
shortens or replays the key holder's signed participant list, asks for the AUC against the
nodes' policy, and asks for a second evaluation of the same global model over another subset.
"""

from __future__ import annotations

import math
import secrets

import pytest
from flwr.app import ArrayRecord, Message, RecordDict
from identities import IDENTITY_DIR, node_configs

from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.clients import policy
from flwr_fedeval.clients.ledger import node_ledger
from flwr_fedeval.fhe.auc import FHEAUCConfig
from flwr_fedeval.fhe.auc_malicious import MaliciousAUCConfig
from flwr_fedeval.fhe.backend import default_backend
from flwr_fedeval.keys import create
from flwr_fedeval.protocol import ReplyCode, fhe_auc
from flwr_fedeval.protocol.fhe_auc import ParticipantList
from flwr_fedeval.strategies.base import Failures
from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase, FHEPhaseFailedError, FHERun

N = 20
BACKEND = default_backend()
RUN_CONFIG = {"share-auc-with-server": True, "identity-dir": IDENTITY_DIR}


@pytest.fixture(scope="module")
def arrays():
    return ArrayRecord(build_model(JobConfig()).get_weights())


def _grid(num_nodes=3, run_config=None, **node_policy):
    from flwr_fedeval.testing import InProcessGrid

    return InProcessGrid(client_app, num_nodes, run_config or RUN_CONFIG,
                         node_configs=node_configs(num_nodes, **node_policy))


def _steps_1_2(phase: FHEAUCPhase, grid) -> FHERun:
    """Steps 1-2 as the honest phase runs them (the key holder signs the participant list)."""
    failed = Failures()
    run = FHERun(secrets.token_hex(16), tuple(sorted(grid.node_ids)))
    keys = phase.collect_public_keys(grid, list(run.nodes), run.session, failed)
    bound = max(sum(v[1] for v in keys.values()), 1)
    config = MaliciousAUCConfig(n_points=N, max_rows=bound, n_splits=phase.n_splits) \
        if phase.protocol == "malicious" else FHEAUCConfig(n_points=N, max_rows=bound)
    run = phase._key_holder(grid, run.replace(config=config), keys, failed)
    assert sorted(run.participants) == sorted(grid.node_ids) and len(run.participant_list.names) == 3
    return run


def _counts_request(phase: FHEAUCPhase, run: FHERun, node: int, arrays, *, listed=None, extra=None):
    params = fhe_auc.EncryptionParams(phase.protocol, N, run.config.max_rows, phase.n_splits,
                                      secrets.token_bytes(16), -1.0)
    request = fhe_auc.CountsRequest(run.session, params, run.holder_key, phase.thresholds,
                                    listed or run.participant_list,
                                    None if node == run.holder else run.bundles[node])
    content = RecordDict({"arrays": arrays})
    for key, record in request.to_record().items():
        content[key] = record
    for key, value in (extra or {}).items():  # fields the server adds on its own
        content[fhe_auc.REQUEST_KEY][key] = value
    return Message(content, dst_node_id=node, message_type=fhe_auc.COUNTS.message_type)


@pytest.mark.slow
def test_forged_party_count_and_index_have_no_effect_every_client_detects_the_solo_aggregate(arrays):
    """The attack of issue 22 item 1: steps 1-2 honest, step 4 tells every client ``n-parties = 1,
    party-index = 0`` and the server aggregates each client's counts alone. The fields are not
    read any more (each client's index and count come from the signed list), so the zero-sum
    offsets of the other two parties are missing from every solo aggregate: every client
    detects tampering and none decrypts its own local AUC."""
    grid = _grid()
    phase = FHEAUCPhase(N, backend=BACKEND, protocol="malicious")
    run = _steps_1_2(phase, grid)
    messages = [_counts_request(phase, run, n, arrays, extra={"n-parties": 1, "party-index": 0})
                for n in run.participants]
    replies = {r.metadata.src_node_id: r for r in grid.send_and_receive(messages)}
    assert all(not r.has_error() for r in replies.values())
    for node, reply in replies.items():
        assert int(grid.contexts[node].state["fhe-auc.params"]["n-parties"]) == 3  # the signed list's count
        counts = fhe_auc.CountsReply.from_record(reply.content, node=node)
        solo = phase.aggregate(run.context, [counts.auc], run.config)  # this client's counts alone
        request = fhe_auc.ResultRequest(run.session, solo).to_record()
        (result,) = grid.send_and_receive([Message(request, dst_node_id=node,
                                                   message_type=fhe_auc.RESULT.message_type)])
        assert result.has_error(), "a client accepted the AUC of its own counts alone"
        assert result.error.code == ReplyCode.RESULT_REJECTED, result.error.reason  # one code, whatever failed


@pytest.mark.parametrize("protocol", ["semi-honest", "malicious"])
@pytest.mark.parametrize("forgery", ["shortened", "reordered", "other-session", "unsigned-by-holder"])
def test_clients_refuse_a_participant_list_the_key_holder_did_not_sign(arrays, protocol, forgery):
    """The server cannot shorten, reorder or replay the key holder's list, nor sign one itself: every
    client refuses it before encrypting anything (and before counting an evaluation)."""
    from flwr_fedeval.identity import NodeIdentity

    grid = _grid()
    phase = FHEAUCPhase(N, backend=BACKEND, protocol=protocol)
    earlier = _steps_1_2(phase, grid).participant_list if forgery == "other-session" else None
    run = _steps_1_2(phase, grid)
    listed = run.participant_list
    if forgery == "shortened":    # each client alone with the key holder, the holder's signature kept
        forged = lambda node: ParticipantList(listed.names[:2], listed.keys[:2], listed.signer, listed.signature,
                                                 listed.protocol)
    elif forgery == "reordered":  # another index for every client
        forged = lambda node: ParticipantList(listed.names[::-1], listed.keys[::-1], listed.signer, listed.signature,
                                                 listed.protocol)
    elif forgery == "other-session":  # the key holder's list of an earlier session, replayed
        forged = lambda node: earlier
    else:  # a list the server signs itself, in the key holder's name
        fake = NodeIdentity.generate(listed.signer)
        forged = lambda node: ParticipantList.sign(fake, session=run.session,
                                                   members=dict(zip(listed.names, listed.keys)), protocol=protocol)
    replies = grid.send_and_receive([_counts_request(phase, run, n, arrays, listed=forged(n))
                                     for n in run.participants])
    assert len(replies) == 3
    for reply in replies:
        assert reply.has_error() and "IdentityError" in reply.error.reason and "participant list" in reply.error.reason
    for node in run.participants:
        assert node_ledger(grid.contexts[node]).summary().evaluations == []  # nothing evaluated


def test_a_client_refuses_a_list_without_itself_or_below_its_floor(arrays):
    """The honest list of 3, sent to a 4th node that was dropped before step 2, and to nodes whose
    policy floor (``fedeval-min-clients = 4``) the list does not reach."""
    grid = _grid(3, fedeval_min_clients=4)
    phase = FHEAUCPhase(N, backend=BACKEND)
    failed, session = Failures(), secrets.token_hex(16)
    keys = phase.collect_public_keys(grid, list(grid.node_ids), session, failed)
    with pytest.raises(RuntimeError, match="at least 2"):  # every key holder refuses a list below its floor
        phase._key_holder(grid, FHERun(session, tuple(grid.node_ids), config=FHEAUCConfig(n_points=N, max_rows=256)),
                          keys, failed)
    assert len(failed.reasons()) >= 2 and all("at least 4" in r for r in failed.reasons().values())

    grid = _grid(4)
    phase = FHEAUCPhase(N, backend=BACKEND)
    session, failed = secrets.token_hex(16), Failures()
    keys = phase.collect_public_keys(grid, list(grid.node_ids), session, failed)
    left_out = sorted(grid.node_ids)[3]
    del keys[left_out]
    run = phase._key_holder(grid, FHERun(session, tuple(sorted(keys)), config=FHEAUCConfig(n_points=N, max_rows=256)),
                            keys, failed)
    assert left_out not in run.participants
    (reply,) = grid.send_and_receive([_counts_request(phase, run.replace(bundles={left_out: b"x" * 100}),
                                                      left_out, arrays)])
    assert reply.has_error() and "does not list this node" in reply.error.reason


def test_node_policy_share_off_no_auc_reaches_the_server_even_if_the_run_config_asks(arrays):
    """Run config ``share-auc-with-server = true`` and a server that expects reports; the nodes'
    policy says ``fedeval-share-auc = false``: the step-6 replies carry no AUC, only ``shared = false``."""
    reports = []

    def spy(node, msg, reply):
        if msg.metadata.message_type == fhe_auc.RESULT.message_type and not reply.has_error():
            reports.append(dict(reply.content["fhe-report"]))
        return reply

    grid = _grid(fedeval_share_auc=False)
    grid.fault = spy
    result = FHEAUCPhase(N, backend=BACKEND, share_auc_with_server=True, metrics_threshold=0.5).run(grid, arrays)
    assert math.isnan(result.auc) and result.details["auc_known_to"] == "clients"
    assert len(reports) == 3 and all(r == {"status": "ok", "shared": False} for r in reports)


def test_the_default_policy_keeps_the_auc_on_the_nodes(tmp_path):
    """``python -m flwr_fedeval.keys create`` writes the documented defaults: sharing off, one
    evaluation per model, ε = 1; a node with that file does not share whatever the run config says."""
    from flwr.app import Context

    create(tmp_path, ["node-0"])
    ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={"fedeval-identity-dir": str(tmp_path), "fedeval-share-auc": True})
    got = policy.node_policy(ctx)
    assert (got.share_auc, got.evaluations_per_model, got.dp_epsilon, got.dp_seed) == (False, 1, 1.0, 0)
    assert str(tmp_path / "node-0.policy.toml") in got.source
    assert policy.share_auc(ctx) is False
    ctx.node_config["fedeval-share-auc"] = True          # node config overrides the file ...
    assert policy.share_auc(ctx) is True
    ctx.run_config["fedeval-share-auc"] = False          # ... and the run config can only turn it off
    assert policy.share_auc(ctx) is False
    (tmp_path / "node-0.policy.toml").chmod(0o666)        # a file anyone could loosen is refused
    with pytest.raises(ValueError, match="writable by group or others"):
        policy.node_policy(ctx)


@pytest.mark.slow
def test_a_second_evaluation_of_the_same_model_over_another_subset_is_refused(arrays):
    """Issue 22 item 5: one honest evaluation by all three nodes; the server then asks two of them
    for the same global model again (a new session, so the difference would give the third
    node's contribution): both refuse, naming the node key, and the phase fails without a result."""
    grid = _grid(3)
    first = FHEAUCPhase(N, backend=BACKEND, share_auc_with_server=True).run(grid, arrays)
    assert math.isfinite(first.auc) and first.contributors == sorted(grid.node_ids)
    subset = _SubsetGrid(grid, sorted(grid.node_ids)[:2])
    before = len(grid.log)
    with pytest.raises(FHEPhaseFailedError) as info:
        FHEAUCPhase(N, backend=BACKEND, share_auc_with_server=True).run(subset, arrays)
    assert sorted(info.value.lost) == sorted(grid.node_ids)[:2]
    assert all("fedeval-evaluations-per-model" in info.value.failed[n] for n in info.value.lost)
    assert "query.fhe_result" not in [t for _, t, _ in grid.log[before:]]  # nothing decrypted
    # another global model is a new evaluation
    other = ArrayRecord([a * 0.5 for a in arrays.to_numpy_ndarrays()])
    again = FHEAUCPhase(N, backend=BACKEND, share_auc_with_server=True).run(subset, other)
    assert math.isfinite(again.auc) and again.contributors == sorted(grid.node_ids)[:2]


class _SubsetGrid:
    """The same nodes, with ``get_node_ids`` reporting only ``nodes`` (a server picking a subset)."""

    def __init__(self, grid, nodes):
        self._grid, self._nodes = grid, list(nodes)

    def get_node_ids(self):
        return list(self._nodes)

    def __getattr__(self, name):
        return getattr(self._grid, name)
