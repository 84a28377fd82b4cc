"""What every server-side phase shares: step timing, failure bookkeeping, readable failures.

* :class:`Failures` — who failed at which step, with a machine-readable code
  (:class:`flwr_fedeval.messages.ReplyCode` for our own error replies, Flower's
  ``ErrorCode`` for the engine's) and the reason. The server classifies by
  code, never by matching the reason text.
* :func:`log_failures` — failures of many nodes collapse into one WARNING line
  per distinct reason with the node count and IDs
  (``16 nodes: ValueError: test split of 1 sample ... [nodes 3, 9, ...]``);
  the full reason (a remote traceback, for the engines' errors) once at DEBUG.
* :class:`FailureLog` and :class:`FailureRecordingGrid` — every failure of
  every step of a run (training, key generation, partial decryption, each
  AUC/Shapley step), with node, round, step, code, the reason that fired and
  the seconds until the step knew; Flower's error replies (node offline,
  heartbeat, ClientApp exception) keep Flower's code and reason, our
  ``TIMEOUT`` is named only for a reply that did not come within the step's
  timeout; a node that leaves the SuperLink's node list is given up at once
  (``NODE_GONE``, :mod:`flwr_fedeval.strategies.collect`), not at the
  timeout. Replies are matched to requests by ``reply_to_message_id``
  (:func:`replies_by_node`), so an error reply the SuperLink sends for a lost
  node is the node's.
* :class:`StepTimer` — every protocol step logs ``<phase>: <step> done in
  1.23 s`` at INFO and keeps ``(step, seconds)`` for callers that measure.
* :class:`EvaluationPhase` — abstract base of the evaluation phases (plaintext,
  FHE and DP AUC, SecSV), the one phase contract ``run(grid, arrays) -> result``:
  configuration validated at construction,
  ``summary()`` in Flower's style (a small tree at INFO), one reply exchange
  that checks replies before use, and the failure bookkeeping above.
* :class:`NodeNotConfigured` — a node refused a step for its configuration
  (``NOT_CONFIGURED``: no identity or roster, a run config looser than its
  policy): no other node or attempt can fix that, so every exchange raises it
  at the first such reply and the run stops there, naming the keys to set
  (issue 23 item 4), instead of retrying every round.
* :class:`ClientAppNotWired` — every node failed a step for a reason in its
  ClientApp's code (no handler registered for the message type, ``xmkckks_mod``
  missing or listed after a Flower mod, a ``client_fn``/``NumPyClient`` App):
  the run stops with one error naming the line to add (:func:`wiring_fix`),
  instead of running every round on the initial model.
* :class:`ReadableFailuresMixin` — the same collapsed failure lines for
  Flower's FedAvg family (instead of one line, with a full remote traceback,
  per failing node).
"""

from __future__ import annotations

import abc
import inspect
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from logging import DEBUG, INFO, WARNING
from typing import Any, Generic, TypeVar

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import validate_message_reply_consistency

from flwr_fedeval.messages import ARRAYS_KEY, ReplyCode
from flwr_fedeval.protocol import MESSAGE_API_GUIDE, MalformedMessage, config_keys_of

__all__ = [
    "ClientAppNotWired",
    "EvaluationPhase",
    "Failure",
    "FailureLog",
    "FailureRecordingGrid",
    "Failures",
    "NodeNotConfigured",
    "raise_if_not_configured",
    "raise_if_not_wired",
    "wiring_fix",
    "ReadableFailuresMixin",
    "ReadableFedAvg",
    "StepTimer",
    "collapse_failures",
    "log_failures",
    "code_name",
    "one_line_reason",
    "replies_by_node",
]

#: How many node IDs a collapsed failure line lists before "...".
MAX_IDS_SHOWN = 8

_EXC_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Refused|Warning)):\s?(.*)$")
_FLWR_FORMAT = re.compile(r"^<class '([\w.]+)'>:<'(.*)'>$", re.S)


def one_line_reason(reason: str) -> str:
    """The one line of a failure reason a person needs: ``"ValueError: message"``.

    Flower's engines report an exception raised in a ClientApp as
    ``"<class '...ClientAppException'>:<'... Traceback ... ValueError: msg'>"``;
    this returns the last ``Name: message`` line of such a text (module path
    dropped), or the first line of any other reason.
    """
    text = str(reason).strip()
    m = _FLWR_FORMAT.match(text)
    if m:
        text = m.group(2).strip() or m.group(1)
        if "\n" not in text and m.group(1).rsplit(".", 1)[-1] != "ClientAppException":
            return f"{m.group(1).rsplit('.', 1)[-1]}: {text}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) > 1:
        for ln in reversed(lines):
            hit = _EXC_LINE.match(ln)
            if hit:
                return f"{hit.group(1).rsplit('.', 1)[-1]}: {hit.group(2).strip()}".rstrip(": ")
    return lines[0].strip() if lines else "(no reason given)"


@dataclass(frozen=True)
class Failure:
    """One node's failure at one step.

    Attributes
    ----------
    step : str
        The protocol step (e.g. ``"step 4 (encrypted counts)"``).
    code : int
        A :class:`~flwr_fedeval.messages.ReplyCode` (our error replies; also
        ``TIMEOUT`` and ``MALFORMED_REPLY`` assigned by the server) or one of
        Flower's ``ErrorCode`` values (errors reported by the engine).
    reason : str
        The full reason (may hold a remote traceback).
    node : int or None
        The node (set in a :class:`FailureLog`).
    round : int or None
        The training round the request names (``server-round`` of training
        and client evaluation, ``round`` of the xMK-CKKS steps and of the
        Shapley steps, whose round is the training round of the models they
        value); ``None`` for requests without one (role discovery, AUC phases).
    seconds_to_detect : float or None
        Seconds from sending the request until the step knew of the failure
        (the error reply arrived, or the step's timeout ran out).
    """

    step: str
    code: int
    reason: str
    node: int | None = None
    round: int | None = None
    seconds_to_detect: float | None = None

    def to_json(self) -> dict[str, Any]:
        """``{node, round, step, reason, code, code_name, seconds_to_detect}`` (``reason``: one line)."""
        return {"node": self.node, "round": self.round, "step": self.step, "reason": self.summary,
                "code": self.code, "code_name": code_name(self.code),
                "seconds_to_detect": None if self.seconds_to_detect is None else round(self.seconds_to_detect, 3)}

    @property
    def summary(self) -> str:
        """One line: ``"<ExceptionType>: <message>"``."""
        return one_line_reason(self.reason)


class NodeNotConfigured(RuntimeError):
    """Nodes refused a step for their configuration (reply code ``NOT_CONFIGURED``): the run stops.

    ``str(error)`` is one line: the step, the nodes, the keys to set and the first node's reason.

    Attributes
    ----------
    step : str
        The step (message type or phase step) that was refused.
    failures : dict of int to Failure
        Node → its ``NOT_CONFIGURED`` failure.
    keys : tuple of str
        The config keys the refusals name (:func:`flwr_fedeval.protocol.config_keys_of`), e.g.
        ``"node config fedeval-identity-key"``, in order of first appearance.
    """

    def __init__(self, step: str, failures: Mapping[int, Failure]) -> None:
        self.step = step
        self.failures = dict(failures)
        keys: dict[str, None] = {}
        for f in self.failures.values():
            keys.update(dict.fromkeys(config_keys_of(f.summary) or config_keys_of(f.reason)))
        self.keys = tuple(keys)
        first = self.failures[min(self.failures)]
        super().__init__(f"{step}: node(s) {_ids(sorted(self.failures))} refused for their configuration; set "
                         f"{' / '.join(self.keys) or 'the keys the reason names'} ({first.summary})")


def raise_if_not_configured(step: str, failures: Mapping[int, Failure | str]) -> None:
    """Raise :class:`NodeNotConfigured` if any of ``failures`` has code ``NOT_CONFIGURED``."""
    refused = {n: f for n, f in failures.items()
               if isinstance(f, Failure) and f.code == int(ReplyCode.NOT_CONFIGURED)}
    if refused:
        raise NodeNotConfigured(step, refused)


# ------------------------------------------------------------------ App wiring errors
#: What Flower's ``ClientApp`` raises for a message type without a registered handler
#: (``flwr.clientapp.ClientApp.__call__``), reported in a ``CLIENT_APP_RAISED_EXCEPTION`` reply.
_NO_HANDLER = re.compile(r"No (train|evaluate|query) function registered with name '(\w+)'")
#: What a ``ClientApp(client_fn=...)`` raises for a message type the legacy API does not know
#: (``flwr.client.message_handler.handle_legacy_message_from_msgtype``).
_LEGACY_APP = re.compile(r"Invalid message type: ([\w.]+)")


def registration_lines() -> dict[str, str]:
    """``{message type: the ClientApp line that registers its handler}`` for every step of ours with a
    handler of ours (the ``train`` step is the App's own handler, wrapped by ``xmkckks_mod``)."""
    from flwr_fedeval.protocol import auc, dp_auc, fhe_auc, secsv, xmk

    table = (
        (xmk.QUERY_STEPS, "register_xmkckks_handlers(app)"),
        (fhe_auc.STEPS, "register_fhe_handlers(app, test_scores=..., test_labels=...)"),
        (dp_auc.STEPS, "register_dp_handlers(app, test_scores=..., test_labels=...)"),
        (auc.STEPS, "register_auc_handlers(app, test_scores=...)"),
        (secsv.STEPS, "register_shapley_handlers(app, test_set=...)"),
    )
    return {step.message_type: line for steps, line in table for step in steps}


def wiring_fix(message_type: str, code: int, reason: str, exc: BaseException | None = None) -> str | None:
    """The fix, in one line, if a failed reply says the node's ClientApp is wired wrongly; else ``None``.

    A reason in the App's code, the same on every node and for every retry:

    * no handler for ``message_type`` (Flower's ``CLIENT_APP_RAISED_EXCEPTION`` with "No ...
      function registered"): the ``register_*_handlers(app)`` line of :func:`registration_lines`,
      or an ``@app.train()`` / ``@app.evaluate()`` handler;
    * a ``client_fn``/``NumPyClient`` App (Flower's legacy "Invalid message type"): the Message API,
      with Flower's migration guide;
    * the ClientApp could not be loaded (``LOAD_CLIENT_APP_EXCEPTION``): its reason;
    * a Flower mod refused a ``train`` request (``MOD_FAILED_PRECONDITION``, e.g.
      ``fixedclipping_mod`` outside ``xmkckks_mod``): ``xmkckks_mod`` first;
    * a ``train`` reply without our record (``exc`` a :class:`~flwr_fedeval.protocol.MalformedMessage`
      with ``record_missing``):
      ``@app.train(mods=[xmkckks_mod])``.

    Flower reports the first two only as text (``Error.reason``); the patterns are Flower 1.30-1.42's.
    """
    from flwr.common.constant import ErrorCode

    action = message_type.split(".", 1)[0]
    line = one_line_reason(reason)
    if int(code) == ErrorCode.CLIENT_APP_RAISED_EXCEPTION:
        if _LEGACY_APP.search(reason):
            return (f"the ClientApp is a client_fn/NumPyClient App, which cannot answer {message_type!r}: "
                    f"flwr-fedeval needs Flower's Message API (app = ClientApp() with @app.train(), "
                    f"then the register_*_handlers(app) lines); Flower's migration guide: {MESSAGE_API_GUIDE}")
        hit = _NO_HANDLER.search(reason)
        if hit:
            registered = registration_lines().get(message_type)
            if registered:
                return f"the ClientApp has no handler for {message_type!r}: add `{registered}` to it"
            if hit.group(2) == "default":
                return (f"the ClientApp has no {action} handler: add `@app.{action}()` (with "
                        f"`mods=[xmkckks_mod]` under secure aggregation) to it")
            return f"the ClientApp has no handler for {message_type!r}: register one with `@app.{action}(...)`"
    if int(code) == ErrorCode.LOAD_CLIENT_APP_EXCEPTION:
        return f"the ClientApp could not be loaded: {line}"
    if int(code) == ErrorCode.MOD_FAILED_PRECONDITION and action == "train":
        return (f"a Flower mod refused the train request ({line}): list xmkckks_mod first (outermost), "
                f"e.g. `@app.train(mods=[xmkckks_mod, fixedclipping_mod])`, so that the mods inside it get "
                f"Flower's own train message")
    if isinstance(exc, MalformedMessage) and exc.record_missing and action == "train":
        return (f"the train reply carries no encrypted update (record {exc.field!r} missing): wrap the train "
                f"handler with xmkckks_mod, `@app.train(mods=[xmkckks_mod])`")
    return None


class ClientAppNotWired(RuntimeError):
    """Every node failed a step for a reason in its ClientApp's code (:func:`wiring_fix`): the run stops.

    ``str(error)`` names the step, the nodes and the fix (one line per distinct fix).

    Attributes
    ----------
    step : str
        The step (message type or phase step) every node failed.
    fixes : dict of str to list of int
        The fix → the nodes it applies to.
    failures : dict of int to Failure
        Node → its failure.
    """

    def __init__(self, step: str, fixes: Mapping[int, str], failures: Mapping[int, Failure]) -> None:
        self.step = step
        self.failures = dict(failures)
        by_fix: dict[str, list[int]] = defaultdict(list)
        for node in sorted(fixes):
            by_fix[fixes[node]].append(int(node))
        self.fixes = dict(by_fix)
        text = "; ".join(f"{fix} [node(s) {_ids(nodes)}]" for fix, nodes in self.fixes.items())
        super().__init__(f"{step}: every node failed for its ClientApp's code, the run stops: {text}")


def raise_if_not_wired(step: str, failures: Mapping[int, Failure], fixes: Mapping[int, str | None],
                       num_valid: int) -> None:
    """Raise :class:`ClientAppNotWired` if no node replied validly and every failure has a fix.

    A node that fails for another reason (a timeout, a refusal), or any valid reply, keeps the
    run going: one node's wiring is logged with the other failures, not fatal.
    """
    if num_valid or not failures or any(fixes.get(n) is None for n in failures):
        return
    raise ClientAppNotWired(step, {n: str(fixes[n]) for n in failures}, failures)


def code_name(code: int) -> str:
    """``"TIMEOUT"`` (ours, :class:`~flwr_fedeval.messages.ReplyCode`) or ``"flwr:NODE_UNAVAILABLE"``
    (Flower's ``ErrorCode``)."""
    try:
        return ReplyCode(int(code)).name
    except ValueError:
        pass
    from flwr.common.constant import ErrorCode

    names = {v: k for k, v in vars(ErrorCode).items() if k.isupper() and isinstance(v, int)}
    return f"flwr:{names.get(int(code), 'UNKNOWN')}"


def replies_by_node(messages: Iterable[Message], replies: Iterable[Message]) -> dict[int, Message]:
    """``{destination node: reply}``, matching each reply to its request by ``reply_to_message_id``.

    An error reply the SuperLink itself sends for a node it lost (node
    offline, heartbeat expired) comes from the SuperLink, not from the node;
    matching by ``src_node_id`` would throw its reason away and name a timeout.
    A reply whose request is unknown falls back to its ``src_node_id``.
    """
    by_id = {m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id}
    out: dict[int, Message] = {}
    for reply in replies:
        node = by_id.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
        out.setdefault(int(node), reply)
    return out


def _round_of(content: RecordDict) -> int | None:
    """The training round a request is for (``server-round`` of Flower's train/evaluate config, ``round`` of ours)."""
    for rec in content.config_records.values():
        for key in ("server-round", "round"):
            value = rec.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return int(value)
    return None


class FailureLog(list):
    """Every failure of a run, in order: a list of :class:`Failure` with ``node`` set.

    :meth:`add` logs one readable WARNING line per failure
    (``failure: node 7, round 2, step query.xmk_pdec: no reply within our timeout of 600 s
    [TIMEOUT, 600.0 s to detect]``); :meth:`to_json` is what ``results.json`` holds.
    """

    def add(self, node: int, step: str, code: int, reason: str, *, round: int | None = None,
            seconds_to_detect: float | None = None) -> Failure:
        f = Failure(step, int(code), str(reason), int(node), round, seconds_to_detect)
        self.append(f)
        log(WARNING, "failure: node %d, %sstep %s: %s [%s%s]", f.node, "" if round is None else f"round {round}, ",
            step, f.summary, code_name(f.code),
            "" if seconds_to_detect is None else f", {seconds_to_detect:.1f} s to detect")
        if f.reason.strip() != f.summary:
            log(DEBUG, "failure: node %d, step %s: full reason:\n%s", f.node, step, f.reason)
        return f

    def has(self, node: int, round: int | None = None) -> bool:
        return any(f.node == int(node) and f.round == round for f in self)

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self]


class FailureRecordingGrid:
    """A view of a Flower ``Grid`` that gives up lost nodes early and records every failed request.

    Each exchange (``send_and_receive``, :meth:`collect_replies`) runs
    :func:`~flwr_fedeval.strategies.collect.send_and_collect`: a node that
    leaves the SuperLink's node list is given up at once (``NODE_GONE``), and
    with a :class:`~flwr_fedeval.strategies.collect.Rejoin` so is a node whose
    identity came back under a new node ID (``NODE_REJOINED``); replies are
    matched to requests (:func:`replies_by_node`). A request still without a
    reply when the step's timeout ran out is recorded as our ``TIMEOUT``, an
    error reply with its own code and reason (Flower's ``ErrorCode`` for the
    engine's errors, a :class:`~flwr_fedeval.messages.ReplyCode` for ours),
    each with the seconds until that node's failure was known. The step is
    the message type; the round is read from the request (``server-round`` /
    ``round``). ``get_node_ids`` leaves out node IDs whose identity came back
    under a new ID. Everything else is delegated to the wrapped grid.

    Attributes
    ----------
    failures : FailureLog
    rejoin : Rejoin or None
        May be set after construction (e.g. once the roles are known).
    """

    def __init__(self, grid: Grid, failures: FailureLog | None = None, *, rejoin: Any = None) -> None:
        self._grid = grid
        self.failures = FailureLog() if failures is None else failures
        self.rejoin = rejoin

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def get_node_ids(self) -> Iterable[int]:
        ids = self._grid.get_node_ids()
        if self.rejoin is None or not self.rejoin.replaced:
            return ids
        return [n for n in ids if int(n) not in self.rejoin.replaced]

    def collect_replies(self, messages: Iterable[Message], *, timeout: float | None = None,
                        on_reply: Callable[[Message], Message] | None = None) -> Any:
        """:func:`~flwr_fedeval.strategies.collect.send_and_collect` over the wrapped grid; failures recorded.
        ``on_reply`` is its per-reply callback (a reply's bulk folded and dropped as it comes)."""
        from flwr_fedeval.strategies.collect import send_and_collect

        messages = list(messages)
        got = send_and_collect(self._grid, messages, timeout=timeout, rejoin=self.rejoin, on_reply=on_reply)
        by_node = replies_by_node(messages, got.replies)
        for msg in messages:
            node = int(msg.metadata.dst_node_id)
            step, rnd = msg.metadata.message_type, _round_of(msg.content)
            reply, seconds = by_node.get(node), got.seconds.get(node, got.elapsed)
            if reply is None:
                limit = "" if timeout is None else f" of {timeout:g} s"
                self.failures.add(node, step, int(ReplyCode.TIMEOUT), f"no reply within our timeout{limit}",
                                  round=rnd, seconds_to_detect=seconds)
            elif reply.has_error():
                self.failures.add(node, step, int(reply.error.code), str(reply.error.reason), round=rnd,
                                  seconds_to_detect=seconds)
        return got

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """As Flower's, but a lost node is given up early (:meth:`collect_replies`); failures recorded."""
        return self.collect_replies(messages, timeout=timeout).replies


def _as_failure(value: Failure | str, step: str = "") -> Failure:
    return value if isinstance(value, Failure) else Failure(step, int(ReplyCode.REFUSED), str(value))


def collapse_failures(failed: Mapping[int, Failure | str]) -> list[tuple[str, list[int], str]]:
    """Group failures by their one-line reason: ``[(line, sorted node IDs, full reason)]``, largest group first."""
    groups: dict[str, list[int]] = defaultdict(list)
    full: dict[str, str] = {}
    for node, value in failed.items():
        f = _as_failure(value)
        line = f.summary
        groups[line].append(int(node))
        full.setdefault(line, f.reason)
    return [(line, sorted(nodes), full[line])
            for line, nodes in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def _ids(nodes: list[int]) -> str:
    shown = ", ".join(str(n) for n in nodes[:MAX_IDS_SHOWN])
    return shown + (f", ... ({len(nodes) - MAX_IDS_SHOWN} more)" if len(nodes) > MAX_IDS_SHOWN else "")


def format_failures(failed: Mapping[int, Failure | str]) -> list[str]:
    """One line per distinct reason: ``"16 nodes: ValueError: ... [nodes 3, 9, ...]"``."""
    out = []
    for line, nodes, _ in collapse_failures(failed):
        count = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
        out.append(f"{count}: {line} [node{'s' if len(nodes) != 1 else ''} {_ids(nodes)}]")
    return out


def log_failures(label: str, step: str, failed: Mapping[int, Failure | str], *, level: int = WARNING) -> None:
    """Log ``failed`` collapsed: one line per distinct reason, the full reason once at DEBUG."""
    for (line, nodes, reason), text in zip(collapse_failures(failed), format_failures(failed)):
        log(level, "%s (%s): %s", label, step, text)
        if reason.strip() != line:
            log(DEBUG, "%s (%s): full reason of '%s' (first of node(s) %s):\n%s", label, step, line,
                _ids(nodes), reason)


class Failures(dict):
    """``{node_id: Failure}`` of one phase run, with classification by code.

    A ``dict`` so that existing code that reads ``failed[node]`` keeps working;
    :meth:`reasons` gives the ``{node: "reason"}`` mapping reported in results.
    """

    def __setitem__(self, node: int, value: Failure | str) -> None:
        # A bare reason is a failure the server found itself (e.g. a duplicate key).
        if not isinstance(value, Failure):
            value = Failure("", int(ReplyCode.MALFORMED_REPLY), str(value))
        super().__setitem__(int(node), value)

    def update(self, other=(), **kw) -> None:  # type: ignore[override]
        for k, v in dict(other, **kw).items():
            self[k] = v

    def add(self, node: int, step: str, code: int, reason: str) -> None:
        self[int(node)] = Failure(step, int(code), str(reason))

    def with_code(self, *codes: int) -> dict[int, Failure]:
        wanted = {int(c) for c in codes}
        return {n: f for n, f in self.items() if f.code in wanted}

    def reasons(self) -> dict[int, str]:
        """``{node: one-line reason}`` (JSON-friendly; the full reason is in the DEBUG log)."""
        return {n: f.summary for n, f in self.items()}

    def lines(self) -> list[str]:
        return format_failures(self)


class StepTimer:
    """Times the protocol steps of a phase; each step is logged at INFO with its duration.

    Attributes
    ----------
    timings : list of (str, float)
        ``(step, seconds)`` in the order the steps ran (across runs; callers
        that measure one run read the entries it added).
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.timings: list[tuple[str, float]] = []

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - t0
            self.timings.append((name, seconds))
            log(INFO, "%s: %s done in %.2f s", self.label, name, seconds)


def exchange_replies(
    grid: Grid,
    contents: Mapping[int, RecordDict],
    message_type: str,
    parse: Callable[[int, RecordDict], Any],
    failures: Failures | dict[int, str],
    *,
    step: str,
    what: str,
    timeout: float,
    label: str,
) -> dict[int, Any]:
    """Send ``contents[node]`` to each node; return ``{node: parse(node, reply)}`` for valid replies.

    Follows Flower's ``FedAvg._check_and_log_replies``: replies are split into
    valid ones and failures first; a node without a valid reply is added to
    ``failures`` with a code (``TIMEOUT``, the error reply's code,
    ``MALFORMED_REPLY``) and the reason, failures are logged collapsed by
    reason (:func:`log_failures`), and only parsed, checked content reaches
    the protocol. The exchange is :func:`~flwr_fedeval.strategies.collect.collect`:
    a node that leaves the SuperLink's node list is given up at once, and
    ``TIMEOUT`` is named only for a node still silent when ``timeout`` ran out.

    Raises
    ------
    NodeNotConfigured
        A node refused for its configuration (``NOT_CONFIGURED``); after the
        failures are logged and recorded.
    ClientAppNotWired
        No node replied validly and every node failed for its ClientApp's code
        (:func:`wiring_fix`); after the failures are logged and recorded.
    """
    from flwr_fedeval.strategies.collect import collect

    messages = [Message(content=c, dst_node_id=n, message_type=message_type) for n, c in contents.items()]
    replies = replies_by_node(messages, collect(grid, messages, timeout=timeout).replies)
    missing: dict[int, Failure] = {n: Failure(step, int(ReplyCode.TIMEOUT),
                                              f"no reply within step-timeout {timeout:g} s")
                                   for n in contents}
    valid: dict[int, Any] = {}
    fixes: dict[int, str | None] = {}
    for node, reply in replies.items():
        if node not in missing:
            continue
        if reply.has_error():
            missing[node] = Failure(step, int(reply.error.code), f"error reply: {reply.error.reason}")
            fixes[node] = wiring_fix(message_type, reply.error.code, str(reply.error.reason))
            continue
        try:
            valid[node] = parse(node, reply.content)
        except (KeyError, ValueError, TypeError) as exc:
            missing[node] = Failure(step, int(ReplyCode.MALFORMED_REPLY),
                                    f"malformed {what}: {type(exc).__name__}: {exc}")
            fixes[node] = wiring_fix(message_type, ReplyCode.MALFORMED_REPLY, str(exc), exc)
            continue
        missing.pop(node)
    if missing:
        log_failures(label, step, missing)
    if isinstance(failures, Failures):
        failures.update(missing)
    else:  # a plain dict keeps the full reasons as strings
        failures.update({n: f.reason for n, f in missing.items()})
    raise_if_not_configured(f"{label} {step}", missing)
    raise_if_not_wired(f"{label} {step}", missing, fixes, len(valid))
    return valid


#: The result type of a phase's :meth:`EvaluationPhase.run`.
ResultT = TypeVar("ResultT")
_PhaseT = TypeVar("_PhaseT", bound="EvaluationPhase")


def _check_phase_config(min_nodes: Any, timeout: Any, min_nodes_floor: int) -> None:
    if isinstance(min_nodes, bool) or not isinstance(min_nodes, int) or min_nodes < min_nodes_floor:
        raise ValueError(f"min_nodes must be an integer >= {min_nodes_floor}, got {min_nodes!r}")
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")


class EvaluationPhase(abc.ABC, Generic[ResultT]):
    """Abstract base of the server-side evaluation phases: the one phase contract.

    Every phase is run after training as ``phase.run(grid, arrays)`` and returns
    its result (``ResultT``: :class:`~flwr_fedeval.strategies.auc_phase.AUCPhaseResult`
    for the AUC phases, :class:`~flwr_fedeval.strategies.shapley_phase.ShapleyPhaseResult`
    for SecSV). Subclasses validate their own configuration in ``__init__`` (after
    calling this one), implement one method per protocol step and :meth:`run`, and
    list what :meth:`summary` shows in :meth:`_summary_items`. The base itself cannot
    be instantiated (``TypeError``); its configuration is checked first, so a bad
    ``min_nodes`` or ``timeout`` is named even then.

    Parameters
    ----------
    min_nodes : int, default=2
        Fewer contributing clients than this at any step raises ``RuntimeError``.
    arrayrecord_key : str, default="arrays"
        Record key of the global model in the requests.
    timeout : float, default=3600
        Seconds to wait for the replies of each exchange.
    min_nodes_floor : int, default=1
        The smallest ``min_nodes`` the phase accepts.

    Raises
    ------
    ValueError
        ``min_nodes`` is not an integer >= ``min_nodes_floor`` or ``timeout`` is not > 0.

    Attributes
    ----------
    timer : StepTimer
        ``timer.timings``: (step, seconds) of every step run so far.
    failures : Failures
        Failures of the last run (node → step, code, reason).
    results : dict of int to ResultT
        The results of the runs through :meth:`evaluate_fn`, by server round.
    """

    #: The ``auc-method`` (or phase name) this class implements.
    method = ""
    #: Prefix of the log lines.
    label = "AUC phase"

    def __new__(cls: type[_PhaseT], *args: Any, **kwargs: Any) -> _PhaseT:
        if inspect.isabstract(cls):   # name a bad configuration before refusing the abstract class
            _check_phase_config(kwargs.get("min_nodes", 2), kwargs.get("timeout", 3600),
                                kwargs.get("min_nodes_floor", 1))
        return super().__new__(cls)

    def __init__(self, *, min_nodes: int = 2, arrayrecord_key: str = ARRAYS_KEY, timeout: float = 3600,
                 min_nodes_floor: int = 1) -> None:
        _check_phase_config(min_nodes, timeout, min_nodes_floor)
        self.min_nodes = min_nodes
        self.arrayrecord_key = arrayrecord_key
        self.timeout = float(timeout)
        self.timer = StepTimer(self._log_label())
        self.failures = Failures()
        #: Results of the runs through :meth:`evaluate_fn`, by server round.
        self.results: dict[int, ResultT] = {}

    @abc.abstractmethod
    def run(self, grid: Grid, arrays: ArrayRecord) -> ResultT:
        """Run the phase's protocol steps over ``grid`` and return its result.

        Parameters
        ----------
        grid : flwr.serverapp.Grid
            The run's grid (the data clients, and any auxiliary node the phase needs).
        arrays : ArrayRecord
            The global model after training (the AUC phases send it; SecSV values the
            local models the clients recorded and accepts it for this contract).

        Raises
        ------
        RuntimeError
            Fewer than ``min_nodes`` clients are left after a step (:meth:`require`);
            each phase documents its own errors (``ShapleyPhaseError`` derives from it).
        """

    def evaluate_fn(self, grid: Grid, *, rounds: Iterable[int]) -> Callable[[int, ArrayRecord], MetricRecord | None]:
        """This phase as Flower's server-side ``evaluate_fn`` (``Strategy.start(..., evaluate_fn=...)``).

        At each server round in ``rounds`` it runs the phase on that round's global model and returns
        the result's ``to_metric_record()`` (e.g. ``auc``, ``auc-resolution-bound``), which Flower keeps
        in ``Result.evaluate_metrics_serverapp[round]``; the full result is kept in ``results[round]``.
        Other rounds return ``None`` (nothing recorded). Each run is one evaluation of that model by
        every client (their ``fedeval-*`` policy counts it): name only the rounds you need, typically
        ``rounds=[num_rounds]``.

        Parameters
        ----------
        grid : flwr.serverapp.Grid
            The run's grid (the one passed to ``start``).
        rounds : iterable of int
            Server rounds to evaluate (0 is the initial model).

        Raises
        ------
        ValueError
            ``rounds`` is empty or holds a negative round.
        """
        wanted = {int(r) for r in rounds}
        if not wanted or min(wanted) < 0:
            raise ValueError(f"rounds must name at least one server round >= 0, got {sorted(wanted)}")
        self.results = {}

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round not in wanted:
                return None
            result = self.run(grid, arrays)
            self.results[server_round] = result
            return result.to_metric_record()  # type: ignore[attr-defined]

        return evaluate

    # --- description --------------------------------------------------------------
    def _log_label(self) -> str:
        return f"{self.label} ({self.method})" if self.method else self.label

    def _summary_items(self) -> list[tuple[str, str]]:
        """``[(name, value)]`` shown by :meth:`summary`; subclasses add theirs first."""
        return [("Minimum nodes", str(self.min_nodes)), ("Timeout per step", f"{self.timeout:g} s"),
                ("ArrayRecord key", repr(self.arrayrecord_key))]

    def describe(self) -> str:
        """One line: the phase and its configuration."""
        return f"{self._log_label()}: " + ", ".join(f"{k.lower()} {v}" for k, v in self._summary_items())

    def summary(self) -> None:
        """Log the configuration as a small tree (as ``flwr.serverapp.strategy.FedAvg.summary``)."""
        items = self._summary_items()
        log(INFO, "\t└──> %s (%s):", type(self).__name__, self.method or "phase")
        for i, (k, v) in enumerate(items):
            log(INFO, "\t\t%s── %s: %s", "└" if i == len(items) - 1 else "├", k, v)

    # --- per run --------------------------------------------------------------------
    def _start_run(self) -> Failures:
        self.failures = Failures()
        return self.failures

    def step(self, name: str):
        """Context manager timing (and logging) one protocol step."""
        return self.timer.step(name)

    def exchange(self, grid: Grid, contents: Mapping[int, RecordDict], message_type: str,
                 parse: Callable[[int, RecordDict], Any], *, step: str, what: str,
                 failures: Failures | None = None) -> dict[int, Any]:
        """:func:`exchange_replies` with this phase's timeout, label and failure record."""
        return exchange_replies(grid, contents, message_type, parse,
                                self.failures if failures is None else failures, step=step, what=what,
                                timeout=self.timeout, label=self._log_label())

    def require(self, nodes: Iterable[int], step: str) -> None:
        """Raise ``RuntimeError`` if fewer than ``min_nodes`` nodes are left after ``step``."""
        nodes = list(nodes)
        if len(nodes) < self.min_nodes:
            lines = "; ".join(self.failures.lines()) or "none failed"
            raise RuntimeError(
                f"{self._log_label()} {step}: {len(nodes)} clients left, at least {self.min_nodes} "
                f"needed; left out: {lines}"
            )


class ReadableFailuresMixin:
    """For Flower's FedAvg family: log failed replies collapsed by reason.

    Flower logs one line per failing node with the full remote reason (a
    traceback in simulation); this logs one WARNING line per distinct reason
    with the node count and IDs, and the full reason once at DEBUG.
    """

    def start(self, grid: Grid, *args: Any, **kwargs: Any) -> Any:
        """Flower's ``Strategy.start`` over a :class:`~flwr_fedeval.strategies.collect.DetectingGrid`
        (unless ``grid`` already collects so, e.g. a :class:`FailureRecordingGrid`): the train and
        evaluate steps give up a node that left the node list at once instead of at ``timeout``."""
        from flwr.serverapp.strategy import Strategy

        from flwr_fedeval.strategies.collect import DetectingGrid

        if not callable(getattr(grid, "collect_replies", None)):
            grid = DetectingGrid(grid)
        return Strategy.start(self, grid, *args, **kwargs)  # type: ignore[arg-type]

    def _check_and_log_replies(self, replies: Iterable[Message], is_train: bool, validate: bool = True):
        """As Flower's ``FedAvg._check_and_log_replies``, with failures collapsed by reason; a
        ``NOT_CONFIGURED`` reply raises :class:`NodeNotConfigured`, and every node failing for its
        ClientApp's code :class:`ClientAppNotWired` (the run stops)."""
        replies = list(replies)
        valid = [r for r in replies if not r.has_error()]
        errors = [r for r in replies if r.has_error()]
        step = "aggregate_train" if is_train else "aggregate_evaluate"
        log(INFO, "%s: Received %s results and %s failures", step, len(valid), len(errors))
        if errors:
            failed = {r.metadata.src_node_id: Failure(step, int(r.error.code), str(r.error.reason)) for r in errors}
            log_failures(type(self).__name__, step, failed)
            raise_if_not_configured(f"{type(self).__name__} {step}", failed)
            message_type = "train" if is_train else "evaluate"
            fixes = {r.metadata.src_node_id: wiring_fix(message_type, r.error.code, str(r.error.reason))
                     for r in errors}
            raise_if_not_wired(f"{type(self).__name__} {step}", failed, fixes, len(valid))
        if validate and valid:
            validate_message_reply_consistency(
                replies=[r.content for r in valid],
                weighted_by_key=self.weighted_by_key,  # type: ignore[attr-defined]
                check_arrayrecord=is_train,
            )
        return valid, errors


class ReadableFedAvg(ReadableFailuresMixin, FedAvg):
    """Flower's ``FedAvg`` with failed replies logged collapsed by reason (:class:`ReadableFailuresMixin`)."""
