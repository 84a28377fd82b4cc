"""Shims over the Flower internals we touch, across the supported ``flwr>=1.30,<1.42``.

Only the serializing in-process grid (tests, ``flwr_fedeval.testing``) needs
Flower internals; the strategies and handlers use the public Message API
(``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``), which is the same on
1.30 and 1.41. What moved between the two ends (measured on flwr 1.30.0 and
1.41.0):

==========================  ==========================  ===========================
name                        flwr 1.30                   flwr 1.41
==========================  ==========================  ===========================
``Run``                     ``flwr.common.typing``      ``flwr.supercore.run``
``TaskIdentity``            absent (Message needs none)  ``flwr.supercore.task_identity``
==========================  ==========================  ===========================

The serde functions (``flwr.common.serde``) and the protobuf classes are at
the same place on both.
"""

from __future__ import annotations

import flwr
from flwr.common.serde import (  # same module on 1.30 and 1.41
    context_from_proto,
    context_to_proto,
    message_from_proto,
    message_to_proto,
)
from flwr.proto.message_pb2 import Context as ProtoContext  # pylint: disable=E0611
from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=E0611

try:  # flwr >= 1.31
    from flwr.supercore.run import Run
except ImportError:  # flwr 1.30
    from flwr.common.typing import Run  # type: ignore[no-redef,attr-defined,unused-ignore]  # moved in 1.31

try:  # flwr >= 1.31: Message() reads the process's task identity
    from flwr.supercore.task_identity import TaskIdentity
except ImportError:  # flwr 1.30: Message() needs no identity
    TaskIdentity = None  # type: ignore[assignment,misc]

__all__ = [
    "FLWR_VERSION",
    "ProtoContext",
    "ProtoMessage",
    "Run",
    "context_from_proto",
    "context_to_proto",
    "message_from_proto",
    "message_to_proto",
    "set_serverapp_identity",
]

#: ``(major, minor)`` of the installed flwr.
FLWR_VERSION = tuple(int(p) for p in flwr.__version__.split(".")[:2])


def set_serverapp_identity(run_id: int, node_id: int = 1, task_id: int = 1) -> None:
    """Set the ServerApp process identity that ``Message()`` reads (flwr >= 1.31; no-op on 1.30).

    The deployment runtime sets it before the ServerApp runs; an in-process
    grid must set it itself. ``node_id`` 1 is Flower's ``SUPERLINK_NODE_ID``.
    """
    if TaskIdentity is not None:
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = node_id
        TaskIdentity.task_id = task_id
