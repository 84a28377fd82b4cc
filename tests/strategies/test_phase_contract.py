"""The one phase contract: every evaluation phase is an EvaluationPhase with ``run(grid, arrays) -> result``."""

import inspect
import typing

import pytest
from flwr.app import ArrayRecord
from flwr.serverapp import Grid

import flwr_fedeval.strategies as strategies
from flwr_fedeval.app.server_app import make_shapley_phase
from flwr_fedeval.app.task import JobConfig
from flwr_fedeval.identity import Roster
from flwr_fedeval.strategies.auc_phase import AUCPhaseResult
from flwr_fedeval.strategies.base import EvaluationPhase
from flwr_fedeval.strategies.phases import make_auc_phase
from flwr_fedeval.strategies.shapley_phase import SecSVPhase, ShapleyPhaseResult

#: Every phase class, with a valid construction and the result type of its run.
PHASES = {
    "PlaintextAUCPhase": (lambda cls: cls(20), AUCPhaseResult),
    "DPAUCLaplacePhase": (lambda cls: cls(20, epsilon=1.0), AUCPhaseResult),
    "DPAUCRRPhase": (lambda cls: cls(20, epsilon=1.0), AUCPhaseResult),
    "FedAUCRRPhase": (lambda cls: cls(epsilon=1.0), AUCPhaseResult),
    "FedAUCLaplacePhase": (lambda cls: cls(epsilon=1.0), AUCPhaseResult),
    "FHEAUCPhase": (lambda cls: cls(20), AUCPhaseResult),
    "SecSVPhase": (lambda cls: cls(), ShapleyPhaseResult),
}


def _params(fn) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def test_every_exported_phase_is_covered():
    exported = {n for n in strategies.__all__ if n.endswith("Phase") and n != "EvaluationPhase"}
    assert exported == set(PHASES)


@pytest.mark.parametrize("name", sorted(PHASES))
def test_phase_is_an_evaluation_phase_with_the_one_run_signature(name):
    make, result_type = PHASES[name]
    cls = getattr(strategies, name)
    phase = make(cls)
    assert isinstance(phase, EvaluationPhase) and not inspect.isabstract(cls)
    assert _params(cls.run) == _params(EvaluationPhase.run) == [
        ("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), ("grid", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("arrays", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    hints = typing.get_type_hints(cls.run)
    assert hints["grid"] is Grid
    assert ArrayRecord in (hints["arrays"], *typing.get_args(hints["arrays"]))
    assert hints["return"] is result_type


def test_evaluation_phase_itself_cannot_be_instantiated():
    assert inspect.isabstract(EvaluationPhase)
    with pytest.raises(TypeError, match="abstract"):
        EvaluationPhase()
    with pytest.raises(ValueError, match="min_nodes"):     # the configuration is still named first
        EvaluationPhase(min_nodes=0)

    class NoRun(EvaluationPhase):
        pass

    with pytest.raises(TypeError, match="abstract"):
        NoRun()


@pytest.mark.parametrize("method, cls", [("plain", "PlaintextAUCPhase"), ("dpauc-laplace", "DPAUCLaplacePhase"),
                                         ("dpauc-rr", "DPAUCRRPhase"), ("fedauc-rr", "FedAUCRRPhase"),
                                         ("fedauc-laplace", "FedAUCLaplacePhase"), ("fhe", "FHEAUCPhase")])
def test_factory_builds_evaluation_phases(method, cls):
    phase = make_auc_phase(JobConfig.from_run_config({"auc-method": method}))
    assert type(phase) is getattr(strategies, cls) and isinstance(phase, EvaluationPhase)
    hints = typing.get_type_hints(make_auc_phase, localns={"JobConfig": JobConfig, "Roster": Roster})
    assert hints["return"] == EvaluationPhase[AUCPhaseResult] and hints["cfg"] is JobConfig


def test_shapley_factory_fixes_the_nodes_at_construction():
    cfg = JobConfig.from_run_config({"shapley": "secsv", "model": "logreg"})
    phase = make_shapley_phase(cfg, clients=[9, 3, 5], aux_node=7)
    assert isinstance(phase, SecSVPhase) and isinstance(phase, EvaluationPhase)
    assert (phase.clients, phase.aux_node) == ([3, 5, 9], 7)
    assert (make_shapley_phase(cfg).clients, make_shapley_phase(cfg).aux_node) == (None, None)
