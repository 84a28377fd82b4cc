"""The main job's task: run configuration, data per client, model per data set.

Shared by the ServerApp and the ClientApp. TensorFlow is only imported when a
model is built, so reading the configuration stays cheap.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from flwr_fedeval import config_keys, constraints
from flwr_fedeval.data.partition import ClientSplit, client_split, partition_indices

__all__ = ["ConfigError", "JobConfig", "LIBRARY_PARAMETERS", "LIBRARY_RUN_CONFIG", "library_run_config",
           "library_choices", "library_default", "library_target",
           "SEED_CNN_MIN_IMAGE_SIZE", "clear_data_cache",
           "client_partitions", "load_pooled_data", "load_client_data", "build_model", "XRAY_TASKS"]

#: Binary chest X-ray tasks: class folders, negative class first.
XRAY_TASKS = {
    "pneumonia-vs-normal": ("normal", "pneumonia"),
    "covid-vs-normal": ("normal", "covid"),
}

#: This App's own enumerations; those of the keys that set a library parameter are the library's
#: (:func:`library_choices`, from the class's ``_parameter_constraints``).
_APP_CHOICES = {
    "dataset": ("breast-cancer", "chest-xray", "bank-marketing"),
    "model": ("default", "logreg"),
    "shapley": ("none", "secsv"),
    "xray_task": tuple(XRAY_TASKS),
    "partitioning": ("iid", "dirichlet"),
    "auc_method": ("plain", "dpauc-laplace", "dpauc-rr", "fedauc-rr", "fedauc-laplace", "fhe"),
    "secure_aggregation": ("none", "xmkckks"),
}

#: App config key -> the library parameter it sets: ``(object, parameter name)``,
#: the object as ``"module:qualname"``. The library signature is the source of
#: the default; ``JobConfig``, ``pyproject.toml`` and the README table restate
#: it and ``tests/app/test_defaults.py`` keeps them equal, names and values.
LIBRARY_PARAMETERS: dict[str, tuple[str, str]] = {
    "dirichlet-alpha": ("flwr_fedeval.data.partition:partition_indices", "alpha"),
    "test-fraction": ("flwr_fedeval.data.partition:client_split", "test_fraction"),
    "num-decision-points": ("flwr_fedeval.strategies.fhe_phase:FHEAUCPhase", "num_decision_points"),
    "decision-point-spacing": ("flwr_fedeval.strategies.fhe_phase:FHEAUCPhase", "spacing"),
    "min-nodes": ("flwr_fedeval.strategies.fhe_phase:FHEAUCPhase", "min_nodes"),
    "dp-epsilon": ("flwr_fedeval.strategies.dp_phases:DPAUCLaplacePhase", "epsilon"),
    "dpauc-clipping": ("flwr_fedeval.strategies.dp_phases:DPAUCLaplacePhase", "clipping"),
    "fedauc-sensitivity": ("flwr_fedeval.strategies.dp_phases:FedAUCLaplacePhase", "sensitivity"),
    "fedauc-allocation": ("flwr_fedeval.strategies.dp_phases:FedAUCLaplacePhase", "allocation"),
    "fedauc-alpha": ("flwr_fedeval.strategies.dp_phases:FedAUCLaplacePhase", "alpha"),
    "fedauc-beta": ("flwr_fedeval.strategies.dp_phases:FedAUCLaplacePhase", "beta"),
    "fhe-auc": ("flwr_fedeval.strategies.fhe_phase:FHEAUCPhase", "protocol"),
    "fhe-splits": ("flwr_fedeval.strategies.fhe_phase:FHEAUCPhase", "n_splits"),
    "fhe-backend": ("flwr_fedeval.strategies.fhe_phase:FHEAUCPhase", "backend"),
    "share-auc-with-server": ("flwr_fedeval.strategies.fhe_phase:FHEAUCPhase", "share_auc_with_server"),
    "xmk-parameter-set": ("flwr_fedeval.strategies.xmk_fedavg:XMKFedAvg", "parameter_set"),
    "xmk-max-abs-value": ("flwr_fedeval.strategies.xmk_fedavg:XMKFedAvg", "max_abs_value"),
    "xmk-rekey": ("flwr_fedeval.strategies.xmk_fedavg:XMKFedAvg", "rekey"),
    "xmk-mask-degree": ("flwr_fedeval.strategies.xmk_fedavg:XMKFedAvg", "mask_degree"),
    "step-timeout": ("flwr_fedeval.strategies.xmk_fedavg:XMKFedAvg", "step_timeout"),
    "shapley-sample-skip": ("flwr_fedeval.strategies.shapley_phase:SecSVPhase", "sample_skip"),
    "shapley-model-bound": ("flwr_fedeval.strategies.shapley_phase:SecSVPhase", "model_bound"),
    "shapley-feature-bound": ("flwr_fedeval.strategies.shapley_phase:SecSVPhase", "feature_bound"),
    "shapley-frac-bits": ("flwr_fedeval.strategies.shapley_phase:SecSVPhase", "data_frac_bits"),
}


def library_target(key: str) -> tuple[Any, str]:
    """``(object, parameter)`` behind App key ``key`` (:data:`LIBRARY_PARAMETERS`), the object imported."""
    import importlib

    target, param = LIBRARY_PARAMETERS[key]
    module, qualname = target.split(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj, param


def library_default(key: str) -> Any:
    """The default of the library parameter behind App key ``key``: its signature's
    (:func:`flwr_fedeval.constraints.default_of`)."""
    return constraints.default_of(*library_target(key))


def library_choices() -> dict[str, tuple[str, ...]]:
    """``{field name: choices}`` of the App keys that set a library parameter with a set of choices
    (:func:`flwr_fedeval.constraints.choices`; the re-key policies: :data:`flwr_fedeval.secagg.REKEY_CHOICES`)."""
    from flwr_fedeval.secagg import REKEY_CHOICES

    out: dict[str, tuple[str, ...]] = {"xmk_rekey": tuple(REKEY_CHOICES)}
    for key in LIBRARY_PARAMETERS:
        found = constraints.choices(*library_target(key))
        if found is not None:
            out[key.replace("-", "_")] = found
    return out


#: Every enumerated key: this App's own and the library's (derived, never restated).
_CHOICES: dict[str, tuple[str, ...]] = {**_APP_CHOICES, **library_choices()}


#: Library classes whose relations between parameters apply only when the run uses them.
_USED_WHEN: dict[str, Any] = {
    "flwr_fedeval.strategies.fhe_phase:FHEAUCPhase": lambda cfg: cfg.auc_method == "fhe",
}


#: This App's run-config key -> the library's run-config key it sets (:mod:`flwr_fedeval.config_keys`):
#: the demo App keeps its short names; :func:`library_run_config` hands the library its own names
#: (the ClientApp through a mod, the ServerApp for its roster). ``fedeval-roster`` is the same key in both.
LIBRARY_RUN_CONFIG: dict[str, str] = {
    "identity-dir": config_keys.IDENTITY_DIR,
    "min-nodes": config_keys.MIN_CLIENTS,
    "dp-epsilon": config_keys.DP_EPSILON,
    "dp-budget": config_keys.DP_BUDGET,
    "share-auc-with-server": config_keys.SHARE_AUC,
    "xmk-mask-degree": config_keys.XMK_MASK_DEGREE,
}


def library_run_config(run_config: dict[str, Any]) -> dict[str, Any]:
    """``run_config`` plus the library's name of every App key in :data:`LIBRARY_RUN_CONFIG` it sets
    (same value); the App's own keys stay (the App reads them)."""
    out = dict(run_config)
    out.update({lib: run_config[app] for app, lib in LIBRARY_RUN_CONFIG.items() if app in run_config})
    return out


class ConfigError(ValueError):
    """The run config has problems; ``problems`` holds one readable line each.

    ``str(error)`` is those lines joined by newlines.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def seed_cnn_feature_side(image_size: int) -> int:
    """Side of the seed CNN's last feature map for ``image_size`` input pixels.

    Three blocks of Conv2D(5×5, "valid") and MaxPool(2)
    (:func:`flwr_fedeval.clients.models.build_seed_cnn`); < 1 means Keras
    fails with "Computed output size would be zero or negative".
    """
    side = int(image_size)
    for _ in range(3):
        side = (side - 4) // 2
    return side


#: Smallest ``image-size`` the seed CNN accepts (36 px).
SEED_CNN_MIN_IMAGE_SIZE = next(s for s in range(1, 1024) if seed_cnn_feature_side(s) >= 1)


@dataclass(frozen=True)
class JobConfig:
    """The ``[tool.flwr.app.config]`` section, validated.

    Keys are the kebab-case names of the fields (``num-server-rounds`` for
    ``num_server_rounds``); see ``pyproject.toml`` for the defaults. A key that sets a library
    parameter (:data:`LIBRARY_PARAMETERS`) takes its default from the library's signature
    (:func:`library_default`), its choices from the library's constraints (:func:`library_choices`)
    and its checks too (:meth:`problems`); ``pyproject.toml`` restates the defaults for Flower and
    ``tests/app/test_defaults.py`` keeps it equal.
    """

    num_server_rounds: int = 3
    local_epochs: int = 5
    batch_size: int = 32
    learning_rate: float = 1e-3
    fraction_train: float = 1.0
    min_nodes: int = library_default("min-nodes")
    seed: int = 42
    dataset: str = "breast-cancer"
    data_dir: str = ""
    model: str = "default"
    xray_task: str = "pneumonia-vs-normal"
    image_size: int = 128
    partitioning: str = "iid"
    dirichlet_alpha: float = library_default("dirichlet-alpha")
    test_fraction: float = library_default("test-fraction")
    auc_method: str = "plain"
    num_decision_points: int = library_default("num-decision-points")
    decision_point_spacing: str = library_default("decision-point-spacing")
    dp_epsilon: float = library_default("dp-epsilon")
    dp_budget: float = 0.0
    dpauc_clipping: str = library_default("dpauc-clipping")
    fedauc_sensitivity: str = library_default("fedauc-sensitivity")
    fedauc_allocation: str = library_default("fedauc-allocation")
    fedauc_alpha: float = library_default("fedauc-alpha")
    fedauc_beta: float | str = library_default("fedauc-beta")
    fhe_auc: str = library_default("fhe-auc")
    fhe_splits: int = library_default("fhe-splits")
    fhe_backend: str = library_default("fhe-backend")
    share_auc_with_server: bool = library_default("share-auc-with-server")
    fhe_metrics_threshold: float = 0.5
    secure_aggregation: str = "none"
    xmk_parameter_set: str = library_default("xmk-parameter-set")
    xmk_max_abs_value: float = library_default("xmk-max-abs-value")
    xmk_rekey: str = library_default("xmk-rekey")
    xmk_mask_degree: int = library_default("xmk-mask-degree")
    step_timeout: float = library_default("step-timeout")
    identity_dir: str = ""
    fedeval_roster: str = ""
    shapley: str = "none"
    shapley_sample_skip: bool = library_default("shapley-sample-skip")
    shapley_model_bound: float = library_default("shapley-model-bound")
    shapley_feature_bound: float = library_default("shapley-feature-bound")
    shapley_frac_bits: int = library_default("shapley-frac-bits")
    shapley_aux_partition_id: int = -1
    output_dir: str = "outputs"
    resume_from: str = ""

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> JobConfig:
        """Build from a Flower run config (kebab-case keys).

        Raises
        ------
        ConfigError
            A ``ValueError`` with one line per problem: an unknown key, a
            value of the wrong type, outside its range or its choices.
        """
        values: dict[str, Any] = {}
        known = {f.name.replace("_", "-"): f.name for f in fields(cls)}
        mapped = {lib: app for app, lib in LIBRARY_RUN_CONFIG.items()}
        problems = []
        for key, value in run_config.items():
            if key in mapped and mapped[key] in run_config and run_config[mapped[key]] == value:
                continue  # the library's name of an App key, from library_run_config
            if key in mapped:
                problems.append(f"config '{key}' is set through this App's key '{mapped[key]}'")
            elif key in known:
                values[known[key]] = value
            else:
                import difflib

                close = difflib.get_close_matches(key, list(known), n=1)
                problems.append(f"config '{key}' is not a key of this App"
                                + (f" (did you mean '{close[0]}'?)" if close else ""))
        cfg = cls(**values)
        problems += cfg.problems()
        if problems:
            raise ConfigError(problems)
        return cfg

    def validate(self) -> None:
        """Check types, ranges and choices (messages name the config key).

        Raises
        ------
        ConfigError
            With one line per problem (:meth:`problems`).
        """
        problems = self.problems()
        if problems:
            raise ConfigError(problems)

    def problems(self) -> list[str]:
        """Every problem of this configuration, one readable line each (empty: valid)."""
        out: list[str] = []
        bad: set[str] = set()
        for f in fields(self):
            value = getattr(self, f.name)
            key = f.name.replace("_", "-")
            problem = None
            if f.type in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
                problem = f"config '{key}' must be an integer, got {value!r}"
            elif f.type in ("float", float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
                problem = f"config '{key}' must be a number, got {value!r}"
            elif f.type in ("bool", bool) and not isinstance(value, bool):
                problem = f"config '{key}' must be true or false, got {value!r}"
            elif f.type in ("str", str) and not isinstance(value, str):
                problem = f"config '{key}' must be a string, got {value!r}"
            elif f.name in _CHOICES and value not in _CHOICES[f.name]:
                problem = f"config '{key}' must be one of {_CHOICES[f.name]}, got {value!r}"
            if problem:
                out.append(problem)
                bad.add(f.name)

        def check(ok: Callable[[], object], message: str, *names: str) -> None:
            if bad.intersection(names):
                return                       # already reported as a type/choice problem
            try:
                passed = ok()
            except Exception as exc:
                out.append(f"{message}: {exc}" if message else str(exc))
                return
            if not passed:
                out.append(message)

        for name in ("num_server_rounds", "local_epochs", "batch_size", "image_size", "min_nodes"):
            check(lambda name=name: getattr(self, name) >= 1,  # type: ignore[misc]
                  f"config '{name.replace('_', '-')}' must be >= 1", name)
        check(lambda: 0.0 < self.fraction_train <= 1.0, "config 'fraction-train' must be in (0, 1]", "fraction_train")
        check(lambda: 0.0 < self.learning_rate < math.inf, "config 'learning-rate' must be a finite number > 0",
              "learning_rate")
        check(lambda: self.seed >= 0, "config 'seed' must be >= 0", "seed")
        check(lambda: 0.0 < self.test_fraction < 1.0, "config 'test-fraction' must be in (0, 1)", "test_fraction")
        check(lambda: 0.0 < self.dirichlet_alpha < math.inf, "config 'dirichlet-alpha' must be a finite number > 0",
              "dirichlet_alpha")
        # DP AUC phases (flwr_fedeval.dp); inf is allowed and disables the noise.
        check(lambda: not math.isnan(self.dp_epsilon) and self.dp_epsilon > 0,
              "config 'dp-epsilon' must be > 0 (inf disables the noise)", "dp_epsilon")
        check(lambda: not math.isnan(self.dp_budget) and self.dp_budget >= 0,
              "config 'dp-budget' must be >= 0 (0 = dp-epsilon: one DP evaluation per run)", "dp_budget")
        check(lambda: not 0 < self.dp_budget < self.dp_epsilon, "config 'dp-budget' must be 0 or >= 'dp-epsilon'",
              "dp_budget", "dp_epsilon")
        out += self._library_problems(bad)
        if self.auc_method == "fhe" and not bad & {"fhe_splits", "fhe_backend", "fhe_auc", "num_decision_points",
                                                     "fhe_metrics_threshold"}:
            out += self._fhe_problems()
        if self.secure_aggregation == "xmkckks":
            from flwr_fedeval.rlwe import get_parameter_set, validate_security

            def secure() -> bool:
                validate_security(get_parameter_set(self.xmk_parameter_set))  # raises if not
                return True

            check(secure,
                  "config 'xmk-parameter-set'", "xmk_parameter_set")
            check(lambda: 1.0 <= self.xmk_max_abs_value < math.inf,
                  "config 'xmk-max-abs-value' must be a finite number >= 1", "xmk_max_abs_value")
            check(lambda: not isinstance(self.xmk_mask_degree, bool) and self.xmk_mask_degree == int(
                self.xmk_mask_degree) and self.xmk_mask_degree >= 0,
                  "config 'xmk-mask-degree' must be an integer >= 0 (0 = complete mask graph)", "xmk_mask_degree")
        check(lambda: 0 < self.step_timeout < math.inf, "config 'step-timeout' must be a finite number > 0 (seconds)",
              "step_timeout")
        check(lambda: self.dataset == "breast-cancer" or bool(self.data_dir),
              f"config 'data-dir' must name the {self.dataset} data when dataset = '{self.dataset}'",
              "dataset", "data_dir")
        check(lambda: not (self.dataset == "chest-xray" and self.model == "logreg"),
              "config 'model' = 'logreg' is for the tabular data sets, not 'chest-xray'", "dataset", "model")
        check(lambda: self.dataset != "chest-xray" or seed_cnn_feature_side(self.image_size) >= 1,
              f"config 'image-size' = {self.image_size} is too small for the seed CNN (three 5x5 conv + 2x2 "
              f"pool blocks): use image-size >= {SEED_CNN_MIN_IMAGE_SIZE}", "dataset", "image_size")
        check(lambda: self.shapley_aux_partition_id >= -1,
              "config 'shapley-aux-partition-id' must be -1 (none) or a partition id", "shapley_aux_partition_id")
        if self.shapley != "none" and not bad & {"model", "secure_aggregation", "shapley_frac_bits",
                                                  "shapley_model_bound", "shapley_feature_bound"}:
            out += self._shapley_problems()
        return out

    def _shapley_problems(self) -> list[str]:
        """``shapley-*`` keys: SecSV needs a linear model and fixed-point bounds that fit."""
        out = []
        if self.model != "logreg":
            out.append("config 'shapley' = 'secsv' evaluates linear classifiers only (Zheng et al. 2023): "
                       "set 'model' = 'logreg'")
        if self.secure_aggregation != "none":
            out.append("config 'shapley' needs the clients' example counts as FedAvg weights: "
                       "use it with 'secure-aggregation' = 'none'")
        if not 1 <= self.shapley_frac_bits <= 20:
            out.append("config 'shapley-frac-bits' must be in [1, 20]")
            return out
        from flwr_fedeval.shapley.secsv import SecSVParams

        try:
            SecSVParams.for_bounds(n_features=64, max_clients=16, model_bound=self.shapley_model_bound,
                                   feature_bound=self.shapley_feature_bound,
                                   data_frac_bits=self.shapley_frac_bits, model_frac_bits=self.shapley_frac_bits)
        except ValueError as exc:
            out.append(f"config 'shapley-model-bound'/'shapley-feature-bound'/'shapley-frac-bits': {exc}")
        return out

    def _library_problems(self, bad: set[str]) -> list[str]:
        """The library's checks of the keys that set its parameters (:data:`LIBRARY_PARAMETERS`): each
        class's ``_parameter_constraints`` and relations (:func:`flwr_fedeval.constraints.parameter_problems`),
        one line each naming this App's keys; keys already refused for their type are skipped."""
        by_target: dict[str, dict[str, str]] = {}
        for key, (target, param) in LIBRARY_PARAMETERS.items():
            if key.replace("-", "_") not in bad:
                by_target.setdefault(target, {})[param] = key
        out = []
        for target, keys in by_target.items():
            obj, _ = library_target(next(iter(keys.values())))
            params = {param: getattr(self, key.replace("-", "_")) for param, key in keys.items()}
            used = _USED_WHEN.get(target, lambda cfg: True)(self)
            for problem in constraints.parameter_problems(obj, params, relations=used):
                named = [f"'{keys[p]}'" for p in problem.params if p in keys]
                out.append(f"config {' / '.join(named) or repr(target)}: {problem.message}")
        return out

    def _fhe_problems(self) -> list[str]:
        """``fhe-*`` keys this App adds to the library's (:meth:`_library_problems`): the threshold, and
        the backend this Python can run."""
        out = []
        if not (self.fhe_metrics_threshold < 0 or 0.0 <= self.fhe_metrics_threshold <= 1.0):
            out.append("config 'fhe-metrics-threshold' must be in [0, 1], or < 0 for none")
        if self.fhe_backend == "openfhe":
            from flwr_fedeval._extras import MissingExtraError

            try:  # the aggregator (this ServerApp) and every client need the engine
                import flwr_fedeval.fhe.openfhe_backend  # noqa: F401
            except MissingExtraError as exc:
                out.append(f"config 'fhe-backend' = 'openfhe': {exc}")
                return out
        return out

    def as_dict(self) -> dict[str, Any]:
        """Kebab-case dict (as in the run config), for result files."""
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}


@functools.lru_cache(maxsize=2)
def _load_pooled(dataset: str, data_dir: str, xray_task: str,
                 image_size: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
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


@functools.lru_cache(maxsize=4)
def _partitions(dataset: str, data_dir: str, xray_task: str, image_size: int, method: str, alpha: float,
                seed: int, num_partitions: int) -> tuple[np.ndarray, ...]:
    _, y, _ = _load_pooled(dataset, data_dir, xray_task, image_size)
    return tuple(partition_indices(y, num_partitions, method=method, alpha=alpha, seed=seed))  # type: ignore[arg-type]


def client_partitions(cfg: JobConfig, num_partitions: int) -> list[np.ndarray]:
    """Row indices of every client's partition of the pooled data (cached per process)."""
    data_dir = str(Path(cfg.data_dir).expanduser().resolve()) if cfg.data_dir else ""
    return list(_partitions(cfg.dataset, data_dir, cfg.xray_task, cfg.image_size, cfg.partitioning,
                            float(cfg.dirichlet_alpha), cfg.seed, num_partitions))


def load_client_data(cfg: JobConfig, partition_id: int, num_partitions: int) -> ClientSplit:
    """Client ``partition_id``'s own train and test split.

    The pooled data and the partitioning are cached per process (see
    :func:`clear_data_cache`); every call returns a new split of them.

    Raises
    ------
    PartitionError
        If the partitioning leaves some client a split smaller than the
        number of classes (the same one-line error for every client).
    """
    x, y, _ = load_pooled_data(cfg)
    parts = client_partitions(cfg, num_partitions)
    return client_split(
        x,
        y,
        partition_id,
        num_partitions,
        method=cfg.partitioning,  # type: ignore[arg-type]
        alpha=cfg.dirichlet_alpha,
        test_fraction=cfg.test_fraction,
        seed=cfg.seed,
        partitions=parts,
    )


def clear_data_cache() -> None:
    """Forget the pooled data and partitionings this process loaded (a new run may see new files)."""
    _partitions.cache_clear()
    _load_pooled.cache_clear()


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
