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


def test_too_many_clients_fail_up_front_with_one_line(labels):
    from flwr_fedeval.data.partition import PartitionError, check_partitions

    x = np.zeros((labels.size, 1), dtype=np.float32)
    parts = partition_indices(labels, 100, seed=42)
    with pytest.raises(PartitionError) as err:
        check_partitions(labels, parts, test_fraction=0.2)
    msg = str(err.value)
    assert "\n" not in msg
    assert "569 samples into 100 clients" in msg and "test split of 1 sample" in msg
    # the hint names a client count that does split (5 rows -> 1 test; 10 rows -> 2 test, 8 train)
    best = int(msg.split("use at most ")[1].split()[0])
    check_partitions(labels, partition_indices(labels, best, seed=42), test_fraction=0.2)
    with pytest.raises(PartitionError):
        check_partitions(labels, partition_indices(labels, best + 1, seed=42), test_fraction=0.2)
    # every client sees the same error (never a crash inside scikit-learn's stratified split)
    with pytest.raises(PartitionError, match="test split"):
        client_split(x, labels, 0, 100, test_fraction=0.2, partitions=parts)


def test_train_split_smaller_than_classes_is_refused(labels):
    from flwr_fedeval.data.partition import PartitionError, check_partitions

    parts = [np.arange(0, 3), np.arange(3, labels.size)]
    with pytest.raises(PartitionError, match="train split of 1 sample"):
        check_partitions(labels, parts, test_fraction=0.6)


def test_single_class_partition_falls_back_to_an_unstratified_split():
    y = np.array([0] * 20 + [1] * 20)
    x = np.arange(40, dtype=np.float32)[:, None]
    parts = [np.arange(0, 20), np.arange(20, 40)]     # each partition holds one class
    split = client_split(x, y, 0, 2, test_fraction=0.25, partitions=parts)
    assert (split.y_train == 0).all() and (split.y_test == 0).all()
    assert split.y_test.size == 5 and split.y_train.size == 15


def test_split_sizes_follow_scikit_learn():
    from sklearn.model_selection import train_test_split

    from flwr_fedeval.data.partition import split_sizes

    for n in (2, 5, 6, 11, 100):
        for tf in (0.1, 0.2, 0.5):
            tr, te = train_test_split(np.arange(n), test_size=tf, random_state=0)
            assert split_sizes(n, tf) == (tr.size, te.size)
