"""The typed message layer: one frozen dataclass per request and reply of every protocol step,
shared by the server side (``strategies/``) and the client side (``clients/``).

==================  ==========================================================
module              protocol
==================  ==========================================================
``_base``           :class:`Step`, :class:`Payload`, checked fields,
                    :class:`MalformedMessage`, :class:`Refused`, :func:`handler`,
                    :func:`register`, :class:`ReplyCode`
``xmk``             xMK-CKKS secure aggregation (Walskaar et al. 2023; Ma et al.):
                    key commitment, reveal, encrypted training, partial decryption
``auc``             the plaintext AUC phase: decision points in, TP/FP/TN/FN out
``dp_auc``          DPAUC_Lap, DPAUC_RR and FedAUC (the DP baselines)
``fhe_auc``         the FHE AUC phase (Baykara et al. 2025), both protocols
``secsv``           SecSV (Zheng, Cao, Yoshikawa 2023) and the role query
==================  ==========================================================

Each protocol module adds its step table (``STEPS``) and payload classes; see
:mod:`flwr_fedeval.protocol._base` for the rules every payload follows.
"""

from flwr_fedeval.protocol import _base
from flwr_fedeval.protocol._base import *  # noqa: F403  (the names in _base.__all__)

__all__ = list(_base.__all__)
