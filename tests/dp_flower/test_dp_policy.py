"""DP AUC: the node's policy decides ε, the budget, the seed and evaluations per model (issue 22, item 2).

A deviating server sets the run config and the requests: it seeds the noise (the attack of issue
22 item 2: ``dp-seed = 1`` let it re-create and subtract every client's Laplace noise), asks for a
larger ε than the node allows, and asks for a second evaluation of the same global model. The
real client handlers run over the serializing in-process grid.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord
from identities import node_configs

from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.clients.dp_handlers import SystemRandomState
from flwr_fedeval.protocol import dp_auc
from flwr_fedeval.strategies.dp_phases import DPAUCLaplacePhase, FedAUCRRPhase
from flwr_fedeval.testing import InProcessGrid

N = 20


@pytest.fixture(scope="module")
def arrays():
    return ArrayRecord(build_model(JobConfig()).get_weights())


def _library_app():
    """A ClientApp with the library's DP handlers only (unlike the demo App, it does not refuse unknown
    run-config keys): the labels and scores of partition i are fixed."""
    from flwr.clientapp import ClientApp

    from flwr_fedeval.clients import register_dp_handlers

    def scores(msg, ctx):
        rng = np.random.default_rng(int(ctx.node_config["partition-id"]))
        return rng.integers(0, 2, 40), rng.uniform(0, 1, 40)

    app = ClientApp()
    register_dp_handlers(app, test_scores=scores, test_labels=lambda ctx: scores(None, ctx)[0])
    return app


def _noisy_counts_per_partition(run_config, arrays, **node_policy):
    """Run DPAUC_Lap once on a fresh grid of 3 nodes; each partition's noisy counts as sent."""
    sent = {}

    def spy(node, msg, reply):
        if msg.metadata.message_type == dp_auc.DPAUC_LAPLACE.message_type and not reply.has_error():
            pid = grid.contexts[node].node_config["partition-id"]
            sent[pid] = np.concatenate([reply.content["noisy-counts"][k].numpy() for k in ("tp", "fp", "tn", "fn")])
        return reply

    grid = InProcessGrid(_library_app(), 3, run_config, node_configs=node_configs(3, **node_policy), fault=spy)
    DPAUCLaplacePhase(N, epsilon=1.0).run(grid, arrays)
    assert sorted(sent) == [0, 1, 2]
    return sent


def test_a_server_set_seed_has_no_effect_the_noise_is_fresh_every_run(arrays):
    """Run config ``dp-seed = 1`` (the attack): two runs with the same seed, model and partitions give
    different noise on every client, so re-running the client function cannot reproduce it."""
    attack = {"dp-seed": 1, "dp-epsilon": 1.0}
    first, second = (_noisy_counts_per_partition(attack, arrays) for _ in range(2))
    for pid in range(3):
        assert not np.allclose(first[pid], second[pid]), pid
        assert np.all(first[pid] != np.round(first[pid]))  # noise on every count (exact counts are integers)
    # the node's own fedeval-dp-seed does reproduce the noise (documented as giving up privacy)
    own = [_noisy_counts_per_partition({"dp-epsilon": 1.0}, arrays, fedeval_dp_seed=5) for _ in range(2)]
    assert all(np.array_equal(own[0][pid], own[1][pid]) for pid in range(3))
    # the demo App refuses the key outright (it is not a key of the App any more)
    grid = InProcessGrid(client_app, 2, attack)
    with pytest.raises(RuntimeError, match="'dp-seed' is not a key of this App"):
        DPAUCLaplacePhase(N, epsilon=1.0).run(grid, arrays)


@pytest.mark.parametrize("run_config,node_key", [
    ({"dp-epsilon": 8.0}, "fedeval-dp-epsilon"),                     # more ε per evaluation
    ({"dp-epsilon": 1.0, "dp-budget": 5.0}, "fedeval-dp-budget"),    # a larger total
    ({"dp-epsilon": math.inf}, "fedeval-dp-epsilon"),                # no noise at all
])
def test_a_looser_run_config_is_refused_naming_the_node_key(arrays, run_config, node_key):
    grid = InProcessGrid(client_app, 3, run_config)  # the default node policy: ε = 1, one evaluation
    with pytest.raises(RuntimeError) as info:
        DPAUCLaplacePhase(N, epsilon=run_config["dp-epsilon"]).run(grid, arrays)
    assert str(info.value).count(node_key) >= 1
    replies = [ok for _, t, ok in grid.log if t == dp_auc.DPAUC_LAPLACE.message_type]
    assert replies == [False] * 3  # no noisy counts left any node


def test_the_run_config_may_tighten_the_node_policy(arrays):
    """Nodes allow ε = 2 per evaluation; the run config lowers it to 0.5: a request for 0.5 is
    answered, a request for 1.0 (above the tightened value) is refused."""
    policy = node_configs(3, fedeval_dp_epsilon=2.0, fedeval_dp_budget=4.0, fedeval_evaluations_per_model=5)
    grid = InProcessGrid(client_app, 3, {"dp-epsilon": 0.5, "dp-budget": 2.0}, node_configs=policy)
    assert math.isfinite(DPAUCLaplacePhase(N, epsilon=0.5).run(grid, arrays).auc)
    with pytest.raises(RuntimeError, match="allows 0.5"):
        DPAUCLaplacePhase(N, epsilon=1.0).run(grid, arrays)


@pytest.mark.parametrize("second", [DPAUCLaplacePhase(N, epsilon=1.0), FedAUCRRPhase(epsilon=1.0)],
                         ids=lambda p: p.method)
def test_a_second_evaluation_of_the_same_model_is_refused(arrays, second):
    """Budget for ten evaluations, one evaluation per model (the default): the second request for the
    same global model is refused naming ``fedeval-evaluations-per-model``; another model is answered."""
    policy = node_configs(3, fedeval_dp_budget=10.0)
    grid = InProcessGrid(client_app, 3, {"dp-epsilon": 1.0, "dp-budget": 10.0}, node_configs=policy)
    DPAUCLaplacePhase(N, epsilon=1.0).run(grid, arrays)
    with pytest.raises(RuntimeError, match="fedeval-evaluations-per-model"):
        second.run(grid, arrays)
    other = ArrayRecord([a * 0.5 for a in arrays.to_numpy_ndarrays()])
    assert sorted(second.run(grid, other).contributors) == sorted(grid.node_ids)


def test_system_random_state_draws_from_the_os_and_refuses_everything_else():
    rng = SystemRandomState()
    u = rng.random_sample((1000, 4))
    assert u.shape == (1000, 4) and u.min() >= 0.0 and u.max() < 1.0 and len(np.unique(u)) == u.size
    assert isinstance(rng.random(), float)
    perm = rng.permutation(50)
    assert sorted(perm.tolist()) == list(range(50)) and perm.tolist() != rng.permutation(50).tolist()
    for name in ("normal", "laplace", "randint", "seed", "shuffle"):
        with pytest.raises(TypeError, match="not a CSPRNG draw"):
            getattr(rng, name)()
    a, b = SystemRandomState(), SystemRandomState()
    assert not np.array_equal(a.random_sample(8), b.random_sample(8))


def test_csprng_noise_has_the_mechanisms_distribution():
    """DPAUC outputs in distribution as before: Laplace(b) noise and ε-RR flips drawn from
    SystemRandomState have the same law as with numpy's generator (Kolmogorov–Smirnov; flip rate)."""
    from scipy import stats

    from flwr_fedeval.dp.mechanisms import flip_probability, laplace_mechanism, laplace_randomise, randomized_response

    rng = SystemRandomState()
    b = 4.0
    noise = laplace_randomise(np.zeros(20000), laplace_mechanism(0.25, 1.0, rng), rng)
    assert stats.kstest(noise, "laplace", args=(0.0, b)).pvalue > 1e-9  # unseeded draws
    flips = randomized_response(np.zeros(20000, dtype=np.int64), 1.0, rng)
    rho = flip_probability(1.0)
    assert abs(flips.mean() - rho) < 5 * math.sqrt(rho * (1 - rho) / flips.size)
