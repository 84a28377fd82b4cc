try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser (a dependency of flwr)
    import tomli as tomllib
from pathlib import Path

import pytest

from flwr_fedeval.app.task import JobConfig


def test_pyproject_app_config_parses_and_matches_dataclass_defaults():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    run_config = pyproject["tool"]["flwr"]["app"]["config"]
    cfg = JobConfig.from_run_config(run_config)
    assert cfg == JobConfig()  # the file and the code agree on every default
    assert set(run_config) == set(cfg.as_dict())


@pytest.mark.parametrize(
    "override,match",
    [
        ({"dataset": "mnist"}, "dataset"),
        ({"num-server-rounds": 0}, "num-server-rounds"),
        ({"num-server-rounds": 2.5}, "num-server-rounds"),
        ({"test-fraction": 1.0}, "test-fraction"),
        ({"dataset": "chest-xray", "data-dir": ""}, "data-dir"),
        ({"partitioning": "shards"}, "partitioning"),
    ],
)
def test_bad_config_values_raise_naming_the_key(override, match):
    with pytest.raises(ValueError, match=match):
        JobConfig.from_run_config(override)
