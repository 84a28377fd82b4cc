import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from flwr_fedeval.metrics.auc import (
    UndefinedAUCError,
    auc_from_counts,
    auc_with_bound,
    resolution_bound,
    roc_points,
)
from flwr_fedeval.metrics.counts import ConfusionCounts, decision_points, tf_vectors, threshold_counts


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
    with pytest.raises(ValueError, match="decision points"):  # shape-checked
        ConfusionCounts(*[np.zeros(3, np.int64)] * 4) + ConfusionCounts(*[np.zeros(4, np.int64)] * 4)


# --- closed curve, resolution bound, real scores, sum() (issue 15 items 2, 3, 5; issue 11 item 7)

def _closed_trapezoid(y, s, th):
    """Independent reference: trapezoid over (0,0), the points at th, (1,1)."""
    p, n = (y == 1).sum(), (y == 0).sum()
    tpr = [0.0] + [((s >= t) & (y == 1)).sum() / p for t in th] + [1.0]
    fpr = [0.0] + [((s >= t) & (y == 0)).sum() / n for t in th] + [1.0]
    return float(np.trapezoid(tpr, fpr))


@pytest.mark.parametrize("th", [np.linspace(0.99, 0.01, 100), np.linspace(0.9, 0.1, 9),
                                np.linspace(0.7, 0.3, 5), np.array([0.5])])
def test_curve_is_closed_whatever_the_decision_points(th):
    y, s = _data(3000, 5)
    c = threshold_counts(y, s, th)
    ref = _closed_trapezoid(y, s, th)
    assert auc_from_counts(c) == pytest.approx(ref, abs=1e-9)
    fpr, tpr = roc_points(c)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert float(np.trapezoid(tpr, fpr)) == pytest.approx(ref, abs=1e-12)
    # sanity against sklearn: within the certified resolution bound
    b = resolution_bound(c)
    assert abs(auc_from_counts(c) - roc_auc_score(y, s)) <= b + 1e-12


def test_linspace_099_001_matches_sklearn_closely():
    y, s = _data(3000, 6)
    c = threshold_counts(y, s, np.linspace(0.99, 0.01, 100))
    assert abs(auc_from_counts(c) - roc_auc_score(y, s)) < 2e-3


def test_resolution_bound_is_certified_and_tight():
    rng = np.random.default_rng(7)
    th = decision_points(6)
    for trial in range(20):
        y = rng.integers(0, 2, 300)
        s = rng.random(300) ** (1 + trial % 3)
        c = threshold_counts(y, s, th)
        auc, b = auc_with_bound(c)
        assert abs(roc_auc_score(y, s) - auc) <= b + 1e-12
    # Tight: within each bin every positive ranks above every negative.
    y = np.r_[np.ones(50, int), np.zeros(50, int)]
    s = np.r_[np.full(50, 0.55), np.full(50, 0.5)]  # one bin [0.4, 0.6) holds everything
    c = threshold_counts(y, s, th)
    auc, b = auc_with_bound(c)
    assert auc == pytest.approx(0.5) and b == pytest.approx(0.5)
    assert roc_auc_score(y, s) == pytest.approx(auc + b)


def test_resolution_bound_zero_when_no_bin_mixes_classes():
    th = decision_points(11)
    y = np.r_[np.ones(10, int), np.zeros(10, int)]
    s = np.r_[np.full(10, 0.95), np.full(10, 0.05)]
    auc, b = auc_with_bound(threshold_counts(y, s, th))
    assert (auc, b) == (1.0, 0.0)


def test_saturated_probabilities_have_a_wide_bound_logits_fix_it():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 2000)
    margin = rng.normal(0, 3, y.size) + 40.0 * (y - 0.5) + rng.normal(0, 20, y.size)
    prob = (1 / (1 + np.exp(-margin.astype(np.float32)))).astype(np.float32)  # saturates to 0/1
    th = decision_points(100, spacing="logit")
    bp = resolution_bound(threshold_counts(y, prob, th))
    th_logit = decision_points(100, spacing="logit", units="logit", logit_range=60)
    cl = threshold_counts(y, margin, th_logit, score_range=None)
    bl = resolution_bound(cl)
    assert bp > 0.01 and bl < 0.01
    assert abs(auc_from_counts(cl) - roc_auc_score(y, margin)) <= bl


def test_real_valued_scores_with_public_points():
    y, s = _data(2000, 8)
    logit = np.log(s / (1 - s)) * 3.0  # decision_function-like, outside [0, 1]
    th = np.linspace(10, -10, 201)
    c = threshold_counts(y, logit, th, score_range=None)
    assert abs(auc_from_counts(c) - roc_auc_score(y, logit)) <= resolution_bound(c) + 1e-12
    with pytest.raises(ValueError, match="score_range=None"):
        threshold_counts(y, logit, th)
    with pytest.raises(ValueError, match="finite"):
        threshold_counts(y, logit, np.array([np.inf, 0.0]), score_range=None)
    with pytest.raises(ValueError, match="\\[-1, 1\\]"):
        threshold_counts(y, logit, th, score_range=(-1, 1))


def test_confusion_counts_sum_and_immutability():
    th = decision_points(10)
    parts = [threshold_counts(*_data(100, k), th) for k in range(4)]
    total = sum(parts)
    ref = parts[0] + parts[1] + parts[2] + parts[3]
    assert all(np.array_equal(a, b) for a, b in zip(total, ref))
    assert sum(parts[:1]) is parts[0]
    with pytest.raises(ValueError):
        total.tp[0] = 5  # read-only arrays
    with pytest.raises(AttributeError):
        total.tp = np.zeros(10)  # immutable fields
    with pytest.raises(TypeError):
        parts[0] + 1
    with pytest.raises(TypeError):
        sum(parts, 5)
    with pytest.raises(ValueError, match="1-D of one length"):
        sum([parts[0], threshold_counts(*_data(100, 9), decision_points(5))])


@pytest.mark.process
def test_metrics_does_not_import_fhe():
    import subprocess
    import sys
    code = ("import sys, flwr_fedeval.metrics.auc, flwr_fedeval.metrics.counts; "
            "sys.exit(int(any(m.startswith('flwr_fedeval.fhe') for m in sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

