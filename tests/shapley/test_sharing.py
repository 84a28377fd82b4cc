"""Additive shares over Z_2^k: reconstruction and uniformity of each share alone."""

import numpy as np
import pytest
from scipy.stats import chisquare

from flwr_fedeval.shapley.sharing import decode_fixed, encode_fixed, reconstruct, share


def test_shares_reconstruct_fixed_point_values():
    x = np.array([-3.25, 0.0, 0.5, 1.0, 7.999])
    v = encode_fixed(x, 10, 36)
    s1, s2 = share(v, 36)
    np.testing.assert_allclose(decode_fixed(reconstruct(s1, s2, 36), 10, 36), np.rint(x * 1024) / 1024)


@pytest.mark.parametrize("secret", [0, 1, 200])
def test_each_share_alone_is_uniform(secret):
    k, n = 8, 64_000
    s1, s2 = share(np.full(n, secret, dtype=np.uint64), k)
    for s in (s1, s2):
        counts = np.bincount(s.astype(np.int64), minlength=2**k)
        assert chisquare(counts).pvalue > 1e-9  # unseeded draws: never fails by chance
    # and the shares are not independent of each other: they sum to the secret
    assert np.all(reconstruct(s1, s2, k) == secret)


def test_encode_refuses_values_outside_the_ring():
    with pytest.raises(ValueError, match="do not fit"):
        encode_fixed(np.array([2.0**30]), 10, 36)
