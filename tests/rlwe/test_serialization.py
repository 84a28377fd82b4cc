"""Byte format: round trips and strict validation of every field."""

import struct

import numpy as np
import pytest

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe.params import get_parameter_set
from flwr_fedeval.rlwe.serialization import HEADER_SIZE

P = get_parameter_set("xmk-n4096-q93")  # q108 (another 4096 set) is the "other" set below


@pytest.fixture(scope="module")
def objects():
    a = rlwe.expand_a(P, rlwe.new_public_seed())
    sk, pk = rlwe.keygen(P, a)
    ct = rlwe.encrypt_vector(P, pk, a, np.linspace(-1, 1, 5000), scale_bits=40, num_clients=2)
    share = rlwe.partial_decrypt(P, sk, ct.c1, num_clients=2)
    return sk, pk, ct, share


def test_round_trips_preserve_every_object(objects):
    sk, pk, ct, share = objects
    sk2 = rlwe.SecretKey.from_bytes(sk.to_bytes())
    assert np.array_equal(sk2.s, sk.s) and sk2.params == P
    pk2 = rlwe.PublicKey.from_bytes(pk.to_bytes(), P)
    assert np.array_equal(pk2.b, pk.b) and pk2.num_shares == 1
    ct2 = rlwe.Ciphertext.from_bytes(ct.to_bytes(), P)
    assert np.array_equal(ct2.c0, ct.c0) and np.array_equal(ct2.c1, ct.c1)
    sh2 = rlwe.DecryptionShare.from_bytes(share.to_bytes())
    assert np.array_equal(sh2.d, share.d)
    c1 = rlwe.polys_from_bytes(rlwe.polys_to_bytes(P, ct.c1), P)
    assert np.array_equal(c1, ct.c1)


def test_ciphertext_size_is_header_plus_bit_packed_residues(objects):
    _, _, ct, _ = objects
    bits = sum(q.bit_length() for q in P.primes)
    assert len(ct.to_bytes()) == HEADER_SIZE + 2 * ct.num_polys * P.n * bits // 8


@pytest.mark.parametrize("cut", [0, 10, HEADER_SIZE, HEADER_SIZE + 1, -1])
def test_truncated_bytes_raise(objects, cut):
    _, _, ct, _ = objects
    data = ct.to_bytes()
    with pytest.raises(ValueError, match="too short|payload length"):
        rlwe.Ciphertext.from_bytes(data[:cut] if cut >= 0 else data[:-1], P)


def test_extra_trailing_bytes_raise(objects):
    _, pk, _, _ = objects
    with pytest.raises(ValueError, match="payload length"):
        rlwe.PublicKey.from_bytes(pk.to_bytes() + b"\0", P)


@pytest.mark.parametrize(
    "offset, value, field",
    [
        (0, b"XXXX", "magic"),
        (4, bytes([9]), "version"),
        (5, bytes([4]), "kind"),
        (6, struct.pack("<H", 4), "limbs"),
        (8, struct.pack("<I", 8192), "n"),
        (12, struct.pack("<I", 0), "count"),
        (12, struct.pack("<I", 3), "payload length"),
        (16, b"xmk-n4096-q108".ljust(32, b"\0"), "params_id"),
        (16, b"\xff" * 32, "params_id"),
    ],
)
def test_corrupted_header_fields_raise_naming_the_field(objects, offset, value, field):
    _, _, ct, _ = objects
    data = bytearray(ct.to_bytes())
    data[offset : offset + len(value)] = value
    with pytest.raises(ValueError, match=field):
        rlwe.Ciphertext.from_bytes(bytes(data), P)


def test_residue_not_below_q_raises(objects):
    _, _, ct, _ = objects
    data = bytearray(ct.to_bytes())
    data[HEADER_SIZE : HEADER_SIZE + 31] = b"\xff" * 31  # 8 values of all-ones bits
    with pytest.raises(ValueError, match="c0 limb 0 has values >= q_0"):
        rlwe.Ciphertext.from_bytes(bytes(data), P)
    share = objects[3].to_bytes()
    bad = bytearray(share)
    bad[-31:] = b"\xff" * 31
    with pytest.raises(ValueError, match="d limb 2"):
        rlwe.DecryptionShare.from_bytes(bytes(bad), P)


def test_mismatched_parameter_set_raises(objects):
    _, pk, _, _ = objects
    q108 = rlwe.get_parameter_set("xmk-n4096-q108")
    with pytest.raises(ValueError, match="params_id is 'xmk-n4096-q93', expected 'xmk-n4096-q108'"):
        rlwe.PublicKey.from_bytes(pk.to_bytes(), q108)


def test_wrong_object_kind_raises(objects):
    sk, pk, ct, share = objects
    with pytest.raises(ValueError, match="kind is 'public key', expected 'ciphertext'"):
        rlwe.Ciphertext.from_bytes(pk.to_bytes(), P)
    with pytest.raises(ValueError, match="kind"):
        rlwe.SecretKey.from_bytes(share.to_bytes(), P)


def test_secret_key_with_non_ternary_coefficient_raises(objects):
    sk = objects[0]
    data = bytearray(sk.to_bytes())
    data[HEADER_SIZE + 5] = 2
    with pytest.raises(ValueError, match="secret key has coefficients outside"):
        rlwe.SecretKey.from_bytes(bytes(data), P)


def test_non_bytes_input_raises():
    with pytest.raises(ValueError, match="data must be bytes"):
        rlwe.Ciphertext.from_bytes("not bytes", P)


def test_aux_field_must_be_zero_where_it_has_no_meaning(objects):
    """Canonical encodings: a C1, a decryption share or a secret key with aux != 0 is refused."""
    sk, _, ct, share = objects
    for data, load in [
        (rlwe.polys_to_bytes(P, ct.c1), lambda d: rlwe.polys_from_bytes(d, P)),
        (share.to_bytes(), lambda d: rlwe.DecryptionShare.from_bytes(d, P)),
        (sk.to_bytes(), lambda d: rlwe.SecretKey.from_bytes(d, P)),
    ]:
        load(data)
        bad = bytearray(data)
        bad[48:52] = struct.pack("<I", 1)
        with pytest.raises(ValueError, match="aux is 1"):
            load(bytes(bad))


def test_polys_from_bytes_checks_the_expected_count(objects):
    _, _, ct, _ = objects
    data = rlwe.polys_to_bytes(P, ct.c1)
    assert rlwe.polys_from_bytes(data, P, count=ct.num_polys).shape == ct.c1.shape
    with pytest.raises(ValueError, match="count is"):
        rlwe.polys_from_bytes(data, P, count=ct.num_polys + 1)


def _pack_reference(values, bits):
    """Bit by bit: value j's bit t is bit j·bits + t of the little-endian byte string."""
    total = len(values) * bits
    out = bytearray((total + 7) // 8)
    for j, v in enumerate(int(x) for x in values):
        for t in range(bits):
            if v >> t & 1:
                pos = j * bits + t
                out[pos // 8] |= 1 << (pos % 8)
    return bytes(out)


@pytest.mark.parametrize("bits", [1, 7, 8, 13, 26, 27, 31, 32, 33, 47, 56, 57, 63, 64])
def test_bit_packing_matches_the_bit_by_bit_reference(bits):
    """_pack_bits / _unpack_bits against the bit-by-bit layout, largest values included; ``out`` and the
    uint32 output give the same bytes and values."""
    from flwr_fedeval.rlwe.serialization import _pack_bits, _unpack_bits

    gen = np.random.default_rng(bits)  # test data
    values = gen.integers(0, 2**62, 296, dtype=np.uint64) * np.uint64(4) + gen.integers(0, 4, 296, dtype=np.uint64)
    top = (1 << bits) - 1
    values &= np.uint64(top)
    values[:9] = np.uint64(top)
    data = _pack_bits(values, bits)
    assert data == _pack_reference(values, bits)
    out = np.empty((values.size // 8, bits), dtype=np.uint8)
    assert _pack_bits(values, bits, out=out) == b"" and out.tobytes() == data
    np.testing.assert_array_equal(_unpack_bits(data, bits, values.size), values)
    np.testing.assert_array_equal(_unpack_bits(memoryview(data), bits, values.size), values)
    if bits <= 32:
        got = _unpack_bits(data, bits, values.size, np.uint32)
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, values)
