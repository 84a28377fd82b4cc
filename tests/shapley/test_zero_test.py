"""The zero test of SecSV (flwr_fedeval.shapley.zerotest): P opens r·(Ŷ − Y), never Ŷ − Y (issue 22, item 3)."""

import numpy as np
import pytest

from flwr_fedeval.shapley.sharing import LABEL_PRIME, random_field, share_field
from flwr_fedeval.shapley.zerotest import aux_share, deal, mask_label_share, open_zero_test

P = LABEL_PRIME


def _run(pred, y, e_shift=0):
    y_P, y_A = share_field(np.asarray(y, dtype=np.uint64), P)
    deal_P, deal_A = deal(np.asarray(pred, dtype=np.uint64))
    e = (mask_label_share(y_P, deal_P) + np.uint64(e_shift)) % np.uint64(P)
    f, z_A = aux_share(deal_A, y_A, e)
    ok, z = open_zero_test(deal_P, e, f, z_A)
    return ok, z, (deal_P, deal_A, e, f, z_A)


@pytest.mark.parametrize("n_classes", [2, 3, 10])
def test_opens_zero_exactly_for_correct_predictions(n_classes):
    r = np.random.default_rng(n_classes)
    y = r.integers(0, n_classes, 2000)
    pred = r.integers(0, n_classes, 2000)
    ok, z, _ = _run(pred, y)
    np.testing.assert_array_equal(ok, pred == y)
    assert np.all(z[pred != y] != 0)


def test_misclassified_values_carry_no_label():
    """Binary task: the paper's opening gives Ŷ − Y = ±1, whose sign is the label (symptom 3).
    The opened r·(Ŷ − Y) of a misclassified sample is uniform on F_p^*, whatever the label."""
    n = 4000
    y = np.repeat([0, 1], n // 2)
    pred = 1 - y                                   # every sample misclassified
    _, z, _ = _run(pred, y)
    signed = np.where(z > P // 2, z.astype(np.int64) - P, z.astype(np.int64))
    guess = (signed < 0).astype(int)              # the symptom-3 attack: Ŷ − Y = −1 ⇒ y = 1
    accuracy = float(np.mean(guess == y))
    assert 0.45 < accuracy < 0.55, accuracy        # chance level (±4.5 σ at n = 4000)
    assert len(np.unique(z)) > n - 5               # fresh r per sample: no repeated values
    for label in (0, 1):                           # same distribution for both labels: mean ~ p/2
        assert abs(z[y == label].mean() / P - 0.5) < 0.03


def test_every_message_p_sees_is_uniform_and_a_wrong_e_opens_noise():
    y = np.zeros(3000, dtype=np.uint64)
    ok, _, (deal_P, _, _, f, _) = _run(y, y)
    assert ok.all()
    for arr in (deal_P.q, deal_P.u, deal_P.c, f):
        assert abs(arr.mean() / P - 0.5) < 0.03 and len(np.unique(arr)) > 2990
    ok_shift, z_shift, _ = _run(y, y, e_shift=1)   # P deviates in e: opens r·0 + δ·v, noise
    assert ok_shift.sum() < 3 and abs(z_shift.mean() / P - 0.5) < 0.03


def test_refuses_values_outside_the_field():
    y_P, y_A = share_field(np.array([0, 1], dtype=np.uint64), P)
    deal_P, deal_A = deal(np.array([1, 1], dtype=np.uint64))
    with pytest.raises(ValueError, match="F_p"):
        aux_share(deal_A, y_A, np.array([P, 0], dtype=np.uint64))
    with pytest.raises(ValueError, match="shape"):
        aux_share(deal_A, y_A, np.zeros(3, dtype=np.uint64))
    with pytest.raises(ValueError, match="F_"):
        share_field(np.array([P], dtype=np.uint64), P)


def test_random_field_is_in_range_and_covers_it():
    v = random_field(100_000, 7)
    assert v.dtype == np.uint64 and v.max() == 6 and v.min() == 0
    counts = np.bincount(v.astype(np.int64), minlength=7)
    assert counts.min() > 100_000 / 7 * 0.9


def test_every_package_module_ships_in_the_fab():
    """Flower's FAB builder drops ``*_test.py`` / ``test_*.py``: a package module so named would be
    missing on a deployment engine (this module was ``zero_test.py`` once)."""
    import io
    import zipfile
    from pathlib import Path

    from flwr.cli.build import build_fab_from_files, collect_files

    import flwr_fedeval

    root = Path(flwr_fedeval.__file__).parents[1]
    fab, _ = build_fab_from_files(collect_files(root))
    shipped = set(zipfile.ZipFile(io.BytesIO(fab)).namelist())
    modules = {p.relative_to(root).as_posix() for p in (root / "flwr_fedeval").rglob("*.py")}
    assert "flwr_fedeval/shapley/zerotest.py" in modules
    assert modules <= shipped, sorted(modules - shipped)
