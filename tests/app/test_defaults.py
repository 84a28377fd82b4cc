"""One value per default: library signatures = JobConfig = pyproject.toml = README table.

The library's signatures are the source (``LIBRARY_PARAMETERS`` names the
parameter behind each App key); the App config restates them with the same
values, and its enumerations are values the library accepts.
"""

import importlib
import inspect
import re

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser (tomli, a dependency of flwr)
    import tomli as tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from flwr_fedeval.app.task import _CHOICES, LIBRARY_PARAMETERS, JobConfig

ROOT = Path(__file__).resolve().parents[2]
APP_CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
DEFAULTS = JobConfig().as_dict()
#: App keys whose name is not ``<phase prefix>-<library parameter>`` (the App
#: groups keys by phase; the library's name is on the right).
RENAMED = {"fhe-auc": "protocol", "fhe-splits": "n_splits", "decision-point-spacing": "spacing",
           "step-timeout": "step_timeout", "shapley-frac-bits": "data_frac_bits", "dirichlet-alpha": "alpha"}
PREFIXES = ("fhe-", "dp-", "dpauc-", "fedauc-", "xmk-", "shapley-", "")


def _library_default(target: str, param: str):
    module, qualname = target.split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    parameter = inspect.signature(obj).parameters[param]
    assert parameter.default is not inspect.Parameter.empty, f"{target}({param}) has no default"
    return parameter.default


def _readme_table() -> dict[str, str]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text[text.index("## Configuration (`[tool.flwr.app.config]`)"):]
    rows = {}
    for line in section.splitlines()[4:]:
        if not line.startswith("| `"):
            break
        key_cell, value_cell = (c.strip() for c in line.strip("|").split("|")[:2])
        keys = re.findall(r"`([^`]+)`", key_cell)
        values = [v.strip().strip("`") for v in value_cell.split(", ")]
        assert len(keys) == len(values), f"README row {line!r}: {len(keys)} keys, {len(values)} defaults"
        rows.update(zip(keys, values))
    return rows


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def test_pyproject_equals_jobconfig_defaults():
    assert set(APP_CONFIG) == set(DEFAULTS)
    for key, value in APP_CONFIG.items():
        assert _same(value, DEFAULTS[key]) and type(value) is type(DEFAULTS[key]), key


def test_readme_table_lists_every_key_with_its_default():
    table = _readme_table()
    assert set(table) == set(DEFAULTS), set(table) ^ set(DEFAULTS)
    for key, shown in table.items():
        value = DEFAULTS[key]
        if isinstance(value, bool):
            assert shown == str(value).lower(), key
        elif isinstance(value, (int, float)):
            assert float(shown) == float(value), key
        else:
            assert shown == (value or '""') or (value == "" and shown == ""), key


@pytest.mark.parametrize("key", sorted(LIBRARY_PARAMETERS))
def test_app_default_is_the_library_default(key):
    target, param = LIBRARY_PARAMETERS[key]
    assert _same(_library_default(target, param), DEFAULTS[key]), (key, target, param)


@pytest.mark.parametrize("key", sorted(LIBRARY_PARAMETERS))
def test_app_key_names_the_library_parameter(key):
    _, param = LIBRARY_PARAMETERS[key]
    if key in RENAMED:
        assert RENAMED[key] == param
    else:
        assert any(key == p + param.replace("_", "-") for p in PREFIXES), (key, param)


def test_library_defaults_agree_with_each_other():
    from flwr_fedeval import rlwe
    from flwr_fedeval.dp.fedauc import FedAUCLaplaceParams
    from flwr_fedeval.shapley.secsv import SecSVParams
    from flwr_fedeval.strategies.shapley_phase import SecSVPhase
    from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg

    assert _library_default("flwr_fedeval.strategies.xmk_fedavg:XMKFedAvg", "parameter_set") \
        == rlwe.DEFAULT_PARAMETER_SET.name
    for name in ("model_bound", "feature_bound", "data_frac_bits", "model_frac_bits"):
        assert _same(inspect.signature(SecSVParams.for_bounds).parameters[name].default,
                     inspect.signature(SecSVPhase).parameters[name].default), name
    for name in ("sensitivity", "allocation", "alpha", "beta"):
        assert inspect.signature(FedAUCLaplaceParams).parameters[name].default == \
            _library_default("flwr_fedeval.strategies.dp_phases:FedAUCLaplacePhase", name), name
    assert XMKFedAvg is not None


@pytest.mark.parametrize("name", sorted(_CHOICES))
def test_every_app_choice_is_accepted_and_others_refused(name):
    """Each enumerated App value is valid in the config; a value outside is refused naming the key."""
    key = name.replace("_", "-")
    for value in _CHOICES[name]:
        cfg = JobConfig(**{name: value})
        assert not [p for p in cfg.problems() if f"'{key}'" in p and "must be one of" in p]
    with pytest.raises(ValueError, match=key):
        JobConfig.from_run_config({key: "no-such-value"})


@pytest.mark.parametrize("allocation", _CHOICES["fedauc_allocation"])
@pytest.mark.parametrize("beta", ["adaptive", 0.3])
def test_fedauc_values_are_the_library_values(allocation, beta):
    from flwr_fedeval.strategies.phases import make_auc_phase

    cfg = JobConfig.from_run_config({"auc-method": "fedauc-laplace", "fedauc-allocation": allocation,
                                     "fedauc-beta": beta, "fedauc-alpha": 0.25})
    phase = make_auc_phase(cfg)
    assert phase.params.allocation == allocation
    assert phase.params.alpha == 0.25 and phase.params.beta == beta


def test_enumerations_match_the_library():
    from flwr_fedeval.secagg import REKEY_CHOICES

    assert set(_CHOICES["xmk_rekey"]) == set(REKEY_CHOICES)
    assert set(JobConfig.__dataclass_fields__) == {f.name for f in fields(JobConfig)}
