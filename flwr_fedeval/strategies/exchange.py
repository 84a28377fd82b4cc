"""Send one request per node and collect the checked replies (shared by the phases).

Follows Flower's ``FedAvg._check_and_log_replies``: replies are split into
valid ones and failures first, every failure is logged with the node and the
reason, and only parsed, checked content reaches the protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from logging import WARNING
from typing import Any

from flwr.app import Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_fedeval.strategies.base import replies_by_node

__all__ = ["exchange"]


def exchange(
    grid: Grid,
    contents: dict[int, RecordDict],
    message_type: str,
    parse: Callable[[int, RecordDict], Any],
    failed: dict[int, str],
    *,
    what: str,
    phase: str,
    timeout: float,
    label: str = "AUC phase",
) -> dict[int, Any]:
    """Send ``contents[node]`` to each node; return ``{node: parse(node, reply)}`` for valid replies.

    Nodes without a valid reply are added to ``failed`` with the reason and
    logged (the reason of an error reply is the client's, e.g. ``BudgetError: ...``).
    """
    messages = [Message(content=c, dst_node_id=n, message_type=message_type) for n, c in contents.items()]
    replies = replies_by_node(messages, grid.send_and_receive(messages, timeout=timeout))
    missing = {n: f"no reply within step-timeout {timeout:g} s" for n in contents}
    valid: dict[int, Any] = {}
    for node, reply in replies.items():
        if node not in missing:
            continue
        if reply.has_error():
            missing[node] = f"error reply: {reply.error.reason}"
            continue
        try:
            valid[node] = parse(node, reply.content)
        except (KeyError, ValueError, TypeError) as exc:
            missing[node] = f"malformed {what}: {type(exc).__name__}: {exc}"
            continue
        missing.pop(node)
    for node, reason in missing.items():
        log(WARNING, "%s (%s): node %d left out: %s", label, phase, node, reason)
    failed.update(missing)
    return valid
