"""Send messages and collect the replies; stop waiting for a node as soon as it is known to be gone.

Flower's ``Grid.send_and_receive`` (flwr 1.30-1.41) pushes the messages and
pulls every 3 s until all replies are in or the timeout runs out: it never
reads the node list (a lost node is given up only if the SuperLink answers
for it with an error reply, else at the timeout), and a SuperNode restarted
under a new node ID is waited for under its old ID until the old one's
heartbeat expires. :func:`send_and_collect` is the one routine every step of
this package uses instead (through :func:`collect`). It polls adaptively:
first after :data:`MIN_POLL_INTERVAL` (20 ms), then each wait 1.5 times the
last, up to :data:`POLL_INTERVAL` (1 s), so a step whose replies come back in
tens of milliseconds is not held for a whole second, and a long step costs the
SuperLink at most one poll a second. At each poll it

1. pulls the pending replies (Flower's own error replies, e.g.
   ``NODE_UNAVAILABLE`` once the heartbeat expired, are kept as they come);
2. compares the pending destinations with ``grid.get_node_ids()``: a node
   that was listed when the messages were pushed and is listed no more is
   given up at once, with an error reply of code
   :attr:`~flwr_fedeval.protocol.ReplyCode.NODE_GONE`;
3. with a :class:`Rejoin`, asks every node whose identity it does not know
   yet to prove one (a signed reply, see :class:`Rejoin`); a pending node
   whose identity came back under a new node ID is given up at once
   (:attr:`~flwr_fedeval.protocol.ReplyCode.NODE_REJOINED`), so the next
   attempt of the step takes the new ID without waiting for the old one.

A node still pending when ``timeout`` runs out has no reply in the result:
only then is our step timeout the reason.

Timing: a node killed with ``kill -9`` leaves the SuperLink's node list when
its heartbeat expires (``HEARTBEAT_PATIENCE`` 2 × the SuperNode's heartbeat
interval, 30 s by default: about 60 s); it is given up within one poll
interval (at most :data:`POLL_INTERVAL`) after that. A restarted node proves
its identity within one poll interval after it connects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO
from typing import Any, Protocol, runtime_checkable

from flwr.app import Error, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_fedeval._compat import Run  # moved between Flower releases
from flwr_fedeval.protocol import ReplyCode

__all__ = ["IDENTITY_TIMEOUT", "MIN_POLL_INTERVAL", "POLL_BACKOFF", "POLL_INTERVAL", "Collected", "DetectingGrid",
           "FoldingGrid", "GridView", "OnReply", "PhaseGrid", "Rejoin", "ReplyCollector", "SimulatedTime", "collect",
           "send_and_collect"]

#: Longest wait (s) between two polls (pull the replies, read the node list) of :func:`send_and_collect`.
POLL_INTERVAL = 1.0
#: First wait (s) after pushing the messages; each later wait is :data:`POLL_BACKOFF` times the last.
MIN_POLL_INTERVAL = 0.02
POLL_BACKOFF = 1.5
#: Seconds a new node gets to prove its identity (a :class:`Rejoin` ``prove`` exchange; capped by the step timeout).
IDENTITY_TIMEOUT = 30.0


@dataclass
class Collected:
    """What :func:`send_and_collect` got back.

    Attributes
    ----------
    replies : list of Message
        Every reply that came (Flower's error replies included), plus an
        error reply made here for each node given up early (codes
        ``NODE_GONE``, ``NODE_REJOINED``, ``NOT_DELIVERED`` of
        :class:`~flwr_fedeval.protocol.ReplyCode`); matched to the requests
        by ``reply_to_message_id``.
    seconds : dict of int to float
        Destination node → seconds from the push until its reply came or it
        was given up (the whole wait for a timed-out node).
    timed_out : list of int
        Nodes still pending when ``timeout`` ran out (no reply in ``replies``).
    replaced : dict of int to int
        Old node ID → the new node ID its identity came back under.
    elapsed : float
        Seconds of the whole exchange.
    """

    replies: list[Message] = field(default_factory=list)
    seconds: dict[int, float] = field(default_factory=dict)
    timed_out: list[int] = field(default_factory=list)
    replaced: dict[int, int] = field(default_factory=dict)
    elapsed: float = 0.0


class Rejoin:
    """Who is who across node IDs: ``node ID → identity``, and how a new node proves one.

    Flower node IDs prove nothing and a restarted SuperNode gets a new one.
    An identity is a roster name proven by a signature over a fresh nonce
    (``prove`` runs :func:`flwr_fedeval.strategies.shapley_phase.discover_roles`
    with the roster), or, before any roster exists, a partition id as the
    node reports it (unsigned: then any node can claim it; without a roster
    there is no identity to protect). When a new node proves the identity of
    a known node ID, the old ID is *replaced*: it is given up at once if a
    step waits for it, and hidden from the node list of a
    :class:`~flwr_fedeval.strategies.base.FailureRecordingGrid`, so that
    every later attempt takes the new ID. One identity therefore counts for
    at most one node ID at a time; the clients refuse a key set that lists a
    roster member twice whatever the server does.

    Parameters
    ----------
    prove : callable
        ``prove(grid, node_ids) -> {node_id: identity}`` for the nodes that
        proved one (the others are left out).
    identities : dict, optional
        Known ``node ID → identity`` (e.g. from the role discovery before round 1).
    ignore : iterable of int, optional
        Node IDs never to ask (e.g. nodes the role discovery already refused).

    Attributes
    ----------
    identities : dict
    replaced : dict of int to int
        Old node ID → new node ID.
    """

    def __init__(self, prove: Callable[[Grid, list[int]], Mapping[int, Hashable]],
                 identities: Mapping[int, Hashable] | None = None, ignore: Iterable[int] = ()) -> None:
        self.prove = prove
        self.identities: dict[int, Hashable] = {int(k): v for k, v in (identities or {}).items()}
        self.replaced: dict[int, int] = {}
        self._asked: set[int] = {int(n) for n in ignore}

    def learn(self, grid: Grid, listed: Iterable[int]) -> None:
        """Ask every listed node of unknown identity (once) to prove one; record replacements."""
        unknown = sorted(int(n) for n in listed if int(n) not in self.identities and int(n) not in self._asked)
        if not unknown:
            return
        self._asked.update(unknown)
        for new, ident in self.prove(grid, unknown).items():
            new = int(new)
            for old, known in list(self.identities.items()):
                if known == ident and old != new and old not in self.replaced:
                    self.replaced[old] = new
                    log(INFO, "node %d is back as node %d (same identity %s); node %d is given up", old, new,
                        ident, old)
            self.identities[new] = ident


def _error_reply(msg: Message, code: int, reason: str) -> Message:
    return Message(Error(code=int(code), reason=reason), reply_to=msg)


#: A per-reply callback of :func:`send_and_collect`: ``on_reply(reply) -> kept``; ``kept`` (a message, e.g. the
#: reply without its bulk once the caller folded it into a running sum) is what the result keeps.
OnReply = Callable[[Message], Message]


@runtime_checkable
class ReplyCollector(Protocol):
    """What a phase exchange needs from a grid: one call that sends the requests and collects the replies.

    ``collect_replies`` pushes the requests and returns every reply, with the nodes given up early
    (:class:`Collected`); ``on_reply`` is :func:`send_and_collect`'s per-reply callback. Every
    :class:`GridView` provides it; :func:`collect` uses it where a grid has it, and polls a plain
    Flower ``Grid`` with :func:`send_and_collect` otherwise.
    """

    def collect_replies(self, messages: Iterable[Message], *, timeout: float | None = None,
                        on_reply: OnReply | None = None) -> Collected: ...


#: What a phase exchange accepts: Flower's ``Grid`` (polled by :func:`send_and_collect`) or a
#: :class:`ReplyCollector` (a :class:`GridView`, or a view that hands back replies it already has).
PhaseGrid = Grid | ReplyCollector


@runtime_checkable
class SimulatedTime(Protocol):
    """A grid with its own clock (the in-process test grid's simulated seconds): ``clock()`` and
    ``sleep(seconds)`` replace ``time.monotonic`` and ``time.sleep`` in :func:`send_and_collect`."""

    def clock(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


def send_and_collect(grid: Grid, messages: Iterable[Message], *, timeout: float | None,
                     poll_interval: float = POLL_INTERVAL, rejoin: Rejoin | None = None,
                     min_poll_interval: float = MIN_POLL_INTERVAL, on_reply: OnReply | None = None) -> Collected:
    """Push ``messages``, then poll until every destination replied, was given up, or ``timeout`` ran out.

    See the module docstring for what is checked at each poll. A grid with
    :class:`SimulatedTime` (the in-process test grid) is polled on its own
    clock; otherwise ``time.monotonic`` and ``time.sleep`` are used.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        Any grid with ``push_messages``, ``pull_messages`` and ``get_node_ids``.
    messages : iterable of Message
    timeout : float or None
        Seconds to wait (``None``: until every node replied or was given up).
    poll_interval : float, default=:data:`POLL_INTERVAL`
        The longest wait between two polls (s).
    rejoin : Rejoin, optional
    min_poll_interval : float, default=:data:`MIN_POLL_INTERVAL`
        The first wait (s); each later one is :data:`POLL_BACKOFF` times the last, up to ``poll_interval``.
    on_reply : callable, optional
        ``on_reply(reply) -> Message``, called once for every reply pulled (error replies included, in the
        order they come, before the next pull), e.g. to fold a ciphertext into a running sum; the result
        keeps what it returns instead of the reply, so the caller may drop the reply's bulk at once.
        The error replies made here for nodes given up are kept as they are (not passed to it).

    Returns
    -------
    Collected

    Raises
    ------
    ValueError
        If ``poll_interval`` or ``min_poll_interval`` is not > 0, or ``min_poll_interval > poll_interval``.
    """
    if poll_interval <= 0 or min_poll_interval <= 0 or min_poll_interval > poll_interval:
        raise ValueError(f"need 0 < min_poll_interval <= poll_interval seconds, got {min_poll_interval!r} "
                         f"and {poll_interval!r}")
    wait = min_poll_interval
    clock: Callable[[], float] = grid.clock if isinstance(grid, SimulatedTime) else time.monotonic
    sleep: Callable[[float], None] = grid.sleep if isinstance(grid, SimulatedTime) else time.sleep
    messages = list(messages)
    t0 = clock()
    out = Collected()
    pushed = list(grid.push_messages(messages)) if messages else []
    listed_at_push = {int(n) for n in grid.get_node_ids()}
    if len(pushed) == len(messages):  # one ID (or None) per message, in order: Flower's grpc/http grids
        ids: list[str | None] = [str(i) if i else None for i in pushed]
    else:  # a grid that leaves out what it could not store (flwr's InMemoryGrid): match by message ID
        stored = {str(i) for i in pushed if i}
        ids = [str(m.metadata.message_id) if str(m.metadata.message_id) in stored else None for m in messages]
    pending: dict[str, Message] = {}
    for mid, msg in zip(ids, messages):
        if mid:
            pending[mid] = msg
        else:
            out.replies.append(_error_reply(msg, ReplyCode.NOT_DELIVERED, "the SuperLink did not accept the message"))
            out.seconds[int(msg.metadata.dst_node_id)] = 0.0

    def give_up(mid: str, code: int, reason: str, now: float) -> None:
        msg = pending.pop(mid)
        out.replies.append(_error_reply(msg, code, reason))
        out.seconds[int(msg.metadata.dst_node_id)] = now

    while pending:
        for reply in grid.pull_messages(list(pending)):
            sent = pending.get(reply.metadata.reply_to_message_id)
            if sent is not None:  # a reply to no pending request (or a second one) is dropped
                del pending[reply.metadata.reply_to_message_id]
                out.replies.append(reply if on_reply is None else on_reply(reply))
                del reply
                out.seconds[int(sent.metadata.dst_node_id)] = clock() - t0
        if not pending:
            break
        now = clock() - t0
        listed = {int(n) for n in grid.get_node_ids()}
        for mid, msg in list(pending.items()):
            node = int(msg.metadata.dst_node_id)
            if node in listed_at_push and node not in listed:
                give_up(mid, ReplyCode.NODE_GONE,
                        f"node left the SuperLink's node list after {now:.1f} s (Flower heartbeat)", now)
        if rejoin is not None and pending:
            rejoin.learn(grid, listed)
            now = clock() - t0
            for mid, msg in list(pending.items()):
                node = int(msg.metadata.dst_node_id)
                if node in rejoin.replaced:
                    new = rejoin.replaced[node]
                    out.replaced[node] = new
                    give_up(mid, ReplyCode.NODE_REJOINED,
                            f"node restarted: its identity {rejoin.identities.get(new)} is back as node {new} "
                            f"after {now:.1f} s; this node ID is given up", now)
        if not pending or (timeout is not None and now >= timeout):
            break
        sleep(wait if timeout is None else max(0.0, min(wait, timeout - now)))
        wait = min(poll_interval, wait * POLL_BACKOFF)
    elapsed = clock() - t0
    for msg in pending.values():
        out.timed_out.append(int(msg.metadata.dst_node_id))
        out.seconds[int(msg.metadata.dst_node_id)] = elapsed
    out.elapsed = elapsed
    return out


def collect(grid: PhaseGrid, messages: Iterable[Message], *, timeout: float | None,
            on_reply: OnReply | None = None) -> Collected:
    """One exchange over ``grid``: its ``collect_replies`` when it is a :class:`ReplyCollector`,
    else :func:`send_and_collect` over the plain Flower ``Grid``.

    A :class:`~flwr_fedeval.strategies.base.FailureRecordingGrid` (and any view that delegates to
    one) records the failures and applies its :class:`Rejoin`. ``on_reply`` (see
    :func:`send_and_collect`) is passed on only when given.
    """
    if isinstance(grid, ReplyCollector):
        if on_reply is None:
            return grid.collect_replies(messages, timeout=timeout)
        return grid.collect_replies(messages, timeout=timeout, on_reply=on_reply)
    return send_and_collect(grid, messages, timeout=timeout, on_reply=on_reply)


class GridView(Grid):
    """A Flower ``Grid`` over another one whose exchanges give up lost nodes early: the one wrapper.

    Every method of Flower's ``Grid`` is delegated to the wrapped grid, except the exchange:
    :meth:`collect_replies` is :func:`collect` over the wrapped grid (so a view over a
    :class:`~flwr_fedeval.strategies.base.FailureRecordingGrid` keeps its failure record) and
    ``send_and_receive`` returns its replies, so Flower's ``Strategy.start`` loop gives up a node
    that left the node list at once instead of at its timeout. Its time (``clock``, ``sleep``)
    is the wrapped grid's. Other attributes (a test grid's
    ``failures``, ``clock``, ...) are read from the wrapped grid. Subclasses change one thing each:
    :class:`~flwr_fedeval.strategies.base.FailureRecordingGrid` records failures,
    :class:`~flwr_fedeval.strategies.shapley_phase.NodeSubsetGrid` hides nodes.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The grid to wrap (Flower's, or another view).
    """

    def __init__(self, grid: Grid) -> None:
        self._grid = grid

    def __getattr__(self, name: str) -> Any:
        if name == "_grid":  # not set yet (e.g. during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._grid, name)

    @property
    def wrapped(self) -> Grid:
        """The grid this view wraps (Flower's, or another view)."""
        return self._grid

    def set_run(self, run: Run) -> None:
        self._grid.set_run(run)

    @property
    def run(self) -> Run:
        return self._grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self._grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def clock(self) -> float:
        """The wrapped grid's clock (:class:`SimulatedTime`), else ``time.monotonic()``."""
        return self._grid.clock() if isinstance(self._grid, SimulatedTime) else time.monotonic()

    def sleep(self, seconds: float) -> None:
        """The wrapped grid's ``sleep`` (:class:`SimulatedTime`), else ``time.sleep``."""
        if isinstance(self._grid, SimulatedTime):
            self._grid.sleep(seconds)
        else:
            time.sleep(seconds)

    def collect_replies(self, messages: Iterable[Message], *, timeout: float | None = None,
                        on_reply: OnReply | None = None) -> Collected:
        """:func:`collect` over the wrapped grid."""
        return collect(self._grid, messages, timeout=timeout, on_reply=on_reply)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """As Flower's, but a node that left the node list is given up at once (an error reply)."""
        return self.collect_replies(messages, timeout=timeout).replies


class DetectingGrid(GridView):
    """A :class:`GridView` that changes nothing: Flower's ``Grid`` with early give-up of lost nodes.

    For Flower's ``Strategy.start`` loop (train and evaluate steps), which calls
    ``grid.send_and_receive``.
    """


class FoldingGrid(GridView):
    """A :class:`GridView` that hands every reply of every exchange to one callback as it arrives.

    For a step whose replies are too large to hold all at once inside Flower's ``Strategy.start``
    loop, which calls ``send_and_receive`` and has no per-reply callback: the strategy passes its
    callback here (:meth:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg.fold_train_reply` folds each
    ``train`` ciphertext into the round's running sum and keeps the reply without it), and every
    exchange over this view, the loop's and the phases', runs it (:func:`send_and_collect`'s
    ``on_reply``). ``fold`` sees the replies of every exchange and must return those it does not
    handle as they are; it recognises its own by ``reply_to_message_id``. An exchange's own
    ``on_reply`` runs after ``fold``, on what ``fold`` kept.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The grid to wrap (Flower's, or another view).
    fold : OnReply
        ``fold(reply) -> kept``.
    """

    def __init__(self, grid: Grid, fold: OnReply) -> None:
        super().__init__(grid)
        self.fold = fold

    def collect_replies(self, messages: Iterable[Message], *, timeout: float | None = None,
                        on_reply: OnReply | None = None) -> Collected:
        """:func:`collect` over the wrapped grid, each reply passed to ``fold`` (then to ``on_reply``)."""
        fold = self.fold
        if on_reply is None:
            return collect(self._grid, messages, timeout=timeout, on_reply=fold)
        then = on_reply

        def both(reply: Message) -> Message:
            return then(fold(reply))

        return collect(self._grid, messages, timeout=timeout, on_reply=both)
