"""The serializing in-process Grid that runs a node only when its reply is pulled.

So that 100 nodes at 11.7M weights fit in memory.

:class:`~flwr_fedeval.testing.InProcessGrid` runs every node at *push* time
and holds every reply until it is pulled: at ResNet-18 size (11,689,512
weights) one compact ``train`` reply is ~236 MB, so 100 held replies would
not fit this machine's 24 GiB. :class:`LazyInProcessGrid` keeps the pushed
instructions (the server's own objects, no copy) and runs a node's ClientApp
when a pull asks for its reply, at most ``per_pull`` nodes per pull, with
the same serialization round trips (instruction, ``Context`` and reply) and
byte counts. The server's polling loop
(:func:`~flwr_fedeval.strategies.collect.send_and_collect`) then sees the
replies "arrive" a few at a time, as over a network.

It counts what it hands out: :attr:`LazyInProcessGrid.max_alive` is the
largest number of reply *contents* (``RecordDict``) alive at once, followed
with weak references, so a server that keeps a reply's bulk (instead of
folding it and dropping it) shows up here.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

from flwr.app import Message

from flwr_fedeval.testing.grid import Fault, InProcessGrid

__all__ = ["LazyInProcessGrid"]


class LazyInProcessGrid(InProcessGrid):
    """:class:`~flwr_fedeval.testing.InProcessGrid` whose nodes run when their reply is pulled.

    Parameters
    ----------
    client_app, num_nodes, run_config, node_configs, fault
        As for :class:`~flwr_fedeval.testing.InProcessGrid`.
    per_pull : int, default=1
        Most nodes run (and replies returned) per ``pull_messages`` call.

    Attributes
    ----------
    max_replies_per_pull : int
        Most replies one pull returned.
    alive, max_alive : int
        Reply contents handed out and still referenced (by anyone), now and at most (error
        replies, which have no content, are not counted).
    max_alive_by_type : dict of str to int
        ``max_alive`` per message type.

    Simulated time (:meth:`clock`) advances in :meth:`sleep` only after a pull
    that returned nothing (a node that never replies still times out); while
    replies come, the server's polling waits take no simulated time.

    Raises
    ------
    ValueError
        If ``per_pull`` < 1.
    """

    def __init__(self, client_app: Any, num_nodes: int, run_config: dict[str, Any] | None = None, *, per_pull: int = 1,
                 node_configs: list[dict[str, Any]] | None = None, fault: Fault | None = None) -> None:
        if per_pull < 1:
            raise ValueError(f"per_pull must be >= 1, got {per_pull!r}")
        super().__init__(client_app, num_nodes, run_config, node_configs=node_configs, fault=fault)
        self.per_pull = per_pull
        self._queued: dict[str, Message] = {}  # pushed, not run yet: message id -> instruction
        self._idle = False
        self.max_replies_per_pull = 0
        self.alive = 0
        self.max_alive = 0
        self._alive_by_type: dict[str, int] = {}
        self.max_alive_by_type: dict[str, int] = {}

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg_id = self._accept(msg)
            ids.append(msg_id)
            self._queued[msg_id] = msg
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Up to ``per_pull`` replies, each made now by running its node; plus the SuperLink's error
        replies for gone nodes (as :meth:`InProcessGrid.pull_messages`)."""
        wanted = list(message_ids)
        out: list[Message] = []
        made = 0
        for msg_id in wanted:
            if made >= self.per_pull:
                break
            msg = self._queued.pop(msg_id, None)
            if msg is None:
                continue
            if msg.metadata.dst_node_id in self._dead:  # accepted by the SuperLink, never delivered
                self._waiting[msg_id] = msg
                self.log.append((msg.metadata.dst_node_id, msg.metadata.message_type, False))
                continue
            made += 1
            received = self._deliver(msg_id, msg)
            if received is not None:
                self._track(received, msg.metadata.message_type)
                out.append(received)
        out.extend(super().pull_messages(wanted))
        self.max_replies_per_pull = max(self.max_replies_per_pull, len(out))
        self._idle = not out
        return out

    def sleep(self, seconds: float) -> None:
        """Advance the simulated time, only if the last pull returned nothing."""
        if self._idle:
            super().sleep(seconds)

    def _track(self, reply: Message, message_type: str) -> None:
        if not reply.has_content():  # an error reply: no content to hold
            return
        self.alive += 1
        self.max_alive = max(self.max_alive, self.alive)
        by = self._alive_by_type
        by[message_type] = by.get(message_type, 0) + 1
        self.max_alive_by_type[message_type] = max(self.max_alive_by_type.get(message_type, 0), by[message_type])
        weakref.finalize(reply.content, self._released, message_type)

    def _released(self, message_type: str) -> None:
        self.alive -= 1
        self._alive_by_type[message_type] -= 1
