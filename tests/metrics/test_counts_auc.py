import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from flwr_fedeval.fhe.counts import ConfusionCounts, decision_points, tf_vectors, threshold_counts
from flwr_fedeval.metrics.auc import UndefinedAUCError, auc_from_counts, roc_points


def _data(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    score = 1 / (1 + np.exp(-(rng.normal(size=n) + 1.2 * y - 0.6)))
    return y, score


@pytest.mark.parametrize("spacing", ["linear", "logit"])
def test_decision_points_descend_from_one_to_zero(spacing):
    th = decision_points(50, spacing=spacing)
    assert th.shape == (50,) and th[0] == 1.0 and th[-1] == 0.0
    assert (np.diff(th) < 0).all()


def test_threshold_counts_match_brute_force():
    y, s = _data(500, 1)
    s[:20] = 0.5  # ties exactly at a decision point
    th = decision_points(11)
    c = threshold_counts(y, s, th)
    for n, t in enumerate(th):
        pred = s >= t
        assert c.tp[n] == np.sum(pred & (y == 1))
        assert c.fp[n] == np.sum(pred & (y == 0))
        assert c.tn[n] == np.sum(~pred & (y == 0))
        assert c.fn[n] == np.sum(~pred & (y == 1))


def test_tf_vectors_follow_eq3():
    t, f = tf_vectors([1, 3, 6], [0, 2, 5])
    assert t.tolist() == [1, 4, 9] and f.tolist() == [0, 2, 3]


@pytest.mark.parametrize("n_points,tol", [(100, 0.01), (1000, 0.002)])
def test_federated_auc_from_summed_counts_matches_sklearn(n_points, tol):
    y, s = _data()
    th = decision_points(n_points)
    parts = np.array_split(np.arange(y.size), 5)
    total = sum((threshold_counts(y[p], s[p], th) for p in parts[1:]), threshold_counts(y[parts[0]], s[parts[0]], th))
    pooled = threshold_counts(y, s, th)
    assert all(np.array_equal(a, b) for a, b in zip(total, pooled))
    assert abs(auc_from_counts(total) - roc_auc_score(y, s)) <= tol


def test_trapezoid_is_exact_when_every_score_is_a_decision_point():
    y, _ = _data(400, 2)
    th = decision_points(11)
    s = th[np.random.default_rng(2).integers(0, 11, y.size) // 2 + 5 * y]
    assert auc_from_counts(threshold_counts(y, s, th)) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_single_class_clients_still_count_and_add_up():
    th = decision_points(20)
    pos_only = threshold_counts(np.ones(10, int), np.linspace(0.5, 1, 10), th)
    neg_only = threshold_counts(np.zeros(10, int), np.linspace(0, 0.6, 10), th)
    assert pos_only.n_negative == 0 and pos_only.fp.sum() == 0
    assert neg_only.n_positive == 0
    total = pos_only + neg_only
    y = np.r_[np.ones(10, int), np.zeros(10, int)]
    s = np.r_[np.linspace(0.5, 1, 10), np.linspace(0, 0.6, 10)]
    assert auc_from_counts(total) == pytest.approx(auc_from_counts(threshold_counts(y, s, th)))


def test_pooled_single_class_raises_undefined_auc():
    th = decision_points(20)
    c = threshold_counts(np.ones(10, int), np.linspace(0, 1, 10), th)
    with pytest.raises(UndefinedAUCError, match="undefined"):
        auc_from_counts(c)
    with pytest.raises(UndefinedAUCError):
        roc_points(c)


def test_bad_inputs_raise():
    th = decision_points(5)
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        threshold_counts([0, 1], [0.2, 1.5], th)
    with pytest.raises(ValueError, match="only 0"):
        threshold_counts([0, 2], [0.2, 0.5], th)
    with pytest.raises(ValueError, match="NaN"):
        threshold_counts([0, 1], [0.2, np.nan], th)
    with pytest.raises(ValueError, match="descending"):
        threshold_counts([0, 1], [0.2, 0.5], th[::-1])
    with pytest.raises(ValueError, match="n_points"):
        decision_points(1)
    with pytest.raises(ValueError, match="decision points"):
        ConfusionCounts(*[np.zeros(3, np.int64)] * 4) + ConfusionCounts(*[np.zeros(4, np.int64)] * 4)
