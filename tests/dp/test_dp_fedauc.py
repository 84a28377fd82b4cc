"""FedAUC (Sun et al., DP AUC in vertical FL): ranks, RR, Global/LocalLaplace, adaptive beta."""

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from flwr_fedeval.dp import (
    FedAUCLaplaceParams,
    RandomizedResponseParams,
    UndefinedAUCWarning,
    adaptive_beta,
    fedauc_laplace_client,
    fedauc_local_stats,
    fedauc_rr_server,
    fedauc_server_auc,
    fedauc_server_ranks,
    fedauc_shuffle_scores,
    fedauc_unshuffle_ranks,
)

VARIANTS = [
    FedAUCLaplaceParams(math.inf, allocation="alpha"),
    FedAUCLaplaceParams(math.inf, sensitivity="global", allocation="alpha"),
    FedAUCLaplaceParams(math.inf, allocation="orthogonal", beta=0.3),
    FedAUCLaplaceParams(math.inf, allocation="orthogonal"),
]


def _clients(n=1200, k=6, seed=0, ties=True):
    rng = np.random.RandomState(seed)
    y = rng.randint(0, 2, n)
    s = np.clip(rng.normal(0.4 + 0.25 * y, 0.2), 0, 1)
    if ties:
        s = np.round(s, 2)
    parts = np.array_split(np.arange(n), k)
    return [(y[p], s[p]) for p in parts], y, s


def _ranks(clients, seed=0):
    shuffled = [fedauc_shuffle_scores(s, random_state=seed + i) for i, (_, s) in enumerate(clients)]
    ranks = fedauc_server_ranks([sh for sh, _ in shuffled])
    return [fedauc_unshuffle_ranks(r, perm) for r, (_, perm) in zip(ranks, shuffled)]


def test_plaintext_protocol_equals_sklearn_with_ties():
    clients, y, s = _clients()
    ranks = _ranks(clients)
    est = fedauc_server_auc([fedauc_local_stats(r, yk) for r, (yk, _) in zip(ranks, clients)])
    assert est.auc == pytest.approx(roc_auc_score(np.concatenate([c[0] for c in clients]),
                                                  np.concatenate([c[1] for c in clients])), abs=1e-12)


def test_shuffle_hides_order_and_unshuffle_restores_it():
    s = np.arange(10) / 10
    sh, perm = fedauc_shuffle_scores(s, random_state=1)
    assert not np.array_equal(sh, s)
    ranks = fedauc_server_ranks([sh])[0]
    np.testing.assert_array_equal(fedauc_unshuffle_ranks(ranks, perm), np.arange(10.0))


def test_ordinal_ranks_are_distinct_and_bounded():
    ranks = fedauc_server_ranks([[0.5, 0.5, 0.1], [0.5, 0.9]], ties="ordinal")
    allr = np.concatenate(ranks)
    assert sorted(allr) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("params", VARIANTS, ids=lambda p: p.variant)
def test_laplace_with_infinite_epsilon_equals_plaintext_protocol(params):
    clients, _, _ = _clients()
    ranks = _ranks(clients)
    plain = fedauc_server_auc([fedauc_local_stats(r, yk) for r, (yk, _) in zip(ranks, clients)])
    stats_ = [fedauc_laplace_client(r, yk, params, max_rank=1199, random_state=i)
              for i, (r, (yk, _)) in enumerate(zip(ranks, clients))]
    est = fedauc_server_auc(stats_, variant=params.variant, epsilon=params.epsilon)
    assert est.auc == plain.auc
    assert est.variant == params.variant


def test_rr_with_infinite_epsilon_equals_plaintext_protocol():
    from flwr_fedeval.dp import randomize_labels

    clients, _, _ = _clients()
    ranks = _ranks(clients)
    params = RandomizedResponseParams(math.inf)
    flipped = [randomize_labels(yk, params, random_state=i) for i, (yk, _) in enumerate(clients)]
    est = fedauc_rr_server([fedauc_local_stats(r, f) for r, f in zip(ranks, flipped)], params)
    plain = fedauc_server_auc([fedauc_local_stats(r, yk) for r, (yk, _) in zip(ranks, clients)])
    assert est.auc == plain.auc


def test_menon_debiasing_recovers_clean_rank_auc_on_constructed_example():
    levels = [0.1, 0.3, 0.5, 0.7, 0.9]
    n_pos, n_neg = [4, 8, 12, 20, 40], [40, 24, 16, 8, 4]
    s, y, yf = [], [], []
    for lv, p, n in zip(levels, n_pos, n_neg):
        for label, count in ((1, p), (0, n)):
            s += [lv] * count
            y += [label] * count
            yf += [1 - label] * (count // 4) + [label] * (count - count // 4)
    s, y, yf = map(np.asarray, (s, y, yf))
    ranks = fedauc_server_ranks([s])[0]
    params = RandomizedResponseParams(math.log(3.0))  # rho = 1/4 exactly
    est = fedauc_rr_server([fedauc_local_stats(ranks, yf)], params)
    assert abs(est.details["noisy_auc"] - roc_auc_score(y, s)) > 0.1
    assert est.auc == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_local_laplace_noise_scale_is_max_rank_over_alpha_epsilon():
    ranks = np.array([3.0, 10.0, 40.0])
    labels = np.array([1, 0, 1])
    params = FedAUCLaplaceParams(2.0, allocation="alpha", alpha=0.5)
    draws = np.array([fedauc_laplace_client(ranks, labels, params, random_state=i).local_sum for i in range(2000)])
    assert stats.kstest(draws - 43.0, stats.laplace(scale=40.0 / 1.0).cdf).pvalue > 1e-3
    assert stats.kstest(draws - 43.0, stats.laplace(scale=80.0).cdf).pvalue < 1e-6


def test_global_laplace_needs_max_rank():
    with pytest.raises(ValueError, match="max_rank"):
        fedauc_laplace_client([1.0, 2.0], [0, 1], FedAUCLaplaceParams(1.0, sensitivity="global", allocation="alpha"))


def test_local_n_is_count_minus_noisy_p():
    st = fedauc_laplace_client([1.0, 2.0, 5.0], [0, 1, 1], FedAUCLaplaceParams(1.0), random_state=0)
    assert st.local_n == pytest.approx(3 - st.local_p)
    assert st.local_p != 2.0


def test_adaptive_beta_minimises_the_variance_of_local_sum():
    ranks = np.array([100.0, 120.0, 180.0, 400.0])
    a = ranks.mean()
    b = np.max(np.abs(ranks - a))
    grid = np.linspace(0.01, 0.99, 981)
    var = a**2 / grid**2 + b**2 / (1 - grid) ** 2
    assert adaptive_beta(ranks) == pytest.approx(grid[np.argmin(var)], abs=1e-3)


def test_one_sample_client_reports_rank_times_noisy_p():
    """FedAUC §5.3 special case: r parallel to u, all budget on localP."""
    assert adaptive_beta([7.0]) == 1.0
    st = fedauc_laplace_client([7.0], [1], FedAUCLaplaceParams(1.0, allocation="orthogonal"), random_state=3)
    assert st.local_sum == pytest.approx(7.0 * st.local_p)


def test_adaptive_has_smaller_spread_than_alpha_split():
    clients, _, _ = _clients(n=3000, k=15, seed=4, ties=False)
    ranks = _ranks(clients)

    def spread(params):
        vals = []
        for run in range(40):
            st = [fedauc_laplace_client(r, yk, params, random_state=1000 * run + i)
                  for i, (r, (yk, _)) in enumerate(zip(ranks, clients))]
            vals.append(fedauc_server_auc(st).auc)
        return np.std(vals)

    assert (spread(FedAUCLaplaceParams(1.0, allocation="orthogonal"))
            < spread(FedAUCLaplaceParams(1.0, allocation="alpha")))


def test_single_class_and_empty_clients_are_fine():
    clients, _, _ = _clients()
    clients[0] = (np.zeros_like(clients[0][0]), clients[0][1])
    clients.append((np.zeros(0, dtype=np.int64), np.zeros(0)))
    ranks = _ranks(clients)
    for params in (FedAUCLaplaceParams(1.0), FedAUCLaplaceParams(1.0, allocation="orthogonal")):
        st = [fedauc_laplace_client(r, yk, params, random_state=i)
              for i, (r, (yk, _)) in enumerate(zip(ranks, clients))]
        assert st[-1] == (0.0, 0.0, 0.0)
        assert math.isfinite(fedauc_server_auc(st).auc)


def test_zero_positive_total_gives_nan_with_warning():
    ranks = fedauc_server_ranks([np.linspace(0, 1, 20)])[0]
    st = [fedauc_laplace_client(ranks, np.zeros(20, dtype=np.int64), FedAUCLaplaceParams(math.inf))]
    with pytest.warns(UndefinedAUCWarning):
        est = fedauc_server_auc(st)
    assert not est.defined and math.isnan(est.auc)
    with pytest.warns(UndefinedAUCWarning):
        est_rr = fedauc_rr_server([fedauc_local_stats(ranks, np.zeros(20))], RandomizedResponseParams(math.inf))
    assert not est_rr.defined and "P̄=0" in est_rr.reason
