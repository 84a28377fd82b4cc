"""Extras (issue 13 item 2) and the flwr-version shims (item 1)."""

import sys

import pytest

from flwr_fedeval import _compat, _extras
from flwr_fedeval._extras import MissingExtraError, require


def test_require_returns_the_module():
    import json

    assert require("json", extra="app") is json


def test_missing_module_names_its_extra_and_chains_the_cause():
    with pytest.raises(MissingExtraError,
                       match=r"install the \[keras\] extra: pip install 'flwr-fedeval\[keras\]'") as info:
        require("keras._definitely_not_a_module_", purpose="the Keras models")
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value.__cause__, ImportError)
    assert "the Keras models needs 'keras'" in str(info.value)


def test_missing_openfhe_names_the_python_it_needs(monkeypatch):
    monkeypatch.setitem(sys.modules, "openfhe", None)  # import openfhe -> ImportError
    with pytest.raises(MissingExtraError, match=r"\[openfhe\] extra.*CPython 3\.10.*this is "):
        require("openfhe", purpose="the OpenFHE CKKS engine")


def test_unknown_module_without_extra_is_a_programming_error():
    with pytest.raises(ValueError, match="no extra"):
        require("some_module_without_an_extra")


def test_every_extra_named_by_require_exists_in_pyproject():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    section = text[text.index("[project.optional-dependencies]"):text.index("[tool.hatch")]
    declared = {line.split("=")[0].strip() for line in section.splitlines() if "= [" in line}
    assert set(_extras.EXTRAS.values()) <= declared
    assert {"keras", "openfhe", "app", "all", "dev"} <= declared
    core = text[text.index("dependencies = ["):text.index("[project.optional-dependencies]")]
    assert "tensorflow" not in core and "keras" not in core and "flwr-datasets" not in core


def test_flwr_version_is_in_the_supported_range():
    """The installed flwr satisfies the range pyproject.toml declares (the one source of it)."""
    import re
    from importlib.metadata import version
    from pathlib import Path

    from packaging.specifiers import SpecifierSet

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    (spec,) = re.findall(r'^\s*"flwr(>=[^"]+)",', text, flags=re.M)  # the core dependency
    assert SpecifierSet(spec).contains(version("flwr")), (version("flwr"), spec)
    assert SpecifierSet(spec).contains("1.30.0") and SpecifierSet(spec).contains("1.42.0"), spec  # both CI ends
    assert _compat.FLWR_VERSION >= (1, 30)
    run = _compat.Run.create_empty(run_id=7)
    assert run.run_id == 7
    _compat.set_serverapp_identity(run_id=7)  # no-op on 1.30, sets TaskIdentity on 1.41


def test_openfhe_engine_without_its_extra_is_refused_early(monkeypatch):
    from flwr_fedeval.app.task import JobConfig
    from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase

    monkeypatch.setitem(sys.modules, "openfhe", None)  # as on a Python where the wheel does not load
    monkeypatch.delitem(sys.modules, "flwr_fedeval.fhe.openfhe_backend", raising=False)
    with pytest.raises(MissingExtraError, match=r"\[openfhe\] extra"):
        FHEAUCPhase(10, backend="openfhe")
    with pytest.raises(ValueError, match=r"'fhe-backend' = 'openfhe'.*\[openfhe\] extra.*CPython 3\.10"):
        JobConfig.from_run_config({"auc-method": "fhe", "fhe-backend": "openfhe"})
    assert FHEAUCPhase(10, backend="tenseal").backend == "tenseal"
