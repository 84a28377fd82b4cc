"""The CDT sampler's guide table gives exactly the binary search's sample (issue 21, speed)."""

import numpy as np
import pytest

from flwr_fedeval.rlwe.sampling import RandomStream, _cdt_lookup, _gaussian_cdt, _guide_table


def _reference(cdt: np.ndarray, xs: np.ndarray, u: np.ndarray) -> np.ndarray:
    return xs[np.searchsorted(cdt, u, side="right")]


@pytest.mark.parametrize("sigma, tail", [(3.2, 19), (3.2, 0), (0.5, 3), (40.0, 127), (3.19, 25)])
def test_guide_lookup_equals_binary_search(sigma, tail):
    cdt, xs = _gaussian_cdt(sigma, tail)
    guide = _guide_table(cdt, xs)
    one = np.uint64(1)
    edges = [cdt, cdt - one, cdt + one]  # at, just below and just above every threshold
    buckets = np.arange(2**16, dtype=np.uint64) << np.uint64(48)
    edges += [buckets, buckets - one, buckets + one, buckets | np.uint64(2**48 - 1)]
    words = np.concatenate(edges + [RandomStream(bytes(32)).uint64(200_000), np.array([0, 2**64 - 1], np.uint64)])
    got = _cdt_lookup(cdt, xs, guide, words)
    assert got.dtype == np.int8
    assert np.array_equal(got, _reference(cdt, xs, words))
    assert (guide == -128).sum() <= cdt.size  # a bucket is ambiguous only if it holds a threshold
