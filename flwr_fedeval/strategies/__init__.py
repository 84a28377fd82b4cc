"""Flower server side: secure aggregation and the evaluation phases.

=============================  ===================================================
``XMKFedAvg``                  FedAvg under xMK-CKKS (instead of ``FedAvg``)
``SecureAggregation``          xMK-CKKS around any FedAvg-family strategy (FedAdam, FedProx, ...)
``PlaintextAUCPhase``          global AUC from plaintext counts (the reference)
``FHEAUCPhase``                global AUC under FHE, known to the clients
``DPAUCLaplacePhase``, ...     DP AUC baselines (``DPAUCRRPhase``, ``FedAUCRRPhase``, ``FedAUCLaplacePhase``)
``SecSVPhase``                 secure Federated Shapley Values (two servers)
``train_with_checkpoints``     any strategy's rounds with a checkpoint per round, resumable
=============================  ===================================================

Every phase has ``run(grid, arrays)`` (the abstract ``EvaluationPhase.run``), validates its
configuration at construction and logs it with ``summary()``; the shared
machinery is in :mod:`flwr_fedeval.strategies.base`. Names are imported on
first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "XMKFedAvg": "flwr_fedeval.strategies.xmk_fedavg",
    "SecureAggregation": "flwr_fedeval.strategies.secure_aggregation",
    "AUCPhaseResult": "flwr_fedeval.strategies.auc_phase",
    "PlaintextAUCPhase": "flwr_fedeval.strategies.auc_phase",
    "FHEAUCPhase": "flwr_fedeval.strategies.fhe_phase",
    "DPAUCLaplacePhase": "flwr_fedeval.strategies.dp_phases",
    "DPAUCRRPhase": "flwr_fedeval.strategies.dp_phases",
    "FedAUCRRPhase": "flwr_fedeval.strategies.dp_phases",
    "FedAUCLaplacePhase": "flwr_fedeval.strategies.dp_phases",
    "SecSVPhase": "flwr_fedeval.strategies.shapley_phase",
    "NodeSubsetGrid": "flwr_fedeval.strategies.shapley_phase",
    "discover_roles": "flwr_fedeval.strategies.shapley_phase",
    "EvaluationPhase": "flwr_fedeval.strategies.base",
    "ClientAppNotWired": "flwr_fedeval.strategies.base",
    "train_with_checkpoints": "flwr_fedeval.strategies.checkpoint",
    "load_checkpoint": "flwr_fedeval.strategies.checkpoint",
    "NodeNotConfigured": "flwr_fedeval.strategies.base",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
