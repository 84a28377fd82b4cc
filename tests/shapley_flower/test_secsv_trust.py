"""SecSV runs only where every node accepts an honest-but-curious principal server (issue 22, item 3).

Node config ``fedeval-secsv-trust-principal`` (default false); in simulation the same key in
``<fedeval-identity-dir>/node-<partition-id>.policy.toml``. A node without it refuses at hello with one
line naming the key; run config cannot switch it on.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

sys.path.insert(0, str(Path(__file__).parent))
from identities import IDENTITY_DIR
from test_secsv_phase import TRUST, app, train_two_rounds

from flwr_fedeval.clients.shapley_handlers import Refused, trusts_principal
from flwr_fedeval.strategies.shapley_phase import SecSVPhase, ShapleyPhaseError
from flwr_fedeval.testing import InProcessGrid

KEY = "fedeval-secsv-trust-principal"


def _grid(trusting: list[bool], run_config=None):
    configs = [{"partition-id": i, "num-partitions": 3, **(TRUST if trusting[i] else {})} for i in range(3)]
    configs.append({"fedeval-role": "shapley-aux", "partition-id": 3, **(TRUST if trusting[3] else {})})
    return InProcessGrid(app, 4, {"fedeval-identity-dir": IDENTITY_DIR, **(run_config or {})}, node_configs=configs)


@pytest.mark.parametrize("who", [0, 3])          # a data client, the auxiliary server
def test_a_node_without_the_trust_key_refuses_naming_it(who):
    trusting = [True] * 4
    trusting[who] = False
    grid = _grid(trusting)
    train_two_rounds(grid)
    with pytest.raises(ShapleyPhaseError) as info:
        SecSVPhase().run(grid)
    assert info.value.step == "hello"
    (node, why), = info.value.failed.items()
    assert node == grid.node_ids[who]
    assert KEY in why and "\n" not in why
    assert not any(t.startswith("query.shapley_") and t != "query.shapley_hello" for _, t, _ in grid.log)


def _context(node_config, run_config=None):
    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config=run_config or {})


def test_run_config_cannot_switch_trust_on():
    assert not trusts_principal(_context({"partition-id": 0}, {KEY: True, "fedeval-identity-dir": IDENTITY_DIR}))
    assert trusts_principal(_context({KEY: True}))
    assert trusts_principal(_context({KEY: "true"}))
    assert not trusts_principal(_context({KEY: False}))
    with pytest.raises(Refused, match=KEY):
        trusts_principal(_context({KEY: "yes"}))


def test_simulation_reads_the_policy_file_next_to_the_node_key(tmp_path):
    ids = tmp_path / "ids"
    shutil.copytree(IDENTITY_DIR, ids)
    (ids / "node-1.policy.toml").write_text(f"{KEY} = true\n")
    (ids / "node-2.policy.toml").write_text(f"{KEY} = 1\n")
    run = {"fedeval-identity-dir": str(ids)}
    assert trusts_principal(_context({"partition-id": 1}, run))
    assert not trusts_principal(_context({"partition-id": 0}, run))        # no file: default false
    with pytest.raises(Refused, match=KEY):
        trusts_principal(_context({"partition-id": 2}, run))
    # deployment (a key in node config): the policy file is not read
    assert not trusts_principal(_context({"partition-id": 1, "fedeval-identity-key": "x"}, run))
