"""Loader for the UCI Bank Marketing data set (``bank-full.csv``).

45,211 rows, 16 attributes, binary target ``y`` ("has the client subscribed a
term deposit?", 11.7 % yes). Encoded to the **48 features** used by Zheng et
al. (PVLDB 2023):

* 7 numeric columns as they are: ``age, balance, day, duration, campaign,
  pdays, previous``;
* 3 yes/no columns as one 0/1 feature each: ``default, housing, loan``;
* 6 categorical columns one-hot over their full, fixed category lists
  (``job`` 12, ``marital`` 3, ``education`` 4, ``contact`` 3, ``month`` 12,
  ``poutcome`` 4 = 38 features, ``"unknown"`` kept as its own category).

7 + 3 + 38 = 48. The category lists are fixed (from the UCI description), so
every subset of the file yields the same columns in the same order. No scaling
is applied (fit a scaler on the training split only).

The data stay where they are: the path is an argument, nothing is copied.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BANK_FEATURE_NAMES", "N_FEATURES", "load_bank_marketing"]

_NUMERIC = ("age", "balance", "day", "duration", "campaign", "pdays", "previous")
_BINARY = ("default", "housing", "loan")
_CATEGORICAL: dict[str, tuple[str, ...]] = {
    "job": ("admin.", "blue-collar", "entrepreneur", "housemaid", "management", "retired",
            "self-employed", "services", "student", "technician", "unemployed", "unknown"),
    "marital": ("divorced", "married", "single"),
    "education": ("primary", "secondary", "tertiary", "unknown"),
    "contact": ("cellular", "telephone", "unknown"),
    "month": ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
    "poutcome": ("failure", "other", "success", "unknown"),
}
_TARGET = "y"
_COLUMNS = ("age", "job", "marital", "education", "default", "balance", "housing", "loan", "contact",
            "day", "month", "duration", "campaign", "pdays", "previous", "poutcome", _TARGET)

BANK_FEATURE_NAMES: tuple[str, ...] = (
    _NUMERIC
    + _BINARY
    + tuple(f"{col}={cat}" for col, cats in _CATEGORICAL.items() for cat in cats)
)
N_FEATURES = len(BANK_FEATURE_NAMES)
assert N_FEATURES == 48


def _yes_no(values: Any, column: str) -> np.ndarray:
    values = np.asarray(values, dtype=object)
    bad = ~np.isin(values, ("yes", "no"))
    if bad.any():
        raise ValueError(f"column {column!r} must be 'yes'/'no', found {sorted(set(values[bad].tolist()))[:5]}")
    out: np.ndarray = (values == "yes").astype(np.float32)
    return out


def load_bank_marketing(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Load and encode ``bank-full.csv`` (or ``bank.csv``) of UCI Bank Marketing.

    Parameters
    ----------
    path : str or path-like
        The CSV file (``;``-separated, quoted strings, header row, target ``y``
        with values ``yes``/``no``), or a directory that contains ``bank-full.csv``.

    Returns
    -------
    X : ndarray of shape (n_samples, 48), dtype float32
        Encoded features in the order of :data:`BANK_FEATURE_NAMES`.
    y : ndarray of shape (n_samples,), dtype int64
        1 = ``yes`` (subscribed), 0 = ``no``.
    feature_names : list of str, length 48

    Raises
    ------
    FileNotFoundError
        If ``path`` (or ``path/bank-full.csv``) does not exist.
    ValueError
        If the file is not the expected format: missing columns, missing
        values, non-numeric numeric columns, unknown categories or targets.
    """
    from flwr_fedeval._extras import require

    pd = require("pandas", purpose="the bank-marketing loader")  # keep import cost off the protocol layers

    path = Path(path)
    if path.is_dir():
        path = path / "bank-full.csv"
    if not path.is_file():
        raise FileNotFoundError(
            f"bank-marketing CSV not found at {str(path)!r} (expected bank-full.csv from "
            "https://archive.ics.uci.edu/dataset/222/bank+marketing)"
        )
    try:
        frame = pd.read_csv(path, sep=";", quotechar='"', dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot parse {str(path)!r} as ';'-separated CSV: {exc}") from exc
    missing = [c for c in _COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{str(path)!r} lacks columns {missing}; found {list(frame.columns)[:20]} "
            "(is it ';'-separated bank-full.csv?)"
        )
    if len(frame) == 0:
        raise ValueError(f"{str(path)!r} has a header but no rows")
    frame = frame.apply(lambda col: col.str.strip())
    empty = [c for c in _COLUMNS if (frame[c] == "").any()]
    if empty:
        raise ValueError(f"{str(path)!r} has missing values in columns {empty}")

    n = len(frame)
    X = np.empty((n, N_FEATURES), dtype=np.float32)
    j = 0
    for col in _NUMERIC:
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=np.float64)
        if np.isnan(values).any():
            row = int(np.flatnonzero(np.isnan(values))[0])
            raise ValueError(f"column {col!r} must be numeric, row {row} has {frame[col].iloc[row]!r}")
        X[:, j] = values
        j += 1
    for col in _BINARY:
        X[:, j] = _yes_no(frame[col].to_numpy(), col)
        j += 1
    for col, cats in _CATEGORICAL.items():
        values = frame[col].to_numpy(dtype=object)
        unknown = set(values.tolist()) - set(cats)
        if unknown:
            raise ValueError(f"column {col!r} has unknown categories {sorted(unknown)[:5]}; expected {list(cats)}")
        for cat in cats:
            X[:, j] = values == cat
            j += 1
    target = frame[_TARGET].to_numpy(dtype=object)
    bad = ~np.isin(target, ("yes", "no"))
    if bad.any():
        raise ValueError(f"target {_TARGET!r} must be 'yes'/'no', found {sorted(set(target[bad].tolist()))[:5]}")
    y = (target == "yes").astype(np.int64)
    return X, y, list(BANK_FEATURE_NAMES)
