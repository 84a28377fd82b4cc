import numpy as np
import pytest

from flwr_fedeval.clients.keras_adapter import KerasModelAdapter
from flwr_fedeval.clients.models import SEED_CNN_NUM_PARAMETERS, build_mlp, build_seed_cnn
from flwr_fedeval.weights import WeightLayout


@pytest.fixture(scope="module")
def cnn():
    return build_seed_cnn()


def test_seed_cnn_has_exactly_949002_parameters(cnn):
    assert cnn.count_params() == SEED_CNN_NUM_PARAMETERS == 949_002
    assert KerasModelAdapter(cnn).num_parameters == 949_002
    assert cnn.input_shape == (None, 128, 128, 1)
    assert cnn.output_shape == (None, 2)


def test_flatten_pad_restore_round_trip_is_exact_on_seed_cnn(cnn):
    adapter = KerasModelAdapter(cnn)
    original = adapter.get_weights()
    flat = adapter.flatten(pad_to_multiple=4096)
    assert flat.dtype == np.float64
    assert flat.size == 232 * 4096  # ceil(949002 / 4096) = 232 ring polynomials
    assert not flat[949_002:].any()
    perturbed = flat.copy()
    perturbed[:949_002] += 0.5
    adapter.set_flat(perturbed)
    assert not np.array_equal(adapter.get_weights()[0], original[0])
    adapter.set_flat(flat)
    restored = adapter.get_weights()
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(original, restored))


def test_layout_rejects_nan_weights_and_shape_mismatch():
    layout = WeightLayout.of([np.zeros((2, 3), np.float32), np.zeros(3, np.float32)])
    assert layout.size == 9
    with pytest.raises(ValueError, match="NaN"):
        layout.flatten([np.full((2, 3), np.nan, np.float32), np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match="shape"):
        layout.flatten([np.zeros((3, 2), np.float32), np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match="cannot hold"):
        layout.unflatten(np.zeros(8))
    with pytest.raises(ValueError, match="padding"):
        layout.unflatten(np.ones(12))


def test_predict_scores_are_positive_class_probabilities():
    model = build_mlp(4)
    adapter = KerasModelAdapter(model)
    x = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32)
    scores = adapter.predict_scores(x, batch_size=64)
    expected = np.asarray(model(x, training=False))[:, 1]
    assert scores.shape == (300,)
    assert np.allclose(scores, expected, atol=1e-6)
    assert ((scores >= 0) & (scores <= 1)).all()
    assert adapter.predict_scores(x[:0]).shape == (0,)


def test_logit_margin_keeps_saturated_scores_apart_and_tightens_the_bound():
    """float32 softmax rounds confident scores to exactly 0/1 and collapses the ROC bins;
    the pre-softmax margin (issue 15.3) keeps them apart: the certified resolution bound
    shrinks and the AUC moves to roc_auc_score of the margins."""
    from sklearn.metrics import roc_auc_score

    from flwr_fedeval.metrics.auc import auc_from_counts, resolution_bound
    from flwr_fedeval.metrics.counts import decision_points, threshold_counts

    rng = np.random.default_rng(0)
    model = build_mlp(3, hidden_units=())  # logreg: one softmax Dense layer
    w = np.array([[0.0, 20.0], [0.0, 8.0], [0.0, 0.0]], dtype=np.float32)  # margins of tens of logits
    model.layers[-1].set_weights([w, np.array([0.0, 15.0], np.float32)])
    y = rng.integers(0, 2, 3000)
    x = (rng.normal(size=(3000, 3)) + 0.8 * y[:, None]).astype(np.float32)
    adapter = KerasModelAdapter(model)
    prob = adapter.predict_scores(x)
    margin = adapter.predict_logit_margin(x)
    assert margin.dtype == np.float64 and np.ptp(margin) > 60
    assert np.mean((prob == 0.0) | (prob == 1.0)) > 0.5  # float32 saturation
    # same ordering where float32 still separates them
    inner = (prob > 1e-3) & (prob < 1 - 1e-3)
    assert np.allclose(1 / (1 + np.exp(-margin[inner])), prob[inner], atol=1e-5)

    th_prob = decision_points(100, spacing="logit")
    b_prob = resolution_bound(threshold_counts(y, prob, th_prob))
    th_margin = decision_points(100, spacing="logit", units="logit", logit_range=64)
    c_margin = threshold_counts(y, margin, th_margin, score_range=None)
    b_margin = resolution_bound(c_margin)
    assert b_prob > 0.1 and b_margin < 0.01
    assert abs(auc_from_counts(c_margin) - roc_auc_score(y, margin)) <= b_margin
    # The App's route: the same margins mapped into probability units by a public temperature,
    # scored against the usual logit-spaced decision points (no float32 anywhere).
    scores = adapter.predict_margin_scores(x)
    c_app = threshold_counts(y, scores, th_prob)
    b_app = resolution_bound(c_app)
    assert b_app < 0.01
    assert abs(auc_from_counts(c_app) - roc_auc_score(y, margin)) <= b_app


def test_logit_margin_refuses_models_without_a_dense_softmax_head():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="softmax"):
        KerasModelAdapter(model).predict_logit_margin(np.zeros((2, 3), np.float32))
