"""Error replies and request serving shared by our client handlers.

A request a node will not serve (wrong session, missing state, values out of
the public bounds, malformed bytes) gets an error reply naming the exception,
so the server can name the node and the reason; nothing is half done.
"""

from __future__ import annotations

from collections.abc import Callable
from logging import WARNING

from flwr.app import Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

__all__ = ["error_reply", "serve"]


def error_reply(msg: Message, exc: BaseException, label: str) -> Message:
    """``Error`` reply with reason ``"<ExceptionType>: <message>"``, logged as ``<label> request ... refused``."""
    reason = f"{type(exc).__name__}: {exc}"
    log(WARNING, "%s request %s refused: %s", label, msg.metadata.message_type, reason)
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)


def serve(msg: Message, request_key: str, step: Callable[[dict], RecordDict], *,
          errors: tuple[type[BaseException], ...], label: str) -> Message:
    """Reply ``step(dict(msg.content[request_key]))``; the exceptions ``errors`` (and a missing
    request record) become :func:`error_reply`."""
    try:
        request = dict(msg.content[request_key])
        return Message(content=step(request), reply_to=msg)
    except (KeyError, *errors) as exc:
        return error_reply(msg, exc, label)
