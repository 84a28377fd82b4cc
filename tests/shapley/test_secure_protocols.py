"""HESV and SecSV FSVs equal the plaintext FSVs on a small case; SecSV parameter checks."""

import numpy as np
import pytest

from flwr_fedeval.shapley.fsv import federated_shapley
from flwr_fedeval.shapley.hesv import HESV
from flwr_fedeval.shapley.secsv import SecSV, SecSVParams, quantize_weights


@pytest.fixture(scope="module")
def case():
    r = np.random.default_rng(5)
    d, M = 6, 90
    X = r.uniform(0, 1, (M, d))
    y = (X @ r.normal(size=d) > 0.0).astype(int)
    owners = np.repeat([0, 1, 2], M // 3)
    rounds = [{i: r.normal(scale=0.8, size=(2, d + 1)) for i in range(3)} for _ in range(1)]
    w = quantize_weights({0: 300, 1: 120, 2: 500}, bits=8)
    return X, y, owners, rounds, w


def test_secsv_with_and_without_sample_skip_equals_plaintext(case):
    X, y, owners, rounds, w = case
    ref = federated_shapley(rounds, w, X, y, n_classes=2)
    s = SecSV(X, y, owners, n_classes=2, params=SecSVParams(n_features=X.shape[1], max_clients=3))
    full = s.run(rounds, w)
    assert np.abs(full.fsv - ref.fsv).max() < 1e-3
    skip = s.run(rounds, w, sample_skip=True)
    assert np.abs(skip.fsv - ref.fsv).max() < 1e-3
    assert skip.skipped_samples > 0


def test_hesv_equals_plaintext(case):
    X, y, owners, rounds, w = case
    ref = federated_shapley(rounds[:1], w, X, y, n_classes=2)
    h = HESV(X, y, owners, n_classes=2)
    res = h.run(rounds[:1], w)
    assert np.abs(res.fsv - ref.fsv).max() < 1e-3
    assert h.stats.ct_ct_mults > 0


def test_secsv_params_refuse_limbs_beyond_exact_ckks_range():
    with pytest.raises(ValueError, match="exact-integer"):
        SecSVParams(limb_bits=30)


def test_secsv_params_refuse_scores_that_wrap_around():
    with pytest.raises(ValueError, match="wrap"):
        SecSVParams(ring_bits=30, limb_bits=10)


def test_quantize_weights_keeps_every_client_positive():
    assert quantize_weights({0: 10_000, 1: 3}, bits=8) == {0: 255, 1: 1}


def test_secsv_binary_margin_layout_equals_plaintext(case):
    X, y, owners, rounds, w = case
    ref = federated_shapley(rounds, w, X, y, n_classes=2, sample_skip=True)
    s = SecSV(X, y, owners, n_classes=2, binary_margin=True,
              params=SecSVParams(n_features=X.shape[1], max_clients=3))
    assert s.d_out == 1 and s.m == s.params.ckks.slot_count
    res = s.run(rounds, w, sample_skip=True)
    assert np.abs(res.fsv - ref.fsv).max() < 1e-3


def test_secsv_params_refuse_a_backend_without_exact_integer_range():
    from flwr_fedeval.fhe.backend import CKKSParams

    with pytest.raises(ValueError, match="tenseal"):
        SecSVParams(ckks=CKKSParams.default("openfhe"))
