"""Choose the evaluation phase that runs after training (config ``auc-method``).

Every phase has ``run(grid, arrays) -> AUCPhaseResult`` and a matching set of
client handlers registered in :mod:`flwr_fedeval.app.client_app`.
"""

from __future__ import annotations

from typing import Any

from flwr_fedeval.strategies.auc_phase import PlaintextAUCPhase

__all__ = ["make_auc_phase"]


def make_auc_phase(cfg: Any) -> Any:
    """The evaluation phase for ``cfg.auc_method`` (a validated ``JobConfig``).

    Raises
    ------
    ValueError
        For an unknown ``auc-method``.
    """
    if cfg.auc_method == "plain":
        return PlaintextAUCPhase(
            cfg.num_decision_points, spacing=cfg.decision_point_spacing, min_nodes=cfg.min_nodes
        )
    raise ValueError(f"unknown auc-method {cfg.auc_method!r}")
