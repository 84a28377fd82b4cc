"""The typed message layer's common part: step tables, payload dataclasses, checked fields,
the one client-side refusal and the one registration idiom.

Every protocol module (:mod:`flwr_fedeval.protocol.xmk`, ``fhe_auc``, ``dp_auc``,
``secsv``, ``auc``) declares, for each protocol step, a :class:`Step` (message type,
who answers it, the request and reply payload types) and one frozen dataclass per
payload (a :class:`Payload`) with ``to_record()`` and ``from_record()``. The server
builds its requests and parses its replies through those classes, the client handlers
parse their requests and build their replies through the same classes, so a record
field name is written in exactly one module (the payload's), and a malformed record is
refused at the edge with one :class:`MalformedMessage` naming the field and the node
(as scikit-learn's ``check_array`` refuses bad input before any arithmetic).

Anchors: Flower's SecAgg+ keeps its vocabulary in ``secaggplus_constants.py`` (a ``Key``
class, a ``Stage`` list, ``check_configs``); Lattigo's ``multiparty`` share types carry
their own binary encoding. This layer keeps both habits: the vocabulary is the payload
classes, the stage list is the step table, and the encoding lives with the type.

The wire format is Flower's records: bytes and Python scalars in ``ConfigRecord``s,
numpy arrays (never object arrays) in ``ArrayRecord``s, so every message survives the
deployment engine's serialization.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import IntEnum
from logging import WARNING
from typing import Any, ClassVar, TypeVar, overload

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.common.constant import SType
from flwr.common.logger import log

__all__ = [
    "ARRAYS_KEY",
    "CONFIG_KEY",
    "METRICS_KEY",
    "MalformedMessage",
    "MESSAGE_API_GUIDE",
    "NotConfigured",
    "Payload",
    "Refused",
    "ReplyCode",
    "Step",
    "array_bytes",
    "array_bytes_view",
    "array_field",
    "array_record",
    "bytes_array",
    "config_bytes",
    "config_keys_of",
    "config_field",
    "config_list",
    "config_of",
    "config_record",
    "error_reply",
    "handler",
    "register",
    "reply_code",
    "require_message_api",
]

#: Flower's default record keys (``FedAvg(arrayrecord_key=..., configrecord_key=...)``): the
#: model's ArrayRecord, the train config and the reply's MetricRecord.
ARRAYS_KEY = "arrays"
CONFIG_KEY = "config"
METRICS_KEY = "metrics"

P = TypeVar("P", bound="Payload")


class ReplyCode(IntEnum):
    """Machine-readable codes of failures (``flwr.app.Error.code``).

    Our client handlers send the first four in their error replies
    (:func:`error_reply`); the server assigns the others itself. The server
    classifies failures by these codes, never by the reason text. They start
    at 1000 so that they never collide with Flower's own
    ``flwr.common.constant.ErrorCode`` values (0-99), which the engines use for
    errors they report (e.g. an exception a ClientApp raised).
    """

    #: The node will not serve the request (wrong session, missing state,
    #: values out of the public bounds, malformed bytes, bad configuration).
    REFUSED = 1000
    #: The node's differential-privacy budget cannot pay for the request.
    BUDGET_EXHAUSTED = 1001
    #: A verification of the malicious FHE AUC protocol failed on the node.
    TAMPERING_DETECTED = 1002
    #: The pooled test data has a single class: the AUC is undefined.
    UNDEFINED_AUC = 1003
    #: No retries: the node already contributed for this global model (or a later round), or already gave
    #: its share for this key set and round (xMK-CKKS): a second contribution would be a
    #: differencing oracle.
    ALREADY_CONTRIBUTED = 1004
    #: The node's configuration refuses the request: an identity or roster is missing, or the run
    #: config asks for more than the node's policy allows. Nothing the server can do in this run
    #: fixes it, so the server stops the run at once; the reason names the
    #: config keys to set (:func:`config_keys_of`).
    NOT_CONFIGURED = 1005
    #: A client that shares its FHE AUC could not accept the result it decrypted (the pooled data has
    #: a single class, the CKKS precision is not met, a value lies out of range, or the malicious
    #: protocol's runs disagree). One code and a fixed reason for all of them: which check failed,
    #: and which way, depends on the decrypted value and would make the client a decryption oracle;
    #: the node's log says which.
    RESULT_REJECTED = 1006
    #: (server) No reply within the step's timeout.
    TIMEOUT = 1100
    #: (server) The reply could not be parsed or failed the server's checks.
    MALFORMED_REPLY = 1101
    #: (server) The node left the SuperLink's node list (Flower's heartbeat expired) before it replied.
    NODE_GONE = 1102
    #: (server) The node's identity came back under a new node ID (a restarted SuperNode) before it replied.
    NODE_REJOINED = 1103
    #: (server) The SuperLink did not accept the message (no message ID returned for it).
    NOT_DELIVERED = 1104


class MalformedMessage(ValueError):
    """A record failed its check: a field is missing, or has the wrong type, length, dtype or shape.

    Parameters
    ----------
    field : str
        The field, as ``"<record key>.<field>"`` (e.g. ``"xmk.public-share"``).
    reason : str
        What is wrong with it, in one line.
    node : int, optional
        The node that sent it (server side: the replying node; client side: unset).
    record_missing : bool, default False
        A whole record is missing (not a field of it): the message was built by other code than
        the payload's, e.g. a ``train`` reply that no
        :func:`~flwr_fedeval.clients.xmkckks.xmkckks_mod` encrypted; the server reads it as an App
        wiring error when every node sends one (:func:`flwr_fedeval.strategies.base.wiring_fix`).

    Notes
    -----
    The message reads ``node <id>: field '<field>': <reason>``; being a ``ValueError``,
    it is caught wherever a malformed reply was caught before.
    """

    def __init__(self, field: str, reason: str, *, node: int | None = None, record_missing: bool = False) -> None:
        self.field = field
        self.reason = reason
        self.node = node
        self.record_missing = record_missing
        where = f"node {node}: " if node is not None else ""
        super().__init__(f"{where}field {field!r}: {reason}")

    def at(self, node: int) -> MalformedMessage:
        """The same error, naming ``node``."""
        return MalformedMessage(self.field, self.reason, node=node, record_missing=self.record_missing)


class Refused(ValueError):
    """The one client-side refusal: the node will not serve this request.

    Raised by a client handler (or by the protocol layer it calls) for a request
    it must not answer: another session, a deviation it detected, values outside
    the public bounds or the node's policy. :func:`handler` turns it into an error
    reply carrying ``code``; nothing is half done.

    Parameters
    ----------
    reason : str
        One line saying why, naming the rule or the node-config key that decides.
    code : ReplyCode, default ``ReplyCode.REFUSED``
        The reply code the server classifies the failure by.
    """

    def __init__(self, reason: str, *, code: ReplyCode = ReplyCode.REFUSED) -> None:
        self.code = ReplyCode(code)
        super().__init__(reason)


#: How a :class:`NotConfigured` reason lists its keys: ``<reason> [set: <key>; <key>]`` at its end.
_KEYS_OPEN, _KEYS_SEP = " [set: ", "; "


class NotConfigured(Refused):
    """A configuration refusal: this node cannot serve the request until its operator (or whoever
    starts the run) sets a config key; code ``NOT_CONFIGURED``, terminal for the run.

    Parameters
    ----------
    reason : str
        One line saying why.
    keys : tuple of str
        What to set, e.g. ``("node config fedeval-identity-key", "run config fedeval-identity-dir")``;
        at least one. ``str(exc)`` is ``reason`` followed by ``[set: key; key]``, which
        :func:`config_keys_of` reads back from an error reply's reason.

    Raises
    ------
    ValueError
        ``keys`` is empty or a key contains ``;`` or ``]``.
    """

    def __init__(self, reason: str, *, keys: Sequence[str]) -> None:
        keys = tuple(str(k) for k in keys)
        if not keys or any(_KEYS_SEP.strip() in k or "]" in k for k in keys):
            raise ValueError(f"NotConfigured needs one or more keys without ';' or ']', got {keys!r}")
        self.keys = keys
        super().__init__(f"{reason}{_KEYS_OPEN}{_KEYS_SEP.join(keys)}]", code=ReplyCode.NOT_CONFIGURED)


def config_keys_of(reason: str) -> tuple[str, ...]:
    """The keys a :class:`NotConfigured` reason names (``()`` if it names none), e.g. from the
    ``Error.reason`` of a ``NOT_CONFIGURED`` reply."""
    start = reason.rfind(_KEYS_OPEN)
    if start < 0 or not reason.rstrip().endswith("]"):
        return ()
    inner = reason.rstrip()[start + len(_KEYS_OPEN):-1]
    return tuple(k for k in inner.split(_KEYS_SEP) if k)


# ------------------------------------------------------------------ checked fields
def _field(key: str, name: str) -> str:
    return f"{key}.{name}"


_V = TypeVar("_V")


@overload
def config_field(record: ConfigRecord, key: str, name: str, kind: type[_V], *,
                 choices: Sequence[Any] | None = None, minimum: float | None = None,
                 maximum: float | None = None) -> _V: ...


@overload
def config_field(record: ConfigRecord, key: str, name: str, kind: tuple[type, ...], *,
                 choices: Sequence[Any] | None = None, minimum: float | None = None,
                 maximum: float | None = None) -> Any: ...


def config_field(record: ConfigRecord, key: str, name: str, kind: type | tuple[type, ...], *,
                 choices: Sequence[Any] | None = None, minimum: float | None = None,
                 maximum: float | None = None) -> Any:
    """``record[name]`` checked: present, of ``kind`` (``bool`` is never an ``int``), finite if a
    float, within ``[minimum, maximum]`` and among ``choices`` when given.

    ``key`` is the record's key in the message, used in the error only.

    Raises
    ------
    MalformedMessage
        If any check fails.
    """
    if name not in record:
        raise MalformedMessage(_field(key, name), "missing")
    value = record[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise MalformedMessage(_field(key, name),
                               f"expected {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}")
    if isinstance(value, float) and not np.isfinite(value):
        raise MalformedMessage(_field(key, name), f"not finite: {value!r}")
    if choices is not None and value not in choices:
        raise MalformedMessage(_field(key, name), f"{value!r} is not one of {tuple(choices)}")
    if minimum is not None and value < minimum:  # type: ignore[operator]  # a number: kind checked above
        raise MalformedMessage(_field(key, name), f"{value!r} is below {minimum}")
    if maximum is not None and value > maximum:  # type: ignore[operator]
        raise MalformedMessage(_field(key, name), f"{value!r} is above {maximum}")
    return value


def config_bytes(record: ConfigRecord, key: str, name: str, *, length: int | None = None,
                 max_length: int | None = None) -> bytes:
    """``record[name]`` as ``bytes`` of exactly ``length`` (or at most ``max_length``) bytes.

    Raises
    ------
    MalformedMessage
        If it is missing, not bytes, or of another length.
    """
    value = config_field(record, key, name, bytes)
    if length is not None and len(value) != length:
        raise MalformedMessage(_field(key, name), f"{len(value)} bytes, expected {length}")
    if max_length is not None and len(value) > max_length:
        raise MalformedMessage(_field(key, name), f"{len(value)} bytes, more than {max_length}")
    return bytes(value)


def config_list(record: ConfigRecord, key: str, name: str, kind: type, *, length: int | None = None,
                item_length: int | None = None) -> list[Any]:
    """``record[name]`` as a list of ``kind`` with ``length`` items (bytes items of ``item_length``).

    Raises
    ------
    MalformedMessage
        If it is missing, not a list of ``kind``, or of another length.
    """
    if name not in record:
        raise MalformedMessage(_field(key, name), "missing")
    value = record[name]
    if not isinstance(value, list) or any(isinstance(v, bool) != (kind is bool) or not isinstance(v, kind)
                                          for v in value):
        raise MalformedMessage(_field(key, name), f"expected a list of {kind.__name__}")
    if length is not None and len(value) != length:
        raise MalformedMessage(_field(key, name), f"{len(value)} items, expected {length}")
    if item_length is not None and any(len(v) != item_length for v in value):  # type: ignore[arg-type]
        raise MalformedMessage(_field(key, name), f"items must be {item_length} long")
    return list(value)


def array_field(record: ArrayRecord, key: str, name: str, *, dtype: Any | Sequence[Any],
                shape: tuple[int | None, ...] | None = None, finite: bool = False) -> np.ndarray:
    """``record[name]`` as a numpy array of ``dtype`` (one of, if a sequence) and ``shape``
    (``None`` entries match any size), finite if ``finite``.

    Raises
    ------
    MalformedMessage
        If it is missing, or its dtype, shape or values fail the check.
    """
    if name not in record:
        raise MalformedMessage(_field(key, name), "missing")
    try:
        a = record[name].numpy()
    except Exception as exc:  # Flower could not decode the array's bytes
        raise MalformedMessage(_field(key, name), f"not a numpy array ({type(exc).__name__})") from None
    wanted: Sequence[Any] = dtype if isinstance(dtype, (list, tuple)) else [dtype]
    dtypes = [np.dtype(d) for d in wanted]
    if a.dtype not in dtypes:
        raise MalformedMessage(_field(key, name), f"dtype {a.dtype}, expected {' or '.join(map(str, dtypes))}")
    if shape is not None and (a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, a.shape))):
        want = "(" + ", ".join("n" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise MalformedMessage(_field(key, name), f"shape {a.shape}, expected {want}")
    if finite and not np.isfinite(a).all():
        raise MalformedMessage(_field(key, name), "NaN or infinite values")
    return a


def bytes_array(data: bytes | memoryview) -> Array:
    """Wrap bytes as a 1-D uint8 ``Array`` (large ArrayRecords are chunked by Flower).

    The ``Array``'s bytes are exactly what ``Array(np.frombuffer(data, np.uint8).copy())`` holds
    (the ``.npy`` serialization), built in one allocation: no intermediate copies of a bulk payload
    (a reply of many MB is not copied)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (len(data),)})
    return Array(dtype="uint8", shape=(len(data),), stype=SType.NUMPY, data=b"".join((header.getvalue(), data)))


def array_bytes(record: ArrayRecord, key: str, name: str, *, max_length: int | None = None) -> bytes:
    """Inverse of :func:`bytes_array` for ``record[name]``.

    Raises
    ------
    MalformedMessage
        If it is missing, not a 1-D uint8 array, or longer than ``max_length``.
    """
    a = array_field(record, key, name, dtype=np.uint8, shape=(None,))
    if max_length is not None and a.size > max_length:
        raise MalformedMessage(_field(key, name), f"{a.size} bytes, more than {max_length}")
    return a.tobytes()


def array_bytes_view(record: ArrayRecord, key: str, name: str) -> memoryview:
    """:func:`array_bytes` without copying: a read-only view of the bytes inside ``record[name]``.

    For bulk payloads (a step-2 ciphertext: hundreds of MB at ResNet-18 size) the message's
    own buffer is the one copy the receiver holds; :func:`array_bytes`
    would make two more (``np.load``, then ``tobytes``). The ``.npy`` header is parsed and
    checked as ``np.load`` does (version, dtype, shape, order) and the payload length must match.

    Raises
    ------
    MalformedMessage
        If it is missing, not a NumPy-serialized array, not a 1-D uint8 array, or its payload
        length does not match its shape.
    """
    if name not in record:
        raise MalformedMessage(_field(key, name), "missing")
    array = record[name]
    data = array.data
    if array.stype != SType.NUMPY or not isinstance(data, (bytes, bytearray, memoryview)):
        raise MalformedMessage(_field(key, name), f"not a numpy array (stype {array.stype!r})")
    if not isinstance(data, bytes):  # Flower's are bytes; anything mutable is copied once (then it cannot change)
        data = bytes(data)
    fp = io.BytesIO(data)  # shares ``data``'s buffer: nothing is copied
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f"npy version {version}")
    except Exception as exc:  # numpy could not read the header
        raise MalformedMessage(_field(key, name), f"not a numpy array ({type(exc).__name__})") from None
    if dtype != np.dtype(np.uint8):
        raise MalformedMessage(_field(key, name), f"dtype {dtype}, expected uint8")
    if len(shape) != 1:
        raise MalformedMessage(_field(key, name), f"shape {shape}, expected (n,)")
    start = fp.tell()
    if len(data) - start != shape[0]:
        raise MalformedMessage(_field(key, name), f"{len(data) - start} payload bytes for shape {shape}")
    return memoryview(data)[start:]


# ------------------------------------------------------------------ payloads
class Payload:
    """Base of every request and reply payload: a frozen dataclass that knows its records.

    A subclass is a ``@dataclasses.dataclass(frozen=True)`` that implements
    :meth:`_to_record` and :meth:`_from_record`; callers use :meth:`to_record`
    and :meth:`from_record`, which add the node to every :class:`MalformedMessage`
    and turn a stray ``KeyError``/``TypeError`` from Flower's records into one.
    """

    #: Short name of the payload, used in errors (e.g. ``"xMK key generation reply"``).
    LABEL: ClassVar[str] = ""

    def _to_record(self) -> RecordDict:
        raise NotImplementedError

    @classmethod
    def _from_record(cls: type[P], content: RecordDict) -> P:
        raise NotImplementedError

    def to_record(self) -> RecordDict:
        """The message content (a ``RecordDict``) carrying this payload."""
        return self._to_record()

    @classmethod
    def from_record(cls: type[P], content: RecordDict, *, node: int | None = None) -> P:
        """Parse and check a message content.

        Raises
        ------
        MalformedMessage
            Naming the field, the reason and ``node``: a record or field is missing,
            or a field has the wrong type, length, dtype, shape or value.
        """
        try:
            return cls._from_record(content)
        except MalformedMessage as exc:
            raise (exc.at(node) if node is not None else exc) from None
        except KeyError as exc:  # a whole record missing
            raise MalformedMessage(str(exc.args[0]) if exc.args else "?", f"missing from the {cls._label()}",
                                   node=node) from None
        except TypeError as exc:  # a record of another kind under the key
            raise MalformedMessage(cls._label(), f"wrong record type ({exc})", node=node) from None

    @classmethod
    def _label(cls) -> str:
        return cls.LABEL or cls.__name__

    def replace(self: P, **changes: Any) -> P:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


R = TypeVar("R", ConfigRecord, ArrayRecord)


def _record(content: RecordDict, key: str, kind: type[R]) -> R:
    if key not in content:
        raise MalformedMessage(key, "record missing", record_missing=True)
    rec = content[key]
    if not isinstance(rec, kind):
        raise MalformedMessage(key, f"expected a {kind.__name__}, got {type(rec).__name__}")
    return rec


def config_record(content: RecordDict, key: str) -> ConfigRecord:
    """``content[key]`` if it is a ``ConfigRecord``.

    Raises
    ------
    MalformedMessage
        If it is missing or another kind of record.
    """
    return _record(content, key, ConfigRecord)


def array_record(content: RecordDict, key: str) -> ArrayRecord:
    """``content[key]`` if it is an ``ArrayRecord``.

    Raises
    ------
    MalformedMessage
        If it is missing or another kind of record.
    """
    return _record(content, key, ArrayRecord)


# ------------------------------------------------------------------ steps
@dataclasses.dataclass(frozen=True)
class Step:
    """One protocol step, as a row of the protocol's step table (Flower SecAgg+'s ``Stage``).

    Attributes
    ----------
    name : str
        The step as the paper and the logs call it (e.g. ``"step 1a (key commitment)"``).
    message_type : str
        Flower message type ``<train|evaluate|query>.<identifier>``.
    replier : str
        The role that answers it (``"client"``, ``"key-holder"``, ``"shapley-aux"``, ...);
        the server always sends the request.
    request, reply : type of Payload, optional
        The payload classes (``None``: a content that is not ours, e.g. Flower's model record).
    """

    name: str
    message_type: str
    replier: str
    request: type[Payload] | None = None
    reply: type[Payload] | None = None

    def __post_init__(self) -> None:
        action, _, ident = self.message_type.partition(".")
        if action not in ("train", "evaluate", "query") or not ident.isidentifier():
            raise ValueError(f"message type must be <train|evaluate|query>.<identifier>, got {self.message_type!r}")

    @property
    def action(self) -> str:
        """``"train"``, ``"evaluate"`` or ``"query"``."""
        return self.message_type.split(".", 1)[0]

    @property
    def handler_name(self) -> str:
        """The ClientApp handler name (``@app.query("<handler_name>")``)."""
        return self.message_type.split(".", 1)[1]


# ------------------------------------------------------------------ client side
def reply_code(exc: BaseException) -> ReplyCode:
    """The :class:`ReplyCode` of an exception a handler refuses a request with.

    :class:`Refused` → its ``code``; ``TamperingDetectedError`` → ``TAMPERING_DETECTED``;
    ``UndefinedAUCError`` → ``UNDEFINED_AUC``; anything else → ``REFUSED``.
    """
    from flwr_fedeval.fhe.auc_malicious import TamperingDetectedError
    from flwr_fedeval.metrics.auc import UndefinedAUCError

    if isinstance(exc, Refused):
        return exc.code
    if isinstance(exc, TamperingDetectedError):
        return ReplyCode.TAMPERING_DETECTED
    if isinstance(exc, UndefinedAUCError):
        return ReplyCode.UNDEFINED_AUC
    return ReplyCode.REFUSED


def error_reply(msg: Message, exc: BaseException, label: str, *, code: ReplyCode | None = None) -> Message:
    """``Error`` reply with ``code`` (default :func:`reply_code`) and reason ``"<ExceptionType>: <message>"``,
    logged as ``<label> request ... refused``."""
    reason = f"{type(exc).__name__}: {exc}"
    code = reply_code(exc) if code is None else code
    log(WARNING, "%s request %s refused (%s): %s", label, msg.metadata.message_type, code.name, reason)
    return Message(Error(code=int(code), reason=reason), reply_to=msg)


Handler = Callable[[Message, Context], Message]


def handler(step: Step, serve: Callable[[Any, Message, Context], Payload | RecordDict], *, label: str,
            errors: tuple[type[BaseException], ...] = ()) -> Handler:
    """The ClientApp handler of ``step``: parse the request (``step.request.from_record``), call
    ``serve(request, msg, context)``, wrap its reply payload in a reply message.

    A :class:`Refused`, a :class:`MalformedMessage` (the request failed its check) or one of
    ``errors`` becomes an :func:`error_reply`; anything else propagates (a bug, which Flower
    reports as the ClientApp's exception).
    """

    caught: tuple[type[BaseException], ...] = (Refused, MalformedMessage, *errors)

    def serve_step(msg: Message, context: Context) -> Message:
        try:
            request = step.request.from_record(msg.content) if step.request is not None else msg.content
            reply = serve(request, msg, context)
            content = reply.to_record() if isinstance(reply, Payload) else reply
            return Message(content=content, reply_to=msg)
        except caught as exc:
            return error_reply(msg, exc, label)

    serve_step.__name__ = f"serve_{step.handler_name}"
    serve_step.__qualname__ = serve_step.__name__
    serve_step.__doc__ = f"{label}: {step.name} (``{step.message_type}``)."
    return serve_step


#: Flower's guide from a ``client_fn``/``NumPyClient`` App to the Message API (``@app.train()``, ...).
MESSAGE_API_GUIDE = "https://flower.ai/docs/framework/how-to-upgrade-to-message-api.html"


def require_message_api(app: Any) -> None:
    """Refuse a ``ClientApp`` built from a ``client_fn`` (Flower's legacy ``NumPyClient`` API).

    Flower's ``ClientApp(client_fn=...)`` answers only the legacy ``train``/``evaluate`` messages
    and refuses every ``@app.query()`` registration with a ValueError that does not say why;
    flwr-fedeval's handlers are Message-API handlers.

    Raises
    ------
    TypeError
        ``app`` was built with a ``client_fn``; the message links Flower's migration guide
        (:data:`MESSAGE_API_GUIDE`).
    """
    if getattr(app, "_call", None) is not None:  # Flower sets it only for ClientApp(client_fn=...)
        raise TypeError(
            "flwr-fedeval's client handlers need a ClientApp on Flower's Message API "
            "(app = ClientApp() with @app.train() / @app.evaluate() handlers), not a client_fn/NumPyClient "
            f"App; Flower's migration guide: {MESSAGE_API_GUIDE}")


def register(app: Any, steps: Iterable[Step], handlers: Mapping[str, Handler]) -> None:
    """The one registration idiom: register ``handlers[step.message_type]`` on the ClientApp
    ``app`` for every step, as ``@app.<action>("<handler_name>")``.

    Raises
    ------
    TypeError
        ``app`` is a ``client_fn``/``NumPyClient`` App (:func:`require_message_api`).
    ValueError
        If a step has no handler or a handler matches no step.
    """
    require_message_api(app)
    steps = list(steps)
    types = [s.message_type for s in steps]
    missing = [t for t in types if t not in handlers]
    extra = [t for t in handlers if t not in types]
    if missing or extra:
        raise ValueError(f"handlers do not match the step table: missing {missing}, unknown {extra}")
    for step in steps:
        getattr(app, step.action)(step.handler_name)(handlers[step.message_type])


def config_of(mapping: Mapping[str, Any]) -> ConfigRecord:
    """A ``ConfigRecord`` of ``mapping`` without its ``None`` values (optional fields left out)."""
    return ConfigRecord({k: v for k, v in mapping.items() if v is not None})
