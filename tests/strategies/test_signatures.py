"""Public strategies and phases show their real parameters (``help()`` / ``inspect.signature``), not ``**kwargs``."""

import inspect

import pytest
from flwr.serverapp.strategy import FedAvg

import flwr_fedeval.strategies as strategies
from flwr_fedeval.strategies.base import EvaluationPhase
from flwr_fedeval.strategies.secure_aggregation import SecureAggregation
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg

# the classes a user constructs (the abstract EvaluationPhase is not one)
PUBLIC_CLASSES = [getattr(strategies, name) for name in strategies.__all__
                  if inspect.isclass(getattr(strategies, name)) and not inspect.isabstract(getattr(strategies, name))]
PHASES = [c for c in PUBLIC_CLASSES if issubclass(c, EvaluationPhase)]
CRYPTO = ["parameter_set", "max_abs_value", "scale_bits", "rekey", "step_timeout", "max_attempts", "mask_degree",
          "threshold", "decryption_attempts"]


def _params(cls):
    return inspect.signature(cls).parameters


@pytest.mark.parametrize("cls", PUBLIC_CLASSES, ids=lambda c: c.__name__)
def test_no_catch_all_parameters(cls):
    kinds = {p.kind for p in _params(cls).values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds
    assert inspect.Parameter.VAR_POSITIONAL not in kinds


def test_xmkfedavg_lists_fedavgs_parameters_with_their_defaults():
    ours, flowers = _params(XMKFedAvg), _params(FedAvg)
    for name, param in flowers.items():
        assert name in ours
        assert ours[name].default == param.default
    assert set(CRYPTO) <= set(ours)


def test_secure_aggregation_lists_the_protocols_parameters_as_xmkfedavg():
    ours, engine, flowers = _params(SecureAggregation), _params(XMKFedAvg), _params(FedAvg)
    assert list(ours)[0] == "strategy"
    protocol = [name for name in engine if name not in flowers]  # every parameter XMKFedAvg adds to FedAvg
    assert set(CRYPTO) <= set(protocol)
    for name in protocol:
        assert name in ours, f"SecureAggregation does not offer XMKFedAvg's {name!r}"
        assert ours[name].default == engine[name].default, name


@pytest.mark.parametrize("cls", PHASES, ids=lambda c: c.__name__)
def test_phases_list_the_shared_phase_parameters(cls):
    assert {"min_nodes", "timeout"} <= set(_params(cls))


def test_every_dp_phase_is_checked():
    names = {c.__name__ for c in PHASES}
    assert {"DPAUCLaplacePhase", "DPAUCRRPhase", "FedAUCRRPhase", "FedAUCLaplacePhase", "FHEAUCPhase",
            "PlaintextAUCPhase", "SecSVPhase"} <= names


def test_secure_aggregation_hands_every_protocol_parameter_to_its_engine():
    values = {"max_abs_value": 2.0**10, "step_timeout": 30.0, "max_attempts": 2, "mask_degree": 2, "threshold": 3,
              "limbs": 4, "decryption_attempts": 1, "rekey": "every-round"}
    wrapped = SecureAggregation(FedAvg(), **values)
    assert wrapped.protocol is wrapped.engine.protocol
    for name, value in values.items():
        assert getattr(wrapped.engine.protocol, name) == value, name
