"""The FHE AUC phase's messages (flwr_fedeval.protocol.fhe_auc), over Flower's serialization.

Each payload round-trips through Flower's protobuf serialization with the record keys and field
names of the wire format unchanged; a malformed field is refused with one ``MalformedMessage``
naming the field and the node, and the server records it as that node's malformed reply.
"""

from __future__ import annotations

import math
import secrets

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from identities import IDENTITY_DIR

from flwr_fedeval._compat import set_serverapp_identity
from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.clients import fhe_handlers
from flwr_fedeval.fhe.auc import FHEAUCConfig
from flwr_fedeval.fhe.auc_malicious import MaliciousAUCConfig
from flwr_fedeval.identity import IdentityError, NodeIdentity, Roster, SignedKey
from flwr_fedeval.protocol import (
    MalformedMessage,
    Refused,
    ReplyCode,
    bytes_array,
    fhe_auc,
)
from flwr_fedeval.protocol.fhe_auc import (
    CountsReply,
    CountsRequest,
    EncryptionParams,
    KeygenReply,
    KeygenRequest,
    ParticipantList,
    PubkeyReply,
    PubkeyRequest,
    ResultReport,
    ResultRequest,
)
from flwr_fedeval.strategies.base import Failures
from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase
from flwr_fedeval.testing import InProcessGrid
from flwr_fedeval.testing.grid import _roundtrip_message

NODE = 12345678901234567890
SESSION = "ab" * 16
ALICE = NodeIdentity.generate("node-0")
BOB = NodeIdentity.generate("node-1")
ROSTER = Roster({i.name: i.public_key_bytes() for i in (ALICE, BOB)})
#: The key holder node-0 (key h…) and node-1 (key p…), signed by node-0.
LIST = ParticipantList.sign(ALICE, session=SESSION, members={"node-1": b"p" * 32, "node-0": b"h" * 32},
                            protocol="malicious")


def roundtrip(content: RecordDict) -> RecordDict:
    """``content`` after Flower's protobuf serialization (as on the deployment engine)."""
    set_serverapp_identity(run_id=1)
    msg, _ = _roundtrip_message(Message(content=content, dst_node_id=5, message_type="query.fhe_pubkey"))
    return msg.content


def fields(content: RecordDict) -> dict[str, list[str]]:
    """The wire layout: record key → field names, in order."""
    return {key: list(record.keys()) for key, record in content.items()}


def refused(payload_cls, content: RecordDict, field: str) -> MalformedMessage:
    with pytest.raises(MalformedMessage) as err:
        payload_cls.from_record(content, node=NODE)
    assert err.value.field == field and err.value.node == NODE, (err.value.field, str(err.value))
    assert str(err.value).startswith(f"node {NODE}: field {field!r}")
    return err.value


def _params(**changes) -> EncryptionParams:
    values = {"protocol": "malicious", "n_points": 5, "max_rows": 64, "n_splits": 4,
              "nonce": bytes(range(16)), "metrics_threshold": 0.5}
    return EncryptionParams(**{**values, **changes})


def _counts_request(**changes) -> CountsRequest:
    holder = fhe_auc.sign(ALICE, session=SESSION, role=fhe_auc.HOLDER_ROLE, key=b"h" * 32)
    values = {"session": SESSION, "params": _params(), "holder": holder, "thresholds": np.linspace(1.0, 0.0, 5),
              "participants": LIST, "sealed": b"sealed bundle"}
    return CountsRequest(**{**values, **changes})


# --- step table ---------------------------------------------------------------------------------
def test_step_table_and_the_one_registration_idiom():
    assert [(s.message_type, s.replier) for s in fhe_auc.STEPS] == [
        ("query.fhe_pubkey", "client"), ("query.fhe_keygen", "key-holder"),
        ("evaluate.fhe_counts", "client"), ("query.fhe_result", "client")]
    assert [(s.request, s.reply) for s in fhe_auc.STEPS] == [
        (PubkeyRequest, PubkeyReply), (KeygenRequest, KeygenReply), (CountsRequest, CountsReply),
        (ResultRequest, ResultReport)]
    registered = {}

    class _App:  # records what register_fhe_handlers registers, as flwr.clientapp.ClientApp would
        def query(self, name):
            return lambda fn: registered.setdefault(("query", name), fn)

        def evaluate(self, name):
            return lambda fn: registered.setdefault(("evaluate", name), fn)

    fhe_handlers.register_fhe_handlers(_App(), test_scores=lambda m, c: (None, None), test_labels=lambda c: [])
    assert sorted(registered) == [("evaluate", "fhe_counts"), ("query", "fhe_keygen"), ("query", "fhe_pubkey"),
                                  ("query", "fhe_result")]


# --- step 1 -------------------------------------------------------------------------------------
def test_pubkey_request_and_reply_round_trip_with_the_wire_layout():
    content = roundtrip(PubkeyRequest(SESSION).to_record())
    assert fields(content) == {"fhe": ["session"]}
    assert PubkeyRequest.from_record(content, node=NODE) == PubkeyRequest(SESSION)

    signed = fhe_auc.sign(BOB, session=SESSION, role=fhe_auc.CLIENT_ROLE, key=b"k" * 32)
    reply = PubkeyReply(b"k" * 32, 64, signed.signer, signed.signature)
    content = roundtrip(reply.to_record())
    assert fields(content) == {"fhe-pubkey": ["public-key", "test-size-bucket", "signer", "signature"]}
    back = PubkeyReply.from_record(content, node=NODE)
    assert back == reply and back.signed_key == signed
    fhe_auc.verify(ROSTER, back.signed_key, session=SESSION, role="client")
    with pytest.raises(IdentityError, match="node-1"):  # signed for "client", not for "key-holder"
        fhe_auc.verify(ROSTER, back.signed_key, session=SESSION, role="key-holder")


@pytest.mark.parametrize("mutate, field, reason", [
    (lambda r: r.__setitem__("public-key", b"k" * 31), "fhe-pubkey.public-key", "31 bytes, expected 32"),
    (lambda r: r.__setitem__("test-size-bucket", 48), "fhe-pubkey.test-size-bucket", "not 0 or a power of two"),
    (lambda r: r.__setitem__("test-size-bucket", True), "fhe-pubkey.test-size-bucket", "expected int"),
    (lambda r: r.__delitem__("signature"), "fhe-pubkey.signature", "missing"),
    (lambda r: r.__setitem__("signer", b"node-1"), "fhe-pubkey.signer", "expected str"),
])
def test_malformed_pubkey_reply_names_the_field_and_the_node(mutate, field, reason):
    content = PubkeyReply(b"k" * 32, 8, "node-1", b"s" * 70).to_record()
    mutate(content["fhe-pubkey"])
    assert reason in refused(PubkeyReply, roundtrip(content), field).reason


def test_pubkey_request_without_a_session_is_malformed():
    refused(PubkeyRequest, RecordDict({"fhe": ConfigRecord({"session": ""})}), "fhe.session")
    refused(PubkeyRequest, RecordDict({"other": ConfigRecord({"session": SESSION})}), "fhe")


#: One signed peer key (node 7) of a step-2 request.
PEER7 = {7: SignedKey("node-1", b"p" * 32, b"s")}


# --- step 2 -------------------------------------------------------------------------------------
def test_keygen_request_and_reply_round_trip_with_the_wire_layout():
    peers = {NODE: fhe_auc.sign(BOB, session=SESSION, role="client", key=b"p" * 32),
             7: fhe_auc.sign(ALICE, session=SESSION, role="client", key=b"q" * 32)}
    request = KeygenRequest(SESSION, "tenseal", 31, 64, peers, "malicious")
    content = roundtrip(request.to_record())
    assert fields(content) == {"fhe": ["session", "backend", "slots", "max-rows", "protocol"],
                               "fhe-peers": [str(NODE), "7"], "fhe-peer-signers": [str(NODE), "7"],
                               "fhe-peer-signatures": [str(NODE), "7"]}
    back = KeygenRequest.from_record(content, node=NODE)
    assert back == request and back.peers[NODE].signer == "node-1"
    assert fhe_auc.verify_peers(ROSTER, {NODE: back.peers[NODE]}, session=SESSION, floor=2, own="node-0") == {
        NODE: "node-1"}

    reply = KeygenReply(b"public context", {NODE: b"sealed-1", 7: b"sealed-2"}, "node-0", b"s" * 71, LIST)
    content = roundtrip(reply.to_record())
    assert fields(content) == {"fhe-context": ["public"], "fhe-bundles": [str(NODE), "7"],
                               "fhe-holder": ["signer", "signature"],
                               "fhe-participants": ["names", "keys", "signer", "signature", "protocol"]}
    assert content["fhe-bundles"][str(NODE)].numpy().dtype == np.uint8
    back = KeygenReply.from_record(content, node=NODE)
    assert back == reply
    assert back.holder_key(b"h" * 32) == SignedKey("node-0", b"h" * 32, b"s" * 71)


def test_unsigned_or_malformed_keygen_request_is_refused_naming_the_field():
    content = KeygenRequest(SESSION, "tenseal", 31, 64, PEER7, "malicious").to_record()
    unsigned = RecordDict({k: v for k, v in content.items() if k != "fhe-peer-signers"})
    assert "not signed" in refused(KeygenRequest, unsigned, "fhe-peer-signers").reason
    del content["fhe-peer-signatures"]["7"]
    assert "node 7 is not signed" in refused(KeygenRequest, roundtrip(content), "fhe-peers.7").reason

    for mutate, field in [
        (lambda c: c["fhe-peers"].__setitem__("node-7", b"p" * 32), "fhe-peers.node-7"),
        (lambda c: c["fhe-peers"].__setitem__("7", b"p" * 33), "fhe-peers.7"),
        (lambda c: c["fhe"].__setitem__("backend", "seal"), "fhe.backend"),
        (lambda c: c["fhe"].__delitem__("max-rows"), "fhe.max-rows"),
    ]:
        content = KeygenRequest(SESSION, "tenseal", 31, 64, PEER7, "malicious").to_record()
        mutate(content)
        refused(KeygenRequest, content, field)


def test_malformed_keygen_reply_names_the_field_and_the_node():
    content = KeygenReply(b"ctx", {7: b"sealed"}, "node-0", b"s", LIST).to_record()
    content["fhe-bundles"]["7"] = Array(np.zeros(3, dtype=np.float32))
    assert "dtype float32" in refused(KeygenReply, roundtrip(content), "fhe-bundles.7").reason
    content = KeygenReply(b"ctx", {7: b"sealed"}, "node-0", b"s", LIST).to_record()
    del content["fhe-context"]
    refused(KeygenReply, content, "fhe-context")


# --- steps 3-4 ----------------------------------------------------------------------------------
def test_counts_request_and_reply_round_trip_with_the_wire_layout():
    request = _counts_request()
    content = roundtrip(request.to_record())
    assert fields(content) == {
        "evaluation": ["thresholds"],
        "fhe": ["session", "protocol", "n-points", "max-rows", "n-splits", "nonce",
                "holder-public-key", "holder-signer", "holder-signature", "metrics-threshold"],
        "fhe-participants": ["names", "keys", "signer", "signature", "protocol"],
        "fhe-bundle": ["sealed"]}  # no party index or count: the clients derive them from the signed list
    back = CountsRequest.from_record(content, node=NODE)
    assert (back.session, back.params, back.holder, back.sealed) == (SESSION, request.params, request.holder,
                                                                    b"sealed bundle")
    assert back.participants == LIST
    assert LIST.verify(ROSTER, session=SESSION, holder="node-0", own="node-1", own_key=b"p" * 32) == 1
    assert back.thresholds.dtype == np.float64 and back.thresholds.tolist() == request.thresholds.tolist()
    assert back.params.auc_config == MaliciousAUCConfig(n_points=5, max_rows=64, n_splits=4)
    fhe_auc.verify(ROSTER, back.holder, session=SESSION, role="key-holder")
    # the key holder gets no bundle; the semi-honest configuration has no splits
    holder = CountsRequest.from_record(roundtrip(_counts_request(sealed=None, params=_params(
        protocol="semi-honest", n_splits=0)).to_record()), node=NODE)
    assert holder.sealed is None and "fhe-bundle" not in holder.to_record()
    assert holder.params.auc_config == FHEAUCConfig(n_points=5, max_rows=64)

    for reply in (CountsReply(b"three ciphertexts", b"one ciphertext"), CountsReply(b"three ciphertexts")):
        content = roundtrip(reply.to_record())
        assert fields(content) == {"fhe-counts": ["auc", "metrics"] if reply.metrics else ["auc"]}
        assert CountsReply.from_record(content, node=NODE) == reply


@pytest.mark.parametrize("change, field, reason", [
    ({"thresholds": np.linspace(1.0, 0.0, 4)}, "evaluation.thresholds", "shape (4,), expected (5,)"),
    ({"thresholds": np.array([1.0, np.nan, 0.5, 0.2, 0.0])}, "evaluation.thresholds", "NaN"),
    ({"params": _params(nonce=b"n" * 15)}, "fhe.nonce", "15 bytes, expected 16"),
    ({"participants": LIST.__class__(LIST.names, (b"h" * 32, b"p" * 31), LIST.signer, LIST.signature,
                                          LIST.protocol)},
     "fhe-participants.keys", "32 long"),
    ({"params": _params(protocol="lazy")}, "fhe.protocol", "not one of"),
    ({"params": _params(n_splits=1)}, "fhe.n-splits", "below 2"),
    ({"params": _params(metrics_threshold=1.5)}, "fhe.metrics-threshold", "above 1.0"),
    ({"holder": SignedKey("node-0", b"h" * 31, b"s")}, "fhe.holder-public-key", "31 bytes"),
])
def test_malformed_counts_request_names_the_field(change, field, reason):
    content = roundtrip(_counts_request(**change).to_record())
    assert reason in refused(CountsRequest, content, field).reason


def test_counts_reply_without_auc_or_the_requested_metrics_is_malformed():
    refused(CountsReply, RecordDict({"fhe-counts": ArrayRecord({"metrics": bytes_array(b"x")})}), "fhe-counts.auc")
    reply = CountsReply.from_record(roundtrip(CountsReply(b"auc").to_record()), node=NODE)
    assert reply.checked(with_metrics=False, node=NODE) is reply
    with pytest.raises(MalformedMessage) as err:
        reply.checked(with_metrics=True, node=NODE)
    assert err.value.field == "fhe-counts.metrics" and err.value.node == NODE


# --- steps 5-6 ----------------------------------------------------------------------------------
def test_result_request_and_report_round_trip_with_the_wire_layout():
    request = ResultRequest(SESSION, b"masked", b"masked metrics")
    content = roundtrip(request.to_record())
    assert fields(content) == {"fhe": ["session"], "fhe-result": ["auc", "metrics"]}
    assert ResultRequest.from_record(content, node=NODE) == request

    report = ResultReport(True, 0.8125, 0.01, 0.75, float("nan"), 0.5, 0.6)
    content = roundtrip(report.to_record())
    assert fields(content) == {"fhe-report": ["status", "shared", "auc", "resolution-bound", "accuracy",
                                              "precision", "recall", "f1"]}
    back = ResultReport.from_record(content, node=NODE)
    assert (back.shared, back.auc, back.resolution_bound, back.status) == (True, 0.8125, 0.01, "ok")
    assert back.threshold_metrics["accuracy"] == 0.75 and math.isnan(back.threshold_metrics["precision"])
    private = ResultReport.from_record(roundtrip(ResultReport(False).to_record()), node=NODE)
    assert fields(private.to_record()) == {"fhe-report": ["status", "shared"]}
    assert private == ResultReport(False) and private.threshold_metrics is None


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r.__setitem__("status", "failed"), "fhe-report.status"),
    (lambda r: r.__setitem__("shared", 1), "fhe-report.shared"),
    (lambda r: r.__setitem__("auc", 1.5), "fhe-report.auc"),
    (lambda r: r.__setitem__("auc", float("nan")), "fhe-report.auc"),
    (lambda r: r.__setitem__("resolution-bound", -0.1), "fhe-report.resolution-bound"),
    (lambda r: r.__delitem__("recall"), "fhe-report.recall"),
    (lambda r: r.__setitem__("f1", "0.5"), "fhe-report.f1"),
])
def test_malformed_result_report_names_the_field_and_the_node(mutate, field):
    content = ResultReport(True, 0.8, 0.01, 0.7, 0.6, 0.5, 0.4).to_record()
    mutate(content["fhe-report"])
    refused(ResultReport, roundtrip(content), field)


def test_malformed_result_request_is_refused():
    content = ResultRequest(SESSION, b"masked").to_record()
    content["fhe-result"]["auc"] = Array(np.zeros(2, dtype=np.float64))
    assert "dtype float64" in refused(ResultRequest, roundtrip(content), "fhe-result.auc").reason


# --- client and server ----------------------------------------------------------------------------
def _context() -> Context:
    return Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})


def _message(content: RecordDict, message_type: str) -> Message:
    set_serverapp_identity(run_id=1)
    return _roundtrip_message(Message(content=content, dst_node_id=5, message_type=message_type))[0]


def test_client_refuses_without_state_and_a_malformed_request_before_any_work():
    ctx = _context()
    with pytest.raises(Refused, match="step 1 missing"):
        fhe_handlers.serve_keygen(KeygenRequest(SESSION, "tenseal", 31, 64, {}, "malicious"), ctx)
    with pytest.raises(Refused, match="no CKKS secret context"):
        fhe_handlers.serve_result(ResultRequest(SESSION, b"x"), ctx)

    reply = fhe_handlers.decrypt_result(_message(ResultRequest(SESSION, b"x").to_record(), "query.fhe_result"), ctx)
    assert reply.has_error() and reply.error.code == ReplyCode.REFUSED
    assert reply.error.reason.startswith("Refused: no CKKS secret context")
    bad = _counts_request(params=_params(nonce=b"n")).to_record()
    reply = fhe_handlers.encrypt_counts(_message(bad, "evaluate.fhe_counts"), ctx, np.array([0, 1]),
                                        np.array([0.2, 0.8]))
    assert reply.has_error() and reply.error.code == ReplyCode.REFUSED
    assert reply.error.reason.startswith("MalformedMessage: field 'fhe.nonce'")


def test_server_records_a_malformed_reply_as_that_nodes_failure():
    victim = {}

    def fault(node, msg, reply):
        if node == victim["node"] and not reply.has_error():
            reply.content["fhe-pubkey"]["test-size-bucket"] = 48
        return reply

    grid = InProcessGrid(client_app, 3, {"identity-dir": IDENTITY_DIR}, fault=fault)
    victim["node"] = grid.node_ids[1]
    failed = Failures()
    keys = FHEAUCPhase(20).collect_public_keys(grid, sorted(grid.node_ids), secrets.token_hex(16), failed)
    assert sorted(keys) == sorted(n for n in grid.node_ids if n != victim["node"])
    assert list(failed) == [victim["node"]]
    failure = failed[victim["node"]]
    assert failure.code == ReplyCode.MALFORMED_REPLY
    assert f"node {victim['node']}: field 'fhe-pubkey.test-size-bucket'" in failure.reason


# --- the signed participant list (issue 22) -----------------------------------------------------
def test_participant_list_is_canonical_and_every_check_refuses():
    """Sorted roster names with the keys sealed to; party index = position; the digest binds the session."""
    assert LIST.names == ("node-0", "node-1") and LIST.keys == (b"h" * 32, b"p" * 32)
    assert LIST.verify(ROSTER, session=SESSION, holder="node-0", own="node-0", own_key=b"h" * 32) == 0
    assert LIST.digest(SESSION) != LIST.digest("cd" * 16) and len(LIST.digest(SESSION)) == 32
    checks = [
        (dict(session="cd" * 16), "does not verify"),                              # replayed into another session
        (dict(holder="node-1"), "not by the key holder"),                         # signed by someone else
        (dict(own="node-2"), "does not list this node"),                          # without this node
        (dict(own="node-1", own_key=b"x" * 32), "another X25519 key"),            # this node with another key
        (dict(floor=3), "at least 3"),                                            # below the node's floor
    ]
    for change, match in checks:
        kwargs = {"session": SESSION, "holder": "node-0", "own": "node-1", "own_key": b"p" * 32, **change}
        with pytest.raises(IdentityError, match=match):
            LIST.verify(ROSTER, **kwargs)
    # a list the server shortened or reordered no longer verifies
    for names, keys in ((("node-1",), (b"p" * 32,)), (("node-1", "node-0"), (b"p" * 32, b"h" * 32))):
        with pytest.raises(IdentityError):
            ParticipantList(names, keys, LIST.signer, LIST.signature, LIST.protocol).verify(
                ROSTER, session=SESSION, holder="node-0", floor=1)
