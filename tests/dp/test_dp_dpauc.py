"""DPAUC_Lap and DPAUC_RR (Sun et al., AAAI 2023) against the plaintext protocol."""

import math

import numpy as np
import pytest

from flwr_fedeval.dp import (
    DPAUCLaplaceParams,
    RandomizedResponseParams,
    UndefinedAUCWarning,
    dpauc_laplace_client,
    dpauc_laplace_server,
    dpauc_rr_server,
    menon_debias,
    randomize_labels,
)
from flwr_fedeval.metrics.auc import auc_from_counts, resolution_bound
from flwr_fedeval.metrics.counts import ConfusionCounts, decision_points, threshold_counts

THETA = decision_points(100)


def _clients(n=1500, k=5, seed=0):
    rng = np.random.RandomState(seed)
    y = rng.randint(0, 2, n)
    s = np.clip(rng.normal(0.4 + 0.25 * y, 0.2), 0, 1)
    parts = np.array_split(np.arange(n), k)
    return [(y[p], s[p]) for p in parts]


def _exact(clients):
    return [threshold_counts(y, s, THETA) for y, s in clients]


@pytest.mark.parametrize("clipping", ["clip-sort", "no-clip"])
def test_laplace_with_infinite_epsilon_equals_plaintext_protocol(clipping):
    counts = _exact(_clients())
    params = DPAUCLaplaceParams(math.inf, len(THETA))
    noisy = [dpauc_laplace_client(c, params, random_state=i) for i, c in enumerate(counts)]
    est = dpauc_laplace_server(noisy, clipping=clipping, epsilon=params.epsilon)
    plain = dpauc_laplace_server(counts, clipping=clipping)
    assert est.auc == plain.auc
    assert est.variant == clipping and est.defined
    assert est.auc == pytest.approx(auc_from_counts(sum(counts[1:], counts[0])), abs=1e-12)


def test_clip_sort_stays_in_unit_interval_where_no_clip_does_not():
    counts = _exact(_clients(n=100, k=15, seed=1))  # FHE paper regime: 100 samples, eps=1
    params = DPAUCLaplaceParams(1.0, len(THETA))
    clipped, raw = [], []
    for run in range(20):
        noisy = [dpauc_laplace_client(c, params, random_state=1000 * run + i) for i, c in enumerate(counts)]
        clipped.append(dpauc_laplace_server(noisy, clipping="clip-sort").auc)
        raw.append(dpauc_laplace_server(noisy, clipping="no-clip").auc)
    assert all(0.0 <= a <= 1.0 for a in clipped)
    assert any(not 0.0 <= a <= 1.0 for a in raw)


def test_laplace_is_close_at_large_size_and_eps_8():
    clients = _clients(n=40_000, k=15, seed=2)
    counts = _exact(clients)
    ref = auc_from_counts(sum(counts[1:], counts[0]))
    params = DPAUCLaplaceParams(8.0, len(THETA))
    noisy = [dpauc_laplace_client(c, params, random_state=i) for i, c in enumerate(counts)]
    assert dpauc_laplace_server(noisy, clipping="clip-sort").auc == pytest.approx(ref, abs=0.02)


def test_rr_with_infinite_epsilon_equals_plaintext_auc():
    clients = _clients()
    params = RandomizedResponseParams(math.inf)
    counts = [threshold_counts(randomize_labels(y, params, random_state=i), s, THETA)
              for i, (y, s) in enumerate(clients)]
    est = dpauc_rr_server(counts, params)
    assert est.auc == auc_from_counts(sum(counts[1:], counts[0]))
    assert est.details["noisy_auc"] == est.auc
    assert est.details["resolution_bound"] == resolution_bound(sum(counts))


def test_rr_resolution_bound_scales_with_the_debiasing_slope():
    s, y, y_flip = _menon_example()
    eps = math.log(3.0)
    counts = [threshold_counts(y_flip, s, np.linspace(0.95, 0.05, 4))]  # coarse: bins mix classes
    est = dpauc_rr_server(counts, RandomizedResponseParams(eps))
    d = menon_debias(est.details["noisy_auc"], est.details["noisy_p"], est.details["noisy_n"], eps)
    assert est.details["resolution_bound"] == pytest.approx(resolution_bound(counts[0]) / (1 - d.alpha - d.beta))
    assert est.details["resolution_bound"] > resolution_bound(counts[0]) > 0


def _menon_example():
    """5 score levels; at each, the positives and negatives are multiples of 4.

    Flipping exactly 1/4 of each class at each level (rho = 1/4, eps = ln 3)
    makes Menon's relation hold exactly for the tie-aware AUC.
    """
    levels = [0.1, 0.3, 0.5, 0.7, 0.9]
    n_pos = [4, 8, 12, 20, 40]
    n_neg = [40, 24, 16, 8, 4]
    scores, clean, flipped = [], [], []
    for lv, p, n in zip(levels, n_pos, n_neg):
        for label, count in ((1, p), (0, n)):
            scores += [lv] * count
            clean += [label] * count
            flipped += [1 - label] * (count // 4) + [label] * (count - count // 4)
    return np.array(scores), np.array(clean), np.array(flipped)


def test_menon_debiasing_recovers_clean_auc_on_constructed_example():
    s, y, y_flip = _menon_example()
    eps = math.log(3.0)
    assert RandomizedResponseParams(eps).flip_probability == pytest.approx(0.25)
    clean = auc_from_counts(threshold_counts(y, s, THETA))
    noisy_counts = [threshold_counts(y_flip, s, THETA)]
    noisy = auc_from_counts(noisy_counts[0])
    assert abs(noisy - clean) > 0.1  # the flips really bias the AUC
    est = dpauc_rr_server(noisy_counts, RandomizedResponseParams(eps))
    assert est.auc == pytest.approx(clean, abs=1e-12)
    assert est.details["p_est"] == pytest.approx(y.sum())


def test_menon_debias_is_identity_without_flips():
    d = menon_debias(0.73, 40, 60, math.inf)
    assert d.auc == 0.73 and d.alpha == 0.0 and d.beta == 0.0


def test_rr_random_flips_debiased_mean_is_unbiased():
    clients = _clients(n=4000, k=5, seed=5)
    counts = _exact(clients)
    ref = auc_from_counts(sum(counts[1:], counts[0]))
    params = RandomizedResponseParams(2.0)
    vals = []
    for run in range(30):
        fl = [threshold_counts(randomize_labels(y, params, random_state=100 * run + i), s, THETA)
              for i, (y, s) in enumerate(clients)]
        vals.append(dpauc_rr_server(fl, params).auc)
    assert abs(np.mean(vals) - ref) < 4 * np.std(vals) / math.sqrt(len(vals)) + 1e-3


def test_single_class_client_is_fine_and_exact_without_noise():
    clients = _clients()
    y0, s0 = clients[0]
    clients[0] = (np.zeros_like(y0), s0)  # only negatives
    clients.append((np.ones(3, dtype=np.int64), np.array([0.2, 0.5, 0.9])))  # only positives
    counts = _exact(clients)
    params = DPAUCLaplaceParams(math.inf, len(THETA))
    noisy = [dpauc_laplace_client(c, params, random_state=i) for i, c in enumerate(counts)]
    est = dpauc_laplace_server(noisy)
    assert est.defined and est.auc == pytest.approx(auc_from_counts(sum(counts[1:], counts[0])), abs=1e-12)
    noisy1 = [dpauc_laplace_client(c, DPAUCLaplaceParams(1.0, len(THETA)), random_state=i)
              for i, c in enumerate(counts)]
    assert math.isfinite(dpauc_laplace_server(noisy1).auc)


@pytest.mark.parametrize("clipping", ["clip-sort", "no-clip"])
def test_zero_positive_total_gives_nan_with_warning(clipping):
    counts = [threshold_counts(np.zeros(50, dtype=np.int64), np.linspace(0, 1, 50), THETA)]
    params = DPAUCLaplaceParams(math.inf, len(THETA))
    noisy = [dpauc_laplace_client(counts[0], params)]
    with pytest.warns(UndefinedAUCWarning):
        est = dpauc_laplace_server(noisy, clipping=clipping)
    assert not est.defined and math.isnan(est.auc) and "TP+FN" in est.reason


def test_rr_zero_positive_total_gives_nan_with_warning():
    counts = [threshold_counts(np.zeros(50, dtype=np.int64), np.linspace(0, 1, 50), THETA)]
    with pytest.warns(UndefinedAUCWarning):
        est = dpauc_rr_server(counts, RandomizedResponseParams(math.inf))
    assert not est.defined and math.isnan(est.auc)


def test_client_refuses_counts_over_other_thresholds():
    counts = threshold_counts([0, 1], [0.2, 0.8], decision_points(10))
    with pytest.raises(ValueError, match="decision points"):
        dpauc_laplace_client(counts, DPAUCLaplaceParams(1.0, 11))


def test_server_refuses_mismatched_clients():
    a = ConfusionCounts(*(np.zeros(3, dtype=np.int64) for _ in range(4)))
    b = ConfusionCounts(*(np.zeros(4, dtype=np.int64) for _ in range(4)))
    with pytest.raises(ValueError):
        dpauc_laplace_server([a, b])


# --- does the noise swamp the counts? (issue 23 item 4) ----------------------------------------
def test_laplace_noise_check_matches_the_laplace_variance_and_names_the_fix():
    from flwr_fedeval.dp.dpauc import laplace_noise_check

    eps, n_points, m = 1.0, 100, 5
    check = laplace_noise_check(eps, n_points, m, positives=40.0, negatives=70.0)
    # each client adds Laplace(b = 4N/eps) to a count: variance 2b^2; M of them summed
    b = 4 * n_points / eps
    assert check["noise_std"] == pytest.approx(math.sqrt(m * 2 * b * b))
    assert check["swamped"] is True
    # the fix it names is exactly at the limit: sigma(min_epsilon) = 0.1 * min(P, N_neg)
    at = laplace_noise_check(check["min_epsilon"], n_points, m, positives=40.0, negatives=70.0)
    assert at["noise_std"] == pytest.approx(0.1 * 40.0) and at["swamped"] is False
    assert check["min_class_rows"] == pytest.approx(check["noise_std"] / 0.1)
    assert laplace_noise_check(math.inf, n_points, m, 40.0, 70.0)["swamped"] is False
    with pytest.raises(ValueError):
        laplace_noise_check(0.0, n_points, m, 40.0, 70.0)


def test_laplace_noise_check_is_measured_not_assumed():
    """The stated sigma is the empirical spread of the summed noisy counts (diffprivlib's Laplace)."""
    from flwr_fedeval.dp.dpauc import laplace_noise_check

    eps, n_points, m = 2.0, 4, 3
    labels = np.array([0, 1, 0, 1, 1, 0])
    scores = np.array([0.1, 0.9, 0.3, 0.7, 0.6, 0.2])
    thresholds = np.linspace(0.8, 0.2, n_points)
    exact = threshold_counts(labels, scores, thresholds)
    sums = []
    for _ in range(400):
        noisy = [dpauc_laplace_client(exact, DPAUCLaplaceParams(eps, n_points)) for _ in range(m)]
        sums.append(sum(np.asarray(c.tp) for c in noisy) - m * np.asarray(exact.tp))
    empirical = float(np.std(np.concatenate(sums)))
    assert empirical == pytest.approx(laplace_noise_check(eps, n_points, m, 1.0, 1.0)["noise_std"], rel=0.15)
