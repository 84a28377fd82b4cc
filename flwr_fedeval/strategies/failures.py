"""Who failed at which step, and why: failure records, their collapsed log lines, and the run-stopping errors.

* :class:`Failure` — one node's failure at one step, with a machine-readable code
  (:class:`flwr_fedeval.protocol.ReplyCode` for our own error replies, Flower's
  ``ErrorCode`` for the engine's) and the reason. The server classifies by
  code, never by matching the reason text.
* :class:`Failures` (one phase run) and :class:`FailureLog` (every failure of a run,
  what ``results.json`` holds).
* :func:`log_failures` — failures of many nodes collapse into one WARNING line
  per distinct reason with the node count and IDs
  (``16 nodes: ValueError: test split of 1 sample ... [nodes 3, 9, ...]``);
  the full reason (a remote traceback, for the engines' errors) once at DEBUG.
* :class:`NodeNotConfigured` — a node refused a step for its configuration
  (``NOT_CONFIGURED``: no identity or roster, a run config looser than its
  policy): no other node or attempt can fix that, so every exchange raises it
  at the first such reply and the run stops there, naming the keys to set,
  instead of retrying every round.
* :class:`ClientAppNotWired` — every node failed a step for a reason in its
  ClientApp's code (no handler registered for the message type, ``xmkckks_mod``
  missing or listed after a Flower mod, a ``client_fn``/``NumPyClient`` App):
  the run stops with one error naming the line to add (:func:`wiring_fix`),
  instead of running every round on the initial model.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from logging import DEBUG, WARNING
from typing import Any

from flwr.common.logger import log

from flwr_fedeval.protocol import MESSAGE_API_GUIDE, MalformedMessage, ReplyCode, config_keys_of

__all__ = [
    "ClientAppNotWired",
    "Failure",
    "FailureLog",
    "Failures",
    "NodeNotConfigured",
    "code_name",
    "collapse_failures",
    "format_failures",
    "log_failures",
    "one_line_reason",
    "raise_if_not_configured",
    "raise_if_not_wired",
    "registration_lines",
    "wiring_fix",
]

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
        A :class:`~flwr_fedeval.protocol.ReplyCode` (our error replies; also
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
    """``"TIMEOUT"`` (ours, :class:`~flwr_fedeval.protocol.ReplyCode`) or ``"flwr:NODE_UNAVAILABLE"``
    (Flower's ``ErrorCode``)."""
    try:
        return ReplyCode(int(code)).name
    except ValueError:
        pass
    from flwr.common.constant import ErrorCode

    names = {v: k for k, v in vars(ErrorCode).items() if k.isupper() and isinstance(v, int)}
    return f"flwr:{names.get(int(code), 'UNKNOWN')}"


class FailureLog(list[Failure]):
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


class Failures(dict[int, Failure]):
    """``{node_id: Failure}`` of one phase run, with classification by code.

    A ``dict`` so that existing code that reads ``failed[node]`` keeps working;
    :meth:`reasons` gives the ``{node: "reason"}`` mapping reported in results.
    """

    def __setitem__(self, node: int, value: Failure | str) -> None:  # a str is wrapped in a Failure
        # A bare reason is a failure the server found itself (e.g. a duplicate key).
        if not isinstance(value, Failure):
            value = Failure("", int(ReplyCode.MALFORMED_REPLY), str(value))
        super().__setitem__(int(node), value)

    def update(self, other: Any = (), **kw: Any) -> None:
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


