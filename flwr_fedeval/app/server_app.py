"""The main job's ServerApp: FedAvg training, then the global-AUC phase.

Run with ``flwr run .`` (see README). Configuration keys are in
``[tool.flwr.app.config]`` of ``pyproject.toml``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flwr_fedeval.app.harness import (
    contributors_reference_auc,
    run_folder,
    score_histogram,
    write_fsv_chart,
    write_results,
)
from flwr_fedeval.app.task import LIBRARY_RUN_CONFIG, ConfigError, JobConfig, build_model, library_run_config
from flwr_fedeval.clients.identity import CONFIG_HELP, server_roster
from flwr_fedeval.identity import Roster
from flwr_fedeval.metrics.auc import RESOLUTION_WARN_THRESHOLD, resolution_advice, roc_points
from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.strategies.auc_phase import AUCPhaseResult
from flwr_fedeval.strategies.base import (
    EvaluationPhase,
    FailureLog,
    FailureRecordingGrid,
    NodeNotConfigured,
    ReadableFedAvg,
)
from flwr_fedeval.strategies.checkpoint import train_with_checkpoints
from flwr_fedeval.strategies.collect import IDENTITY_TIMEOUT, Rejoin
from flwr_fedeval.strategies.fhe_phase import FHEPhaseFailedError
from flwr_fedeval.strategies.phases import make_auc_phase
from flwr_fedeval.strategies.shapley_phase import NodeSubsetGrid, SecSVPhase, ShapleyPhaseResult, discover_roles
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg

app = ServerApp()


def job_problems(cfg: JobConfig, num_clients: int) -> list[str]:
    """:func:`flwr_fedeval.app.preflight.job_problems` (imported late: it imports this module)."""
    from flwr_fedeval.app.preflight import job_problems as check

    return check(cfg, num_clients)


def make_strategy(cfg: JobConfig) -> FedAvg:
    """Flower's FedAvg, or :class:`XMKFedAvg` when ``secure-aggregation = "xmkckks"``."""
    nodes = cfg.min_nodes
    if cfg.secure_aggregation == "xmkckks":
        xmk: FedAvg = XMKFedAvg(
            parameter_set=cfg.xmk_parameter_set,
            max_abs_value=cfg.xmk_max_abs_value,
            rekey=cfg.xmk_rekey,
            mask_degree=int(cfg.xmk_mask_degree),
            step_timeout=cfg.step_timeout,
            fraction_train=cfg.fraction_train, fraction_evaluate=1.0, min_train_nodes=nodes,
            min_evaluate_nodes=nodes, min_available_nodes=nodes,
        )
        return xmk
    # FedAvg, failures logged one line per distinct reason
    return ReadableFedAvg(fraction_train=cfg.fraction_train, fraction_evaluate=1.0, min_train_nodes=nodes,
                          min_evaluate_nodes=nodes, min_available_nodes=nodes)


def make_shapley_phase(cfg: JobConfig, roster: Roster | None = None, *, clients: Iterable[int] | None = None,
                       aux_node: int | None = None) -> SecSVPhase:
    """The SecSV phase of ``shapley = "secsv"`` from the ``shapley-*`` keys (over ``clients`` and the
    auxiliary server ``aux_node`` when given, else those :func:`discover_roles` finds)."""
    return SecSVPhase(
        sample_skip=cfg.shapley_sample_skip,
        model_bound=cfg.shapley_model_bound,
        feature_bound=cfg.shapley_feature_bound,
        data_frac_bits=cfg.shapley_frac_bits,
        model_frac_bits=cfg.shapley_frac_bits,
        min_nodes=max(2, cfg.min_nodes),
        timeout=cfg.step_timeout,
        roster=roster,
        clients=clients,
        aux_node=aux_node,
    )


def make_rejoin(cfg: JobConfig, roster: Roster | None, partitions: dict[int, tuple[int, int]],
                identities: dict[int, str], refused: Iterable[int] = ()) -> Rejoin:
    """Who is who across node IDs (:class:`~flwr_fedeval.strategies.collect.Rejoin`): roster names proven by
    a signed role reply (with a roster), else the partition ids the nodes report (unsigned). A proven
    newcomer's partition goes into ``partitions`` (for the harness's reference); ``refused`` nodes (not
    in the roster) are not asked again."""

    def by_partition(parts: dict[int, tuple[int, int]]) -> dict[int, str]:
        return {n: f"partition {p} of {k}" for n, (p, k) in parts.items()}

    def prove(grid: Grid, nodes: list[int]) -> dict[int, str]:
        names: dict[int, str] = {}
        parts: dict[int, tuple[int, int]] = {}
        discover_roles(grid, nodes=nodes, timeout=min(cfg.step_timeout, IDENTITY_TIMEOUT), strict=False,
                       roster=roster, refused={}, partitions=parts, identities=names)
        if roster is None:
            names = by_partition(parts)
        partitions.update({n: p for n, p in parts.items() if n in names})
        return names

    return Rejoin(prove, identities if roster is not None else by_partition(partitions), ignore=refused)


class NoTrainedRound(RuntimeError):
    """Every training round of the run failed (e.g. each node had already trained on this initial model:
    ``ALREADY_CONTRIBUTED``): the results are written, then the run stops as failed."""


def _record_checked_failures(failures: FailureLog, strategy: FedAvg, auc_result: AUCPhaseResult) -> None:
    """Add the failures the server's checks found (malformed replies, aborted xMK attempts) to
    ``failures``, which already holds every timeout and error reply (:class:`FailureRecordingGrid`)."""
    for rnd, exc in strategy.aborted_attempts if isinstance(strategy, XMKFedAvg) else []:
        for node, reason in exc.failed.items():
            if exc.step != "sampling" and not failures.has(node, rnd):
                failures.add(node, exc.step, int(ReplyCode.MALFORMED_REPLY), str(reason), round=rnd)
    for node, reason in auc_result.failed.items():
        if not failures.has(node, None):
            failures.add(node, f"{auc_result.method} AUC phase", int(ReplyCode.MALFORMED_REPLY), str(reason))


def _write_failed_phase(cfg: JobConfig, fed: _Federation, strategy: FedAvg, folder: Path, exc: Exception,
                        phase: EvaluationPhase[AUCPhaseResult], train_hist: dict[int, dict[str, float]],
                        eval_hist: dict[int, dict[str, float]], t_train: float, wall: float) -> None:
    """``results.json`` of a run whose AUC phase failed (an FHE participant lost at steps 3-4, no
    re-run over another subset; too few nodes left, e.g. every node's DP budget spent):
    ``auc_phase_error``, no AUC, every failure (the phase's own, with their reply codes, included),
    so that nothing the run learnt about its nodes is lost."""
    lost = exc.lost if isinstance(exc, FHEPhaseFailedError) else []
    failed = exc.failed if isinstance(exc, FHEPhaseFailedError) else {}
    for node, reason in failed.items():
        if not fed.failures.has(node, None):
            fed.failures.add(node, f"{cfg.auc_method} AUC phase", int(ReplyCode.MALFORMED_REPLY), str(reason))
    for node, f in phase.failures.items():
        fed.failures.add(node, f"{cfg.auc_method} AUC phase: {f.step}", f.code, f.reason,
                         seconds_to_detect=f.seconds_to_detect)
    write_results(cfg, {
        "config": cfg.as_dict(),
        "auc_method": cfg.auc_method,
        "auc_phase_error": str(exc),
        "federated_auc": None,
        "lost_participants": [str(n) for n in lost],
        "failed_nodes": {str(n): r for n, r in failed.items()},
        "failures": fed.failures.to_json(),
        **({"refused_nodes": {str(k): v for k, v in fed.refused.items()}} if fed.refused else {}),
        "train_metrics": train_hist,
        "evaluate_metrics": eval_hist,
        **xmk_results(strategy),
        "wall_time_s": {"training": t_train, "total": wall},
    }, folder=folder)
    log(ERROR, "AUC phase failed; results (without an AUC) written to %s", folder)


def xmk_results(strategy: FedAvg) -> dict[str, Any]:
    """The xMK-CKKS part of ``results.json`` (empty for another strategy): ``xmk_key_sets``, every key set
    generated (round, key-set ID, member node IDs), and ``xmk_rounds``, per round its signed contributor
    set by roster identity (size, ``left_out`` before uploading, ``lost_after_upload``, signers,
    decryptors, every decryption attempt's active set:
    :attr:`XMKFedAvg.contributor_sets <flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg>`)."""
    if not isinstance(strategy, XMKFedAvg):
        return {}
    return {"xmk_key_sets": strategy.key_sets, "xmk_rounds": strategy.contributor_sets}


def warn_resolution(bound: float) -> bool:
    """Log a warning with the fix when the AUC's resolution bound exceeds 0.01; True if it did."""
    if bound > RESOLUTION_WARN_THRESHOLD:  # nan: unknown, no warning
        log(WARNING, "FINAL federated AUC: %s", resolution_advice(bound))
        return True
    return False


def _metric_history(history: Mapping[int, MetricRecord]) -> dict[int, dict[str, float]]:
    """``{round: {metric: value}}``; the demo App's metrics are numbers (``TypeError`` for a list)."""

    def number(name: str, value: object) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        raise TypeError(f"metric {name!r} is a {type(value).__name__}, not a number")

    return {int(r): {k: number(k, v) for k, v in rec.items()} for r, rec in history.items()}


def _log_threshold_metrics(details: dict[str, Any], y_true: np.ndarray,
                           y_score: np.ndarray) -> dict[str, Any] | None:
    """FHE phase: the clients' private metrics at the threshold next to sklearn's on the pooled data."""
    got = details.get("threshold_metrics")
    if not got:
        return None
    from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score

    t = float(details["metrics_threshold"])
    pred = (y_score >= t).astype(int)
    ref = {
        "accuracy": float(accuracy_score(y_true, pred)),
        "precision": float(precision_score(y_true, pred, zero_division=float("nan"))),
        "recall": float(recall_score(y_true, pred, zero_division=float("nan"))),
        "f1": float(f1_score(y_true, pred, zero_division=float("nan"))),
    }
    log(
        INFO,
        "FINAL private metrics at threshold %g (clients): %s | pooled sklearn: %s",
        t,
        " ".join(f"{k} {got[k]:.6f}" for k in ref),
        " ".join(f"{k} {v:.6f}" for k, v in ref.items()),
    )
    return ref


@dataclass
class _Federation:
    """Who takes part, as found before round 1 (:func:`discover_federation`)."""

    grid: Grid                      # the data clients only (A and refused nodes filtered out)
    failures: FailureLog            # every failure of every step, with its true reason
    roles: dict[int, str]           # node -> role it proved
    aux_node: int | None            # SecSV's auxiliary server A
    refused: dict[int, str]         # node -> why it was refused (not in the roster)
    partitions: dict[int, tuple[int, int]]  # node -> (partition id, num-partitions), for the reference


def require_identities(cfg: JobConfig, run_config: dict[str, Any]) -> Roster | None:
    """The ServerApp's copy of the roster; secure phases refuse to start without one.

    Raises
    ------
    ConfigError
        If the FHE AUC or SecSV is asked for and no roster is configured.
    """
    roster = server_roster(library_run_config(run_config))
    secure = [k for k, on in (("auc-method = 'fhe'", cfg.auc_method == "fhe"),
                              (f"shapley = '{cfg.shapley}'", cfg.shapley != "none"),
                              ("secure-aggregation = 'xmkckks'", cfg.secure_aggregation == "xmkckks")) if on]
    if secure and roster is None:
        raise ConfigError([f"{' and '.join(secure)} need node identities and a roster: set run config "
                           f"'identity-dir' (simulation) or 'fedeval-roster' (the ServerApp's copy of the "
                           f"roster); every node: {CONFIG_HELP}"])
    return roster


def discover_federation(grid: Grid, cfg: JobConfig, roster: Roster | None) -> _Federation:
    """Role discovery: every node proves its roster identity and role; nodes outside the roster are
    refused; the auxiliary server A (``fedeval-role = "shapley-aux"``) holds no data and stays out of
    training and of the AUC phase. Then the checks before round 1 (data, every client's split).

    Raises
    ------
    ValueError
        If SecSV is asked for and there is not exactly one auxiliary server.
    ConfigError
        From the checks before round 1.
    """
    grid = FailureRecordingGrid(grid)  # every failure of every step, with its true reason
    failures = grid.failures
    refused: dict[int, str] = {}
    partitions: dict[int, tuple[int, int]] = {}
    identities: dict[int, str] = {}  # node -> roster name it proved
    roles = discover_roles(grid, timeout=cfg.step_timeout, strict=cfg.shapley != "none", roster=roster,
                           refused=refused, partitions=partitions, identities=identities)
    grid.rejoin = make_rejoin(cfg, roster, partitions, identities, refused)  # a restarted node is taken back at once
    auxes = sorted(n for n, r in roles.items() if r == "shapley-aux")
    if cfg.shapley != "none" and len(auxes) != 1:
        raise ValueError(
            f"shapley = '{cfg.shapley}' needs exactly one node with fedeval-role = 'shapley-aux' "
            f"(the auxiliary server), found {len(auxes)}: start one SuperNode with --node-config "
            "'fedeval-role=\"shapley-aux\"', or in simulation add a node and set shapley-aux-partition-id")
    if auxes:
        log(INFO, "Node(s) %s: auxiliary server of the Shapley phase; %d data clients", auxes,
            len(roles) - len(auxes))
    if refused:
        log(INFO, "Node(s) %s refused (not in the roster): left out of training and every phase", sorted(refused))
    data_grid: Grid = NodeSubsetGrid(grid, auxes + sorted(refused)) if auxes or refused else grid
    problems = job_problems(cfg, len(roles) - len(auxes))  # the data folder, every client's split
    if problems:
        raise ConfigError(problems)
    return _Federation(data_grid, failures, roles, auxes[0] if cfg.shapley != "none" else None, refused,
                       partitions)


def log_rounds(train_hist: dict[int, dict[str, float]], eval_hist: dict[int, dict[str, float]]) -> None:
    """One line per round: the clients' train and eval loss and accuracy."""
    def part(name: str, hist: dict[str, float], missing: str) -> str:
        if f"{name}-loss" not in hist:
            return f"{name}: {missing}"
        acc = hist.get(f"{name}-acc")
        return f"{name} loss {hist[f'{name}-loss']:.4f}" + (f" acc {acc:.4f}" if acc is not None else "")

    for rnd in sorted(set(train_hist) | set(eval_hist)):
        log(INFO, "round %d: %s | %s", rnd,
            part("train", train_hist.get(rnd, {}), "no update aggregated (global model unchanged)"),
            part("eval", eval_hist.get(rnd, {}), "no evaluation replies"))


def log_final_auc(cfg: JobConfig, auc_result: AUCPhaseResult, ref_auc: float) -> None:
    """The FINAL line: the federated AUC (or that only the clients know it) next to the pooled reference."""
    n_clients = len(auc_result.contributors)
    if auc_result.details.get("auc_known_to") == "clients":
        log(INFO, "FINAL federated AUC (%s, N=%d, %d clients): known to the clients only "
            "(share-auc-with-server = false; see the client logs) | pooled roc_auc_score: %.6f",
            auc_result.label, cfg.num_decision_points, n_clients, ref_auc)
    else:
        log(INFO, "FINAL federated AUC (%s, N=%d, %d clients): %.6f | resolution bound: %.4g | "
            "pooled roc_auc_score: %.6f | |diff| %.6f", auc_result.label, cfg.num_decision_points, n_clients,
            auc_result.auc, auc_result.resolution_bound, ref_auc, abs(auc_result.auc - ref_auc))
    warn_resolution(auc_result.resolution_bound)


def log_final_shapley(shapley: ShapleyPhaseResult, seconds: float, y_true: np.ndarray, y_score: np.ndarray) -> None:
    """The FINAL line of the SecSV phase: every client's Federated Shapley Value and their sum."""
    last = shapley.utilities[-1][tuple(shapley.clients)]
    pooled_acc = float(((y_score >= 0.5).astype(int) == y_true).mean())
    n_rounds = len(shapley.rounds)
    log(INFO, "FINAL Federated Shapley Values (SecSV%s, %d round%s, %.1f s): %s | sum %.6f = v(I^T) %.6f - "
        "1/2 | v(I^T) (coalition model, 8-bit weights) vs pooled accuracy of the global model: %.6f",
        "+SampleSkip" if shapley.sample_skip else "", n_rounds, "" if n_rounds == 1 else "s", seconds,
        " ".join(f"client {i} ({n}): {shapley.fsv[n]:+.4f}" for i, n in enumerate(shapley.clients)),
        sum(shapley.fsv.values()), last, pooled_acc)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train with FedAvg (or XMKFedAvg) for ``num-server-rounds``, then run the AUC phase (and SecSV).

    Raises
    ------
    ConfigError
        The run config has problems (one line each), or a secure step lacks the roster.
    flwr_fedeval.strategies.base.NodeNotConfigured
        A node refused for its configuration (no identity, a run config looser than its policy):
        the run stops at that step, logged as one ERROR line naming the keys to set.
    """
    cfg = JobConfig.from_run_config(dict(context.run_config))  # ConfigError: one line per problem
    roster = require_identities(cfg, dict(context.run_config))
    try:
        _main(grid, cfg, roster)
    except NodeNotConfigured as exc:
        app_name = {f"run config {lib}": f"run config {app}" for app, lib in LIBRARY_RUN_CONFIG.items()}
        log(ERROR, "run stopped: %s (this App's keys: %s)", exc, " / ".join(app_name.get(k, k) for k in exc.keys))
        raise


def _main(grid: Grid, cfg: JobConfig, roster: Roster | None) -> None:
    t_start = time.perf_counter()
    fed = discover_federation(grid, cfg, roster)
    grid = fed.grid
    initial = ArrayRecord(build_model(cfg).get_weights())
    auc_phase = make_auc_phase(cfg, roster)

    strategy = make_strategy(cfg)
    folder = run_folder(cfg)  # checkpoint/ after every completed round; resume-from continues one
    result = train_with_checkpoints(strategy, grid, initial, num_rounds=cfg.num_server_rounds,
                                    run_config=cfg.as_dict(), folder=folder, resume_from=cfg.resume_from or None,
                                    train_config=ConfigRecord({"local-epochs": cfg.local_epochs}))
    train_hist = _metric_history(result.train_metrics_clientapp)
    eval_hist = _metric_history(result.evaluate_metrics_clientapp)
    log_rounds(train_hist, eval_hist)
    t_train = time.perf_counter() - t_start
    if not train_hist:  # every round failed: the model is the initial one, which the run must not hide
        log(ERROR, "no round of this run aggregated a training update (see the failures above): the global "
            "model is the initial one; it is evaluated as such and the run then stops as failed")

    try:
        auc_result = auc_phase.run(grid, result.arrays)
    except (FHEPhaseFailedError, RuntimeError) as exc:  # no re-run over another subset (signed list)
        if isinstance(exc, NodeNotConfigured):
            raise  # a configuration refusal stops the run before any result: the operator's key to set
        _write_failed_phase(cfg, fed, strategy, folder, exc, auc_phase, train_hist, eval_hist, t_train,
                            time.perf_counter() - t_start)
        raise
    shapley, t_sv = None, 0.0
    if fed.aux_node is not None:
        t_sv = time.perf_counter()
        shapley = make_shapley_phase(cfg, roster, clients=grid.get_node_ids(), aux_node=fed.aux_node).run(
            grid, result.arrays)
        t_sv = time.perf_counter() - t_sv

    _record_checked_failures(fed.failures, strategy, auc_result)
    # Harness reference (not part of the protocol): pooled roc_auc_score over exactly the contributors' data.
    ref_auc, y_true, y_score, ref_note = contributors_reference_auc(
        cfg, result.arrays.to_numpy_ndarrays(), auc_result.contributors, fed.partitions)
    if ref_note:
        log(WARNING, "FINAL pooled reference %s", ref_note)
    wall = time.perf_counter() - t_start
    log_final_auc(cfg, auc_result, ref_auc)
    ref_threshold_metrics = _log_threshold_metrics(auc_result.details, y_true, y_score) if y_true.size else None
    if shapley is not None:
        log_final_shapley(shapley, t_sv, y_true, y_score)
    from sklearn.metrics import roc_curve

    reference_roc = roc_curve(y_true, y_score)[:2] if y_true.size else None
    folder = write_results(
        cfg,
        {
            "config": cfg.as_dict(),
            "auc_method": auc_result.method,
            "auc_details": auc_result.details,
            "federated_auc": auc_result.auc,
            "resolution_bound": None if math.isnan(auc_result.resolution_bound) else auc_result.resolution_bound,
            "reference_roc_auc_score": None if ref_note else ref_auc,
            **({"reference_note": ref_note} if ref_note else {}),
            "num_clients": len(auc_result.contributors),
            # node ID (a string: unsigned 64-bit) -> the partition id it reported (null: none reported)
            "contributors": {str(n): (fed.partitions[n][0] if n in fed.partitions else None)
                             for n in auc_result.contributors},
            "failed_nodes": auc_result.failed,
            "failures": fed.failures.to_json(),
            **({"refused_nodes": {str(k): v for k, v in fed.refused.items()}} if fed.refused else {}),
            **({"reference_threshold_metrics": ref_threshold_metrics} if ref_threshold_metrics else {}),
            "num_test_samples": int(y_true.size),
            "reference_score_histogram": score_histogram(y_true, y_score),
            "train_metrics": train_hist,
            "trained_rounds": sorted(train_hist),
            "evaluate_metrics": eval_hist,
            **xmk_results(strategy),
            "wall_time_s": {"training": t_train, "total": wall},
            **({"shapley": shapley.to_json()} if shapley is not None else {}),
        },
        roc=roc_points(auc_result.counts) if auc_result.counts is not None else None,
        reference_roc=reference_roc,
        folder=folder,
    )
    if shapley is not None:
        write_fsv_chart(folder, shapley.fsv, title=f"Federated Shapley Values (SecSV), {cfg.dataset}")
    log(INFO, "Results written to %s (wall time %.1f s)", folder, wall)
    if not train_hist:
        raise NoTrainedRound(
            f"no round of this run aggregated a training update ({len(fed.failures.to_json())} failure(s) in "
            f"{folder}/results.json): the AUC above is the initial model's"
        )
