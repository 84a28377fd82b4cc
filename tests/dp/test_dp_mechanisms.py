"""Noise distributions, parameter validation and budget accounting of flwr_fedeval.dp."""

import math

import numpy as np
import pytest
from diffprivlib import BudgetAccountant
from diffprivlib.mechanisms import Laplace
from scipy import stats

from flwr_fedeval.dp import (
    BudgetError,
    DPAUCLaplaceParams,
    FedAUCLaplaceParams,
    RandomizedResponseParams,
    dpauc_laplace_client,
    fedauc_laplace_client,
    randomize_labels,
)
from flwr_fedeval.dp.mechanisms import laplace_randomise
from flwr_fedeval.metrics.counts import decision_points, threshold_counts


def _counts(n_thresholds=50, n=200, seed=0):
    rng = np.random.RandomState(seed)
    y = rng.randint(0, 2, n)
    s = rng.random_sample(n)
    return threshold_counts(y, s, decision_points(n_thresholds))


def test_dpauc_laplace_noise_has_scale_one_over_epsilon_prime():
    eps_prime = 0.5
    params = DPAUCLaplaceParams.from_epsilon_prime(eps_prime, n_thresholds=2500)
    counts = _counts(2500)
    noisy = dpauc_laplace_client(counts, params, random_state=1)
    noise = np.concatenate([np.asarray(a) - b for a, b in zip(noisy, counts)])  # 10^4 draws
    assert noise.size == 10_000
    assert stats.kstest(noise, stats.laplace(scale=1 / eps_prime).cdf).pvalue > 1e-3
    # the test has power: twice the scale is rejected
    assert stats.kstest(noise, stats.laplace(scale=2 / eps_prime).cdf).pvalue < 1e-6


def test_vectorised_laplace_reproduces_diffprivlib_randomise_draw_for_draw():
    values = np.arange(1000, dtype=np.float64)
    rng_a, rng_b = np.random.RandomState(7), np.random.RandomState(7)
    vec = laplace_randomise(values, Laplace(epsilon=0.3, sensitivity=2.0, random_state=rng_a), rng_a)
    mech_b = Laplace(epsilon=0.3, sensitivity=2.0, random_state=rng_b)
    scalar = laplace_randomise(values, mech_b, rng_b, sampler="diffprivlib")
    np.testing.assert_allclose(vec, scalar, rtol=0, atol=1e-9)
    assert not np.allclose(vec, values)


def test_rr_flip_rate_within_three_sigma():
    params = RandomizedResponseParams(1.0)
    labels = np.tile([0, 1], 50_000)
    flipped = randomize_labels(labels, params, random_state=3)
    rho = 1 / (1 + math.e)
    assert params.flip_probability == pytest.approx(rho)
    n_flips = int((flipped != labels).sum())
    assert abs(n_flips - labels.size * rho) <= 3 * params.flip_std(labels.size)


def test_rr_diffprivlib_sampler_has_same_flip_rate():
    params = RandomizedResponseParams(2.0)
    labels = np.zeros(20_000, dtype=np.int64)
    flipped = randomize_labels(labels, params, random_state=4, sampler="diffprivlib")
    rho = params.flip_probability
    assert abs(flipped.sum() - labels.size * rho) <= 3 * params.flip_std(labels.size)


def test_rr_with_infinite_epsilon_flips_nothing():
    labels = np.tile([0, 1, 1], 1000)
    np.testing.assert_array_equal(randomize_labels(labels, RandomizedResponseParams(math.inf), random_state=0), labels)


def test_same_seed_gives_same_noise_and_different_seeds_differ():
    params = DPAUCLaplaceParams(1.0, 50)
    c = _counts()
    a = dpauc_laplace_client(c, params, random_state=11)
    b = dpauc_laplace_client(c, params, random_state=11)
    d = dpauc_laplace_client(c, params, random_state=12)
    np.testing.assert_array_equal(a.tp, b.tp)
    assert not np.array_equal(a.tp, d.tp)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(epsilon=0.0, n_thresholds=10), ValueError),
        (dict(epsilon=-1.0, n_thresholds=10), ValueError),
        (dict(epsilon=float("nan"), n_thresholds=10), ValueError),
        (dict(epsilon="1", n_thresholds=10), TypeError),
        (dict(epsilon=True, n_thresholds=10), TypeError),
        (dict(epsilon=1.0, n_thresholds=1), ValueError),
        (dict(epsilon=1.0, n_thresholds=10, split=(1, 1, 1)), ValueError),
        (dict(epsilon=1.0, n_thresholds=10, split=(1, 1, 1, 0)), ValueError),
    ],
)
def test_dpauc_params_reject_invalid_values(kwargs, error):
    with pytest.raises(error):
        DPAUCLaplaceParams(**kwargs)


def test_dpauc_params_split_is_normalised_and_composes_to_epsilon():
    p = DPAUCLaplaceParams(2.0, 100, split=(2, 1, 1, 0.5))
    eps = p.epsilon_per_count
    assert sum(eps.values()) * p.n_thresholds == pytest.approx(2.0)
    assert eps["tp"] == pytest.approx(2 * eps["fp"])
    assert p.noise_scale["fn"] == pytest.approx(1 / eps["fn"])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(epsilon=1.0, alpha=1.0),
        dict(epsilon=1.0, alpha=0.0),
        dict(epsilon=1.0, sensitivity="max"),
        dict(epsilon=1.0, allocation="orthogonal", sensitivity="global"),
        dict(epsilon=1.0, allocation="orthogonal", beta=0.0),
        dict(epsilon=0.0),
    ],
)
def test_fedauc_params_reject_invalid_values(kwargs):
    with pytest.raises(ValueError):
        FedAUCLaplaceParams(**kwargs)


def test_accountant_total_is_four_thresholds_epsilon_prime_per_client():
    eps_prime, n_thresholds = 0.0025, 100
    params = DPAUCLaplaceParams.from_epsilon_prime(eps_prime, n_thresholds)
    accountants = [BudgetAccountant(epsilon=10.0) for _ in range(3)]
    for k, acc in enumerate(accountants):
        dpauc_laplace_client(_counts(n_thresholds, seed=k), params, accountant=acc, random_state=k)
    for acc in accountants:
        assert acc.total()[0] == pytest.approx(4 * n_thresholds * eps_prime)
        assert acc.total()[1] == 0.0


def test_over_budget_run_raises_before_any_noise_is_drawn():
    params = DPAUCLaplaceParams(1.0, 50)
    acc = BudgetAccountant(epsilon=1.5)
    rng = np.random.RandomState(5)
    dpauc_laplace_client(_counts(), params, accountant=acc, random_state=rng)
    state_before = rng.get_state()[1].copy(), rng.get_state()[2]
    with pytest.raises(BudgetError):
        dpauc_laplace_client(_counts(), params, accountant=acc, random_state=rng)
    assert acc.total()[0] == pytest.approx(1.0)  # refused spend not recorded
    state_after = rng.get_state()[1], rng.get_state()[2]
    np.testing.assert_array_equal(state_before[0], state_after[0])  # no uniform drawn
    assert state_before[1] == state_after[1]


def test_rr_and_fedauc_clients_charge_and_refuse():
    acc = BudgetAccountant(epsilon=1.0)
    randomize_labels([0, 1, 1], RandomizedResponseParams(0.6), accountant=acc, random_state=0)
    assert acc.total()[0] == pytest.approx(0.6)
    with pytest.raises(BudgetError):
        fedauc_laplace_client([0.0, 1.0, 2.0], [0, 1, 1], FedAUCLaplaceParams(0.5), accountant=acc, random_state=0)
    assert acc.total()[0] == pytest.approx(0.6)


def test_disabled_noise_against_finite_budget_is_refused():
    with pytest.raises(BudgetError):
        dpauc_laplace_client(_counts(), DPAUCLaplaceParams(math.inf, 50), accountant=BudgetAccountant(epsilon=100.0))


@pytest.mark.process
def test_dp_layer_imports_neither_flwr_nor_tensorflow():
    import subprocess
    import sys

    code = (
        "import sys, flwr_fedeval.dp, flwr_fedeval.dp.fedauc, flwr_fedeval.dp.dpauc; "
        "bad = [m for m in ('flwr', 'tensorflow', 'keras') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
