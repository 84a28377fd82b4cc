"""Bank-marketing loader: 48 features (Zheng et al., PVLDB 2023), clear errors."""

from pathlib import Path

import numpy as np
import pytest

from flwr_fedeval.data.bank_marketing import BANK_FEATURE_NAMES, load_bank_marketing

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
BANK_FULL = SHARED_DATA / "bank-marketing" / "bank-full.csv"

HEADER = ('"age";"job";"marital";"education";"default";"balance";"housing";"loan";"contact";"day";"month";'
          '"duration";"campaign";"pdays";"previous";"poutcome";"y"\n')
ROW_YES = '30;"student";"single";"tertiary";"no";100;"yes";"no";"cellular";3;"jun";200;1;-1;0;"unknown";"yes"\n'
ROW_NO = '58;"management";"married";"tertiary";"no";2143;"yes";"no";"unknown";5;"may";261;1;-1;0;"unknown";"no"\n'


def test_small_file_is_encoded_to_48_float32_features(tmp_path):
    f = tmp_path / "bank.csv"
    f.write_text(HEADER + ROW_YES + ROW_NO)
    X, y, names = load_bank_marketing(f)
    assert X.shape == (2, 48) and X.dtype == np.float32
    assert y.dtype == np.int64 and y.tolist() == [1, 0]
    assert names == list(BANK_FEATURE_NAMES) and len(set(names)) == 48
    row = dict(zip(names, X[0]))
    assert row["age"] == 30 and row["housing"] == 1 and row["default"] == 0
    assert row["job=student"] == 1 and row["month=jun"] == 1 and row["poutcome=unknown"] == 1
    assert X[:, names.index("job=admin."):].sum(axis=1).tolist() == [6, 6]  # one hot per categorical


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="bank-full.csv"):
        load_bank_marketing(tmp_path / "nope")


def test_comma_separated_file_raises_value_error(tmp_path):
    f = tmp_path / "bank.csv"
    f.write_text((HEADER + ROW_YES).replace(";", ","))
    with pytest.raises(ValueError, match="lacks columns"):
        load_bank_marketing(f)


def test_unknown_category_and_target_raise_value_error(tmp_path):
    f = tmp_path / "bank.csv"
    f.write_text(HEADER + ROW_YES.replace('"student"', '"astronaut"'))
    with pytest.raises(ValueError, match="astronaut"):
        load_bank_marketing(f)
    f.write_text(HEADER + ROW_YES.replace('"yes"\n', '"maybe"\n'))
    with pytest.raises(ValueError, match="maybe"):
        load_bank_marketing(f)


def test_non_numeric_value_raises_value_error(tmp_path):
    f = tmp_path / "bank.csv"
    f.write_text(HEADER + ROW_YES.replace("30;", "thirty;", 1))
    with pytest.raises(ValueError, match="age"):
        load_bank_marketing(f)


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent on this machine")
def test_full_file_has_45211_rows_and_5289_positives():
    X, y, _ = load_bank_marketing(BANK_FULL.parent)  # a directory works too
    assert X.shape == (45211, 48)
    assert int(y.sum()) == 5289
    assert np.isfinite(X).all()
