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

from flwr_fedeval.protocol import _base
from flwr_fedeval.protocol._base import *  # noqa: F403  (the names in _base.__all__)

__all__ = list(_base.__all__)
