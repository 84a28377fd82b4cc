"""Plaintext FSV: efficiency, symmetry, SampleSkip exactness (Theorem 6.3), FindSkippable."""

import numpy as np
import pytest

from flwr_fedeval.shapley.fsv import (
    coalitions,
    federated_shapley,
    find_skippable,
    round_utilities,
    sample_skip_utilities,
    shapley_values,
)


def _case(seed, n_clients=4, d=5, M=200, rounds=3):
    r = np.random.default_rng(seed)
    X = r.normal(size=(M, d))
    y = (X @ r.normal(size=d) > 0).astype(int)
    models = [{i: r.normal(size=(2, d + 1)) for i in range(n_clients)} for _ in range(rounds)]
    weights = {i: int(r.integers(1, 50)) for i in range(n_clients)}
    return X, y, models, weights


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_efficiency_every_round(seed):
    X, y, rounds, w = _case(seed)
    res = federated_shapley(rounds, w, X, y, n_classes=2)
    for t, util in enumerate(res.utilities):
        full = util[frozenset(range(4))]
        assert res.ssv[t].sum() == pytest.approx(full - res.empty_utilities[t], abs=1e-12)
    assert res.empty_utilities[0] == 0.5
    assert res.empty_utilities[1] == res.utilities[0][frozenset(range(4))]


def test_symmetric_clients_get_equal_values():
    X, y, rounds, w = _case(3, rounds=1)
    rounds[0][1] = rounds[0][0].copy()
    w[1] = w[0]
    res = federated_shapley(rounds, w, X, y, n_classes=2)
    assert res.fsv[0] == pytest.approx(res.fsv[1], abs=1e-12)


def test_shapley_values_of_constructed_game():
    # v(S) = |S ∩ {0, 1}| / 2 : client 2 is a null player, 0 and 1 split the value.
    util = {S: len(S & {0, 1}) / 2 for S in coalitions([0, 1, 2])}
    phi = shapley_values(util, [0, 1, 2], 0.0)
    np.testing.assert_allclose(phi, [0.5, 0.5, 0.0], atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_sample_skip_never_changes_utility_of_linear_classifier(seed):
    X, y, rounds, w = _case(10 + seed, n_clients=5, rounds=1)
    exact = round_utilities(rounds[0], w, X, y)
    skip = sample_skip_utilities(rounds[0], w, X, y)
    assert skip.utilities == exact.utilities
    for S in exact.correct:
        np.testing.assert_array_equal(skip.correct[S], exact.correct[S])
    assert skip.skipped_samples > 0


def test_find_skippable_paper_example_5_5():
    # Example 5.5: θ1, θ23 correct on x1,x2; θ2, θ13 on x2,x3; θ3, θ12 on x3,x4.
    m = lambda *ids: np.isin(np.arange(4), ids)
    phi = {frozenset({1}): m(0, 1), frozenset({2, 3}): m(0, 1), frozenset({2}): m(1, 2),
           frozenset({1, 3}): m(1, 2), frozenset({3}): m(2, 3), frozenset({1, 2}): m(2, 3)}
    assert find_skippable(frozenset({1, 2, 3}), phi).all()
    np.testing.assert_array_equal(find_skippable(frozenset({1, 2}), phi), m(1))
