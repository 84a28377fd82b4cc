"""xMK secure aggregation as protocol objects below Flower (no Flower import).

:class:`KeySetParameters` (what a key set's members sign), :class:`ProtocolParameters` (the server
operator's settings), the member party (:mod:`flwr_fedeval.secagg.member`) and the server party
(:mod:`flwr_fedeval.secagg.server`). The Flower glue is :mod:`flwr_fedeval.strategies.xmk_fedavg` and
:mod:`flwr_fedeval.clients.xmkckks`.
"""

from flwr_fedeval.secagg.parameters import (
    BULK_MODES,
    REKEY_CHOICES,
    KeySetParameters,
    ProtocolParameters,
    protocol_keywords,
)

__all__ = ["BULK_MODES", "REKEY_CHOICES", "KeySetParameters", "ProtocolParameters", "protocol_keywords"]
