import numpy as np
import pytest

from flwr_fedeval.data.partition import client_split, partition_indices
from flwr_fedeval.data.tabular import load_breast_cancer_data


@pytest.fixture(scope="module")
def labels():
    return load_breast_cancer_data()[1]


@pytest.mark.parametrize("method", ["iid", "dirichlet"])
def test_partitions_are_disjoint_and_cover_all_rows(labels, method):
    parts = partition_indices(labels, 5, method=method, alpha=0.5, seed=3)
    assert len(parts) == 5
    joined = np.concatenate(parts)
    assert joined.size == labels.size == np.unique(joined).size


@pytest.mark.parametrize("method", ["iid", "dirichlet"])
def test_partitions_are_deterministic_per_seed(labels, method):
    a = partition_indices(labels, 4, method=method, seed=7)
    b = partition_indices(labels, 4, method=method, seed=7)
    c = partition_indices(labels, 4, method=method, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_iid_partitions_have_equal_sizes_and_similar_class_mix(labels):
    parts = partition_indices(labels, 5, method="iid", seed=1)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    rates = [labels[p].mean() for p in parts]
    assert max(rates) - min(rates) < 0.2


def test_dirichlet_small_alpha_skews_class_mix(labels):
    parts = partition_indices(labels, 5, method="dirichlet", alpha=0.3, seed=1)
    rates = [labels[p].mean() for p in parts]
    assert max(rates) - min(rates) > 0.4


def test_client_split_train_and_test_are_disjoint_and_within_partition(labels):
    x = np.arange(labels.size, dtype=np.float32)[:, None]
    parts = partition_indices(labels, 3, seed=42)
    split = client_split(x, labels, 1, 3, test_fraction=0.25, seed=42)
    assert np.intersect1d(split.train_index, split.test_index).size == 0
    assert np.array_equal(np.union1d(split.train_index, split.test_index), parts[1])
    assert np.array_equal(split.x_test[:, 0].astype(int), split.test_index)
    assert split.y_test.tolist() == labels[split.test_index].tolist()


def test_bad_arguments_raise(labels):
    x = np.zeros((labels.size, 1))
    with pytest.raises(ValueError, match="partition_id"):
        client_split(x, labels, 3, 3)
    with pytest.raises(ValueError, match="test_fraction"):
        client_split(x, labels, 0, 3, test_fraction=1.0)
    with pytest.raises(ValueError, match="method"):
        partition_indices(labels, 3, method="zipf")
    with pytest.raises(ValueError, match="cannot split"):
        partition_indices(labels[:2], 3)


def test_impossible_dirichlet_split_raises_with_guidance(labels):
    with pytest.raises(ValueError, match="raise alpha"):
        partition_indices(labels, 5, method="dirichlet", alpha=0.1, seed=1)
