"""Experiment harness: the reference AUC and the result files of the main job.

The reference ``roc_auc_score`` on the *pooled* test data is computed here,
outside the protocol: it reloads every client's test split (the partitioning
is deterministic per seed) and scores it with the final global model. No
protocol message carries these data.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from flwr_fedeval.app.task import JobConfig, build_model, load_client_data
from flwr_fedeval.clients.keras_adapter import KerasModelAdapter

__all__ = ["contributors_reference_auc", "pooled_reference_auc", "positive_scores", "run_folder",
           "score_histogram", "write_results"]


def positive_scores(cfg: JobConfig, adapter: KerasModelAdapter, x: np.ndarray) -> np.ndarray:
    """Positive-class scores in ``[0, 1]`` of the App's models (seed CNN, MLP).

    With ``decision-point-spacing = "logit"`` the scores come from the
    pre-softmax logit margin in float64
    (:meth:`~flwr_fedeval.clients.keras_adapter.KerasModelAdapter.predict_margin_scores`,
    margins ±64 over the decision points' ±12): float32 softmax saturation
    cannot collapse the ROC bins. Otherwise the softmax probability.

    Returns
    -------
    ndarray of shape (n_samples,), dtype float64
    """
    if cfg.decision_point_spacing == "logit":
        return adapter.predict_margin_scores(x)
    return adapter.predict_scores(x)


def pooled_reference_auc(
    cfg: JobConfig, weights: list[np.ndarray], num_partitions: int, partition_ids: list[int] | None = None
) -> tuple[float, np.ndarray, np.ndarray]:
    """``roc_auc_score`` of the global model on the clients' test splits pooled.

    ``num_partitions`` is the number of partitions the data was split into
    (the nodes' ``num-partitions``); ``partition_ids`` (default: all) the
    partitions whose test splits are pooled.

    Returns
    -------
    auc : float
    y_true : ndarray of shape (n_test,), dtype int64
    y_score : ndarray of shape (n_test,), dtype float64
    """
    from sklearn.metrics import roc_auc_score

    adapter = KerasModelAdapter(build_model(cfg))
    adapter.set_weights(weights)
    ys, scores = [], []
    for pid in (range(num_partitions) if partition_ids is None else partition_ids):
        split = load_client_data(cfg, pid, num_partitions)
        ys.append(split.y_test)
        scores.append(positive_scores(cfg, adapter, split.x_test))
    y_true, y_score = np.concatenate(ys), np.concatenate(scores)
    return float(roc_auc_score(y_true, y_score)), y_true, y_score


def contributors_reference_auc(
    cfg: JobConfig, weights: list[np.ndarray], contributors: list[int], partitions: dict[int, tuple[int, int]]
) -> tuple[float, np.ndarray, np.ndarray, str]:
    """The pooled reference over exactly the partitions of ``contributors``.

    ``partitions`` maps node IDs to ``(partition id, num-partitions)`` as the
    nodes reported them (:func:`~flwr_fedeval.strategies.shapley_phase.discover_roles`).
    The data are split into the nodes' ``num-partitions``, never into the
    number of nodes still connected (after a dropout that would be another
    data set).

    Returns
    -------
    auc : float
        ``nan`` when the reference cannot be computed honestly.
    y_true : ndarray of shape (n_test,), dtype int64 (empty when ``auc`` is nan)
    y_score : ndarray of shape (n_test,), dtype float64 (empty when ``auc`` is nan)
    note : str
        Why the reference is left out (a contributor did not report its
        partition, the nodes disagree on ``num-partitions``, two contributors
        claim one partition); ``""`` when it is computed.
    """
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))
    unknown = [n for n in contributors if n not in partitions]
    if not contributors or unknown:
        return (math.nan, *empty,
                f"left out: contributor(s) {unknown or '(none)'} reported no partition id")
    nums = {partitions[n][1] for n in contributors}
    pids = sorted(partitions[n][0] for n in contributors)
    if len(nums) != 1:
        return math.nan, *empty, f"left out: the contributors report different num-partitions {sorted(nums)}"
    (num,) = nums
    if len(set(pids)) != len(pids) or not all(0 <= p < num for p in pids):
        return math.nan, *empty, f"left out: contributors claim partitions {pids} of {num}"
    auc, y_true, y_score = pooled_reference_auc(cfg, weights, num, pids)
    return auc, y_true, y_score, ""


def score_histogram(y_true: np.ndarray, y_score: np.ndarray, *, bins: int = 20) -> dict[str, Any]:
    """Histogram of the pooled scores per class, on the linear and the logit scale.

    Shows where decision points lose resolution: trained models often put
    most scores within 1e-4 of 0 or 1, where evenly spaced thresholds are
    coarse. Logits are clipped to ``[-20, 20]`` (float32 softmax saturates
    at about ±17).

    Returns
    -------
    dict
        ``{"linear": {"edges", "positive", "negative"}, "logit": {...}}``.
    """
    y_true = np.asarray(y_true)
    y_score = np.asarray(y_score, dtype=np.float64)
    eps = 1e-300
    logit = np.clip(np.log(y_score + eps) - np.log((1.0 - y_score) + eps), -20.0, 20.0)
    out: dict[str, Any] = {}
    for name, values, rng in (("linear", y_score, (0.0, 1.0)), ("logit", logit, (-20.0, 20.0))):
        edges = np.linspace(*rng, bins + 1)
        out[name] = {
            "edges": edges.tolist(),
            "positive": np.histogram(values[y_true == 1], edges)[0].tolist(),
            "negative": np.histogram(values[y_true == 0], edges)[0].tolist(),
        }
    out["saturated_fraction"] = float(np.mean((y_score < 1e-4) | (y_score > 1 - 1e-4))) if y_score.size else 0.0
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def run_folder(cfg: JobConfig) -> Path:
    """The run folder: ``resume-from`` when set, else a new ``<output-dir>/<dataset>-<UTC timestamp>``.

    A relative ``output-dir`` is resolved against the current working directory.
    """
    if cfg.resume_from:
        return Path(cfg.resume_from).expanduser().resolve()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return Path(cfg.output_dir).expanduser().resolve() / f"{cfg.dataset}-{stamp}"


def write_results(
    cfg: JobConfig,
    payload: dict[str, Any],
    *,
    roc: tuple[np.ndarray, np.ndarray] | None = None,
    reference_roc: tuple[np.ndarray, np.ndarray] | None = None,
    folder: Path | None = None,
) -> Path:
    """Write ``results.json`` (and ``roc.png``) to the run folder (default: a new :func:`run_folder`).

    Returns
    -------
    Path
        The run folder.
    """
    folder = run_folder(cfg) if folder is None else Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(_jsonable(payload), indent=2))
    if roc is not None:
        from flwr_fedeval._extras import require

        matplotlib = require("matplotlib", purpose="the ROC plot")

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 5))
        ax.plot(*roc, marker=".", label=f"federated, N={cfg.num_decision_points} ({payload.get('auc_method', '')})")
        if reference_roc is not None:
            ax.plot(*reference_roc, linestyle="--", label="pooled reference (sklearn)")
        ax.plot([0, 1], [0, 1], color="grey", linewidth=0.5)
        ax.set_xlabel("False positive rate")
        ax.set_ylabel("True positive rate")
        ax.set_title(f"ROC, {cfg.dataset}: AUC {payload.get('federated_auc', float('nan')):.4f}")
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(folder / "roc.png", dpi=120)
        plt.close(fig)
    return folder


def write_fsv_chart(folder: Path, fsv: dict[int, float], *, title: str) -> Path:
    """Bar chart of the Federated Shapley Value per client (``fsv.png`` in ``folder``)."""
    from flwr_fedeval._extras import require

    matplotlib = require("matplotlib", purpose="the Shapley chart")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = sorted(fsv)
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(nodes)), 3.5))
    ax.bar(range(len(nodes)), [fsv[n] for n in nodes], color="tab:blue")
    ax.set_xticks(range(len(nodes)), [f"client {i}\n{str(n)[:6]}" for i, n in enumerate(nodes)], fontsize=8)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_ylabel("FSV (accuracy)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = folder / "fsv.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
