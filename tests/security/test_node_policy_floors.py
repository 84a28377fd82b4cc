"""The data owner sets the floors, the run config only tightens them; a node can insist on the
malicious FHE AUC protocol. A deviating server over the in-process grid, real handlers, roster
identities and policy files written by ``python -m flwr_fedeval.keys create``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from fhe_deviating_server import BACKEND, N, counts_request, grid_over, policy_dir, steps_1_2
from flwr.app import ArrayRecord
from xmk_app import flat, initial, make_app, plain_fedavg, run

from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.clients import policy
from flwr_fedeval.protocol import ReplyCode, fhe_auc
from flwr_fedeval.strategies.base import NodeNotConfigured
from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid


def _ledger(grid, node):
    """The node's privacy ledger (the grid's fresh ledger of that node)."""
    from flwr_fedeval.clients.ledger import LEDGER_CONFIG
    from flwr_fedeval.ledger import NodeLedger

    return NodeLedger(grid.contexts[node].node_config[LEDGER_CONFIG])


@pytest.fixture(scope="module")
def arrays():
    return ArrayRecord(build_model(JobConfig()).get_weights())


# --- symptom 4: a node that shares its AUC insists on the malicious protocol -----------------------
def test_sharing_nodes_refuse_a_semi_honest_session_naming_the_key(tmp_path, arrays):
    """``fedeval-share-auc = true``, ``fedeval-fhe-min-protocol`` unset: the semi-honest phase (whose
    server could aggregate one client's counts alone and have it report its own AUC) is refused at
    step 2 by the key holder, with a configuration refusal naming the key; nothing was encrypted."""
    grid = grid_over(policy_dir(tmp_path, fedeval_share_auc=True))
    with pytest.raises((NodeNotConfigured, RuntimeError)) as info:
        FHEAUCPhase(N, backend=BACKEND, share_auc_with_server=True).run(grid, arrays)
    assert "fedeval-fhe-min-protocol" in str(info.value)
    assert all(not _ledger(grid, n).summary().evaluations for n in grid.node_ids)


def test_a_semi_honest_counts_request_under_a_malicious_key_set_is_refused_by_every_client(tmp_path, arrays):
    """The server runs step 2 as malicious (the key holder signs that protocol into the participant
    list), then asks every client for semi-honest counts: each refuses before encrypting — by its
    policy, or (a node that allows semi-honest) because the signed list says malicious."""
    grid = grid_over(policy_dir(tmp_path, fedeval_share_auc=True))
    phase = FHEAUCPhase(N, backend=BACKEND, protocol="malicious")
    run_ = steps_1_2(phase, grid)
    assert run_.participant_list.protocol == "malicious"
    replies = grid.send_and_receive([counts_request(phase, run_, n, arrays, protocol="semi-honest")
                                     for n in run_.participants])
    assert len(replies) == 3
    for reply in replies:
        assert reply.has_error() and reply.error.code == ReplyCode.NOT_CONFIGURED
        assert "fedeval-fhe-min-protocol" in reply.error.reason
    # nodes whose operator allows semi-honest still refuse a protocol the key holder did not sign
    grid = grid_over(policy_dir(tmp_path / "allow", fedeval_share_auc=True, fedeval_fhe_min_protocol="semi-honest"))
    run_ = steps_1_2(phase, grid)
    replies = grid.send_and_receive([counts_request(phase, run_, n, arrays, protocol="semi-honest")
                                     for n in run_.participants])
    for reply in replies:
        assert reply.has_error() and "participant list" in reply.error.reason and "malicious" in reply.error.reason
    for node in run_.participants:
        assert not _ledger(grid, node).summary().evaluations


def test_the_honest_malicious_run_on_sharing_nodes_completes(tmp_path, arrays):
    grid = grid_over(policy_dir(tmp_path, fedeval_share_auc=True))
    result = FHEAUCPhase(N, backend=BACKEND, protocol="malicious", share_auc_with_server=True).run(grid, arrays)
    assert math.isfinite(result.auc) and result.contributors == sorted(grid.node_ids)


def test_the_least_protocol_follows_the_policy_table(tmp_path):
    """Unset: malicious when sharing, semi-honest otherwise; an explicit value wins either way."""
    for share, least, want in ((True, None, "malicious"), (False, None, "semi-honest"),
                               (True, "semi-honest", "semi-honest"), (False, "malicious", "malicious")):
        got = policy.NodePolicy.from_values({"fedeval-share-auc": share, "fedeval-fhe-min-protocol": least}, "test")
        assert got.least_fhe_protocol == want
    assert policy.FHE_PROTOCOLS == fhe_auc.PROTOCOLS


# --- symptom 6: the xMK floors come from the node's policy ------------------------------------------
def _xmk_grid(identity_dir, num_nodes, run_config=None):
    return InProcessGrid(make_app(), num_nodes, {"fedeval-identity-dir": identity_dir, **(run_config or {})})


def _xmk_round(grid, num_nodes, mask_degree=4):
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=num_nodes,
                         max_abs_value=1e4, mask_degree=mask_degree)
    try:
        result = run(grid, strategy)
    except Exception as exc:  # the strategy gives up: every attempt refused
        return None, strategy, str(exc)
    return result, strategy, ""


def _reasons(strategy, error):
    """The error and every member's refusal of the aborted attempts, in one string."""
    parts = [error]
    for _, aborted in strategy.aborted_attempts:
        parts += [str(aborted), *map(str, getattr(aborted, "failed", {}).values())]
    return " ".join(parts)


def _completed(result, num_nodes):
    if result is None or not len(result.arrays):
        return False
    got = flat(result.arrays.to_numpy_ndarrays())
    want = plain_fedavg(initial(), range(num_nodes), 1)
    return got.shape == want.shape and float(np.max(np.abs(got - want))) <= 1e-6


def test_policy_file_min_clients_refuses_a_key_set_of_three(tmp_path):
    """``fedeval-min-clients = 4`` in every policy file (node config and run config silent): a key set
    of 3 is refused by every member and the model is not aggregated; with 4 nodes the round completes."""
    ids = policy_dir(tmp_path, num_nodes=4, fedeval_min_clients=4)
    result, strategy, error = _xmk_round(_xmk_grid(ids, 3), 3)
    assert not _completed(result, 3)
    reasons = _reasons(strategy, error)
    assert "at least 4" in reasons, reasons
    result, _, error = _xmk_round(_xmk_grid(ids, 4), 4)
    assert _completed(result, 4), error


def test_policy_file_mask_degree_is_accepted_and_enforced_and_run_config_cannot_lower_it(tmp_path):
    """``fedeval-xmk-mask-degree`` in the policy file: 2 lets a degree-2 round through (the default
    floor, 4, would refuse it); 0 (the complete graph) refuses degree 4; a run config of 2 does not
    lower the default floor."""
    low = policy_dir(tmp_path / "low", num_nodes=6, fedeval_xmk_mask_degree=2)
    result, _, error = _xmk_round(_xmk_grid(low, 6), 6, mask_degree=2)
    assert _completed(result, 6), error

    complete = policy_dir(tmp_path / "complete", num_nodes=6, fedeval_xmk_mask_degree=0)
    result, strategy, error = _xmk_round(_xmk_grid(complete, 6), 6, mask_degree=4)
    assert not _completed(result, 6)
    assert "requires at least 5" in _reasons(strategy, error)

    default = policy_dir(tmp_path / "default", num_nodes=6)
    result, strategy, error = _xmk_round(_xmk_grid(default, 6, {"fedeval-xmk-mask-degree": 2}), 6, mask_degree=2)
    assert not _completed(result, 6)
    assert "requires at least 4" in _reasons(strategy, error)


def test_run_config_only_tightens_the_floors(tmp_path):
    """The floor functions: policy file value, raised (never lowered) by the run config."""
    from flwr.app import Context, RecordDict

    ids = policy_dir(tmp_path, num_nodes=1, fedeval_min_clients=4, fedeval_xmk_mask_degree=3)

    def ctx(**run):
        return Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(),
                       run_config={"fedeval-identity-dir": ids, **run})

    assert (policy.key_set_floor(ctx()), policy.mask_degree_floor(ctx())) == (4, 3)
    lowered = ctx(**{"fedeval-min-clients": 2, "fedeval-xmk-mask-degree": 2})
    assert (policy.key_set_floor(lowered), policy.mask_degree_floor(lowered)) == (4, 3)
    raised = ctx(**{"fedeval-min-clients": 6, "fedeval-xmk-mask-degree": 5})
    assert (policy.key_set_floor(raised), policy.mask_degree_floor(raised)) == (6, 5)
    assert policy.mask_degree_floor(ctx(**{"fedeval-xmk-mask-degree": 0})) == 0  # the complete graph is tighter
    with pytest.raises(ValueError, match="fedeval-min-clients"):
        policy.key_set_floor(ctx(**{"fedeval-min-clients": "4"}))
