"""Semi-honest FHE AUC (Baykara et al. 2025, §IV-C) against the plaintext reference."""

from __future__ import annotations

import numpy as np
import pytest
from tiled_scores import tiled_counts

from flwr_fedeval.fhe import auc as fa
from flwr_fedeval.fhe.backend import SerializationError, unpack_blobs
from flwr_fedeval.metrics.auc import UndefinedAUCError, auc_from_counts, resolution_bound
from flwr_fedeval.metrics.counts import closed_tf_vectors, decision_points, threshold_counts


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
    return sum(counts)


def _rows(counts):
    tot = _total(counts)
    return tot.n_positive + tot.n_negative


def _run(ks, counts, cfg):
    msgs = [fa.client_encrypt_counts(ks.client, c, config=cfg) for c in counts]
    result = fa.aggregate_auc(ks.server, msgs, config=cfg)
    return fa.client_decrypt_auc(ks.client, result, config=cfg), result


@pytest.mark.parametrize("n_clients,n_points,seed", [(1, 10, 0), (3, 25, 1), (7, 50, 2)])
def test_semi_honest_auc_equals_plaintext_trapezoid(keysets, n_clients, n_points, seed):
    ks = keysets(n_points + 1)
    counts = _clients(n_clients, n_points, seed)
    cfg = fa.FHEAUCConfig(n_points=n_points, max_rows=80 * n_clients)
    res, _ = _run(ks, counts, cfg)
    assert res.auc == pytest.approx(auc_from_counts(_total(counts)), abs=1e-6)
    assert res.resolution_bound == pytest.approx(resolution_bound(_total(counts)), abs=1e-6)


def test_decrypting_every_slot_reveals_only_the_masked_pair(keysets):
    ks = keysets(26)
    counts = _clients(3, 25, 3)
    cfg = fa.FHEAUCConfig(n_points=25, max_rows=_rows(counts))
    res, result = _run(ks, counts, cfg)
    tot = _total(counts)
    for blob in unpack_blobs(result, expected=3):
        slots = ks.client.decrypt(ks.client.deserialize_ciphertext(blob))
        assert abs(slots[0]) > 1e-3
        assert np.abs(slots[1:]).max() < 1e-7 * abs(slots[0])  # noise only, no T^n·F^n
    # The pair is masked: c = num'/num lies in the mask range and is not 1.
    num = sum(int(a) * int(b) for a, b in zip(*closed_tf_vectors(tot)))
    c = res.num_masked / (num / cfg.count_scale**2)
    assert cfg.mask_range[0] <= c <= cfg.mask_range[1]


def test_single_class_client_is_fine_but_single_class_pool_is_undefined(keysets):
    ks = keysets(11)
    th = decision_points(10)
    pos_only = threshold_counts(np.ones(5, int), np.linspace(0.2, 0.9, 5), th)
    neg_only = threshold_counts(np.zeros(6, int), np.linspace(0.1, 0.7, 6), th)
    cfg = fa.FHEAUCConfig(n_points=10, max_rows=16)  # 11 rows; power-of-two declarations
    res, _ = _run(ks, [pos_only, neg_only], cfg)
    assert res.auc == pytest.approx(auc_from_counts(pos_only + neg_only), abs=1e-6)
    with pytest.raises(UndefinedAUCError):
        _run(ks, [pos_only, pos_only], cfg)


def test_n1000_logit_points_equal_plaintext(keysets):
    counts = _clients(4, 1000, 11, spacing="logit")
    ks = keysets(1001)
    cfg = fa.FHEAUCConfig(n_points=1000, max_rows=_rows(counts))
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
    cfg = fa.FHEAUCConfig(n_points=1000, max_rows=int(yte.size))
    res, _ = _run(ks, counts, cfg)
    assert res.auc == pytest.approx(auc_from_counts(_total(counts)), abs=1e-6)
    assert res.auc == pytest.approx(roc_auc_score(yte, score), abs=1e-3)


def test_client_upload_size(keysets, backend_name):
    ks = keysets(101)
    msg = fa.client_encrypt_counts(ks.client, _clients(1, 100)[0], config=fa.FHEAUCConfig(n_points=100, max_rows=1000))
    if backend_name == "tenseal":
        assert len(msg) <= 1.05 * 2**20  # three ciphertexts


def test_aggregator_rejects_corrupted_and_foreign_messages(keysets):
    ks = keysets(11)
    cfg = fa.FHEAUCConfig(n_points=10, max_rows=100)
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
        fa.client_encrypt_counts(ks.client, _clients(1, 12)[0], config=fa.FHEAUCConfig(n_points=10, max_rows=100))
    for bad in (0, -3, 2.5, True, None):
        with pytest.raises(ValueError, match="max_rows"):
            fa.FHEAUCConfig(n_points=10, max_rows=bad)
    with pytest.raises(TypeError):
        fa.FHEAUCConfig(n_points=10)  # the bound is required


def test_threshold_metrics_match_plaintext(keysets):
    ks = keysets(8)
    rng = np.random.default_rng(5)
    cfg = fa.FHEAUCConfig(n_points=2, max_rows=200)
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
    cfg = fa.FHEAUCConfig(n_points=2, max_rows=10)
    msgs = [fa.client_encrypt_confusion(ks.client, 0, 0, 7, 3, config=cfg)]
    res = fa.client_decrypt_threshold_metrics(
        ks.client, fa.aggregate_threshold_metrics(ks.server, msgs, config=cfg), config=cfg)
    assert np.isnan(res.precision)
    assert res.recall == pytest.approx(0.0, abs=1e-6)
    assert res.accuracy == pytest.approx(0.7, abs=1e-6)


# --- issue 15: derived count encoding, closed curve, resolution bound, refusals

_tiled = tiled_counts


@pytest.mark.parametrize("factor", [1, 111])  # 9,049 and 1,004,439 pooled rows
def test_tiled_to_a_million_rows_equals_plaintext_with_defaults(keysets, factor):
    counts = _tiled(factor)
    ks = keysets(102)
    tot = _total(counts)
    cfg = fa.FHEAUCConfig(n_points=100, max_rows=_rows(counts))
    res, _ = _run(ks, counts, cfg)
    assert _rows(counts) >= (1_000_000 if factor > 1 else 9049)
    assert abs(res.auc - auc_from_counts(tot)) <= 1e-6
    assert abs(res.resolution_bound - resolution_bound(tot)) <= 1e-6
    assert res.ckks_error <= cfg.max_error


def test_loose_bound_is_still_exact(keysets):
    counts = _tiled(1)
    ks = keysets(102)
    cfg = fa.FHEAUCConfig(n_points=100, max_rows=4 * _rows(counts))  # e.g. power-of-two declarations
    res, _ = _run(ks, counts, cfg)
    assert abs(res.auc - auc_from_counts(_total(counts))) <= 1e-6


def test_one_row_pools_work():
    th = decision_points(5)
    cfg = fa.FHEAUCConfig(n_points=5, max_rows=2)
    assert cfg.count_scale == 0.25
    a, b, r = fa.client_vectors(threshold_counts([1], [0.7], th), config=cfg, slot_count=16)
    assert a.sum() == pytest.approx(1 / cfg.count_scale)


def test_counts_beyond_the_declaration_are_refused(keysets):
    ks = keysets(102)
    counts = _tiled(1)
    cfg = fa.FHEAUCConfig(n_points=100, max_rows=1000)
    with pytest.raises(fa.CountBoundError, match="max_rows=1000"):
        fa.client_encrypt_counts(ks.client, counts[0], config=cfg)
    cfg = fa.FHEAUCConfig(n_points=100, max_rows=_rows(counts))
    with pytest.raises(fa.CountBoundError, match="declared \\(512\\)"):
        fa.client_encrypt_counts(ks.client, counts[0], config=cfg, declared_rows=512)


def test_bound_beyond_the_parameter_set_is_refused_naming_the_maximum(keysets):
    ks = keysets(102)
    limit = fa.max_pooled_rows(ks.client.params)
    assert limit >= 10**7
    cfg = fa.FHEAUCConfig(n_points=100, max_rows=limit + 1)
    with pytest.raises(fa.CountBoundError, match=f"{limit:,}.*fix"):
        fa.client_encrypt_counts(ks.client, _tiled(1)[0], config=cfg)


def test_tiny_minority_among_many_rows_is_refused_not_wrong(keysets):
    ks = keysets(102)
    th = decision_points(100)
    rng = np.random.default_rng(1)
    counts = []
    for i in range(5):
        y = np.zeros(200_000, int)
        y[:1 if i == 0 else 0] = 1
        counts.append(threshold_counts(y, rng.random(y.size), th))
    cfg = fa.FHEAUCConfig(n_points=100, max_rows=_rows(counts))
    with pytest.raises(fa.AUCPrecisionError, match="minority class"):
        _run(ks, counts, cfg)


def test_closed_curve_under_encryption_when_points_stop_short(keysets):
    rng = np.random.default_rng(4)
    th = np.linspace(0.99, 0.01, 100)
    counts = []
    for _ in range(3):
        y = rng.integers(0, 2, 300)
        counts.append(threshold_counts(y, np.clip(rng.normal(0.3 + 0.4 * y, 0.25), 0, 1), th))
    ks = keysets(102)
    res, _ = _run(ks, counts, fa.FHEAUCConfig(n_points=100, max_rows=_rows(counts)))
    assert abs(res.auc - auc_from_counts(_total(counts))) <= 1e-6


def test_out_of_range_result_raises_never_returned(keysets):
    """An overflowing or deviating aggregate is refused, never returned outside [0, 1]."""
    ks = keysets(102)
    counts = _tiled(1)
    cfg = fa.FHEAUCConfig(n_points=100, max_rows=_rows(counts))
    msgs = [fa.client_encrypt_counts(ks.client, c, config=cfg) for c in counts]
    good = unpack_blobs(fa.aggregate_auc(ks.server, msgs, config=cfg), expected=3)
    den = float(ks.client.decrypt(ks.client.deserialize_ciphertext(good[1]))[0])
    from flwr_fedeval.fhe.backend import pack_blobs
    for value in (3.0 * den, -0.5 * den):  # AUC 3 or -0.5: what an overflow looks like
        forged = ks.server.serialize_ciphertext(ks.server.encrypt([value]))
        bad = pack_blobs([forged, *good[1:]])
        with pytest.raises(fa.AUCPrecisionError, match="outside"):
            fa.client_decrypt_auc(ks.client, bad, config=cfg)


def test_threshold_metrics_refuse_counts_beyond_the_bound(keysets):
    ks = keysets(8)
    with pytest.raises(fa.CountBoundError, match="max_rows=8"):
        fa.client_encrypt_confusion(ks.client, 5, 0, 7, 3, config=fa.FHEAUCConfig(n_points=2, max_rows=8))


def test_parameter_set_follows_the_public_row_bound():
    """The key holder's CKKS set supports max_rows (>= 10^7 on both engines), or the bound is refused."""
    from flwr_fedeval.fhe.auc import CountBoundError, ckks_params_for, max_pooled_rows
    from flwr_fedeval.fhe.backend import CKKSParams

    for backend in ("tenseal", "openfhe"):
        small = ckks_params_for(backend, 102, 9_049)
        assert small == CKKSParams.for_slots(102, backend) and max_pooled_rows(small) >= 9_049
    for backend in ("tenseal", "openfhe"):
        assert max_pooled_rows(ckks_params_for(backend, 102, 10**7)) >= 10**7
    with pytest.raises(CountBoundError, match="exceeds the maximum"):
        ckks_params_for("tenseal", 102, max_pooled_rows(CKKSParams.default("tenseal")) + 1)
