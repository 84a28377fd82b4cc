"""FHE AUC against a deviating server that holds no roster key (issue 12, items 2, 4, 6).

The server runs :class:`FHEAUCPhase` steps by hand (or through fault hooks on
the serializing in-process grid) and substitutes relayed X25519 keys; the real
client handlers must refuse with an :class:`IdentityError` naming the signer,
and never seal or encrypt anything under a key the server controls.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest
import tenseal as ts
from client_scores import client_scores, plain_auc_of
from flwr.app import ArrayRecord
from identities import IDENTITY_DIR, ROSTER_PATH

from flwr_fedeval import keyshare
from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.clients import fhe_handlers
from flwr_fedeval.fhe.auc import FHEAUCConfig
from flwr_fedeval.fhe.backend import CKKSParams, create_context, load_context, pack_blobs, unpack_blobs
from flwr_fedeval.identity import NodeIdentity, Roster, SignedKey, sign_key
from flwr_fedeval.keys import create
from flwr_fedeval.protocol import array_bytes, bytes_array, fhe_auc
from flwr_fedeval.protocol.fhe_auc import ParticipantList
from flwr_fedeval.strategies.auc_phase import PlaintextAUCPhase
from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase, FHEPhaseFailedError
from flwr_fedeval.testing import InProcessGrid

N = 20


@pytest.fixture(scope="module")
def arrays():
    return ArrayRecord(build_model(JobConfig()).get_weights())


@pytest.fixture(scope="module")
def grid():
    return InProcessGrid(client_app, 3, {"share-auc-with-server": True, "identity-dir": IDENTITY_DIR})


def _step1(phase, grid):
    session = secrets.token_hex(16)
    failed: dict[int, str] = {}
    keys = phase.collect_public_keys(grid, sorted(grid.node_ids), session, failed)
    assert failed == {} and len(keys) == len(grid.node_ids)
    return session, keys


def _attacker_signed(key: bytes, how: str, victim: SignedKey, session: str) -> SignedKey:
    """What a server without the victim's roster key can relay for ``key``."""
    if how == "victim-signature":          # the victim's real signature, over its real key
        return SignedKey(victim.signer, key, victim.signature)
    if how == "own-key-victim-name":       # a signature by a key the roster does not hold
        fake = NodeIdentity.generate(victim.signer)
        return SignedKey(victim.signer, key, sign_key(fake, protocol="fhe-auc", session=session, round=0,
                                                      role="client", key=key))
    if how == "unknown-signer":
        fake = NodeIdentity.generate("aggregator")
        return SignedKey("aggregator", key, sign_key(fake, protocol="fhe-auc", session=session, round=0,
                                                     role="client", key=key))
    if how == "other-session":             # the victim's signature from an earlier session, replayed
        return victim
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["victim-signature", "own-key-victim-name", "unknown-signer"])
def test_key_holder_refuses_a_substituted_client_key(grid, how):
    phase = FHEAUCPhase(N)
    session, keys = _step1(phase, grid)
    holder, victim = sorted(grid.node_ids)[0], sorted(grid.node_ids)[1]
    server = keyshare.generate_keypair()
    peers = {n: keys[n][2] for n in keys if n != holder}
    peers[victim] = _attacker_signed(server.public, how, peers[victim], session)
    failed: dict[int, str] = {}
    assert phase.setup_keys(grid, holder, peers, session, failed, holder_pk=keys[holder][0]) is None
    reason = failed[holder]
    assert "IdentityError" in reason and ("aggregator" if how == "unknown-signer" else peers[victim].signer) in reason
    assert fhe_handlers.STATE_SECRET not in grid.contexts[holder].state   # no CKKS key was even made


def test_key_holder_refuses_replayed_and_unsigned_keys(grid):
    phase = FHEAUCPhase(N)
    old_session, old_keys = _step1(phase, grid)
    session, keys = _step1(phase, grid)
    holder, victim = sorted(grid.node_ids)[:2]
    for peers in (
        {**{n: keys[n][2] for n in keys if n != holder}, victim: old_keys[victim][2]},        # replay
        {**{n: keys[n][2] for n in keys if n != holder},                                        # one member twice
         sorted(grid.node_ids)[2]: keys[victim][2]._replace(key=keys[sorted(grid.node_ids)[2]][0])},
    ):
        failed: dict[int, str] = {}
        assert phase.setup_keys(grid, holder, peers, session, failed, holder_pk=keys[holder][0]) is None
        assert "IdentityError" in failed[holder], failed
    # unsigned: the server leaves the signature records out
    from flwr.app import ConfigRecord, RecordDict

    content = RecordDict({fhe_auc.REQUEST_KEY: ConfigRecord({"session": session, "backend": "tenseal",
                                                                  "slots": N + 1}),
                          fhe_auc.PEERS_KEY: ConfigRecord({str(n): keys[n][0] for n in keys if n != holder})})
    from flwr_fedeval.strategies.base import exchange_replies

    failed = {}
    exchange_replies(grid, {holder: content}, fhe_auc.KEYGEN.message_type, lambda n, c: c, failed, step="t",
                     what="keygen", timeout=5, label="test")
    assert "not signed" in failed[holder]


def test_key_set_below_the_node_floor_is_refused(arrays):
    grid = InProcessGrid(client_app, 3, {"identity-dir": IDENTITY_DIR},
                         node_configs=[{"partition-id": i, "num-partitions": 3, "fedeval-min-clients": 3}
                                       for i in range(3)])
    phase = FHEAUCPhase(N)
    session, keys = _step1(phase, grid)
    holder, other = sorted(grid.node_ids)[:2]
    failed: dict[int, str] = {}
    assert phase.setup_keys(grid, holder, {other: keys[other][2]}, session, failed, holder_pk=keys[holder][0]) is None
    assert "at least 3" in failed[holder]


@pytest.mark.parametrize("how", ["server-as-key-holder", "victim-signature", "client-role-signature"])
def test_clients_refuse_a_substituted_key_holder(grid, arrays, how):
    """The server plays key holder: its own CKKS keys, sealed for every client under its own X25519 key."""
    phase = FHEAUCPhase(N)
    session, keys = _step1(phase, grid)
    nodes = sorted(grid.node_ids)
    server = keyshare.generate_keypair()
    ckks = create_context(params=CKKSParams.for_slots(N + 1, "tenseal"))
    bundles = keyshare.seal_bundle(ckks.secret_bytes(), secrets.token_bytes(32), sender=server,
                                   recipients={n: keys[n][0] for n in nodes})
    if how == "server-as-key-holder":
        holder_key = _attacker_signed(server.public, "own-key-victim-name", keys[nodes[0]][2], session)
    elif how == "victim-signature":
        holder_key = SignedKey(keys[nodes[0]][2].signer, server.public, keys[nodes[0]][2].signature)
    else:   # a real client's key with its step-1 signature (role "client"), not a key holder's
        holder_key = keys[nodes[0]][2]
    failed: dict[int, str] = {}
    config = FHEAUCConfig(n_points=N, max_rows=1024)
    forged = ParticipantList.sign(NodeIdentity.generate(holder_key.signer), session=session,
                                  members={keys[n][2].signer: keys[n][0] for n in nodes},
                                  protocol=phase.protocol)
    valid, _ = phase.collect_counts(grid, arrays, load_context(ckks.public_bytes()), nodes, bundles, holder=0,
                                    holder_key=holder_key, session=session, config=config, failed=failed,
                                    participant_list=forged)
    assert valid == {}                                   # no client encrypted anything under the server's key
    assert set(failed) == set(nodes)
    assert all("IdentityError" in r and "key-holder" in r for r in failed.values()), failed


def _plain_auc(grid, arrays, nodes):
    """The plaintext counts-AUC of ``nodes`` from their own scores (no evaluation message: the nodes
    answer one evaluation per global model)."""
    return plain_auc_of(client_scores(grid, arrays), nodes, PlaintextAUCPhase(N).thresholds)


@pytest.mark.parametrize("bad", ["slots", "level", "scale"])
def test_mismatched_ciphertext_fails_the_phase_naming_that_node(arrays, bad):
    """A client (or a relay) sends a ciphertext with another slot count, level or scale: the server
    names that node; the phase does not crash, and (issue 22) it fails instead of aggregating the
    others: the result is over the signed participant list or nothing."""
    victim: dict = {}

    def craft(node, msg, reply):
        if msg.metadata.message_type != fhe_auc.COUNTS.message_type or node != victim.get("node") or reply.has_error():
            return reply
        ctx = load_context(array_bytes(grid.contexts[node].state[fhe_handlers.STATE_SECRET], "secret", "context"))
        raw = ctx._ctx
        if bad == "slots":
            ct = ts.ckks_vector(raw, [1.0, 2.0])
        elif bad == "level":
            ct = ctx.multiply_plain(ctx.encrypt([1.0]), [1.0])        # rescaled: one level down
        else:
            ct = ts.ckks_vector(raw, [0.0] * ctx.slot_count, scale=2.0 ** 40)
        blobs = unpack_blobs(array_bytes(reply.content["fhe-counts"], "fhe-counts", "auc"))
        blobs[0] = ctx.serialize_ciphertext(ct)
        reply.content["fhe-counts"]["auc"] = bytes_array(pack_blobs(blobs))
        return reply

    grid = InProcessGrid(client_app, 3, {"share-auc-with-server": True, "identity-dir": IDENTITY_DIR}, fault=craft)
    victim["node"] = grid.node_ids[2]
    with pytest.raises(FHEPhaseFailedError) as info:
        FHEAUCPhase(N, share_auc_with_server=True).run(grid, arrays)
    assert info.value.lost == [victim["node"]]
    word = {"slots": "slot count", "level": "level", "scale": "scale"}[bad]
    assert word in info.value.failed[victim["node"]]
    assert "query.fhe_result" not in [t for _, t, _ in grid.log]  # nothing aggregated, nothing decrypted


def test_without_a_roster_the_phase_refuses_naming_the_config_keys(arrays):
    grid = InProcessGrid(client_app, 2, {})
    with pytest.raises(RuntimeError) as info:
        FHEAUCPhase(N).run(grid, arrays)
    assert "fedeval-identity-key" in str(info.value) and "identity-dir" in str(info.value)


def test_node_outside_the_roster_is_left_out_by_a_server_with_the_roster(tmp_path, arrays):
    """A fourth SuperNode with its own key (and its own roster listing it): the federation's
    roster does not list it, so the server leaves it out and the other three compute the AUC."""
    create(tmp_path, ["intruder"])
    configs = [{"partition-id": i, "num-partitions": 4} for i in range(3)] + [
        {"partition-id": 3, "num-partitions": 4, "fedeval-identity-key": str(tmp_path / "intruder.key"),
         "fedeval-roster": str(tmp_path / "roster.json")}]
    grid = InProcessGrid(client_app, 4, {"share-auc-with-server": True, "identity-dir": IDENTITY_DIR},
                         node_configs=configs)
    intruder = grid.node_ids[3]
    result = FHEAUCPhase(N, share_auc_with_server=True, roster=Roster.load(ROSTER_PATH)).run(grid, arrays)
    assert intruder not in result.contributors and "unknown signer 'intruder'" in result.failed[intruder]
    assert abs(result.auc - _plain_auc(grid, arrays, grid.node_ids[:3])) <= 1e-6
    assert np.isfinite(result.auc)


def test_role_discovery_with_a_roster_refuses_nodes_outside_it(tmp_path):
    from flwr_fedeval.strategies.shapley_phase import discover_roles

    create(tmp_path, ["intruder"])
    configs = [{"partition-id": i, "num-partitions": 4} for i in range(2)] + [
        {"partition-id": 2, "num-partitions": 4, "fedeval-identity-key": str(tmp_path / "intruder.key"),
         "fedeval-roster": str(tmp_path / "roster.json")},
        {"partition-id": 3, "num-partitions": 4, "fedeval-identity-key": "", "fedeval-roster": ""}]
    grid = InProcessGrid(client_app, 4, {"identity-dir": IDENTITY_DIR}, node_configs=configs)
    configs[3]["partition-id"] = 3
    grid.contexts[grid.node_ids[3]].run_config["identity-dir"] = ""          # this node has no identity at all
    refused: dict[int, str] = {}
    roles = discover_roles(grid, roster=Roster.load(ROSTER_PATH), refused=refused)
    assert sorted(roles) == sorted(grid.node_ids[:2])
    assert "unknown signer 'intruder'" in refused[grid.node_ids[2]]
    assert "identity-dir" in refused[grid.node_ids[3]]
    # without a roster nobody is refused
    assert sorted(discover_roles(grid)) == sorted(grid.node_ids)


def test_main_job_refuses_secure_phases_without_a_roster_before_training(tmp_path):
    from flwr.app import Context, RecordDict

    from flwr_fedeval.app import server_app

    for run_config in ({"auc-method": "fhe"}, {"shapley": "secsv", "model": "logreg"},
                       {"secure-aggregation": "xmkckks"}):  # issue 23 item 4: no round to retry first
        grid = InProcessGrid(client_app, 2, run_config)
        ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={**run_config, "output-dir": str(tmp_path)})
        with pytest.raises(ValueError, match="identity-dir") as info:
            server_app.main(grid, ctx)
        assert "fedeval-roster" in str(info.value)
        assert grid.log == []                     # refused before any message
