"""The typed message layer: one frozen dataclass per request and reply of every protocol step,
shared by the server side (``strategies/``) and the client side (``clients/``).

==================  ==========================================================
module              protocol
==================  ==========================================================
``_base``           :class:`Step`, :class:`Payload`, checked fields,
                    :class:`MalformedMessage`, :class:`Refused`, :func:`handler`,
                    :func:`register`, :class:`ReplyCode`
==================  ==========================================================

Each protocol module adds its step table (``STEPS``) and payload classes; see
:mod:`flwr_fedeval.protocol._base` for the rules every payload follows.
"""

from flwr_fedeval.protocol._base import (
    MalformedMessage,
    Payload,
    Refused,
    ReplyCode,
    Step,
    array_bytes,
    array_field,
    array_record,
    bytes_array,
    config_bytes,
    config_field,
    config_list,
    config_of,
    config_record,
    error_reply,
    handler,
    register,
    reply_code,
)

__all__ = [
    "MalformedMessage",
    "Payload",
    "Refused",
    "ReplyCode",
    "Step",
    "array_bytes",
    "array_field",
    "array_record",
    "bytes_array",
    "config_bytes",
    "config_field",
    "config_list",
    "config_of",
    "config_record",
    "error_reply",
    "handler",
    "register",
    "reply_code",
]
