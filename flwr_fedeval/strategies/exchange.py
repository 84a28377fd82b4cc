"""One typed exchange for every phase step: requests by node in, checked replies and failures out.

* :func:`exchange_replies` — send one request per node, collect the replies
  (:func:`~flwr_fedeval.strategies.collect.collect`: a node that leaves the
  SuperLink's node list is given up at once), parse each valid one, record a
  :class:`~flwr_fedeval.strategies.failures.Failure` for every other node, and
  stop the run for a node's configuration or a ClientApp's wiring.
* :class:`FailureRecordingGrid` — the :class:`~flwr_fedeval.strategies.collect.GridView`
  that records every failure of every step of a run (training, key generation,
  partial decryption, each AUC/Shapley step), with node, round, step, code,
  the reason that fired and the seconds until the step knew; Flower's error
  replies keep Flower's code and reason, our ``TIMEOUT`` is named only for a
  reply that did not come within the step's timeout. Replies are matched to
  requests by ``reply_to_message_id`` (:func:`replies_by_node`), so an error
  reply the SuperLink sends for a lost node is the node's.
* :class:`StepTimer` — every protocol step logs ``<phase>: <step> done in
  1.23 s`` at INFO and keeps ``(step, seconds)`` for callers that measure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from logging import INFO
from typing import TypeVar

from flwr.app import Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.strategies.collect import Collected, GridView, OnReply, PhaseGrid, Rejoin, collect, send_and_collect
from flwr_fedeval.strategies.failures import (
    Failure,
    FailureLog,
    Failures,
    log_failures,
    raise_if_not_configured,
    raise_if_not_wired,
    wiring_fix,
)

__all__ = ["FailureRecordingGrid", "StepTimer", "exchange_replies", "rejoin_of", "replies_by_node"]


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


class FailureRecordingGrid(GridView):
    """A :class:`~flwr_fedeval.strategies.collect.GridView` that records every failed request.

    Each exchange (``send_and_receive``, :meth:`collect_replies`) runs
    :func:`~flwr_fedeval.strategies.collect.send_and_collect`: a node that
    leaves the SuperLink's node list is given up at once (``NODE_GONE``), and
    with a :class:`~flwr_fedeval.strategies.collect.Rejoin` so is a node whose
    identity came back under a new node ID (``NODE_REJOINED``); replies are
    matched to requests (:func:`replies_by_node`). A request still without a
    reply when the step's timeout ran out is recorded as our ``TIMEOUT``, an
    error reply with its own code and reason (Flower's ``ErrorCode`` for the
    engine's errors, a :class:`~flwr_fedeval.protocol.ReplyCode` for ours),
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

    def __init__(self, grid: Grid, failures: FailureLog | None = None, *, rejoin: Rejoin | None = None) -> None:
        super().__init__(grid)
        self.failures = FailureLog() if failures is None else failures
        self.rejoin = rejoin

    def get_node_ids(self) -> Iterable[int]:
        ids = self._grid.get_node_ids()
        if self.rejoin is None or not self.rejoin.replaced:
            return ids
        replaced = self.rejoin.replaced
        return [n for n in ids if int(n) not in replaced]

    def collect_replies(self, messages: Iterable[Message], *, timeout: float | None = None,
                        on_reply: OnReply | None = None) -> Collected:
        """:func:`~flwr_fedeval.strategies.collect.send_and_collect` over the wrapped grid; failures recorded.
        ``on_reply`` is its per-reply callback (a reply's bulk folded and dropped as it comes)."""
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


def rejoin_of(grid: Grid) -> Rejoin | None:
    """The :class:`~flwr_fedeval.strategies.collect.Rejoin` of the :class:`FailureRecordingGrid` that
    ``grid`` is or wraps (through any :class:`~flwr_fedeval.strategies.collect.GridView`), else ``None``."""
    while isinstance(grid, GridView):
        if isinstance(grid, FailureRecordingGrid):
            return grid.rejoin
        grid = grid.wrapped
    return None


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


_Parsed = TypeVar("_Parsed")


def exchange_replies(
    grid: PhaseGrid,
    contents: Mapping[int, RecordDict],
    message_type: str,
    parse: Callable[[int, RecordDict], _Parsed],
    failures: Failures | dict[int, str],
    *,
    step: str,
    what: str,
    timeout: float,
    label: str,
    on_reply: OnReply | None = None,
) -> dict[int, _Parsed]:
    """Send ``contents[node]`` to each node; return ``{node: parse(node, reply)}`` for valid replies.

    Follows Flower's ``FedAvg._check_and_log_replies``: replies are split into
    valid ones and failures first; a node without a valid reply is added to
    ``failures`` with a code (``TIMEOUT``, the error reply's code,
    ``MALFORMED_REPLY``) and the reason, failures are logged collapsed by
    reason (:func:`log_failures`), and only parsed, checked content reaches
    the protocol. The exchange is :func:`~flwr_fedeval.strategies.collect.collect`:
    a node that leaves the SuperLink's node list is given up at once, and
    ``TIMEOUT`` is named only for a node still silent when ``timeout`` ran out. ``on_reply`` is
    the exchange's per-reply callback (:func:`~flwr_fedeval.strategies.collect.send_and_collect`),
    e.g. to parse each reply and fold its bulk into a running sum as it arrives.

    Raises
    ------
    NodeNotConfigured
        A node refused for its configuration (``NOT_CONFIGURED``); after the
        failures are logged and recorded.
    ClientAppNotWired
        No node replied validly and every node failed for its ClientApp's code
        (:func:`wiring_fix`); after the failures are logged and recorded.
    """
    messages = [Message(content=c, dst_node_id=n, message_type=message_type) for n, c in contents.items()]
    replies = replies_by_node(messages, collect(grid, messages, timeout=timeout, on_reply=on_reply).replies)
    missing: dict[int, Failure] = {n: Failure(step, int(ReplyCode.TIMEOUT),
                                              f"no reply within step-timeout {timeout:g} s")
                                   for n in contents}
    valid: dict[int, _Parsed] = {}
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


