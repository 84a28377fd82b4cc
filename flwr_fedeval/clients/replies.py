"""Error replies and request serving shared by our client handlers.

A request a node will not serve (wrong session, missing state, values out of
the public bounds, malformed bytes) gets an error reply with a
machine-readable code (:class:`flwr_fedeval.messages.ReplyCode`) and a reason
naming the exception, so the server can classify the failure by its code and
name the node and the reason; nothing is half done.
"""

from __future__ import annotations

from collections.abc import Callable
from logging import WARNING

from flwr.app import Error, Message, RecordDict
from flwr.common.logger import log

from flwr_fedeval.messages import ReplyCode

__all__ = ["error_reply", "reply_code", "serve"]


def reply_code(exc: BaseException) -> ReplyCode:
    """The :class:`ReplyCode` of an exception a handler refuses a request with.

    ``TamperingDetectedError`` → ``TAMPERING_DETECTED``, ``UndefinedAUCError`` →
    ``UNDEFINED_AUC``, anything else → ``REFUSED``. (The DP handlers pass
    ``BUDGET_EXHAUSTED`` for diffprivlib's ``BudgetError`` themselves, so that
    this module does not import diffprivlib.)
    """
    from flwr_fedeval.fhe.auc_malicious import TamperingDetectedError
    from flwr_fedeval.metrics.auc import UndefinedAUCError

    if isinstance(exc, TamperingDetectedError):
        return ReplyCode.TAMPERING_DETECTED
    if isinstance(exc, UndefinedAUCError):
        return ReplyCode.UNDEFINED_AUC
    return ReplyCode.REFUSED


def error_reply(msg: Message, exc: BaseException, label: str, *, code: ReplyCode | None = None) -> Message:
    """``Error`` reply with ``code`` (default :func:`reply_code`) and reason ``"<ExceptionType>: <message>"``,
    logged as ``<label> request ... refused``."""
    reason = f"{type(exc).__name__}: {exc}"
    code = reply_code(exc) if code is None else code
    log(WARNING, "%s request %s refused (%s): %s", label, msg.metadata.message_type, code.name, reason)
    return Message(Error(code=int(code), reason=reason), reply_to=msg)


def serve(msg: Message, request_key: str, step: Callable[[dict], RecordDict], *,
          errors: tuple[type[BaseException], ...], label: str) -> Message:
    """Reply ``step(dict(msg.content[request_key]))``; the exceptions ``errors`` (and a missing
    request record) become :func:`error_reply`."""
    try:
        request = dict(msg.content[request_key])
        return Message(content=step(request), reply_to=msg)
    except (KeyError, *errors) as exc:
        return error_reply(msg, exc, label)
