"""DP configuration keys, phase selection and the main job with a DP AUC phase."""

import json
import math

import pytest
from flwr.app import Context, RecordDict

from flwr_fedeval.app import server_app
from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.app.task import JobConfig
from flwr_fedeval.clients.dp_handlers import CLIENT_DP_DEFAULTS
from flwr_fedeval.strategies import dp_phases
from flwr_fedeval.strategies.phases import make_auc_phase
from flwr_fedeval.testing import InProcessGrid


def test_client_side_dp_defaults_equal_job_config_defaults():
    from flwr_fedeval.app.task import library_run_config

    defaults = library_run_config(JobConfig().as_dict())
    assert {k: defaults[k] for k in CLIENT_DP_DEFAULTS} == CLIENT_DP_DEFAULTS


@pytest.mark.parametrize(
    "override,match",
    [
        ({"dp-epsilon": 0.0}, "dp-epsilon"),
        ({"dp-epsilon": "1"}, "dp-epsilon"),
        ({"dp-epsilon": 2.0, "dp-budget": 1.0}, "dp-budget"),
        ({"dp-seed": 3}, "dp-seed"),  # not a key of the App: a server-set seed is gone (issue 22)
        ({"dpauc-clipping": "clip"}, "dpauc-clipping"),
        ({"fedauc-sensitivity": "max"}, "fedauc-sensitivity"),
        ({"fedauc-allocation": "beta"}, "fedauc-allocation"),
        ({"fedauc-allocation": "adaptive"}, "fedauc-allocation"),
        ({"fedauc-sensitivity": "global", "fedauc-allocation": "orthogonal"}, "fedauc-allocation"),
        ({"fedauc-alpha": 0.0}, "fedauc-alpha"),
        ({"fedauc-alpha": 1.0}, "fedauc-alpha"),
        ({"fedauc-beta": 0.0}, "fedauc-beta"),
        ({"fedauc-beta": "fixed"}, "fedauc-beta"),
        ({"fedauc-split": 0.5}, "fedauc-split"),
        ({"auc-method": "dpauc"}, "auc-method"),
    ],
)
def test_bad_dp_config_values_raise_naming_the_key(override, match):
    with pytest.raises(ValueError, match=match):
        JobConfig.from_run_config(override)


@pytest.mark.parametrize(
    "override,cls,variant",
    [
        ({"auc-method": "dpauc-laplace"}, dp_phases.DPAUCLaplacePhase, "clip-sort"),
        ({"auc-method": "dpauc-laplace", "dpauc-clipping": "no-clip"}, dp_phases.DPAUCLaplacePhase, "no-clip"),
        ({"auc-method": "dpauc-rr"}, dp_phases.DPAUCRRPhase, None),
        ({"auc-method": "fedauc-rr"}, dp_phases.FedAUCRRPhase, None),
        ({"auc-method": "fedauc-laplace"}, dp_phases.FedAUCLaplacePhase, "local-adaptive"),
        ({"auc-method": "fedauc-laplace", "fedauc-allocation": "orthogonal", "fedauc-beta": 0.3},
         dp_phases.FedAUCLaplacePhase, "local-orthogonal"),
        ({"auc-method": "fedauc-laplace", "fedauc-allocation": "alpha", "fedauc-sensitivity": "global"},
         dp_phases.FedAUCLaplacePhase, "global-alpha"),
    ],
)
def test_auc_method_selects_the_dp_phase_and_variant(override, cls, variant):
    phase = make_auc_phase(JobConfig.from_run_config({"dp-epsilon": math.inf, **override}))
    assert type(phase) is cls and phase.params.epsilon == math.inf
    if cls is dp_phases.DPAUCLaplacePhase:
        assert phase.clipping == variant
    elif variant:
        assert phase.params.variant == variant
    assert phase.method in phase.describe() and "minimum nodes 2" in phase.describe()
    phase.summary()  # logs the configuration tree (Flower's style), returns None


def _main(tmp_path, num_nodes, node_policy=None, **overrides):
    run_config = {"num-server-rounds": 1, "local-epochs": 1, "output-dir": str(tmp_path), **overrides}
    configs = [{"partition-id": i, "num-partitions": num_nodes, **(node_policy or {})} for i in range(num_nodes)]
    grid = InProcessGrid(client_app, num_nodes, run_config, node_configs=configs)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    server_app.main(grid, ctx)
    (folder,) = list(tmp_path.iterdir())
    return grid, json.loads((folder / "results.json").read_text())


@pytest.mark.slow
def test_main_job_with_dpauc_laplace_without_noise_matches_reference(tmp_path):
    grid, result = _main(tmp_path, 3, {"fedeval-dp-epsilon": math.inf},  # the nodes allow no noise
                         **{"auc-method": "dpauc-laplace", "dp-epsilon": math.inf})
    assert result["auc_method"] == "dpauc-laplace"
    assert result["auc_details"]["variant"] == "clip-sort" and result["auc_details"]["epsilon"] == math.inf
    assert result["num_clients"] == 3
    assert abs(result["federated_auc"] - result["reference_roc_auc_score"]) <= 0.01
    assert all("evaluate.dpauc_laplace" in [t for n, t, ok in grid.log if n == node and ok]
               for node in grid.node_ids)


@pytest.mark.slow
def test_main_job_with_noisy_fedauc_laplace_records_variant_and_budget(tmp_path):
    grid, result = _main(tmp_path, 3, **{"auc-method": "fedauc-laplace", "dp-epsilon": 1.0})
    assert result["auc_method"] == "fedauc-laplace"
    assert result["auc_details"]["variant"] == "local-adaptive"
    assert result["auc_details"]["epsilon"] == 1.0 and result["num_clients"] == 3
    assert math.isfinite(result["federated_auc"])
    assert result["config"]["dp-epsilon"] == 1.0


def test_main_job_stops_at_a_run_config_looser_than_the_node_policy(tmp_path, caplog):
    """Issue 23 item 4: the demo App's ``dp-epsilon = 8`` against nodes that allow 1 (the default
    policy) is a configuration refusal: the run stops at the DP phase's first step, nothing is written,
    and the exception names the library key and the node key; the ERROR record names the App's key."""
    import logging

    from flwr_fedeval.strategies.base import NodeNotConfigured

    with caplog.at_level(logging.ERROR), pytest.raises(NodeNotConfigured) as info:
        _main(tmp_path, 3, **{"auc-method": "dpauc-laplace", "dp-epsilon": 8.0})
    assert {"run config fedeval-dp-epsilon", "node config fedeval-dp-epsilon"} <= set(info.value.keys)
    assert list(tmp_path.glob("*/results.json")) == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and isinstance(r.args, tuple)]
    assert any("run config dp-epsilon" in str(arg) for r in errors for arg in r.args)
