"""What a person reads on the server after the FHE AUC phase: never ``nan``.

With the default node policy (``fedeval-share-auc = false``, what ``keys create`` writes) the clients keep
the AUC: ``str(result)`` says "not shared by policy" and gives the command that changes the policy, where
the README's snippet printed ``FHE AUC nan``. With sharing on it gives the AUC with its resolution bound,
and above 0.01 the fix (``decision-point-spacing='logit'``). ``keys create`` prints the policy it wrote.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord
from flwr.clientapp import ClientApp
from identities import IDENTITY_DIR, node_configs

from flwr_fedeval.clients import register_fhe_handlers
from flwr_fedeval.fhe.auc import FHEAUCConfig
from flwr_fedeval.keys import create, main
from flwr_fedeval.metrics.auc import RESOLUTION_WARN_THRESHOLD, resolution_bound
from flwr_fedeval.metrics.counts import decision_points, threshold_counts
from flwr_fedeval.strategies import FHEAUCPhase
from flwr_fedeval.strategies.auc_phase import AUCPhaseResult
from flwr_fedeval.testing import InProcessGrid

NUM_NODES = 3


def _local(context):
    """Partition p's test labels and scores (test data: a fixed generator, not key material)."""
    rng = np.random.default_rng(100 + int(context.node_config["partition-id"]))
    y = rng.integers(0, 2, 40)
    return y, np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1)


def _app() -> ClientApp:
    app = ClientApp()
    register_fhe_handlers(app, test_scores=lambda msg, ctx: _local(ctx), test_labels=lambda ctx: _local(ctx)[0])
    return app


def _run(identity_dir: str):
    grid = InProcessGrid(
        _app(), NUM_NODES, {"fedeval-identity-dir": identity_dir}, node_configs=node_configs(NUM_NODES)
    )
    return grid, FHEAUCPhase(num_decision_points=50, share_auc_with_server=True).run(
        grid, ArrayRecord([np.zeros(2, np.float32)])
    )


def test_the_default_policy_reads_not_shared_by_policy_with_the_command(tmp_path):
    create(tmp_path / "ids", [f"node-{i}" for i in range(NUM_NODES)])  # the documented defaults
    grid, result = _run(str(tmp_path / "ids"))
    text = str(result)
    assert "not shared by policy" in text and "nan" not in text
    assert "--policy fedeval-share-auc=true" in text and "fedeval-share-auc = true" in text
    assert math.isnan(result.auc) and result.details["withheld_by"] == sorted(grid.node_ids)


def test_a_shared_auc_reads_with_its_resolution_bound():
    grid, result = _run(IDENTITY_DIR)  # these nodes' policy shares the AUC
    thresholds = decision_points(50)
    counts = sum(threshold_counts(*_local(grid.contexts[n]), thresholds) for n in grid.node_ids)
    bound = resolution_bound(counts)
    # Decrypted under CKKS: right within the certified CKKS error (FHEAUCConfig.max_error), not bit-exact.
    assert result.resolution_bound == pytest.approx(bound, abs=FHEAUCConfig(n_points=50, max_rows=120).max_error)
    text = str(result)
    assert f"FHE AUC {result.auc:.6f} ± {result.resolution_bound:.4f}" in text and "N = 50 decision points" in text
    assert ("decision-point-spacing='logit'" in text) == (bound > RESOLUTION_WARN_THRESHOLD)
    assert result.details["withheld_by"] == []


def test_a_wide_resolution_bound_names_logit_spacing():
    wide = AUCPhaseResult(
        auc=0.71, thresholds=decision_points(10), counts=None, contributors=[1, 2], method="fhe", resolution_bound=0.34
    )
    narrow = AUCPhaseResult(
        auc=0.71, thresholds=decision_points(10), counts=None, contributors=[1, 2], method="fhe", resolution_bound=0.004
    )
    assert "decision-point-spacing='logit'" in str(wide) and "0.3400" in str(wide)
    assert "decision-point-spacing" not in str(narrow) and "0.0040" in str(narrow)


@pytest.mark.parametrize("extra, shared", [([], "false"), (["--policy", "fedeval-share-auc=true"], "true")])
def test_keys_create_prints_the_policy_it_wrote(tmp_path, capsys, extra, shared):
    assert main(["create", "--out", str(tmp_path / "k"), "--nodes", "2", *extra]) == 0
    out = capsys.readouterr().out
    assert f"fedeval-share-auc = {shared}" in out
    written = (tmp_path / "k" / "node-1.policy.toml").read_text()
    assert f"fedeval-share-auc = {shared}" in written
