"""xMK-CKKS aggregation end to end (Walskaar et al. 2023, Eqs. 1-11)."""

import numpy as np
import pytest

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe.params import get_parameter_set

P = get_parameter_set("xmk-n4096-q93")  # q108 (another 4096 set) is the "other" set below

M = 10
LENGTH = 3 * P.n - 123  # three polynomials, the last one padded


@pytest.fixture(scope="module")
def round_():
    a = rlwe.expand_a(P, rlwe.new_public_seed())
    keys = [rlwe.keygen(P, a) for _ in range(M)]
    pk = rlwe.aggregate_public_keys([pk_i for _, pk_i in keys])
    k = rlwe.max_scale_bits(P, num_clients=M, max_abs_value=1.0)
    # test data (not key material): any generator is fine here
    gen = np.random.default_rng(2023)
    xs = [gen.uniform(-1.0, 1.0, LENGTH) for _ in range(M)]
    cts = [rlwe.encrypt_vector(P, pk, a, x, scale_bits=k, num_clients=M) for x in xs]
    total = rlwe.add_ciphertexts(cts)
    shares = [rlwe.partial_decrypt(P, sk, total.c1, num_clients=M) for sk, _ in keys]
    return a, keys, pk, k, xs, cts, total, shares


def test_sum_of_ten_encrypted_vectors_decrypts_within_4e_minus_6(round_):
    a, keys, pk, k, xs, cts, total, shares = round_
    got = rlwe.combine_and_decode(P, total.c0, shares, LENGTH, scale_bits=k)
    expected = np.sum(xs, axis=0)
    assert got.shape == (LENGTH,) and got.dtype == np.float64
    # 1e-6 until the smudging was sized for W = 3 decryptions of one sum (issue 21): 4 x the noise at q93
    assert np.max(np.abs(got - expected)) < 4e-6
    bound = rlwe.check_noise_budget(P, num_clients=M, scale_bits=k, max_abs_value=1.0)
    fixed = np.sum([np.rint(x * 2.0**k) for x in xs], axis=0) / 2.0**k
    assert np.max(np.abs(got - fixed)) <= bound.total_noise / 2.0**k


def test_public_key_is_the_sum_of_shares(round_):
    a, keys, pk, *_ = round_
    assert pk.num_shares == M
    assert np.array_equal(pk.b, P.ring.sum(np.stack([b.b for _, b in keys])))


def test_decryption_needs_every_share(round_):
    a, keys, pk, k, xs, cts, total, shares = round_
    got = rlwe.combine_and_decode(P, total.c0, shares[:-1], LENGTH, scale_bits=k)
    assert np.mean(np.abs(got - np.sum(xs, axis=0)) > 0.01) > 0.99  # uniform mod q


def test_one_ciphertext_alone_does_not_reveal_its_plaintext(round_):
    a, keys, pk, k, xs, cts, total, shares = round_
    # shares computed for the sum do not decrypt a single client's c0
    got = rlwe.combine_and_decode(P, cts[0].c0, shares, LENGTH, scale_bits=k)
    assert np.mean(np.abs(got - xs[0]) > 0.01) > 0.99  # uniform in (-q, q)/2Delta


def test_ciphertext_shape_and_sum_count(round_):
    a, keys, pk, k, xs, cts, total, shares = round_
    assert cts[0].c0.shape == (3, P.limbs, P.n) and cts[0].c0.dtype == np.uint64
    assert total.num_summed == M
    assert np.all(total.c0 < P.ring.q_col) and np.all(total.c1 < P.ring.q_col)


def test_single_client_round_trip_and_rounding():
    a = rlwe.expand_a(P, rlwe.new_public_seed())
    sk, pk = rlwe.keygen(P, a)
    x = np.array([0.5, -0.25, 3.0, 1e-3])
    k = 60
    ct = rlwe.encrypt_vector(P, pk, a, x, scale_bits=k, num_clients=1)
    d = rlwe.partial_decrypt(P, sk, ct.c1, num_clients=1)
    got = rlwe.combine_and_decode(P, ct.c0, [d], 4, scale_bits=k)
    assert np.max(np.abs(got - x)) <= rlwe.total_noise_bound(P, 1) / 2.0**k


def test_encrypt_vector_refuses_values_that_could_wrap():
    a = rlwe.expand_a(P, rlwe.new_public_seed())
    _, pk = rlwe.keygen(P, a)
    k = rlwe.max_scale_bits(P, num_clients=M, max_abs_value=1.0)
    with pytest.raises(rlwe.EncodingRangeError):
        rlwe.encrypt_vector(P, pk, a, np.array([0.0, 4.0]), scale_bits=k, num_clients=M)


def test_mixed_parameter_sets_and_empty_lists_are_rejected():
    q108 = rlwe.get_parameter_set("xmk-n4096-q108")
    a = rlwe.expand_a(P, rlwe.new_public_seed())
    a2 = rlwe.expand_a(q108, rlwe.new_public_seed())
    sk, pk = rlwe.keygen(P, a)
    _, pk2 = rlwe.keygen(q108, a2)
    with pytest.raises(ValueError, match="parameter set"):
        rlwe.aggregate_public_keys([pk, pk2])
    with pytest.raises(ValueError, match="parameter set"):
        rlwe.partial_decrypt(q108, sk, P.ring.zeros((1,)), num_clients=1)
    with pytest.raises(ValueError, match="empty"):
        rlwe.add_ciphertexts([])
    with pytest.raises(ValueError, match="empty"):
        rlwe.aggregate_public_keys([])
    with pytest.raises(ValueError, match="c1_sum"):
        rlwe.partial_decrypt(P, sk, np.zeros((1, 2, P.n), dtype=np.uint64), num_clients=1)


def test_larger_parameter_set_aggregates_large_weighted_updates():
    p = rlwe.get_parameter_set("xmk-n8192-q155")
    a = rlwe.expand_a(p, rlwe.new_public_seed())
    keys = [rlwe.keygen(p, a) for _ in range(3)]
    pk = rlwe.aggregate_public_keys([b for _, b in keys])
    xs = [np.array([1e4, -2.5e3, 0.125, 1234.5678]) * (i + 1) for i in range(3)]
    k = rlwe.max_scale_bits(p, num_clients=3, max_abs_value=3e4)
    cts = [rlwe.encrypt_vector(p, pk, a, x, scale_bits=k, num_clients=3) for x in xs]
    total = rlwe.add_ciphertexts(cts)
    shares = [rlwe.partial_decrypt(p, sk, total.c1, num_clients=3) for sk, _ in keys]
    got = rlwe.combine_and_decode(p, total.c0, shares, 4, scale_bits=k)
    assert np.max(np.abs(got - np.sum(xs, axis=0))) < 1e-9
