"""HESV with the paper's Matrix Squaring packing (§4.2) equals the plaintext FSV, like Matrix Reducing."""

import numpy as np
import pytest

from flwr_fedeval.shapley.fsv import federated_shapley
from flwr_fedeval.shapley.hesv import HESV
from flwr_fedeval.shapley.secsv import quantize_weights


@pytest.fixture(scope="module")
def case():
    r = np.random.default_rng(11)
    d, M = 6, 60
    X = r.uniform(0, 1, (M, d))
    y = (X @ r.normal(size=d) > 0.0).astype(int)
    owners = np.repeat([0, 1, 2], M // 3)
    rounds = [{i: r.normal(scale=0.8, size=(2, d + 1)) for i in range(3)}]
    w = quantize_weights({0: 300, 1: 120, 2: 500}, bits=8)
    return X, y, owners, rounds, w


@pytest.mark.parametrize("binary_margin", [False, True])
def test_hesv_squaring_equals_plaintext_and_rotates(case, binary_margin):
    X, y, owners, rounds, w = case
    ref = federated_shapley(rounds, w, X, y, n_classes=2)
    # batch of 7 (tile order 8, or 7 with one output row): 3 batches per owner, the last partly empty
    h = HESV(X, y, owners, n_classes=2, packing="squaring", batch_size=7, binary_margin=binary_margin)
    res = h.run(rounds, w)
    assert np.abs(res.fsv - ref.fsv).max() < 1e-3
    lay = h.layout
    assert lay is not None and lay.d_in == X.shape[1] + 1 and lay.d_out == (1 if binary_margin else 2)
    batches = 3 * 3 * 7            # 3 owners x 3 batches (7 + 7 + 6), 7 coalitions
    assert h.stats.batches == batches
    assert h.stats.ct_ct_mults == batches * lay.mults_per_batch
    assert h.stats.extra["rotations"] == batches * lay.rotations_per_batch > 0


def test_hesv_reducing_does_not_rotate(case):
    X, y, owners, rounds, w = case
    h = HESV(X, y, owners, n_classes=2)
    h.run(rounds, w)
    assert h.stats.extra["rotations"] == 0
    assert h.stats.ct_ct_mults == h.stats.batches * (X.shape[1] + 1)


def test_hesv_refuses_unknown_packing_and_oversized_batch(case):
    X, y, owners, _, _ = case
    with pytest.raises(ValueError, match="packing"):
        HESV(X, y, owners, n_classes=2, packing="squared")
    with pytest.raises(ValueError, match="batch_size"):
        HESV(X, y, owners, n_classes=2, packing="squaring", batch_size=65)   # tile order is 8 here


def test_hesv_squaring_three_classes_equals_plaintext():
    """d_out = 3: tiles of ℓ = 3 rows (order 6 for d_in = 5), one rotation per batch."""
    r = np.random.default_rng(3)
    d, M = 4, 36
    X = r.uniform(0, 1, (M, d))
    y = np.argmax(X @ r.normal(size=(d, 3)), axis=1)
    owners = np.repeat([0, 1, 2], M // 3)
    rounds = [{i: r.normal(scale=0.8, size=(3, d + 1)) for i in range(3)}]
    w = quantize_weights({0: 50, 1: 80, 2: 20}, bits=6)
    ref = federated_shapley(rounds, w, X, y, n_classes=3)
    h = HESV(X, y, owners, n_classes=3, packing="squaring")
    res = h.run(rounds, w)
    assert (h.layout.rows, h.layout.order, h.layout.rotations_per_batch) == (3, 6, 1)
    assert np.abs(res.fsv - ref.fsv).max() < 1e-3
    assert h.stats.extra["rotations"] == h.stats.batches > 0
