import numpy as np
import pytest

from flwr_fedeval.clients.keras_adapter import KerasModelAdapter, WeightLayout
from flwr_fedeval.clients.models import SEED_CNN_NUM_PARAMETERS, build_mlp, build_seed_cnn


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
    assert ((0 <= scores) & (scores <= 1)).all()
    assert adapter.predict_scores(x[:0]).shape == (0,)
