"""The CKKS seam: arithmetic, whole-batch sums, serialization and key separation."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fedeval.fhe.backend import (
    _HEADER,
    CKKSParams,
    ContextMismatchError,
    NoSecretKeyError,
    SerializationError,
    create_context,
    load_context,
    pack_blobs,
    unpack_blobs,
)


def _vec(ks, seed=0, n=20):
    rng = np.random.default_rng(seed)
    v = np.zeros(ks.client.slot_count)
    v[:n] = rng.uniform(-1, 1, n)
    return v


def test_encrypt_decrypt_returns_every_slot(keysets):
    ks = keysets()
    v = _vec(ks)
    out = ks.client.decrypt(ks.client.encrypt(v[:20]))
    assert out.shape == (ks.client.slot_count,)
    np.testing.assert_allclose(out, v, atol=1e-7)


def test_sum_slots_puts_the_whole_batch_sum_in_every_slot(keysets):
    ks = keysets()
    v = _vec(ks)
    v[-1] = 0.5  # the last slot must be included too
    ct = ks.server.deserialize_ciphertext(ks.client.serialize_ciphertext(ks.client.encrypt(v)))
    out = ks.client.decrypt(ks.server.sum_slots(ct))
    np.testing.assert_allclose(out, np.full_like(v, v.sum()), atol=1e-6)


def test_multiply_then_mask_uses_two_levels(keysets):
    ks = keysets()
    a, b = _vec(ks, 1), _vec(ks, 2)
    ca, cb = (ks.server.deserialize_ciphertext(ks.client.serialize_ciphertext(ks.client.encrypt(x)))
              for x in (a, b))
    prod = ks.server.multiply(ks.server.add_many([ca, cb]), cb)
    masked = ks.server.multiply_plain(ks.server.sum_slots(prod), [1.5])
    out = ks.client.decrypt(masked)
    assert out[0] == pytest.approx(1.5 * ((a + b) * b).sum(), abs=1e-6)
    assert np.abs(out[1:]).max() < 1e-6


def test_server_context_cannot_decrypt(keysets):
    ks = keysets()
    server = load_context(ks.public_bytes)
    assert not server.is_private
    ct = server.deserialize_ciphertext(ks.client.serialize_ciphertext(ks.client.encrypt([1.0, 2.0])))
    with pytest.raises(NoSecretKeyError):
        server.decrypt(ct)
    with pytest.raises(NoSecretKeyError):
        server.secret_bytes()


def test_public_bytes_hold_no_secret_key(keysets, backend_name):
    ks = keysets()
    payload = unpack_blobs(ks.public_bytes[_HEADER.size:])
    if backend_name == "tenseal":
        import tenseal as ts

        assert not ts.context_from(payload[1]).is_private()
    else:
        assert len(payload) == 5  # params, crypto context, public key, mult keys, rotation keys
    secret_payload = unpack_blobs(ks.secret_bytes[_HEADER.size:])
    assert len(ks.secret_bytes) < len(ks.public_bytes)  # no evaluation keys in the secret share
    assert len(secret_payload) in (2, 4)


def test_corrupted_ciphertext_bytes_raise_a_clear_error(keysets):
    ks = keysets()
    data = bytearray(ks.client.serialize_ciphertext(ks.client.encrypt([1.0])))
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x01
    with pytest.raises(SerializationError, match="corrupted ciphertext"):
        ks.server.deserialize_ciphertext(bytes(flipped))
    with pytest.raises(SerializationError):
        ks.server.deserialize_ciphertext(bytes(data[:-10]))
    with pytest.raises(SerializationError, match="magic"):
        ks.server.deserialize_ciphertext(b"x" * 100)
    with pytest.raises(SerializationError, match="too short"):
        ks.server.deserialize_ciphertext(b"")
    with pytest.raises(SerializationError, match="expected a ciphertext"):
        ks.server.deserialize_ciphertext(ks.public_bytes)


def test_ciphertext_from_another_key_set_is_rejected(keysets, backend_name):
    ks = keysets()
    other = create_context(params=CKKSParams.for_slots(ks.client.slot_count, backend_name))
    foreign = other.serialize_ciphertext(other.encrypt([1.0]))
    with pytest.raises(ContextMismatchError, match="key set"):
        ks.server.deserialize_ciphertext(foreign)


def test_blob_framing_rejects_truncation():
    data = pack_blobs([b"ab", b"cde"])
    assert unpack_blobs(data, expected=2) == [b"ab", b"cde"]
    with pytest.raises(SerializationError):
        unpack_blobs(data[:-1])
    with pytest.raises(SerializationError):
        unpack_blobs(data, expected=3)


def test_params_refuse_parameters_below_128_bit():
    with pytest.raises(ValueError, match="128-bit"):
        CKKSParams(backend="tenseal", coeff_mod_bit_sizes=(60, 50, 50, 60))
    with pytest.raises(ValueError, match="batch_size"):
        CKKSParams(backend="openfhe", poly_modulus_degree=16384, batch_size=100)


def test_openfhe_parameter_sets_and_their_validation():
    ours, fast, paper = CKKSParams.default("openfhe"), CKKSParams.fast_openfhe(), CKKSParams.paper_openfhe()
    assert (ours.poly_modulus_degree, ours.mult_depth, ours.scale_bits, ours.first_mod_bits) == (16384, 2, 50, 60)
    assert (fast.poly_modulus_degree, fast.mult_depth, fast.scale_bits, fast.first_mod_bits) == (8192, 2, 47, 55)
    assert (paper.poly_modulus_degree, paper.mult_depth, paper.scale_bits, paper.first_mod_bits) == (16384, 3, 50, 60)
    assert ours.max_final_value == paper.max_final_value == 2.0 ** 9
    assert fast.max_final_value == 2.0 ** 7 > 96  # the malicious protocol's largest final value
    assert CKKSParams.from_json(ours.to_json()) == ours
    assert CKKSParams.for_slots(100, "openfhe", base=paper).batch_size == 128
    with pytest.raises(ValueError, match="scaling"):
        CKKSParams(backend="openfhe", scaling="auto")
    with pytest.raises(ValueError, match="num_large_digits"):
        CKKSParams(backend="openfhe", num_large_digits=-1)


def test_openfhe_results_leave_mod_reduced_and_the_paper_set_still_works(backend_name):
    if backend_name != "openfhe":
        pytest.skip("OpenFHE engine only (Python 3.10 leg)")
    for params in (CKKSParams.for_slots(8, "openfhe"), CKKSParams.for_slots(8, base=CKKSParams.fast_openfhe()),
                   CKKSParams.for_slots(8, base=CKKSParams.paper_openfhe())):
        holder = create_context(params=params)
        server = load_context(holder.public_bytes())
        fresh = server.deserialize_ciphertext(holder.serialize_ciphertext(holder.encrypt([1.5, -2.0, 0.25])))
        out = server.multiply_plain(server.sum_slots(server.multiply(fresh, fresh)), [3.0])
        got = holder.decrypt(holder.deserialize_ciphertext(server.serialize_ciphertext(out)))
        assert abs(got[0] - 3.0 * (1.5 ** 2 + 2.0 ** 2 + 0.25 ** 2)) <= 1e-6
        if params.scaling == "fixed-manual":  # one RNS limb left: a third of a fresh ciphertext
            assert len(server.serialize_ciphertext(out)) < 0.4 * len(holder.serialize_ciphertext(fresh))
        else:
            assert len(server.serialize_ciphertext(out)) > 0.4 * len(holder.serialize_ciphertext(fresh))
