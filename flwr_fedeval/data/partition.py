"""Partition a loaded data set across clients with flwr-datasets partitioners.

Each client gets its own partition of the pooled data (IID or Dirichlet
non-IID over the labels), then splits it into its own train and test part.
Only sample *indices* and labels go through ``datasets.Dataset``: the
features stay in the numpy array the loader returned, so partitioning image
data costs no copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["ClientSplit", "PartitionError", "partition_indices", "split_sizes", "check_partitions", "client_split"]

Partitioning = Literal["iid", "dirichlet"]


@dataclass(frozen=True)
class ClientSplit:
    """One client's private data.

    Attributes
    ----------
    x_train, x_test : ndarray of shape (n, *feature_shape)
    y_train, y_test : ndarray of shape (n,), dtype int64
    train_index, test_index : ndarray of shape (n,), dtype int64
        Row indices into the pooled data set (for tests and the harness).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    train_index: np.ndarray
    test_index: np.ndarray


class PartitionError(ValueError):
    """The data cannot be split as configured (raised before any training).

    The message is one line naming the problem, how many clients it hits,
    and the fix.
    """


def split_sizes(n_rows: int, test_fraction: float) -> tuple[int, int]:
    """``(n_train, n_test)`` of a partition of ``n_rows`` rows.

    scikit-learn's rule for a float ``test_size``: ``n_test = ⌈test_fraction·n⌉``,
    the rest is train.
    """
    n_test = int(math.ceil(test_fraction * n_rows))
    return n_rows - n_test, n_test


def check_partitions(
    y: np.ndarray,
    partitions: list[np.ndarray],
    *,
    test_fraction: float,
    method: str = "iid",
) -> None:
    """Refuse a partitioning that leaves a client unable to train or evaluate.

    Every client's test split and train split must hold at least as many
    samples as the data set has classes (a stratified split of fewer rows is
    impossible, and a one-sample test split cannot hold both classes).
    Partitions that lack a class altogether (skewed Dirichlet partitions)
    are accepted: :func:`client_split` splits them without stratification.

    Raises
    ------
    PartitionError
        One line: the number of clients hit, example partition ids, the split
        sizes, and the fix (fewer clients or another ``test_fraction``).
    """
    y = np.asarray(y)
    n_classes = max(int(np.unique(y).size), 1)
    short_test, short_train = [], []
    for pid, rows in enumerate(partitions):
        n_train, n_test = split_sizes(len(rows), test_fraction)
        if n_test < n_classes:
            short_test.append((pid, n_test))
        elif n_train < n_classes:
            short_train.append((pid, n_train))
    if not short_test and not short_train:
        return
    num = len(partitions)
    hint = "use fewer clients"
    if method == "iid":
        best = max((k for k in range(1, num + 1)
                    if min(split_sizes(y.size // k, test_fraction)) >= n_classes), default=0)
        hint = f"use at most {best} clients" if best else "this data set is too small to split"
    where = f"partitioning {y.size} samples into {num} clients ({method}, test-fraction {test_fraction:g})"
    if short_test:
        ids = ", ".join(str(p) for p, _ in short_test[:5]) + (", ..." if len(short_test) > 5 else "")
        smallest = min(n for _, n in short_test)
        raise PartitionError(
            f"{where} gives {len(short_test)} client(s) a test split of {smallest} sample(s), fewer than "
            f"the {n_classes} classes (partition {ids}): {hint} or raise test-fraction")
    ids = ", ".join(str(p) for p, _ in short_train[:5]) + (", ..." if len(short_train) > 5 else "")
    smallest = min(n for _, n in short_train)
    raise PartitionError(
        f"{where} gives {len(short_train)} client(s) a train split of {smallest} sample(s), fewer than "
        f"the {n_classes} classes (partition {ids}): {hint} or lower test-fraction")


def _check_partition_args(num_partitions: int, partition_id: int | None = None) -> None:
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, (int, np.integer)) or num_partitions < 1:
        raise ValueError(f"num_partitions must be a positive integer, got {num_partitions!r}")
    if partition_id is not None and not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition_id must be in [0, {num_partitions - 1}], got {partition_id!r}"
        )


def partition_indices(
    y: np.ndarray,
    num_partitions: int,
    *,
    method: Partitioning = "iid",
    alpha: float = 0.5,
    seed: int = 42,
    min_partition_size: int = 10,
) -> list[np.ndarray]:
    """Disjoint row indices of every partition, deterministic per ``seed``.

    Parameters
    ----------
    y : array-like of shape (n_samples,)
        Labels of the pooled data (used by the Dirichlet partitioner).
    num_partitions : int
        Number of clients.
    method : {"iid", "dirichlet"}, default="iid"
        ``"iid"``: :class:`flwr_datasets.partitioner.IidPartitioner` over a
        seeded shuffle. ``"dirichlet"``:
        :class:`flwr_datasets.partitioner.DirichletPartitioner` over the
        labels with concentration ``alpha`` (smaller = more skewed).
    alpha : float, default=0.5
        Dirichlet concentration.
    seed : int, default=42
    min_partition_size : int, default=10
        Dirichlet only: resample until every partition has this many rows
        (lowered automatically when the data set is too small for it).

    Returns
    -------
    list of ndarray of dtype int64
        ``num_partitions`` disjoint, sorted index arrays covering all rows.
    """
    from flwr_fedeval._extras import require

    Dataset = require("datasets", extra="app", purpose="partitioning (flwr-datasets)").Dataset
    partitioner = require("flwr_datasets.partitioner", extra="app", purpose="partitioning (flwr-datasets)")
    DirichletPartitioner, IidPartitioner = partitioner.DirichletPartitioner, partitioner.IidPartitioner

    _check_partition_args(num_partitions)
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D, got shape {y.shape}")
    if y.shape[0] < num_partitions:
        raise ValueError(
            f"cannot split {y.shape[0]} samples into {num_partitions} partitions"
        )
    table = Dataset.from_dict({"row": np.arange(y.shape[0], dtype=np.int64), "label": y.astype(np.int64)})
    if method == "iid":
        partitioner = IidPartitioner(num_partitions=num_partitions)
        table = table.shuffle(seed=seed)
    elif method == "dirichlet":
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha!r}")
        partitioner = DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            alpha=float(alpha),
            min_partition_size=min(min_partition_size, y.shape[0] // (2 * num_partitions)),
            self_balancing=False,
            shuffle=True,
            seed=seed,
        )
    else:
        raise ValueError(f"method must be 'iid' or 'dirichlet', got {method!r}")
    partitioner.dataset = table
    try:
        return [
            np.sort(np.asarray(partitioner.load_partition(i)["row"], dtype=np.int64))
            for i in range(num_partitions)
        ]
    except ValueError as exc:
        raise ValueError(
            f"Dirichlet partitioning of {y.shape[0]} samples into {num_partitions} partitions "
            f"with alpha={alpha} failed to give every partition {min_partition_size} rows; "
            f"raise alpha or lower min_partition_size ({exc})"
        ) from exc


def client_split(
    x: np.ndarray,
    y: np.ndarray,
    partition_id: int,
    num_partitions: int,
    *,
    method: Partitioning = "iid",
    alpha: float = 0.5,
    test_fraction: float = 0.2,
    seed: int = 42,
    partitions: list[np.ndarray] | None = None,
) -> ClientSplit:
    """The train and test data of client ``partition_id``.

    The partition is split into train/test with a seeded, stratified split.
    Documented fallback: a partition in which some class has fewer than two
    samples (skewed Dirichlet partitions) is split at random, unstratified.

    Parameters
    ----------
    partitions : list of ndarray, optional
        The result of :func:`partition_indices` for these arguments, if the
        caller already has it (saves recomputing every partition).

    Raises
    ------
    PartitionError
        If any client's split would be smaller than the number of classes
        (:func:`check_partitions`): the same error for every client, before
        any training.
    ValueError
        For a bad ``partition_id``, ``test_fraction`` outside (0, 1), or
        mismatched ``x``/``y``.
    """
    from sklearn.model_selection import train_test_split

    _check_partition_args(num_partitions, partition_id)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} vs {len(y)}")
    if partitions is None:
        partitions = partition_indices(y, num_partitions, method=method, alpha=alpha, seed=seed)
    if len(partitions) != num_partitions:
        raise ValueError(f"partitions holds {len(partitions)} partitions, expected {num_partitions}")
    check_partitions(y, partitions, test_fraction=test_fraction, method=method)
    rows = partitions[partition_id]
    labels = np.asarray(y)[rows]
    _, counts = np.unique(labels, return_counts=True)
    n_train, n_test = split_sizes(len(rows), test_fraction)
    stratify = labels if counts.min() >= 2 and min(n_train, n_test) >= len(counts) > 1 else None
    train_rows, test_rows = train_test_split(
        rows, test_size=test_fraction, random_state=seed + partition_id, stratify=stratify
    )
    train_rows, test_rows = np.sort(train_rows), np.sort(test_rows)
    return ClientSplit(
        x_train=x[train_rows],
        y_train=np.asarray(y)[train_rows].astype(np.int64),
        x_test=x[test_rows],
        y_test=np.asarray(y)[test_rows].astype(np.int64),
        train_index=train_rows,
        test_index=test_rows,
    )
