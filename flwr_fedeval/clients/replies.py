"""Error replies and request serving shared by our client handlers.

A request a node will not serve (wrong session, missing state, values out of
the public bounds, malformed bytes) gets an error reply with a
machine-readable code (:class:`flwr_fedeval.messages.ReplyCode`) and a reason
naming the exception, so the server can classify the failure by its code and
name the node and the reason; nothing is half done.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Message, RecordDict

from flwr_fedeval.protocol import error_reply, reply_code

__all__ = ["error_reply", "reply_code", "serve"]


def serve(msg: Message, request_key: str, step: Callable[[dict], RecordDict], *,
          errors: tuple[type[BaseException], ...], label: str) -> Message:
    """Reply ``step(dict(msg.content[request_key]))``; the exceptions ``errors`` (and a missing
    request record) become :func:`error_reply`."""
    try:
        request = dict(msg.content[request_key])
        return Message(content=step(request), reply_to=msg)
    except (KeyError, *errors) as exc:
        return error_reply(msg, exc, label)
