"""The serializing in-process Grid (see :mod:`flwr_fedeval.testing` for usage)."""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from flwr_fedeval._compat import (  # Flower internals, shimmed for flwr 1.30-1.41
    ProtoContext,
    ProtoMessage,
    Run,
    context_from_proto,
    context_to_proto,
    message_from_proto,
    message_to_proto,
    set_serverapp_identity,
)

__all__ = ["Fault", "InProcessGrid"]

#: ``fault(node_id, instruction, reply) -> reply | None``: return the reply
#: (possibly altered) or ``None`` to drop it (the node times out).
Fault = Callable[[int, Message, Message], "Message | None"]


def _roundtrip_message(msg: Message) -> tuple[Message, int]:
    data = message_to_proto(msg).SerializeToString()
    proto = ProtoMessage()
    proto.ParseFromString(data)
    return message_from_proto(proto), len(data)


def _roundtrip_context(ctx: Context) -> Context:
    data = context_to_proto(ctx).SerializeToString()
    proto = ProtoContext()
    proto.ParseFromString(data)
    return context_from_proto(proto)


class InProcessGrid(Grid):
    """Grid over ``num_nodes`` in-process nodes running ``client_app``, serializing every message.

    ``send_and_receive`` delivers each instruction synchronously: the
    instruction is serialized and parsed back (as the SuperLink would), the
    ClientApp runs in this process with the node's ``Context`` (also
    serialized and parsed back, before and after), and the reply goes through
    the same round trip. An exception raised by the ClientApp becomes an
    error reply with code ``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``, as in the
    engines. ``timeout`` is ignored (there is no waiting); a dropped reply
    (see ``fault``) is simply missing from the result, as a timed-out node's.

    Node IDs are random unsigned 64-bit integers, half of them above the int64
    range, as the deployment engine assigns them.

    Time is simulated: :meth:`clock` starts at 0 and only :meth:`sleep`
    advances it (the polling of
    :func:`~flwr_fedeval.strategies.collect.send_and_collect` uses both), so
    a test of a 60 s heartbeat or a 600 s step timeout takes no real time.
    :meth:`kill` and :meth:`restart` play a lost SuperNode: it stops
    replying at once and leaves :meth:`get_node_ids` when its heartbeat
    expires (``gone_after`` simulated seconds later); a restarted one comes
    back under a new node ID with the same node config (partition, identity
    key) and an empty state.

    Parameters
    ----------
    client_app : flwr.clientapp.ClientApp
    num_nodes : int
    run_config : dict
        The run config every node sees (kebab-case keys).
    node_configs : list of dict, optional
        Per-node config; default ``{"partition-id": i, "num-partitions": num_nodes}``.
    fault : callable, optional
        Hook to drop or alter replies (see :data:`Fault`); may also be set
        later as ``grid.fault`` (e.g. once ``grid.node_ids`` are known).
    ledgers : "fresh", path or None, default "fresh"
        The nodes' privacy ledgers (:mod:`flwr_fedeval.clients.ledger`): ``"fresh"`` gives every
        node an empty ledger in a temporary folder (removed with the grid): each grid is a new
        federation of new nodes. A folder gives node ``i`` ``<folder>/node-<i>.ledger.sqlite``
        (created if missing, kept otherwise): a second grid over the same folder is a new run of
        the same nodes. ``None`` sets nothing: the nodes find their ledger as in deployment (node
        config ``fedeval-ledger``, else beside their identity key). A node config that sets
        ``fedeval-ledger`` is never overridden.

    Attributes
    ----------
    node_ids : list of int
        The nodes' IDs, in partition order (``node_ids[i]`` has partition ``i``),
        then the new IDs of restarted nodes (:meth:`restart`) in order;
        :meth:`get_node_ids` lists those connected now.
    contexts : dict of int to flwr.app.Context
        Each node's ``Context`` (its ``state`` persists across messages).
    bytes_down, bytes_up : dict of int to int
        Serialized bytes sent to / received from each node.
    log : list of (node_id, message_type, ok)
    now : float
        The simulated time in seconds (see :meth:`clock`).
    """

    def __init__(
        self,
        client_app: Any,
        num_nodes: int,
        run_config: dict[str, Any] | None = None,
        *,
        node_configs: list[dict[str, Any]] | None = None,
        fault: Fault | None = None,
        ledgers: str | os.PathLike[str] | None = "fresh",
    ) -> None:
        self.client_app = client_app
        self._run = Run.create_empty(run_id=1)
        # The ServerApp process identity that Message() reads (set by the runtime in deployment).
        set_serverapp_identity(run_id=1)
        # Node IDs as the deployment engine assigns them: random unsigned 64-bit (half of
        # them above the int64 range, so code that stores them in int64 arrays fails here too).
        self.node_ids = [secrets.randbits(64) | (1 << 63) if i % 2 else secrets.randbits(63) + 1
                         for i in range(num_nodes)]
        node_configs = node_configs or [
            {"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)
        ]
        node_configs = self._with_ledgers(node_configs, ledgers)
        self.contexts = {
            nid: Context(
                run_id=1,
                node_id=nid,
                node_config=dict(cfg),
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for nid, cfg in zip(self.node_ids, node_configs)
        }
        self.fault = fault
        self._replies: dict[str, Message] = {}
        self._ids = itertools.count(1)
        self.bytes_down = dict.fromkeys(self.node_ids, 0)
        self.bytes_up = dict.fromkeys(self.node_ids, 0)
        self.log: list[tuple[int, str, bool]] = []
        self.now = 0.0
        self._dead: set[int] = set()  # killed: no reply, ever
        self._gone_at: dict[int, float] = {}  # killed node -> simulated time it leaves the node list
        self._joins_at: dict[int, float] = {}  # restarted node's new ID -> simulated time it connects
        self._superlink_errors: set[int] = set()  # gone nodes the SuperLink answers for (NODE_UNAVAILABLE)
        self._waiting: dict[str, Message] = {}  # pushed to a dead node: message id -> instruction

    def _with_ledgers(self, node_configs: list[dict[str, Any]],
                      ledgers: str | os.PathLike[str] | None) -> list[dict[str, Any]]:
        """``node_configs`` with node config ``fedeval-ledger`` set as ``ledgers`` says (see the class)."""
        from flwr_fedeval.clients.ledger import LEDGER_CONFIG, LEDGER_SUFFIX
        from flwr_fedeval.ledger import NodeLedger

        if ledgers is None:
            return [dict(c) for c in node_configs]
        if isinstance(ledgers, str) and ledgers == "fresh":
            folder = tempfile.mkdtemp(prefix="fedeval-ledgers-")
            weakref.finalize(self, shutil.rmtree, folder, True)
        else:
            folder = os.fspath(ledgers)
            os.makedirs(folder, exist_ok=True)
        out = []
        for i, cfg in enumerate(node_configs):
            cfg = dict(cfg)
            if not cfg.get(LEDGER_CONFIG):
                path = os.path.join(folder, f"node-{i}{LEDGER_SUFFIX}")
                if not os.path.exists(path):
                    NodeLedger.create(path)
                cfg[LEDGER_CONFIG] = path
            out.append(cfg)
        return out

    # --- Grid API ---------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """The connected nodes: not yet gone (killed, heartbeat expired) and already joined (restarted)."""
        return [n for n in self.node_ids if self._listed(n)]

    def _listed(self, node: int) -> bool:
        return self._gone_at.get(node, float("inf")) > self.now and self._joins_at.get(node, 0.0) <= self.now

    def _accept(self, msg: Message) -> str:
        """Give ``msg`` a message ID and this run's ID, as the SuperLink does on a push; its ID.

        Raises
        ------
        ValueError
            If its destination is not a node of this grid.
        """
        msg_id = f"msg-{next(self._ids)}"
        msg.metadata.__dict__["_message_id"] = msg_id
        msg.metadata.__dict__["_run_id"] = self._run.run_id
        if msg.metadata.dst_node_id not in self.contexts:
            raise ValueError(f"unknown destination node {msg.metadata.dst_node_id}")
        return msg_id

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg_id = self._accept(msg)
            node = msg.metadata.dst_node_id
            ids.append(msg_id)
            if node in self._dead:  # accepted by the SuperLink, never delivered
                self._waiting[msg_id] = msg
                self.log.append((node, msg.metadata.message_type, False))
                continue
            received = self._deliver(msg_id, msg)
            if received is not None:
                self._replies[msg_id] = received
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies that came; for a message to a gone node of ``kill(..., superlink_error=True)``,
        Flower's ``NODE_UNAVAILABLE`` error reply from the SuperLink (as flwr's link state sends it)."""
        out = []
        for i in list(message_ids):
            if i in self._replies:
                out.append(self._replies.pop(i))
            elif i in self._waiting:
                msg = self._waiting[i]
                node = msg.metadata.dst_node_id
                if node in self._superlink_errors and not self._listed(node):
                    del self._waiting[i]
                    reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason=(
                        "Error: Node Unavailable - The destination node failed to report a heartbeat within "
                        "2 x its expected interval.")), reply_to=msg)
                    reply.metadata.__dict__["_src_node_id"] = 1  # the SuperLink, not the node
                    out.append(reply)
        return out

    # --- simulated time and lost nodes ------------------------------------------
    def clock(self) -> float:
        """Simulated seconds since the grid was created."""
        return self.now

    def sleep(self, seconds: float) -> None:
        """Advance the simulated time by ``seconds`` (no real waiting)."""
        self.now += max(0.0, float(seconds))

    def kill(self, node: int, *, gone_after: float = 0.0, superlink_error: bool = False) -> None:
        """Kill ``node`` as ``kill -9`` would: no reply from now on (also not to a message it is working on,
        when called from the fault hook); it leaves :meth:`get_node_ids` ``gone_after`` simulated seconds
        later (when its heartbeat expires: Flower's default is about 60 s). With ``superlink_error``, a
        pull for a message to it then returns Flower's ``NODE_UNAVAILABLE`` error reply (as flwr >= 1.30's
        SuperLink does); without, its messages simply never get a reply.

        Raises
        ------
        ValueError
            ``node`` is not a node of this grid.
        """
        if node not in self.contexts:
            raise ValueError(f"unknown node {node}")
        self._dead.add(node)
        self._gone_at[node] = min(self._gone_at.get(node, float("inf")), self.now + float(gone_after))
        if superlink_error:
            self._superlink_errors.add(node)

    def restart(self, node: int, *, back_after: float = 0.0, gone_after: float = 60.0,
                superlink_error: bool = False) -> int:
        """Kill ``node`` (:meth:`kill`) and start it again: a new node ID with the same node config
        (partition, identity key) and an empty state connects ``back_after`` simulated seconds later.
        Returns the new node ID (also appended to :attr:`node_ids`)."""
        self.kill(node, gone_after=gone_after, superlink_error=superlink_error)
        new = secrets.randbits(64) | (1 << 63) if node >= 1 << 63 else secrets.randbits(63) + 1
        old = self.contexts[node]
        self.contexts[new] = Context(run_id=old.run_id, node_id=new, node_config=dict(old.node_config),
                                     state=RecordDict(), run_config=dict(old.run_config))
        self.node_ids.append(new)
        self._joins_at[new] = self.now + float(back_after)
        self.bytes_down[new] = self.bytes_up[new] = 0
        return new

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    # --- internals ----------------------------------------------------------
    def _deliver(self, msg_id: str, msg: Message) -> Message | None:
        """Serialize ``msg`` to its node, run the ClientApp, serialize the reply back; ``None`` if none came."""
        node = msg.metadata.dst_node_id
        delivered, size = _roundtrip_message(msg)
        self.bytes_down[node] += size
        reply: Message | None = self._execute(node, delivered)
        if self.fault is not None and reply is not None:
            reply = self.fault(node, delivered, reply)
        del delivered
        if node in self._dead:  # killed while it worked on the message (e.g. by the fault hook)
            self._waiting[msg_id] = msg
            reply = None
        ok = reply is not None and not reply.has_error()
        received = None
        if reply is not None:
            reply.metadata.__dict__["_message_id"] = f"reply-{msg_id}"
            received, size = _roundtrip_message(reply)
            del reply
            self.bytes_up[node] += size
        self.log.append((node, msg.metadata.message_type, ok))
        return received

    def _execute(self, node: int, msg: Message) -> Message:
        context = _roundtrip_context(self.contexts[node])
        try:
            reply: Message = self.client_app(msg, context)
        except Exception as exc:  # reported as an error reply, as the engines do
            return Message(
                Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(exc).__name__}: {exc}"),
                reply_to=msg,
            )
        self.contexts[node] = _roundtrip_context(context)
        return reply
