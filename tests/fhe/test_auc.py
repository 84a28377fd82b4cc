"""Semi-honest FHE AUC (Baykara et al. 2025, §IV-C) against the plaintext reference."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fedeval.fhe import auc as fa
from flwr_fedeval.fhe.backend import SerializationError, unpack_blobs
from flwr_fedeval.fhe.counts import decision_points, tf_vectors, threshold_counts
from flwr_fedeval.metrics.auc import UndefinedAUCError, auc_from_counts


def _clients(n_clients, n_points, seed=0, size=(20, 80), spacing="linear"):
    rng = np.random.default_rng(seed)
    th = decision_points(n_points, spacing=spacing)
    out = []
    for _ in range(n_clients):
        n = int(rng.integers(*size))
        y = rng.integers(0, 2, n)
        s = np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1)
        out.append(threshold_counts(y, s, th))
    return out


def _total(counts):
    tot = counts[0]
    for c in counts[1:]:
        tot = tot + c
    return tot


def _run(ks, counts, cfg):
    msgs = [fa.client_encrypt_counts(ks.client, c, config=cfg) for c in counts]
    result = fa.aggregate_auc(ks.server, msgs, config=cfg)
    return fa.client_decrypt_auc(ks.client, result, config=cfg), result


@pytest.mark.parametrize("n_clients,n_points,seed", [(1, 10, 0), (3, 25, 1), (7, 50, 2)])
def test_semi_honest_auc_equals_plaintext_trapezoid(keysets, n_clients, n_points, seed):
    ks = keysets(n_points + 1)
    counts = _clients(n_clients, n_points, seed)
    cfg = fa.FHEAUCConfig(n_points=n_points, count_scale=fa.suggest_count_scale(50 * n_clients))
    res, _ = _run(ks, counts, cfg)
    assert res.auc == pytest.approx(auc_from_counts(_total(counts)), abs=1e-6)


def test_decrypting_every_slot_reveals_only_the_masked_pair(keysets):
    ks = keysets(26)
    counts = _clients(3, 25, 3)
    cfg = fa.FHEAUCConfig(n_points=25, count_scale=64)
    res, result = _run(ks, counts, cfg)
    tot = _total(counts)
    for blob in unpack_blobs(result, expected=2):
        slots = ks.client.decrypt(ks.client.deserialize_ciphertext(blob))
        assert abs(slots[0]) > 1e-3
        assert np.abs(slots[1:]).max() < 1e-7 * abs(slots[0])  # noise only, no T^n·F^n
    # The pair is masked: c = num'/num lies in the mask range and is not 1.
    num = sum(int(a) * int(b) for a, b in zip(*tf_vectors(tot.tp, tot.fp)))
    c = res.num_masked / (num / cfg.count_scale**2)
    assert cfg.mask_range[0] <= c <= cfg.mask_range[1]


def test_single_class_client_is_fine_but_single_class_pool_is_undefined(keysets):
    ks = keysets(11)
    th = decision_points(10)
    pos_only = threshold_counts(np.ones(5, int), np.linspace(0.2, 0.9, 5), th)
    neg_only = threshold_counts(np.zeros(6, int), np.linspace(0.1, 0.7, 6), th)
    cfg = fa.FHEAUCConfig(n_points=10, count_scale=8)
    res, _ = _run(ks, [pos_only, neg_only], cfg)
    assert res.auc == pytest.approx(auc_from_counts(pos_only + neg_only), abs=1e-6)
    with pytest.raises(UndefinedAUCError):
        _run(ks, [pos_only, pos_only], cfg)


def test_n1000_logit_points_equal_plaintext(keysets):
    counts = _clients(4, 1000, 11, spacing="logit")
    ks = keysets(1001)
    cfg = fa.FHEAUCConfig(n_points=1000, count_scale=fa.suggest_count_scale(200))
    res, _ = _run(ks, counts, cfg)
    assert res.auc == pytest.approx(auc_from_counts(_total(counts)), abs=1e-6)


def test_breast_cancer_n1000_matches_roc_auc_score(keysets):
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = load_breast_cancer(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.5, random_state=0, stratify=y)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(xtr, ytr)
    score = model.predict_proba(xte)[:, 1]
    th = decision_points(1000, spacing="logit")
    parts = np.array_split(np.arange(yte.size), 4)
    counts = [threshold_counts(yte[p], score[p], th) for p in parts]
    ks = keysets(1001)
    cfg = fa.FHEAUCConfig(n_points=1000, count_scale=fa.suggest_count_scale(yte.size))
    res, _ = _run(ks, counts, cfg)
    assert res.auc == pytest.approx(auc_from_counts(_total(counts)), abs=1e-6)
    assert res.auc == pytest.approx(roc_auc_score(yte, score), abs=1e-3)


def test_client_upload_size(keysets, backend_name):
    ks = keysets(101)
    msg = fa.client_encrypt_counts(ks.client, _clients(1, 100)[0], config=fa.FHEAUCConfig(n_points=100))
    if backend_name == "tenseal":
        assert len(msg) <= 0.7 * 2**20


def test_aggregator_rejects_corrupted_and_foreign_messages(keysets):
    ks = keysets(11)
    cfg = fa.FHEAUCConfig(n_points=10, count_scale=8)
    good = fa.client_encrypt_counts(ks.client, _clients(1, 10)[0], config=cfg)
    bad = bytearray(good)
    bad[-100] ^= 0xFF
    with pytest.raises(SerializationError, match="client message 1"):
        fa.aggregate_auc(ks.server, [good, bytes(bad)], config=cfg)
    with pytest.raises(SerializationError):
        fa.aggregate_auc(ks.server, [good[:-5]], config=cfg)


def test_counts_must_match_config(keysets):
    ks = keysets(11)
    with pytest.raises(ValueError, match="decision points"):
        fa.client_encrypt_counts(ks.client, _clients(1, 12)[0], config=fa.FHEAUCConfig(n_points=10))
    with pytest.raises(ValueError, match="count_scale"):
        fa.FHEAUCConfig(n_points=10, count_scale=0)


def test_threshold_metrics_match_plaintext(keysets):
    ks = keysets(8)
    rng = np.random.default_rng(5)
    cfg = fa.FHEAUCConfig(n_points=2, count_scale=64)
    tot = np.zeros(4, dtype=np.int64)
    msgs = []
    for _ in range(3):
        n = int(rng.integers(20, 60))
        y = rng.integers(0, 2, n)
        s = np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1)
        c = threshold_counts(y, s, [0.5])
        four = np.array([c.tp[0], c.fp[0], c.tn[0], c.fn[0]])
        tot += four
        msgs.append(fa.client_encrypt_confusion(ks.client, *map(int, four), config=cfg))
    res = fa.client_decrypt_threshold_metrics(
        ks.client, fa.aggregate_threshold_metrics(ks.server, msgs, config=cfg), config=cfg)
    tp, fp, tn, fn = tot
    assert res.accuracy == pytest.approx((tp + tn) / tot.sum(), abs=1e-6)
    assert res.precision == pytest.approx(tp / (tp + fp), abs=1e-6)
    assert res.recall == pytest.approx(tp / (tp + fn), abs=1e-6)
    assert res.f1 == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-6)


def test_threshold_metrics_undefined_ratio_is_nan(keysets):
    ks = keysets(8)
    cfg = fa.FHEAUCConfig(n_points=2, count_scale=16)
    msgs = [fa.client_encrypt_confusion(ks.client, 0, 0, 7, 3, config=cfg)]
    res = fa.client_decrypt_threshold_metrics(
        ks.client, fa.aggregate_threshold_metrics(ks.server, msgs, config=cfg), config=cfg)
    assert np.isnan(res.precision)
    assert res.recall == pytest.approx(0.0, abs=1e-6)
    assert res.accuracy == pytest.approx(0.7, abs=1e-6)
