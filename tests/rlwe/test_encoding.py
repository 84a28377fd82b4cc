"""Fixed-point encoding: exact round trip, padding, range errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from flwr_fedeval.rlwe.encoding import EncodingRangeError, decode, encode, num_polys
from flwr_fedeval.rlwe.params import DEFAULT_PARAMETER_SET as P
from flwr_fedeval.rlwe.params import PARAMETER_SETS, max_plaintext_int

FLOATS = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, width=64)


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.integers(1, 5000), elements=FLOATS), st.integers(0, 70))
def test_decode_of_encode_is_round_half_even_of_x_times_delta(x, scale_bits):
    pt = encode(P, x, scale_bits=scale_bits, num_clients=10)
    assert pt.shape == (num_polys(P, x.size), P.limbs, P.n)
    got = decode(P, pt, scale_bits=scale_bits, length=x.size)
    expected = np.rint(x * 2.0**scale_bits) / 2.0**scale_bits
    assert np.array_equal(got, expected)


def test_rounding_is_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.25])
    got = decode(P, encode(P, x, scale_bits=0, num_clients=1), scale_bits=0, length=6)
    assert list(got) == [0.0, 2.0, 2.0, -0.0, -2.0, 0.0]


def test_chunks_into_ceil_len_over_n_zero_padded_polynomials():
    x = np.full(P.n + 3, 0.75)
    pt = encode(P, x, scale_bits=4, num_clients=1)
    assert pt.shape[0] == 2
    full = decode(P, pt, scale_bits=4, length=2 * P.n)
    assert np.all(full[: P.n + 3] == 0.75) and not np.any(full[P.n + 3 :])


@pytest.mark.parametrize("name", sorted(PARAMETER_SETS))
def test_large_scales_round_trip_on_every_parameter_set(name):
    p = PARAMETER_SETS[name]
    x = np.array([1.0, -1.0, 0.123456789, -3.75e-5, 0.0] * 13)
    k = max_plaintext_int(p, 2).bit_length() - 2
    pt = encode(p, x, scale_bits=k, num_clients=2)
    assert np.array_equal(decode(p, pt, scale_bits=k, length=x.size), np.rint(x * 2.0**k) / 2.0**k)


def test_value_whose_m_fold_sum_could_wrap_raises():
    limit = max_plaintext_int(P, 10)
    ok = np.array([limit / 2.0**40 * 0.999])
    encode(P, ok, scale_bits=40, num_clients=10)
    with pytest.raises(EncodingRangeError, match="exceed the fixed-point range"):
        encode(P, ok * 1.01, scale_bits=40, num_clients=10)
    # fits for one client, not for ten
    one = np.array([max_plaintext_int(P, 1) / 2.0**40 * 0.999])
    encode(P, one, scale_bits=40, num_clients=1)
    with pytest.raises(EncodingRangeError):
        encode(P, one, scale_bits=40, num_clients=10)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e308])
def test_non_finite_or_overflowing_values_raise(bad):
    with pytest.raises(EncodingRangeError):
        encode(P, np.array([0.0, bad]), scale_bits=30, num_clients=2)


def test_invalid_shapes_and_lengths_raise_value_error():
    with pytest.raises(ValueError, match="1-D"):
        encode(P, np.zeros((2, 2)), scale_bits=3, num_clients=1)
    pt = encode(P, np.zeros(3), scale_bits=3, num_clients=1)
    with pytest.raises(ValueError, match="length"):
        decode(P, pt, scale_bits=3, length=P.n + 1)
