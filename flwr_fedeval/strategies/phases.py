"""Choose the evaluation phase that runs after training (config ``auc-method``).

Every phase is an :class:`~flwr_fedeval.strategies.base.EvaluationPhase` with
``run(grid, arrays) -> AUCPhaseResult`` and a matching set of client handlers
registered in :mod:`flwr_fedeval.app.client_app`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr_fedeval.strategies.auc_phase import AUCPhaseResult, PlaintextAUCPhase
from flwr_fedeval.strategies.base import EvaluationPhase

if TYPE_CHECKING:  # the job config lives in the app layer, the roster in identity
    from flwr_fedeval.app.task import JobConfig
    from flwr_fedeval.identity import Roster
    from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase

__all__ = ["make_auc_phase"]


def make_auc_phase(cfg: JobConfig, roster: Roster | None = None) -> EvaluationPhase[AUCPhaseResult]:
    """The evaluation phase for ``cfg.auc_method`` (a validated ``JobConfig``); ``roster`` (FHE only)
    lets the server check the nodes' signed keys.

    Raises
    ------
    ValueError
        For an unknown ``auc-method``.
    """
    if cfg.auc_method == "plain":
        return PlaintextAUCPhase(
            cfg.num_decision_points, spacing=cfg.decision_point_spacing, min_nodes=cfg.min_nodes
        )
    if cfg.auc_method in ("dpauc-laplace", "dpauc-rr", "fedauc-rr", "fedauc-laplace"):
        return _make_dp_phase(cfg)
    if cfg.auc_method == "fhe":
        return _make_fhe_phase(cfg, roster)
    raise ValueError(f"unknown auc-method {cfg.auc_method!r}")


def _make_dp_phase(cfg: JobConfig) -> EvaluationPhase[AUCPhaseResult]:
    """The DP baselines of :mod:`flwr_fedeval.strategies.dp_phases` (``dp-*``, ``dpauc-*``, ``fedauc-*`` keys)."""
    from flwr_fedeval.strategies import dp_phases

    epsilon, min_nodes = cfg.dp_epsilon, cfg.min_nodes
    if cfg.auc_method == "dpauc-laplace":
        return dp_phases.DPAUCLaplacePhase(cfg.num_decision_points, spacing=cfg.decision_point_spacing,
                                           clipping=cfg.dpauc_clipping, epsilon=epsilon, min_nodes=min_nodes)
    if cfg.auc_method == "dpauc-rr":
        return dp_phases.DPAUCRRPhase(cfg.num_decision_points, spacing=cfg.decision_point_spacing, epsilon=epsilon,
                                      min_nodes=min_nodes)
    if cfg.auc_method == "fedauc-rr":
        return dp_phases.FedAUCRRPhase(epsilon=epsilon, min_nodes=min_nodes)
    return dp_phases.FedAUCLaplacePhase(sensitivity=cfg.fedauc_sensitivity, allocation=cfg.fedauc_allocation,
                                        alpha=cfg.fedauc_alpha, beta=cfg.fedauc_beta, epsilon=epsilon,
                                        min_nodes=min_nodes)


def _make_fhe_phase(cfg: JobConfig, roster: Roster | None = None) -> FHEAUCPhase:
    """The FHE AUC phase of :mod:`flwr_fedeval.strategies.fhe_phase` (``fhe-*`` keys)."""
    from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase

    return FHEAUCPhase(
        cfg.num_decision_points,
        protocol=cfg.fhe_auc,
        n_splits=cfg.fhe_splits,
        backend=cfg.fhe_backend,
        spacing=cfg.decision_point_spacing,
        share_auc_with_server=cfg.share_auc_with_server,
        metrics_threshold=cfg.fhe_metrics_threshold if cfg.fhe_metrics_threshold >= 0 else None,
        min_nodes=cfg.min_nodes,
        timeout=cfg.step_timeout,
        roster=roster,
    )
