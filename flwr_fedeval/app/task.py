"""The main job's task: run configuration, data per client, model per data set.

Shared by the ServerApp and the ClientApp. TensorFlow is only imported when a
model is built, so reading the configuration stays cheap.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from flwr_fedeval.data.partition import ClientSplit, client_split

__all__ = ["JobConfig", "load_pooled_data", "load_client_data", "build_model", "XRAY_TASKS"]

#: Binary chest X-ray tasks: class folders, negative class first.
XRAY_TASKS = {
    "pneumonia-vs-normal": ("normal", "pneumonia"),
    "covid-vs-normal": ("normal", "covid"),
}

_CHOICES = {
    "dataset": ("breast-cancer", "chest-xray", "bank-marketing"),
    "model": ("default", "logreg"),
    "shapley": ("none", "secsv"),
    "xray_task": tuple(XRAY_TASKS),
    "partitioning": ("iid", "dirichlet"),
    "auc_method": ("plain", "dpauc-laplace", "dpauc-rr", "fedauc-rr", "fedauc-laplace", "fhe"),
    "fhe_auc": ("semi-honest", "malicious"),
    "fhe_backend": ("tenseal", "openfhe"),
    "dpauc_clipping": ("clip-sort", "no-clip"),
    "fedauc_sensitivity": ("local", "global"),
    "fedauc_allocation": ("alpha", "orthogonal", "adaptive"),
    "decision_point_spacing": ("linear", "logit"),
    "secure_aggregation": ("none", "xmkckks"),
    "xmk_rekey": ("every-round", "per-client-set"),
}


@dataclass(frozen=True)
class JobConfig:
    """The ``[tool.flwr.app.config]`` section, validated.

    Keys are the kebab-case names of the fields (``num-server-rounds`` for
    ``num_server_rounds``); see ``pyproject.toml`` for the defaults.
    """

    num_server_rounds: int = 3
    local_epochs: int = 5
    batch_size: int = 32
    learning_rate: float = 1e-3
    fraction_train: float = 1.0
    min_nodes: int = 2
    seed: int = 42
    dataset: str = "breast-cancer"
    data_dir: str = ""
    model: str = "default"
    xray_task: str = "pneumonia-vs-normal"
    image_size: int = 128
    partitioning: str = "iid"
    dirichlet_alpha: float = 0.5
    test_fraction: float = 0.2
    auc_method: str = "plain"
    num_decision_points: int = 100
    decision_point_spacing: str = "linear"
    dp_epsilon: float = 1.0
    dp_budget: float = 0.0
    dp_seed: int = 0
    dpauc_clipping: str = "clip-sort"
    fedauc_sensitivity: str = "local"
    fedauc_allocation: str = "adaptive"
    fedauc_split: float = 0.5
    fhe_auc: str = "semi-honest"
    fhe_splits: int = 4
    fhe_backend: str = "tenseal"
    share_auc_with_server: bool = True
    fhe_metrics_threshold: float = 0.5
    secure_aggregation: str = "none"
    xmk_parameter_set: str = "xmk-n4096-q108"
    xmk_max_abs_value: float = 65536.0
    xmk_rekey: str = "every-round"
    step_timeout: float = 600.0
    shapley: str = "none"
    shapley_sample_skip: bool = True
    shapley_model_bound: float = 8.0
    shapley_feature_bound: float = 16.0
    shapley_frac_bits: int = 10
    shapley_aux_partition_id: int = -1
    output_dir: str = "outputs"

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> "JobConfig":
        """Build from a Flower run config (kebab-case keys; unknown keys kept out).

        Raises
        ------
        ValueError
            For a value of the wrong type or outside its allowed choices.
        """
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = f.name.replace("_", "-")
            if key in run_config:
                values[f.name] = run_config[key]
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Check types, ranges and choices (messages name the config key)."""
        for f in fields(self):
            value = getattr(self, f.name)
            key = f.name.replace("_", "-")
            if f.type in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"config '{key}' must be an integer, got {value!r}")
            if f.type in ("float", float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"config '{key}' must be a number, got {value!r}")
            if f.type in ("bool", bool) and not isinstance(value, bool):
                raise ValueError(f"config '{key}' must be true or false, got {value!r}")
            if f.name in _CHOICES and value not in _CHOICES[f.name]:
                raise ValueError(f"config '{key}' must be one of {_CHOICES[f.name]}, got {value!r}")
        positive = ("num_server_rounds", "local_epochs", "batch_size", "image_size", "min_nodes")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"config '{name.replace('_', '-')}' must be >= 1")
        if not 0.0 < self.fraction_train <= 1.0:
            raise ValueError("config 'fraction-train' must be in (0, 1]")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError("config 'test-fraction' must be in (0, 1)")
        if self.num_decision_points < 2:
            raise ValueError("config 'num-decision-points' must be >= 2")
        # DP AUC phases (flwr_fedeval.dp); inf is allowed and disables the noise.
        if math.isnan(self.dp_epsilon) or self.dp_epsilon <= 0:
            raise ValueError("config 'dp-epsilon' must be > 0 (inf disables the noise)")
        if math.isnan(self.dp_budget) or self.dp_budget < 0:
            raise ValueError("config 'dp-budget' must be >= 0 (0 = dp-epsilon: one DP evaluation per run)")
        if 0 < self.dp_budget < self.dp_epsilon:
            raise ValueError("config 'dp-budget' must be 0 or >= 'dp-epsilon'")
        if self.dp_seed < 0:
            raise ValueError("config 'dp-seed' must be >= 0 (0 = seeded from secrets)")
        if not 0.0 < self.fedauc_split <= 1.0 or (self.fedauc_allocation == "alpha" and self.fedauc_split == 1.0):
            raise ValueError("config 'fedauc-split' must be in (0, 1) (alpha) or (0, 1] (beta, orthogonal)")
        if self.fedauc_sensitivity == "global" and self.fedauc_allocation != "alpha":
            raise ValueError("config 'fedauc-allocation' must be 'alpha' when 'fedauc-sensitivity' = 'global'")
        if self.auc_method == "fhe":
            self._validate_fhe()
        if self.secure_aggregation == "xmkckks":
            from flwr_fedeval.rlwe import get_parameter_set, validate_security

            validate_security(get_parameter_set(self.xmk_parameter_set))
            if not 1.0 <= self.xmk_max_abs_value < math.inf:
                raise ValueError("config 'xmk-max-abs-value' must be a finite number >= 1")
        if not self.step_timeout > 0:
            raise ValueError("config 'step-timeout' must be > 0 (seconds)")
        if self.dataset in ("chest-xray", "bank-marketing") and not self.data_dir:
            raise ValueError(f"config 'data-dir' must name the {self.dataset} data when dataset = '{self.dataset}'")
        if self.dataset == "chest-xray" and self.model == "logreg":
            raise ValueError("config 'model' = 'logreg' is for the tabular data sets, not 'chest-xray'")
        if self.shapley != "none":
            self._validate_shapley()

    def _validate_shapley(self) -> None:
        """``shapley-*`` keys: SecSV needs a linear model and fixed-point bounds that fit."""
        if self.model != "logreg":
            raise ValueError("config 'shapley' = 'secsv' evaluates linear classifiers only (Zheng et al. 2023): "
                             "set 'model' = 'logreg'")
        if self.secure_aggregation != "none":
            raise ValueError("config 'shapley' needs the clients' example counts as FedAvg weights: "
                             "use it with 'secure-aggregation' = 'none'")
        if not 1 <= self.shapley_frac_bits <= 20:
            raise ValueError("config 'shapley-frac-bits' must be in [1, 20]")
        if self.shapley_aux_partition_id < -1:
            raise ValueError("config 'shapley-aux-partition-id' must be -1 (none) or a partition id")
        from flwr_fedeval.shapley.secsv import SecSVParams

        try:
            SecSVParams.for_bounds(n_features=64, max_clients=16, model_bound=self.shapley_model_bound,
                                   feature_bound=self.shapley_feature_bound,
                                   data_frac_bits=self.shapley_frac_bits, model_frac_bits=self.shapley_frac_bits)
        except ValueError as exc:
            raise ValueError(f"config 'shapley-model-bound'/'shapley-feature-bound'/'shapley-frac-bits': {exc}") from None

    def _validate_fhe(self) -> None:
        """``fhe-*`` keys: splits, slots, threshold, and the backend this Python can run."""
        if self.fhe_splits < 2:
            raise ValueError("config 'fhe-splits' must be >= 2")
        if not (self.fhe_metrics_threshold < 0 or 0.0 <= self.fhe_metrics_threshold <= 1.0):
            raise ValueError("config 'fhe-metrics-threshold' must be in [0, 1], or < 0 for none")
        if self.fhe_backend == "openfhe":
            from flwr_fedeval._extras import MissingExtraError

            try:  # the aggregator (this ServerApp) and every client need the engine
                import flwr_fedeval.fhe.openfhe_backend  # noqa: F401
            except MissingExtraError as exc:
                raise ValueError(f"config 'fhe-backend' = 'openfhe': {exc}") from None
        from flwr_fedeval.fhe.backend import CKKSParams

        n = self.num_decision_points
        slots = self.fhe_splits * (n + 1) + 2 if self.fhe_auc == "malicious" else n + 1
        available = CKKSParams.default(self.fhe_backend).slot_count
        if slots > available:
            raise ValueError(
                f"config 'num-decision-points' = {n}"
                + (f" with 'fhe-splits' = {self.fhe_splits}" if self.fhe_auc == "malicious" else "")
                + f" needs {slots} CKKS slots, the {self.fhe_backend} parameters have {available}"
            )

    def as_dict(self) -> dict[str, Any]:
        """Kebab-case dict (as in the run config), for result files."""
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}


@functools.lru_cache(maxsize=2)
def _load_pooled(dataset: str, data_dir: str, xray_task: str, image_size: int):
    if dataset == "breast-cancer":
        from flwr_fedeval.data.tabular import load_breast_cancer_data

        return load_breast_cancer_data()
    if dataset == "bank-marketing":
        from flwr_fedeval.data.bank_marketing import load_bank_marketing

        x, y, _ = load_bank_marketing(data_dir)
        lo, hi = x.min(axis=0), x.max(axis=0)          # public value ranges of the file
        x = (x - lo) / np.where(hi > lo, hi - lo, 1.0)
        return x.astype(np.float32), y, ["no", "yes"]
    from flwr_fedeval.data.images import load_image_folder

    return load_image_folder(
        Path(data_dir), XRAY_TASKS[xray_task], image_size=(image_size, image_size)
    )


def load_pooled_data(cfg: JobConfig) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The whole data set before partitioning (cached per process).

    Returns ``(x, y, class_names)``; see :mod:`flwr_fedeval.data`.
    """
    data_dir = str(Path(cfg.data_dir).expanduser().resolve()) if cfg.data_dir else ""
    return _load_pooled(cfg.dataset, data_dir, cfg.xray_task, cfg.image_size)


def load_client_data(cfg: JobConfig, partition_id: int, num_partitions: int) -> ClientSplit:
    """Client ``partition_id``'s own train and test split."""
    x, y, _ = load_pooled_data(cfg)
    return client_split(
        x,
        y,
        partition_id,
        num_partitions,
        method=cfg.partitioning,  # type: ignore[arg-type]
        alpha=cfg.dirichlet_alpha,
        test_fraction=cfg.test_fraction,
        seed=cfg.seed,
    )


def build_model(cfg: JobConfig) -> Any:
    """The compiled Keras model for ``cfg.dataset`` (seeded initialisation)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from flwr_fedeval._extras import require

    keras = require("keras", purpose="the App's models")
    from flwr_fedeval.clients.models import build_mlp, build_seed_cnn

    keras.utils.set_random_seed(cfg.seed)
    if cfg.dataset in ("breast-cancer", "bank-marketing"):
        x, _, _ = load_pooled_data(cfg)
        hidden = () if cfg.model == "logreg" else (32, 16)   # logreg: one softmax Dense layer
        return build_mlp(x.shape[1], hidden_units=hidden, learning_rate=cfg.learning_rate)
    return build_seed_cnn((cfg.image_size, cfg.image_size, 1), learning_rate=cfg.learning_rate)
