"""The xMK-CKKS payloads (flwr_fedeval.protocol.xmk) over Flower's serialization, and their use by both sides."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from identities import IDENTITY_DIR
from xmk_app import flat as _flat
from xmk_app import initial, make_app, plain_fedavg, run

from flwr_fedeval._compat import set_serverapp_identity
from flwr_fedeval.clients.xmkckks import PartialDecryptionRefused, register_xmkckks_handlers
from flwr_fedeval.protocol import MalformedMessage, Refused, ReplyCode, array_bytes, bytes_array, xmk
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg, _RoundState
from flwr_fedeval.testing import InProcessGrid
from flwr_fedeval.testing.grid import _roundtrip_message

RUN_CONFIG = {"fedeval-identity-dir": IDENTITY_DIR}
NODE = 12345678901234567890
KID = "0123456789abcdef" * 2
NAMES = ("node-0", "node-1")


def roundtrip(content: RecordDict) -> RecordDict:
    """``content`` after Flower's protobuf serialization (as on the deployment engine)."""
    set_serverapp_identity(run_id=1)
    msg, _ = _roundtrip_message(Message(content=content, dst_node_id=5, message_type="query.xmk_keygen"))
    return msg.content


PAYLOADS = {
    "keygen-request": xmk.KeygenRequest("xmk-n4096-q108", bytes(range(32)), KID, 3),
    "keygen-reply": xmk.KeygenReply(KID, "node-0", b"\x07" * 32, b"s" * 64),
    "reveal-request": xmk.RevealRequest(KID, 3, NAMES, (b"\x01" * 32, b"\x02" * 32), (b"a" * 64, b"b" * 64), 4,
                                        40, 65536.0, 2, 3, 2, "kahe", 21),
    "reveal-reply": xmk.RevealReply(KID, "node-1", b"b_i bytes", b"\x03" * 32, b"\x04" * 32, b"t" * 64),
    "shares-request": xmk.SharesRequest("xmk-n4096-q108", KID, 3, NAMES, (b"b0", b"b1"),
                                        (b"\x05" * 32, b"\x06" * 32), (b"u" * 64, b"v" * 64)),
    "shares-reply": xmk.SharesReply(KID, "node-0", 3, ("node-1",), (b"sealed box",)),
    "train-request": xmk.TrainRequest("xmk-n4096-q108", KID, 3, NAMES, (b"b0", b"b1"), (b"\x05" * 32, b"\x06" * 32),
                                      (b"u" * 64, b"v" * 64), 2, ("node-1",), (b"sealed box",)),
    "contributors-request": xmk.ContributorsRequest(KID, 3, b"\x08" * 32, NAMES),
    "contributors-reply": xmk.ContributorsReply(KID, "node-0", b"s" * 64),
    "pdec-request": xmk.PdecRequest("xmk-n4096-q108", KID, 3, NAMES, 2, b"C1 polynomials", 2, b"\x08" * 32, NAMES,
                                    (b"s" * 64, b"t" * 64), NAMES, 2),
    "pdec-request-kahe": xmk.PdecRequest("xmk-n4096-q108", KID, 3, NAMES, 2, b"", 2, b"\x08" * 32, NAMES,
                                         (b"s" * 64, b"t" * 64), NAMES, 1, (b"c1 of node-0", b"c1 of node-1"),
                                         (b"u" * 64, b"v" * 64)),
    "pdec-reply": xmk.PdecReply(b"D_i polynomials", (b"seed share",), (b"key share",)),
}

#: The wire format (issue 20 keeps it byte-identical): record → field → value type.
WIRE = {
    "keygen-request": {"xmk": {"params": str, "seed-a": bytes, "key-id": str, "round": int}},
    "keygen-reply": {"xmk": {"key-id": str, "signer": str, "commitment": bytes, "signature": bytes}},
    "reveal-request": {"xmk": {"key-id": str, "round": int, "signers": list, "commitments": list,
                               "signatures": list, "mask-degree": int, "scale-bits": int, "max-abs-value": float,
                               "threshold": int, "limbs": int, "decryption-attempts": int, "bulk": str,
                               "fractional-bits": int}},
    "reveal-reply": {"xmk": {"key-id": str, "signer": str, "public-share": bytes, "mask-key": bytes,
                             "transcript": bytes, "transcript-signature": bytes}},
    "shares-request": {"xmk": {"params": str, "key-id": str, "round": int, "signers": list, "public-shares": list,
                               "mask-keys": list, "transcript-signatures": list}},
    "shares-reply": {"xmk": {"key-id": str, "signer": str, "round": int, "recipients": list,
                             "sealed-shares": list}},
    "train-request": {"xmk": {"params": str, "key-id": str, "round": int, "signers": list, "public-shares": list,
                              "mask-keys": list, "transcript-signatures": list, "num-clients": int,
                              "senders": list, "sealed-shares": list}},
    "contributors-request": {"xmk": {"key-id": str, "round": int, "model-hash": bytes, "contributors": list}},
    "contributors-reply": {"xmk": {"key-id": str, "signer": str, "signature": bytes}},
    "pdec-request": {"xmk": {"params": str, "key-id": str, "round": int, "contributors": list, "num-clients": int,
                             "limbs": int, "model-hash": bytes, "contributor-signers": list,
                             "contributor-signatures": list, "active": list, "attempt": int,
                             "capsule-c1s": list, "capsule-signatures": list},
                     "xmk-c1": {"c1": Array}},
    "pdec-request-kahe": {"xmk": {"params": str, "key-id": str, "round": int, "contributors": list,
                                  "num-clients": int, "limbs": int, "model-hash": bytes, "contributor-signers": list,
                                  "contributor-signatures": list, "active": list, "attempt": int,
                                  "capsule-c1s": list, "capsule-signatures": list}},
    "pdec-reply": {"xmk-share": {"share": Array}, "xmk": {"seed-shares": list, "mask-shares": list}},
}


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_payload_round_trips_through_flowers_serialization_in_the_old_wire_format(name):
    payload = PAYLOADS[name]
    content = payload.to_record()
    assert {k: {f: type(v) for f, v in rec.items()} for k, rec in content.items()} == WIRE[name]
    assert list(content[next(iter(WIRE[name]))].keys()) == list(next(iter(WIRE[name].values())))  # field order
    back = type(payload).from_record(roundtrip(content), node=NODE)
    assert back == payload


def test_train_reply_round_trips_with_its_metrics():
    reply = xmk.TrainReply(b"ciphertext bytes", MetricRecord({"train-loss": 0.25}))
    content = reply.to_record()
    assert list(content.keys()) == ["xmk-ciphertext", "metrics"]
    back = xmk.TrainReply.from_record(roundtrip(content), node=NODE)
    assert back.ciphertext == b"ciphertext bytes" and dict(back.metrics) == {"train-loss": 0.25}
    assert xmk.TrainReply.from_record(roundtrip(xmk.TrainReply(b"c").to_record())).metrics is None


def test_kahe_train_reply_round_trips_with_its_capsule_and_signature():
    reply = xmk.TrainReply(b"kahe ciphertext", MetricRecord({"train-loss": 0.5}), b"capsule bytes", b"s" * 64)
    content = reply.to_record()
    assert list(content.keys()) == ["xmk-ciphertext", "xmk-capsule", "xmk", "metrics"]
    back = xmk.TrainReply.from_record(roundtrip(content), node=NODE)
    assert bytes(back.ciphertext) == b"kahe ciphertext" and back.capsule == b"capsule bytes"
    assert back.capsule_signature == b"s" * 64


def test_pdec_request_with_both_c1_and_capsules_or_misaligned_capsules_is_malformed():
    content = PAYLOADS["pdec-request-kahe"].to_record()
    content["xmk-c1"] = ArrayRecord({"c1": bytes_array(b"C1")})
    with pytest.raises(MalformedMessage, match="either C1 or"):
        xmk.PdecRequest.from_record(content)
    content = PAYLOADS["pdec-request-kahe"].to_record()
    content["xmk"]["capsule-c1s"] = [b"only one"]
    content["xmk"]["capsule-signatures"] = [b"s" * 64]
    with pytest.raises(MalformedMessage, match="one capsule c1 per contributor"):
        xmk.PdecRequest.from_record(content)


def _set(record, field, value):
    return lambda c: c[record].__setitem__(field, value)


@pytest.mark.parametrize("name, mutate, field, reason", [
    ("keygen-request", _set("xmk", "seed-a", b"x" * 31), "xmk.seed-a", "31 bytes, expected 32"),
    ("keygen-request", _set("xmk", "round", True), "xmk.round", "expected int"),
    ("keygen-request", _set("xmk", "round", -1), "xmk.round", "below 0"),
    ("keygen-reply", _set("xmk", "commitment", b"h" * 31), "xmk.commitment", "expected 32"),
    ("keygen-reply", lambda c: c["xmk"].__delitem__("signer"), "xmk.signer", "missing"),
    ("reveal-request", _set("xmk", "signatures", [b"a" * 64]), "xmk.signatures", "must align"),
    ("reveal-request", _set("xmk", "commitments", [b"\x01" * 32, b"\x02" * 31]), "xmk.commitments", "32 long"),
    ("reveal-request", _set("xmk", "mask-degree", 2.5), "xmk.mask-degree", "integer >= 0"),
    ("reveal-request", lambda c: c["xmk"].__delitem__("mask-degree"), "xmk.mask-degree", "missing"),
    ("reveal-reply", _set("xmk", "mask-key", b"k" * 31), "xmk.mask-key", "expected 32"),
    ("reveal-reply", _set("xmk", "transcript", "T"), "xmk.transcript", "expected bytes"),
    ("train-request", _set("xmk", "public-shares", [b"b0"]), "xmk.public-shares", "must align"),
    ("train-request", _set("xmk", "mask-keys", [b"\x05" * 32, b"\x06" * 33]), "xmk.mask-keys", "32 long"),
    ("reveal-request", _set("xmk", "max-abs-value", float("nan")), "xmk.max-abs-value", "not finite"),
    ("reveal-request", _set("xmk", "scale-bits", 0), "xmk.scale-bits", "below 1"),
    ("reveal-request", _set("xmk", "threshold", 0), "xmk.threshold", "below 1"),
    ("train-request", _set("xmk", "sealed-shares", [b"box", b"box"]), "xmk.sealed-shares", "must align"),
    ("contributors-request", _set("xmk", "model-hash", b"h" * 31), "xmk.model-hash", "expected 32"),
    ("train-request", _set("xmk", "signers", [0, 1]), "xmk.signers", "list of str"),
    ("pdec-request", lambda c: c.__delitem__("xmk-c1"), "xmk-c1", "record missing"),
    ("pdec-request", _set("xmk-c1", "c1", Array(np.zeros(3, dtype=np.uint16))), "xmk-c1.c1", "dtype uint16"),
    ("pdec-request", _set("xmk", "contributors", [1, 2]), "xmk.contributors", "list of str"),
    ("pdec-request", _set("xmk", "attempt", 0), "xmk.attempt", "below 1"),
    ("pdec-request", lambda c: c["xmk"].__delitem__("attempt"), "xmk.attempt", "missing"),
    ("pdec-reply", _set("xmk-share", "share", Array(np.zeros((2, 2), dtype=np.uint8))), "xmk-share.share",
     "shape (2, 2)"),
])
def test_malformed_field_names_the_field_and_the_node(name, mutate, field, reason):
    payload = PAYLOADS[name]
    content = roundtrip(payload.to_record())
    mutate(content)
    with pytest.raises(MalformedMessage) as err:
        type(payload).from_record(content, node=NODE)
    assert err.value.field == field and err.value.node == NODE and reason in err.value.reason
    assert str(err.value).startswith(f"node {NODE}: field {field!r}")


def test_malformed_train_reply_names_the_node():
    content = roundtrip(xmk.TrainReply(b"c", MetricRecord({"a": 1.0})).to_record())
    content["xmk-ciphertext"]["ciphertext"] = Array(np.zeros(4, dtype=np.float64))
    with pytest.raises(MalformedMessage, match=rf"^node {NODE}: field 'xmk-ciphertext.ciphertext': dtype float64"):
        xmk.TrainReply.from_record(content, node=NODE)
    content = RecordDict({"xmk-ciphertext": ArrayRecord({"ciphertext": bytes_array(b"c")}),
                          "metrics": ConfigRecord({"a": 1.0})})
    with pytest.raises(MalformedMessage) as err:
        xmk.TrainReply.from_record(content, node=NODE)
    assert (err.value.field, err.value.node) == ("metrics", NODE)


def test_step_table_and_the_registration_idiom():
    assert [s.message_type for s in xmk.STEPS] == ["query.xmk_keygen", "query.xmk_reveal", "query.xmk_shares",
                                                   "train", "query.xmk_contributors", "query.xmk_pdec"]
    assert [(s.request, s.reply) for s in xmk.STEPS] == [
        (xmk.KeygenRequest, xmk.KeygenReply), (xmk.RevealRequest, xmk.RevealReply),
        (xmk.SharesRequest, xmk.SharesReply), (xmk.TrainRequest, xmk.TrainReply),
        (xmk.ContributorsRequest, xmk.ContributorsReply), (xmk.PdecRequest, xmk.PdecReply)]
    assert isinstance(xmk.TRAIN, xmk.ModStep) and xmk.TRAIN.action == "train" and xmk.TRAIN.handler_name == ""
    with pytest.raises(ValueError, match="mod step"):
        xmk.ModStep("bad", "train.x", "client")
    registered = {}

    class _App:  # records what the idiom registers, as flwr.clientapp.ClientApp would
        def query(self, name):
            return lambda fn: registered.setdefault(name, fn.__name__)

    register_xmkckks_handlers(_App())
    assert registered == {"xmk_keygen": "serve_xmk_keygen", "xmk_reveal": "serve_xmk_reveal",
                          "xmk_shares": "serve_xmk_shares", "xmk_contributors": "serve_xmk_contributors",
                          "xmk_pdec": "serve_xmk_pdec"}
    assert PartialDecryptionRefused is Refused


def test_array_bytes_is_the_checked_inverse_of_bytes_array():
    assert array_bytes(ArrayRecord({"b": bytes_array(b"\x00\xffab")}), "r", "b") == b"\x00\xffab"
    for bad in (np.zeros(2, dtype=np.uint16), np.zeros((2, 2), dtype=np.uint8)):
        with pytest.raises(ValueError, match="dtype uint16|shape"):
            array_bytes(ArrayRecord({"b": Array(bad)}), "r", "b")


# ------------------------------------------------------------------ both sides, over the serializing grid
def test_client_answers_a_malformed_request_with_an_error_naming_the_field():
    grid = InProcessGrid(make_app(), 2, RUN_CONFIG)
    node = grid.node_ids[0]
    content = xmk.KeygenRequest("xmk-n4096-q108", bytes(32), KID, 1).to_record()
    content["xmk"]["seed-a"] = b"x" * 31
    (reply,) = grid.send_and_receive([Message(content, dst_node_id=node, message_type="query.xmk_keygen")])
    assert reply.has_error() and reply.error.code == ReplyCode.REFUSED
    assert reply.error.reason == "MalformedMessage: field 'xmk.seed-a': 31 bytes, expected 32"
    # a refusal of the protocol (no key set) is the one Refused, with its code
    pdec = xmk.PdecRequest("xmk-n4096-q108", KID, 1, NAMES, 2, b"c1", 2).to_record()
    (reply,) = grid.send_and_receive([Message(pdec, dst_node_id=node, message_type="query.xmk_pdec")])
    assert reply.error.code == ReplyCode.REFUSED and reply.error.reason == f"Refused: no key for key set {KID!r}"


def _strategy(num_nodes, **kw):
    return XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=num_nodes, max_abs_value=1e4, **kw)


def test_server_counts_a_malformed_reply_against_its_node_and_reruns_without_it():
    bad = {}

    def fault(node, msg, reply):
        if node == bad["node"] and msg.metadata.message_type == "query.xmk_keygen":
            reply.content["xmk"]["commitment"] = b"h" * 31
        return reply

    grid = InProcessGrid(make_app(), 3, RUN_CONFIG, fault=fault)
    bad["node"] = grid.node_ids[1]
    strategy = _strategy(3)
    result = run(grid, strategy)
    (_, exc), = strategy.aborted_attempts
    assert exc.step == "key generation" and list(exc.failed) == [bad["node"]]
    failure = exc.failures[bad["node"]]
    assert failure.code == ReplyCode.MALFORMED_REPLY
    assert f"node {bad['node']}: field 'xmk.commitment': 31 bytes, expected 32" in failure.reason
    assert "MALFORMED_REPLY" in exc.failed[bad["node"]]
    assert np.max(np.abs(_flat(result.arrays.to_numpy_ndarrays()) - plain_fedavg(initial(), [0, 2], 1))) <= 1e-6


def test_train_replies_are_checked_by_the_shared_exchange_with_their_codes():
    """Step 2's replies come from Flower's Strategy.start: an error reply the SuperLink sends (sender 0) is
    still its node's, with Flower's code; a missing one is a timeout of the train step. Both nodes are left
    out of the contributor set (issue 21: no retry) and the round completes over the other three."""
    victims = {}

    def fault(node, msg, reply):
        if msg.metadata.message_type == "train" and node == victims["gone"]:
            error = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node offline"), reply_to=msg)
            error.metadata.__dict__["_src_node_id"] = 0
            return error
        if msg.metadata.message_type == "train" and node == victims["silent"]:
            return None
        return reply

    grid = InProcessGrid(make_app(), 5, RUN_CONFIG, fault=fault)
    victims.update(gone=grid.node_ids[0], silent=grid.node_ids[3])
    strategy = _strategy(5)
    result = run(grid, strategy)
    assert not strategy.aborted_attempts
    (_, failed), = strategy.left_out
    assert set(failed) == {victims["gone"], victims["silent"]}
    gone = failed[victims["gone"]]
    assert "node offline" in gone and f"code {ErrorCode.NODE_UNAVAILABLE}" in gone
    assert f"code {int(ReplyCode.TIMEOUT)}" in failed[victims["silent"]]
    assert "within the train timeout" in failed[victims["silent"]]
    assert np.max(np.abs(_flat(result.arrays.to_numpy_ndarrays()) - plain_fedavg(initial(), [1, 2, 4], 1))) <= 1e-6


def test_round_state_has_one_accessor_with_a_clear_error():
    strategy = _strategy(2)
    with pytest.raises(RuntimeError, match="no round in progress"):
        strategy.train_messages(None)
    strategy._round = _RoundState(4, ArrayRecord(initial()), ConfigRecord({}), grid=None)
    with pytest.raises(RuntimeError, match="round 4 has no key set"):
        strategy.partial_decryptions(None, b"", [], {})
