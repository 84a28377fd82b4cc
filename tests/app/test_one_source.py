"""One source for every constraint: the App refuses exactly what the library refuses.

``docs/configuration.md`` promised N ≤ 1022 decision points at ``fhe-splits = 4``; the App's own copy of the
slot formula (S·(N+1)+2) passed it and the phase (S·(N+2)+2) refused it after training. Now the App runs the
library's declared constraints and relations (:mod:`flwr_fedeval.constraints`), takes its choices from them
and its defaults from the signatures, and the docs cite the function instead of a formula.
"""

import re
from pathlib import Path

import pytest

from flwr_fedeval import constraints
from flwr_fedeval.app.task import _CHOICES, LIBRARY_PARAMETERS, JobConfig, library_target
from flwr_fedeval.strategies import FHEAUCPhase
from flwr_fedeval.strategies.dp_phases import FedAUCLaplacePhase

ROOT = Path(__file__).resolve().parents[2]


def _phase_refuses(**kwargs) -> bool:
    try:
        FHEAUCPhase(**kwargs)
    except ValueError:
        return True
    return False


def test_the_largest_n_at_four_splits_is_the_same_for_the_app_and_the_phase():
    cfg = JobConfig(auc_method="fhe", fhe_auc="malicious", fhe_splits=4, num_decision_points=1022)
    assert cfg.problems()  # the old App check passed it; the phase refuses it
    assert _phase_refuses(num_decision_points=1022, protocol="malicious", n_splits=4)


@pytest.mark.parametrize("protocol", ["semi-honest", "malicious"])
@pytest.mark.parametrize("n_splits", [2, 4, 7])
def test_app_and_phase_agree_around_the_slot_limit(protocol, n_splits):
    slots = 4096  # TenSEAL's default parameters
    largest = max(n for n in range(2, slots) if FHEAUCPhase.slots_needed(n, protocol, n_splits) <= slots)
    for n in (largest - 1, largest, largest + 1, largest + 50):
        cfg = JobConfig(auc_method="fhe", fhe_auc=protocol, fhe_splits=n_splits, num_decision_points=n)
        assert (
            bool(cfg.problems())
            == _phase_refuses(num_decision_points=n, protocol=protocol, n_splits=n_splits)
            == (n > largest)
        ), n


@pytest.mark.parametrize("key", sorted(LIBRARY_PARAMETERS))
def test_app_choices_are_the_library_constraints(key):
    obj, param = library_target(key)
    found = constraints.choices(obj, param)
    if found is not None:
        assert _CHOICES[key.replace("-", "_")] == found


@pytest.mark.parametrize(
    "run_config, phase",
    [
        ({"fhe-splits": 1}, lambda: FHEAUCPhase(n_splits=1)),
        ({"num-decision-points": 1}, lambda: FHEAUCPhase(1)),
        ({"fedauc-alpha": 1.0}, lambda: FedAUCLaplacePhase(alpha=1.0, allocation="alpha")),
        ({"fedauc-sensitivity": "global"}, lambda: FedAUCLaplacePhase(sensitivity="global")),
    ],
)
def test_the_app_refuses_what_the_library_refuses_naming_its_key(run_config, phase):
    with pytest.raises(ValueError):
        phase()
    (key,) = [k for k in run_config if k != "fedauc-allocation"]
    with pytest.raises(ValueError, match=f"'{key}'"):
        JobConfig.from_run_config(run_config)


def test_the_docs_cite_the_slot_function_not_a_formula():
    text = (ROOT / "docs" / "configuration.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `fhe-splits`"))
    assert "FHEAUCPhase.slots_needed" in row
    assert not re.search(r"S·\(N\s*\+\s*\d\)", row) and not re.search(r"N ≤ \d+", row)
