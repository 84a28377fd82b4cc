"""WeightLayout.difference: new − old flattened in one buffer (flwr_fedeval.weights)."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fedeval.weights import WeightLayout

DATA = np.random.default_rng(7)  # test data


def test_difference_equals_flatten_minus_flatten_for_mixed_dtypes():
    old = [
        DATA.normal(size=(3, 4)).astype(np.float32),
        DATA.normal(size=5).astype(np.float16),
        np.array(7, dtype=np.int64),
    ]
    new = [
        DATA.normal(size=(3, 4)).astype(np.float32),
        DATA.normal(size=5).astype(np.float16),
        np.array(9, dtype=np.int64),
    ]
    layout = WeightLayout.of(old)
    got = layout.difference(new, old)
    assert got.dtype == np.float64 and got.shape == (layout.size,)
    np.testing.assert_array_equal(got, layout.flatten(new) - layout.flatten(old))
    assert got[-1] == 2.0


def test_difference_refuses_nan_and_shape_mismatch_in_either_list():
    layout = WeightLayout.of([np.zeros((2, 3), np.float32), np.zeros(3, np.float32)])
    good = [np.ones((2, 3), np.float32), np.ones(3, np.float32)]
    bad = [np.ones((2, 3), np.float32), np.array([1.0, np.nan, 1.0], np.float32)]
    for new, old in ((bad, good), (good, bad)):
        with pytest.raises(ValueError, match="flat index 7"):
            layout.difference(new, old)
    with pytest.raises(ValueError, match="layout expects"):
        layout.difference(good, [np.ones((3, 2), np.float32), np.ones(3, np.float32)])
    with pytest.raises(ValueError, match="expected 2 arrays"):
        layout.difference(good, good[:1])
