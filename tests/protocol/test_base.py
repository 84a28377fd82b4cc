"""The typed message layer's common part (flwr_fedeval.protocol._base), over Flower's serialization."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flwr_fedeval._compat import set_serverapp_identity
from flwr_fedeval.protocol import (
    MalformedMessage,
    Payload,
    Refused,
    ReplyCode,
    Step,
    array_bytes,
    array_bytes_view,
    array_field,
    array_record,
    bytes_array,
    config_bytes,
    config_field,
    config_list,
    config_record,
    handler,
    register,
)
from flwr_fedeval.testing.grid import _roundtrip_message


@dataclasses.dataclass(frozen=True)
class _Ping(Payload):
    LABEL = "ping"
    KEY = "ping"
    session: str
    key: bytes
    values: np.ndarray

    def _to_record(self) -> RecordDict:
        return RecordDict({self.KEY: ConfigRecord({"session": self.session, "key": self.key}),
                           "ping-data": ArrayRecord({"values": bytes_array(self.values.tobytes())})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> _Ping:
        rec = config_record(content, cls.KEY)
        data = array_record(content, "ping-data")
        return cls(config_field(rec, cls.KEY, "session", str), config_bytes(rec, cls.KEY, "key", length=32),
                   np.frombuffer(array_bytes(data, "ping-data", "values", max_length=64), dtype=np.uint8))


STEP = Step("step 1 (ping)", "query.ping", "client", _Ping, _Ping)


def test_payload_round_trips_through_flowers_serialization():
    ping = _Ping("s1", bytes(range(32)), np.arange(5, dtype=np.uint8))
    back = _Ping.from_record(roundtrip(ping.to_record()), node=7)
    assert back.session == "s1" and back.key == ping.key and back.values.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("mutate, field", [
    (lambda c: c["ping"].__setitem__("key", b"x" * 31), "ping.key"),
    (lambda c: c["ping"].__setitem__("session", 3), "ping.session"),
    (lambda c: c["ping"].__delitem__("session"), "ping.session"),
    (lambda c: c.__delitem__("ping-data"), "ping-data"),
    (lambda c: c["ping-data"].__setitem__("values", bytes_array(b"y" * 65)), "ping-data.values"),
])
def test_malformed_field_names_the_field_and_the_node(mutate, field):
    content = _Ping("s1", bytes(32), np.zeros(2, dtype=np.uint8)).to_record()
    mutate(content)
    with pytest.raises(MalformedMessage) as err:
        _Ping.from_record(content, node=12345678901234567890)
    assert err.value.field == field and err.value.node == 12345678901234567890
    assert str(err.value).startswith("node 12345678901234567890: field")


def test_checked_fields():
    rec = ConfigRecord({"b": True, "i": 3, "f": float("nan"), "l": [b"ab", b"cd"]})
    with pytest.raises(MalformedMessage, match="expected int"):
        config_field(rec, "k", "b", int)  # a bool is not an int
    assert config_field(rec, "k", "i", int, minimum=0, maximum=3) == 3
    with pytest.raises(MalformedMessage, match="above"):
        config_field(rec, "k", "i", int, maximum=2)
    with pytest.raises(MalformedMessage, match="not finite"):
        config_field(rec, "k", "f", float)
    assert config_list(rec, "k", "l", bytes, length=2, item_length=2) == [b"ab", b"cd"]
    with pytest.raises(MalformedMessage, match="3 items, expected|2 items, expected 3"):
        config_list(rec, "k", "l", bytes, length=3)
    arrays = ArrayRecord({"a": bytes_array(b"abc")})
    with pytest.raises(MalformedMessage, match="dtype uint8, expected float64"):
        array_field(arrays, "k", "a", dtype=np.float64)
    with pytest.raises(MalformedMessage, match=r"shape \(3,\), expected \(4,\)"):
        array_field(arrays, "k", "a", dtype=np.uint8, shape=(4,))


def test_step_table_rows_and_the_one_registration_idiom():
    with pytest.raises(ValueError, match="message type"):
        Step("bad", "ping", "client")
    assert (STEP.action, STEP.handler_name) == ("query", "ping")

    registered = {}

    class _App:  # records what the idiom registers, as flwr.clientapp.ClientApp would
        def query(self, name):
            return lambda fn: registered.setdefault(("query", name), fn)

    serve = handler(STEP, lambda req, msg, ctx: req.replace(session=req.session + "!"), label="ping")
    register(_App(), [STEP], {STEP.message_type: serve})
    assert registered == {("query", "ping"): serve}
    with pytest.raises(ValueError, match="missing"):
        register(_App(), [STEP], {})


def _message(content: RecordDict) -> Message:
    set_serverapp_identity(run_id=1)
    msg, _ = _roundtrip_message(Message(content=content, dst_node_id=5, message_type="query.ping"))
    return msg


def roundtrip(content: RecordDict) -> RecordDict:
    """``content`` after Flower's protobuf serialization (as on the deployment engine)."""
    return _message(content).content


def test_handler_replies_payload_refusal_and_malformed_request():
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    ok = handler(STEP, lambda req, msg, c: req.replace(session="pong"), label="ping")
    good = _Ping("s", bytes(32), np.zeros(1, dtype=np.uint8)).to_record()
    reply = ok(_message(good), ctx)
    assert not reply.has_error() and _Ping.from_record(reply.content).session == "pong"

    def refuse(req, msg, c):
        raise Refused("policy says no (node config fedeval-x)", code=ReplyCode.BUDGET_EXHAUSTED)

    reply = handler(STEP, refuse, label="ping")(_message(good), ctx)
    assert reply.has_error() and reply.error.code == ReplyCode.BUDGET_EXHAUSTED
    assert reply.error.reason.startswith("Refused: policy says no")
    bad = RecordDict({"ping": ConfigRecord({"session": "s"})})
    reply = ok(_message(bad), ctx)
    assert reply.has_error() and reply.error.code == ReplyCode.REFUSED and "MalformedMessage" in reply.error.reason


@pytest.mark.parametrize("size", [0, 1, 7, 70_001])
def test_bytes_array_is_flowers_serialization_and_the_view_reads_it_without_a_copy(size):
    data = bytes(np.arange(size, dtype=np.uint64).astype(np.uint8))
    ours, flowers = bytes_array(data), Array(np.frombuffer(data, dtype=np.uint8).copy())
    fields = ("data", "dtype", "shape", "stype")
    assert [getattr(ours, f) for f in fields] == [getattr(flowers, f) for f in fields]
    record = ArrayRecord({"a": ours})
    view = array_bytes_view(record, "k", "a")
    assert isinstance(view, memoryview) and view.readonly and view.obj is ours.data  # the record's own buffer
    assert view == data == array_bytes(record, "k", "a")


@pytest.mark.parametrize("array, match", [
    (Array(np.zeros(3, dtype=np.float64)), "dtype float64, expected uint8"),
    (Array(np.zeros((2, 2), dtype=np.uint8)), r"shape \(2, 2\), expected"),
    (Array(dtype="uint8", shape=(4,), stype="numpy.ndarray", data=bytes_array(b"abcd").data[:-1]), "payload bytes"),
    (Array(dtype="uint8", shape=(4,), stype="numpy.ndarray", data=bytes_array(b"abcd").data + b"e"), "payload bytes"),
    (Array(dtype="uint8", shape=(4,), stype="numpy.ndarray", data=b"not an npy file"), "not a numpy array"),
])
def test_array_bytes_view_refuses_what_array_bytes_refuses(array, match):
    record = ArrayRecord({"a": array})
    with pytest.raises(MalformedMessage, match=match):
        array_bytes_view(record, "k", "a")
    with pytest.raises(MalformedMessage, match="missing"):
        array_bytes_view(record, "k", "b")
