"""Flower client side: one call per phase adds its handlers to your ``ClientApp``.

=================================  ===============================================
``register_xmkckks_handlers(app)``  xMK-CKKS secure aggregation (+ ``xmkckks_mod`` on your train handler)
``register_auc_handlers(app, ...)`` plaintext global AUC
``register_fhe_handlers(app, ...)`` FHE AUC (Baykara et al. 2025)
``register_dp_handlers(app, ...)``  DPAUC_Lap, DPAUC_RR, FedAUC (Sun et al. 2023)
``register_shapley_handlers(...)``  SecSV (+ ``shapley_record_mod`` on your train handler)
=================================  ===============================================

Names are imported on first use (``from flwr_fedeval.clients import ...``),
so a ClientApp loads only the phases it registers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "register_xmkckks_handlers": "flwr_fedeval.clients.xmkckks",
    "xmkckks_mod": "flwr_fedeval.clients.xmkckks",
    "register_auc_handlers": "flwr_fedeval.clients.auc_handlers",
    "register_dp_handlers": "flwr_fedeval.clients.auc_handlers",
    "register_fhe_handlers": "flwr_fedeval.clients.fhe_handlers",
    "register_shapley_handlers": "flwr_fedeval.clients.shapley_handlers",
    "shapley_record_mod": "flwr_fedeval.clients.shapley_handlers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
