"""The SecSV messages (flwr_fedeval.protocol.secsv): every payload through Flower's serialization,
malformed fields named with the node, the wire format pinned, and malformed hello replies over the
serializing grid."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp

from flwr_fedeval._compat import set_serverapp_identity
from flwr_fedeval.identity import SignedKey
from flwr_fedeval.protocol import (
    MalformedMessage,
    ReplyCode,
    bytes_array,
    register,
    secsv,
)
from flwr_fedeval.shapley.secsv import SecSVParams
from flwr_fedeval.shapley.sharing import LABEL_PRIME
from flwr_fedeval.shapley.zerotest import PDeal
from flwr_fedeval.testing.grid import _roundtrip_message

NODE = 18446744073709551557          # a node ID above the int64 range, as the deployment engine assigns
PUBLIC = secsv.PublicParams("a1b2", SecSVParams.for_bounds(n_features=5, max_clients=3), m=4096, d_out=1, n_classes=2)
PK = bytes(range(32))
LEADER = SignedKey("node-0", PK, b"\x30" * 70)
AUX = SignedKey("node-3", bytes(range(1, 33)), b"\x31" * 71)
KEYS = secsv.KeySet.of({11: LEADER, 12: SignedKey("node-2", bytes(range(2, 34)), b"s2")})
IDS = np.array([0, 5, 7], dtype=np.int64)

SAMPLES = {
    "role-request": secsv.RoleRequest("f00d"),
    "role-reply": secsv.RoleReply("client", (1, 3), "node-1", b"sig", None),
    "hello-request": secsv.HelloRequest("a1b2"),
    "hello-reply": secsv.HelloReply("client", PK, "node-1", b"sig", 80, 30, 5, 2, (1, 2)),
    "hello-reply-aux": secsv.HelloReply("shapley-aux", PK, "node-3", b"sig"),
    "keygen-request": secsv.KeygenRequest(dataclasses.replace(PUBLIC, m=None, d_out=None, n_classes=None), KEYS),
    "keygen-reply": secsv.KeygenReply(b"ctx" * 10, {"12": b"bundle"}, "node-0", b"sig"),
    "share-request": secsv.ShareRequest(PUBLIC, LEADER, AUX, b"sealed"),
    "share-request-leader": secsv.ShareRequest(PUBLIC, LEADER, AUX),
    "share-reply": secsv.ShareReply(np.arange(12, dtype=np.uint64).reshape(2, 6), np.array([1, 0], dtype=np.uint64),
                              b"for A"),
    "aux-setup-request": secsv.AuxSetupRequest(dataclasses.replace(PUBLIC, m=None, d_out=None, n_classes=None),
                                         ("11", "12"), b"ctx", {"11": b"s11", "12": b"s12"}, KEYS),
    "aux-setup-reply": secsv.AuxSetupReply(120),
    "models-request": secsv.ModelsRequest(PUBLIC, 2, 255),
    "models-reply": secsv.ModelsReply(b"cts" * 5, "node-1", b"sig"),
    "aux-eval-request": secsv.AuxEvalRequest(PUBLIC, 1, {0: (np.array([0, 2], dtype=np.int64), IDS),
                                                   1: (np.array([1], dtype=np.int64), IDS[:1])},
                                       {"11": b"m11", "12": b"m12"}, {"11": b"s11", "12": b"s12"}),
    "aux-eval-reply": secsv.AuxEvalReply({0: (b"p0", b"s0"), 1: (b"p1", b"s1")}),
    "helper-request": secsv.HelperRequest(PUBLIC, AUX.key, 2, {3: (b"o3", b"a3", IDS, ("11", "12"), b"s3"),
                                                               10: (b"o10", b"a10", IDS[:1], ("12",), b"s10")}),
    "helper-reply": secsv.HelperReply({3: (PDeal(*(np.array([1, 2, 3], dtype=np.uint64) + i for i in range(3))),
                                           b"a3")}),
    "aux-diff-request": secsv.AuxDiffRequest(dataclasses.replace(PUBLIC, m=None, d_out=None, n_classes=None),
                                       {0: (b"sealed0", IDS, PK, np.array([7, 8, 9], dtype=np.uint64))}),
    "aux-diff-reply": secsv.AuxDiffReply({0: (np.array([4, 5, 6], dtype=np.uint64),
                                              np.array([0, 1, 2], dtype=np.uint64))}),
}


def roundtrip(content: RecordDict) -> RecordDict:
    """``content`` after Flower's protobuf serialization (as on the deployment engine)."""
    set_serverapp_identity(run_id=1)
    msg, _ = _roundtrip_message(Message(content=content, dst_node_id=5, message_type="query.shapley_hello"))
    return msg.content


def _same(a, b) -> bool:
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_payload_round_trips_through_flowers_serialization(name):
    payload = SAMPLES[name]
    back = type(payload).from_record(roundtrip(payload.to_record()), node=NODE)
    assert _same(payload, back), (payload, back)
    assert not _same(payload, SAMPLES["hello-request"] if name != "hello-request" else SAMPLES["role-request"])


def test_every_step_has_its_payloads_and_the_wire_names():
    types = [s.message_type for s in secsv.STEPS]
    assert types == ["query.fedeval_role", "query.shapley_hello", "query.shapley_keygen", "query.shapley_share",
                     "query.shapley_aux_setup", "query.shapley_models", "query.shapley_aux_eval",
                     "query.shapley_helper", "query.shapley_aux_diff"]
    covered = {type(p) for p in SAMPLES.values()}
    assert all(s.request in covered and s.reply in covered for s in secsv.STEPS)
    registered = []

    class _App(ClientApp):
        def query(self, name=None):
            return lambda fn: registered.append(name)

    register(_App(), secsv.STEPS, {s.message_type: (lambda m, c: m) for s in secsv.STEPS})
    assert registered == [s.handler_name for s in secsv.STEPS]


def test_wire_format_is_pinned():
    hello = SAMPLES["hello-reply"].to_record()
    assert list(hello.keys()) == ["shapley-hello"]
    assert list(hello["shapley-hello"].keys()) == ["role", "public-key", "signer", "signature", "num-examples",
                                                   "num-test", "n-features", "n-classes", "rounds"]
    share = SAMPLES["share-request"].to_record()
    assert list(share.keys()) == ["shapley", "shapley-bundle"]
    assert list(share["shapley"].keys()) == [
        "session", "ring-bits", "data-frac-bits", "model-frac-bits", "limb-bits", "weight-bits", "model-bound",
        "feature-bound", "max-clients", "n-features", "m", "d-out", "n-classes", "leader-public-key",
        "leader-signer", "leader-signature", "aux-public-key", "aux-signer", "aux-signature"]
    setup = SAMPLES["aux-setup-request"].to_record()
    assert list(setup.keys()) == ["shapley", "shapley-context", "shapley-aux-shares", "shapley-aux-keys",
                                  "shapley-aux-keys-signers", "shapley-aux-keys-signatures"]
    assert list(setup["shapley-aux-shares"].keys()) == ["sealed-11", "sealed-12"]
    jobs = SAMPLES["aux-eval-request"].to_record()
    assert list(jobs["shapley-jobs"].keys()) == ["members-0", "ids-0", "members-1", "ids-1"]
    assert jobs["shapley-jobs"]["ids-0"].numpy().dtype == np.int64
    helper = SAMPLES["helper-request"].to_record()["shapley-batches"]
    assert list(helper.keys()) == ["own-3", "aux-3", "ids-3", "own-10", "aux-10", "ids-10"]
    assert helper["ids-3"].numpy().tolist() == IDS.tolist()
    role = SAMPLES["role-reply"].to_record()["role"]
    assert dict(role) == {"role": "client", "partition-id": 1, "num-partitions": 3, "signer": "node-1",
                          "signature": b"sig"}


def _set(key, field, value):
    return lambda c: c[key].__setitem__(field, value)


def _del(key, field=None):
    return (lambda c: c[key].__delitem__(field)) if field else (lambda c: c.__delitem__(key))


MALFORMED = [
    ("role-request", _set("role", "nonce", 5), "role.nonce"),
    ("role-reply", _set("role", "role", "server"), "role.role"),
    ("role-reply", _set("role", "signature", "not bytes"), "role.signature"),
    ("hello-request", _set("shapley", "session", ""), "shapley.session"),
    ("hello-reply", _set("shapley-hello", "public-key", PK[:31]), "shapley-hello.public-key"),
    ("hello-reply", _del("shapley-hello", "num-test"), "shapley-hello.num-test"),
    ("hello-reply", _set("shapley-hello", "rounds", []), "shapley-hello.rounds"),
    ("keygen-request", _set("shapley-peers", "12", b"short"), "shapley-peers.12"),
    ("keygen-request", _set("shapley-peers-signers", "12", 7), "shapley-peers-signers.12"),
    ("keygen-request", _set("shapley", "ring-bits", 2.5), "shapley.ring-bits"),
    ("keygen-reply", _del("shapley-leader"), "shapley-leader"),
    ("keygen-reply", _set("shapley-bundles", "node-12", bytes_array(b"x")), "shapley-bundles.node-12"),
    ("share-request", _set("shapley", "aux-public-key", PK + b"!"), "shapley.aux-public-key"),
    ("share-request", _del("shapley", "m"), "shapley.m"),
    ("share-reply", lambda c: c.__setitem__("shapley-share", ConfigRecord({"x": 1})), "shapley-share"),
    ("share-reply", _set("shapley-share", "y", bytes_array(b"abc")), "shapley-share.y"),
    ("share-reply", _set("shapley-share", "x", bytes_array(b"abc")), "shapley-share.x"),
    ("aux-setup-request", _del("shapley-aux-shares", "sealed-12"), "shapley-aux-shares"),
    ("aux-setup-request", _set("shapley", "order", [11, 12]), "shapley.order"),
    ("aux-setup-reply", _set("shapley-aux", "samples", -1), "shapley-aux.samples"),
    ("models-request", _set("shapley", "weight", 0), "shapley.weight"),
    ("models-reply", _set("shapley-model", "cts", Array(np.zeros(3))), "shapley-model.cts"),
    ("models-reply", _del("shapley-model-signature", "signature"), "shapley-model-signature.signature"),
    ("aux-eval-request", _set("shapley-round-models-signatures", "12", "not bytes"),
     "shapley-round-models-signatures.12"),
    ("aux-eval-request", _del("shapley-jobs", "ids-1"), "shapley-jobs.ids-1"),
    ("aux-eval-request", _set("shapley-jobs", "ids-0", Array(IDS.astype(np.int32))),
     "shapley-jobs.ids-0"),
    ("aux-eval-reply", _set("shapley-products", "extra", bytes_array(b"?")), "shapley-products.extra"),
    ("aux-eval-reply", _del("shapley-products-signatures", "sig-1"), "shapley-products-signatures"),
    ("helper-request", _set("shapley-batches", "ids-3", Array(np.zeros(0, np.int64))),
     "shapley-batches.ids-3"),
    ("helper-request", _set("shapley-batch-proofs", "members-10", ["node-12"]), "shapley-batch-proofs.members-10"),
    ("helper-reply", _del("shapley-pred", "a-3"), "shapley-pred.a-3"),
    ("helper-reply", _set("shapley-pred", "u-3", Array(np.array([1, 2, LABEL_PRIME], np.uint64))),
     "shapley-pred.u-3"),
    ("share-reply", _set("shapley-share", "y", Array(np.array([1, LABEL_PRIME], np.uint64))), "shapley-share.y"),
    ("aux-diff-request", _set("shapley-preds", "e-0", Array(np.array([1, 2], np.uint64))), "shapley-preds.e-0"),
    ("aux-diff-request", _set("shapley-helper-keys", "helper-0", PK[:31]), "shapley-helper-keys.helper-0"),
    ("aux-diff-request", _del("shapley-helper-keys", "helper-0"), "shapley-helper-keys"),
    ("aux-diff-reply", _set("shapley-diffs", "z-0", Array(np.zeros((3, 1), np.uint64))),
     "shapley-diffs.z-0"),
    ("aux-diff-reply", _set("shapley-diffs", "f-0", Array(np.array([0, 0, LABEL_PRIME + 5], np.uint64))),
     "shapley-diffs.f-0"),
]


@pytest.mark.parametrize("name, mutate, field", MALFORMED, ids=[f"{n}:{f}" for n, _, f in MALFORMED])
def test_malformed_field_names_the_field_and_the_node(name, mutate, field):
    payload = SAMPLES[name]
    content = roundtrip(payload.to_record())
    mutate(content)
    with pytest.raises(MalformedMessage) as err:
        type(payload).from_record(roundtrip(content), node=NODE)
    assert err.value.field == field and err.value.node == NODE
    assert str(err.value).startswith(f"node {NODE}: field '{field}'")


def test_every_payload_has_a_malformed_case():
    assert {type(SAMPLES[n]) for n, _, _ in MALFORMED} == {type(p) for p in SAMPLES.values()}


def test_role_request_without_a_nonce_and_key_set_without_signatures():
    assert secsv.RoleRequest.from_record(RecordDict()).nonce is None
    assert secsv.RoleRequest.from_record(roundtrip(RecordDict({"role": ConfigRecord({})}))).nonce is None
    content = roundtrip(SAMPLES["keygen-request"].to_record())
    del content["shapley-peers-signatures"]
    peers = secsv.KeygenRequest.from_record(content, node=NODE).peers
    assert peers.keys == KEYS.keys and peers.signatures == {}
    with pytest.raises(ValueError, match="not signed"):          # an IdentityError: refused, not malformed
        peers.entries()


# --- malformed hello replies over the serializing grid ------------------------------------------------
sys.path.insert(0, str(Path(__file__).parents[1] / "shapley_flower"))
from test_secsv_phase import make_grid, train_two_rounds  # noqa: E402

from flwr_fedeval.strategies.shapley_phase import SecSVPhase, ShapleyPhaseError  # noqa: E402


def test_malformed_hello_replies_are_refused_naming_the_node():
    grid = make_grid()
    aux = train_two_rounds(grid)
    lacking, short = [n for n in grid.node_ids if n != aux][:2]

    def fault(node, msg, reply):
        if msg.metadata.message_type == secsv.HELLO.message_type and not reply.has_error():
            if node == lacking:
                del reply.content[secsv.HELLO_KEY]["num-test"]
            elif node == short:
                reply.content[secsv.HELLO_KEY]["public-key"] = reply.content[secsv.HELLO_KEY]["public-key"][:31]
        return reply

    grid.fault = fault
    phase = SecSVPhase()
    with pytest.raises(ShapleyPhaseError) as info:
        phase.run(grid, ArrayRecord())
    assert info.value.step == "hello" and set(info.value.failed) == {lacking, short}
    assert {phase.failures[n].code for n in (lacking, short)} == {ReplyCode.MALFORMED_REPLY}
    why = info.value.failed
    assert f"node {lacking}: field 'shapley-hello.num-test': missing" in why[lacking]
    assert f"node {short}: field 'shapley-hello.public-key': 31 bytes, expected 32" in why[short]
    assert all("MalformedMessage" in why[n] for n in why)
    # nothing went past hello: no key generation was asked for
    assert not any(t == secsv.KEYGEN.message_type for _, t, _ in grid.log)
