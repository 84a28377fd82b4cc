"""DP AUC phases over the serializing in-process grid (issue 6, Flower wiring).

The model is the untrained MLP of the main job on the embedded breast-cancer
data: its scores are continuous, which is all the protocols need. The nodes'
policy (issue 22: ε, budget, evaluations per model) is node config here
(:func:`_grid`); the run config may only tighten it.
"""

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from identities import node_configs

from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.app.client_app import local_test_scores
from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.clients import dp_handlers
from flwr_fedeval.clients.ledger import TEST_SET, node_ledger
from flwr_fedeval.dp import dpauc_laplace_server, fedauc_local_stats, fedauc_server_auc, fedauc_server_ranks
from flwr_fedeval.strategies.auc_phase import PlaintextAUCPhase
from flwr_fedeval.strategies.dp_phases import (
    DPAUCLaplacePhase,
    DPAUCRRPhase,
    FedAUCLaplacePhase,
    FedAUCRRPhase,
)
from flwr_fedeval.testing import InProcessGrid

N = 50
INF = math.inf


def _grid(num_nodes, run_config, *, fault=None, evaluations=50, seed=0):
    """Nodes whose policy allows the run config's ε and budget (and ``evaluations`` per model)."""
    eps = run_config.get("dp-epsilon", 1.0)
    budget = run_config.get("dp-budget", 0.0)
    configs = node_configs(num_nodes, fedeval_dp_epsilon=eps, fedeval_dp_budget=budget,
                           fedeval_evaluations_per_model=evaluations, fedeval_dp_seed=seed)
    return InProcessGrid(client_app, num_nodes, run_config, node_configs=configs, fault=fault)


@pytest.fixture(scope="module")
def arrays():
    return ArrayRecord(build_model(JobConfig()).get_weights())


@pytest.fixture(scope="module")
def inf_grid():
    """4 clients whose own budget is infinite (so noise can be switched off)."""
    return _grid(4, {"dp-epsilon": INF})


def _client_scores(grid, arrays):
    """Each node's (labels, scores) exactly as its handlers compute them."""
    out = []
    for node in sorted(grid.node_ids):
        msg = Message(RecordDict({"arrays": arrays}), dst_node_id=node, message_type="evaluate")
        out.append(local_test_scores(msg, grid.contexts[node]))
    return out


@pytest.fixture(scope="module")
def plaintext(inf_grid, arrays):
    """Plaintext values of each protocol (same server formula, exact inputs).

    ``counts``: the plaintext phase (Eqs. 2-3 of the FHE paper); DPAUC_Lap's
    server integrates the same ROC points with the rates formula, so its
    plaintext value is that formula on the exact summed counts (equal to
    ``counts`` up to rounding, checked below).
    """
    plain = PlaintextAUCPhase(N).run(inf_grid, arrays)
    clients = _client_scores(inf_grid, arrays)
    ranks = fedauc_server_ranks([s for _, s in clients])
    rank_auc = fedauc_server_auc([fedauc_local_stats(r, y) for r, (y, _) in zip(ranks, clients)]).auc
    values = {"counts": plain.auc, "ranks": rank_auc}
    for clipping in ("clip-sort", "no-clip"):
        values[clipping] = dpauc_laplace_server([plain.counts], clipping=clipping).auc
        assert values[clipping] == pytest.approx(plain.auc, abs=1e-12)
    return values


def _budget_grid(num_nodes=3, **run_config):
    return _grid(num_nodes, run_config, seed=7)


def _exhaust(grid, node, total):
    """Spend the node's whole budget in its privacy ledger (as earlier runs would have)."""
    node_ledger(grid.contexts[node]).spend_epsilon(TEST_SET, float(total), float(total))


# --- noise disabled: exactly the plaintext value of the same protocol ---------
@pytest.mark.parametrize(
    "phase,protocol",
    [
        (DPAUCLaplacePhase(N, epsilon=INF, clipping="clip-sort"), "clip-sort"),
        (DPAUCLaplacePhase(N, epsilon=INF, clipping="no-clip"), "no-clip"),
        (DPAUCRRPhase(N, epsilon=INF), "counts"),
        (FedAUCRRPhase(epsilon=INF), "ranks"),
        (FedAUCLaplacePhase(epsilon=INF), "ranks"),
        (FedAUCLaplacePhase(epsilon=INF, allocation="orthogonal", beta=0.3), "ranks"),
        (FedAUCLaplacePhase(epsilon=INF, allocation="alpha", sensitivity="global"), "ranks"),
        (FedAUCLaplacePhase(epsilon=INF, allocation="alpha", sensitivity="local"), "ranks"),
    ],
    ids=["dpauc-laplace-clip-sort", "dpauc-laplace-no-clip", "dpauc-rr", "fedauc-rr", "fedauc-laplace-local-adaptive",
         "fedauc-laplace-local-orthogonal", "fedauc-laplace-global-alpha", "fedauc-laplace-local-alpha"],
)
def test_dp_phase_without_noise_equals_plaintext_protocol(phase, protocol, inf_grid, arrays, plaintext):
    result = phase.run(inf_grid, arrays)
    assert result.auc == plaintext[protocol]
    assert result.contributors == sorted(inf_grid.node_ids) and result.failed == {}
    assert result.method == phase.method and result.counts is None
    assert result.details["epsilon"] == INF and result.details["defined"] is True
    expected_variant = getattr(phase, "clipping", None) or getattr(phase.params, "variant", "debiased")
    assert result.details["variant"] == expected_variant
    assert expected_variant in result.label


def test_rank_protocol_equals_pooled_roc_auc_score(inf_grid, arrays, plaintext):
    from sklearn.metrics import roc_auc_score

    clients = _client_scores(inf_grid, arrays)
    y = np.concatenate([c[0] for c in clients])
    s = np.concatenate([c[1] for c in clients])
    assert plaintext["ranks"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)


# --- noisy runs, budget ---------------------------------------------------------
def test_noisy_dpauc_laplace_is_reproducible_with_node_dp_seed_and_differs_per_request(arrays):
    """The node's own fedeval-dp-seed (documented as giving up privacy) makes runs reproducible."""
    config = {"dp-epsilon": 8.0, "dp-budget": 16.0}
    phase = DPAUCLaplacePhase(N, epsilon=8.0, clipping="no-clip")
    first = [phase.run(_budget_grid(**config), arrays).auc for _ in range(2)]
    # same fedeval-dp-seed, same partitions: same noise (the server sums in node-id order, hence approx)
    assert first[0] == pytest.approx(first[1], rel=1e-9)
    grid = _budget_grid(**config)
    a, b = phase.run(grid, arrays).auc, phase.run(grid, arrays).auc
    assert a == pytest.approx(first[0], rel=1e-9) and b != pytest.approx(a, rel=1e-6)  # fresh noise per request
    assert all(math.isfinite(x) for x in (a, b))


def test_repeated_evaluations_accumulate_and_over_budget_request_is_refused(arrays):
    grid = _budget_grid(**{"dp-epsilon": 1.0, "dp-budget": 2.0})
    for _ in range(2):
        result = DPAUCLaplacePhase(N, epsilon=1.0).run(grid, arrays)
        assert 0.0 <= result.auc <= 1.0 and result.details["variant"] == "clip-sort"
    assert all(dp_handlers.spent_epsilon(grid.contexts[n]) == 2.0 for n in grid.node_ids)
    up_before = dict(grid.bytes_up)
    with pytest.raises(RuntimeError, match="BudgetError"):
        DPAUCLaplacePhase(N, epsilon=1.0).run(grid, arrays)
    assert all(dp_handlers.spent_epsilon(grid.contexts[n]) == 2.0 for n in grid.node_ids)
    assert [ok for _, t, ok in grid.log[-3:]] == [False] * 3
    # an error reply is small: no counts travelled
    assert all(grid.bytes_up[n] - up_before[n] < 600 for n in grid.node_ids)


def test_server_cannot_switch_noise_off_against_a_finite_client_budget(arrays):
    grid = _budget_grid(**{"dp-epsilon": 1.0, "dp-budget": 100.0})
    with pytest.raises(RuntimeError, match="fedeval-dp-epsilon"):  # ε per evaluation: the node's (issue 22)
        DPAUCLaplacePhase(N, epsilon=INF).run(grid, arrays)


@pytest.mark.parametrize(
    "phase",
    [DPAUCLaplacePhase(N, epsilon=1.0), DPAUCRRPhase(N, epsilon=1.0), FedAUCRRPhase(epsilon=1.0),
     FedAUCLaplacePhase(epsilon=1.0)],
    ids=lambda p: p.method,
)
def test_exhausted_client_gets_error_reply_and_is_reported(phase, arrays):
    grid = _budget_grid(4, **{"dp-epsilon": 1.0})
    bad = sorted(grid.node_ids)[2]
    _exhaust(grid, bad, 1.0)
    result = phase.run(grid, arrays)
    assert result.contributors == sorted(set(grid.node_ids) - {bad})
    assert result.failed[bad].startswith("error reply: BudgetError")
    assert result.details["budget_refused"] == [bad]
    assert math.isfinite(result.auc)
    assert dp_handlers.spent_epsilon(grid.contexts[bad]) == 1.0  # unchanged
    assert all(dp_handlers.spent_epsilon(grid.contexts[n]) == 1.0 for n in result.contributors)
    bad_log = [(t, ok) for n, t, ok in grid.log if n == bad and t != "query.dp_join"]  # it joined (issue 22)
    assert all(not ok for _, ok in bad_log)
    assert "evaluate.fedauc_stats" not in [t for t, _ in bad_log]  # never ranked, never asked


def test_rr_labels_are_flipped_once_and_reused_for_free(arrays):
    grid = _budget_grid(**{"dp-epsilon": 1.0})  # budget = one evaluation
    first = DPAUCRRPhase(N, epsilon=1.0).run(grid, arrays)
    second = DPAUCRRPhase(N, epsilon=1.0).run(grid, arrays)
    rank = FedAUCRRPhase(epsilon=1.0).run(grid, arrays)
    assert first.details["noisy_p"] == second.details["noisy_p"] == rank.details["noisy_p"]
    assert first.auc == second.auc
    assert all(dp_handlers.spent_epsilon(grid.contexts[n]) == 1.0 for n in grid.node_ids)
    with pytest.raises(RuntimeError, match="BudgetError"):
        FedAUCLaplacePhase(epsilon=1.0).run(grid, arrays)  # a new release costs again


# --- malformed replies ------------------------------------------------------------
def _corrupt(message_type, victim, edit):
    def fault(node, msg, reply):
        if node == victim["node"] and msg.metadata.message_type == message_type and not reply.has_error():
            edit(reply.content)
        return reply

    return fault


def _set_array(record_name, key, transform):
    def edit(content):
        rec = content[record_name]
        rec[key] = Array(transform(rec[key].numpy().copy()))

    return edit


@pytest.mark.parametrize(
    "phase,message_type,edit,match",
    [
        (DPAUCLaplacePhase(N, epsilon=INF), "evaluate.dpauc_laplace",
         _set_array("noisy-counts", "fp", lambda a: np.where(np.arange(a.size) == 0, np.nan, a)), "NaN"),
        (DPAUCLaplacePhase(N, epsilon=INF), "evaluate.dpauc_laplace",
         _set_array("noisy-counts", "tn", lambda a: a[:-1]), "shape"),
        (DPAUCRRPhase(N, epsilon=INF), "evaluate.dpauc_rr",
         _set_array("counts", "tp", lambda a: a - 10**6), "negative"),
        (FedAUCRRPhase(epsilon=INF), "evaluate.fedauc_scores",
         _set_array("scores", "scores", lambda a: a.astype(np.float32)), "float64"),
    ],
    ids=["dpauc-laplace-nan", "dpauc-laplace-shape", "dpauc-rr-negative", "fedauc-scores-dtype"],
)
def test_malformed_reply_is_rejected_naming_the_node(phase, message_type, edit, match, arrays):
    victim = {}
    grid = _grid(3, {"dp-epsilon": INF}, fault=_corrupt(message_type, victim, edit))
    victim["node"] = grid.node_ids[0]
    result = phase.run(grid, arrays)
    assert set(result.failed) == {victim["node"]}
    assert result.failed[victim["node"]].startswith("malformed") and match in result.failed[victim["node"]]
    assert result.contributors == sorted(grid.node_ids[1:])


def test_fedauc_stats_inconsistent_with_round_one_abort_the_phase_naming_the_node(arrays):
    victim = {}

    def edit(content):
        content["stats"]["local-p"] = content["stats"]["local-p"] + 5.0

    grid = _grid(3, {"dp-epsilon": INF}, fault=_corrupt("evaluate.fedauc_stats", victim, edit))
    victim["node"] = grid.node_ids[1]
    with pytest.raises(RuntimeError, match=rf"\[{victim['node']}\].*local-p \+ local-n"):
        FedAUCLaplacePhase(epsilon=INF).run(grid, arrays)


def test_stats_request_without_pending_round_one_is_refused(arrays):
    grid = _grid(1, {"dp-epsilon": INF})
    node = grid.node_ids[0]
    content = RecordDict({
        "fedauc": ArrayRecord({"ranks": Array(np.zeros(3))}),
        "dp": ConfigRecord({"session": "x", "mechanism": "rr", "epsilon": INF}),
    })
    (reply,) = grid.send_and_receive([Message(content, dst_node_id=node, message_type="evaluate.fedauc_stats")])
    assert reply.has_error() and "round 1 missing" in reply.error.reason


def test_dpauc_laplace_phase_says_when_the_noise_swamps_the_counts(arrays):
    """~25 test rows per client at eps = 1 and N = 50: the phase flags the AUC; at the eps the check names
    for the true class sizes, the same data is not flagged."""
    from flwr_fedeval.dp.dpauc import laplace_noise_check

    grid = _budget_grid(**{"dp-epsilon": 1.0})
    labels = np.concatenate([y for y, _ in _client_scores(grid, arrays)])
    smaller = float(min(labels.sum(), (1 - labels).sum()))
    result = DPAUCLaplacePhase(N, epsilon=1.0).run(grid, arrays)
    d, m = result.details, len(result.contributors)
    assert d["noise_swamped"] == 1.0
    expected = laplace_noise_check(1.0, N, m, d["noise_smaller_class"], 1e12)
    assert d["noise_std"] == pytest.approx(expected["noise_std"])
    assert d["noise_min_epsilon"] == pytest.approx(expected["min_epsilon"])
    fix = laplace_noise_check(1.0, N, m, smaller, smaller)["min_epsilon"] * 1.5
    assert fix > 1.0
    ok = DPAUCLaplacePhase(N, epsilon=fix).run(_grid(3, {"dp-epsilon": fix}, evaluations=2), arrays).details
    assert ok["noise_swamped"] == 0.0
