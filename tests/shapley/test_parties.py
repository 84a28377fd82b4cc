"""SecSV party functions: batch planning, bounds checks, label shares over F_p."""

import numpy as np
import pytest

from flwr_fedeval.shapley.parties import (
    model_matrix,
    plan_batches,
    share_test_set,
)
from flwr_fedeval.shapley.secsv import SecSVParams
from flwr_fedeval.shapley.sharing import LABEL_PRIME, reconstruct


@pytest.mark.parametrize("m,sizes", [(7, [5, 9, 3]), (16, [4, 4, 4]), (3, [1, 10]), (50, [20, 20])])
def test_plan_batches_cover_everything_once_and_never_all_owners(m, sizes):
    owners = np.concatenate([np.full(s, i) for i, s in enumerate(sizes)])
    np.random.default_rng(0).shuffle(owners)
    batches = plan_batches(owners, m, range(len(sizes)))
    pos = np.concatenate(batches)
    assert sorted(pos.tolist()) == list(range(len(owners)))
    for b in batches:
        assert 0 < len(b) <= m
        assert len(set(owners[b].tolist())) < len(sizes)   # some client can be the helper


def test_share_test_set_refuses_features_outside_the_bound():
    p = SecSVParams.for_bounds(n_features=3, max_clients=2, feature_bound=1.0)
    with pytest.raises(ValueError, match="feature_bound"):
        share_test_set(np.array([[0.5, 1.5, 0.0]]), np.array([1]), p)
    with pytest.raises(ValueError, match="NaN"):
        share_test_set(np.array([[0.5, np.nan, 0.0]]), np.array([1]), p)


def test_model_matrix_checks_bound_weight_and_shape():
    p = SecSVParams.for_bounds(n_features=3, max_clients=2, model_bound=2.0)
    theta = np.array([[0.0, 0, 0, 0], [1.0, -0.5, 0.25, 0.125]])
    A = model_matrix(theta, 3, p, n_classes=2, d_out=1)
    np.testing.assert_array_equal(A, 3 * np.rint(theta[1:] * 2 ** p.model_frac_bits))
    with pytest.raises(ValueError, match="model_bound"):
        model_matrix(theta * 10, 3, p, n_classes=2, d_out=1)
    with pytest.raises(ValueError, match="weight"):
        model_matrix(theta, 0, p, n_classes=2, d_out=1)
    with pytest.raises(ValueError, match="shape"):
        model_matrix(theta[:, :3], 1, p, n_classes=2, d_out=1)


def test_test_set_shares_reconstruct_features_in_the_ring_and_labels_in_the_field():
    """Labels are shared over F_p (the zero test, flwr_fedeval.shapley.zerotest; was Z_2^k)."""
    p = SecSVParams.for_bounds(n_features=2, max_clients=2, feature_bound=1.0)
    X, y = np.array([[0.5, -0.25], [1.0, 0.0]]), np.array([1, 0])
    (X_P, y_P), (X_A, y_A) = share_test_set(X, y, p)
    assert y_P.max() < LABEL_PRIME and y_A.max() < LABEL_PRIME
    np.testing.assert_array_equal((y_P + y_A) % np.uint64(LABEL_PRIME), y)
    np.testing.assert_array_equal(reconstruct(X_P, X_A, p.ring_bits)[:, -1], 2 ** p.data_frac_bits)
