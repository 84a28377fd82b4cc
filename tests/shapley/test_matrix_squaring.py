"""Matrix Squaring (Zheng et al. 2023 §4.2) equals A @ B, in plaintext and under CKKS."""

import numpy as np
import pytest

from flwr_fedeval.shapley.matrix_squaring import (
    matrix_squaring,
    pack_data,
    pack_model,
    rotate_and_sum,
    rotation_count,
    squaring_layout,
    squaring_product,
    unpack_product,
)


@pytest.mark.parametrize("d_out,d_in,m,slots", [
    (2, 4, 3, 16),        # Example 4.1 (N = 16)
    (2, 49, 50, 4096),    # BANK, 2 outputs: d_in padded to 50
    (1, 49, 49, 4096),    # BANK, binary margin
    (3, 7, 9, 4096),      # d_in padded to a multiple of d_out
    (2, 100, 64, 4096),   # §4.2.2: K = 2 column blocks
    (70, 10, 5, 4096),    # §4.2.2: J = 2 row blocks of ⌊√N⌋ rows
    (5, 130, 15, 256),    # both, with √N = 16
])
def test_squaring_equals_matmul(d_out, d_in, m, slots):
    r = np.random.default_rng(d_out * 1000 + d_in + m)
    A, B = r.normal(size=(d_out, d_in)), r.normal(size=(d_in, m))
    np.testing.assert_allclose(squaring_product(A, B, slot_count=slots), A @ B, atol=1e-12)


def test_packing_is_the_literal_sigma_tau_xi_psi_of_example_4_1():
    """Steps 1–2 as written (rotate row j of Ā by j, column k of B̄ by k, then shift), N = 16."""
    r = np.random.default_rng(4)
    A, B = r.normal(size=(2, 4)), r.normal(size=(4, 3))
    lay = squaring_layout(2, 4, 16)
    Abar = np.vstack([A, A])
    Bbar = np.hstack([B, np.zeros((4, 1))])
    sig = np.stack([np.roll(Abar[j], -j) for j in range(4)])
    tau = np.stack([np.roll(Bbar[:, k], -k) for k in range(4)], axis=1)
    a, b = pack_model(A, lay), pack_data(B, lay)
    H = np.zeros((4, 4))
    for o in range(2):
        np.testing.assert_array_equal(a[0, 0, o].reshape(4, 4), np.roll(sig, -o, axis=1))
        np.testing.assert_array_equal(b[0, o].reshape(4, 4), np.roll(tau, -o, axis=0))
        H += np.roll(sig, -o, axis=1) * np.roll(tau, -o, axis=0)
    np.testing.assert_allclose(H[:2, :3] + H[2:, :3], A @ B, atol=1e-12)   # step 5


@pytest.mark.parametrize("copies", [1, 2, 3, 7, 16, 25, 49])
def test_rotate_and_sum_by_doubling(copies):
    h = np.arange(200.0)
    calls = []

    def rot(x, k):
        calls.append(k)
        return np.roll(x, -k)

    out = rotate_and_sum(h, copies, 3, rot, np.add)
    np.testing.assert_array_equal(out, sum(np.roll(h, -3 * r) for r in range(copies)))
    assert len(calls) == rotation_count(copies) <= 2 * np.log2(copies) + 1e-9


def test_layout_follows_table_1_bounds():
    lay = squaring_layout(2, 49, 4096)
    assert (lay.order, lay.rows, lay.row_blocks, lay.col_blocks) == (50, 2, 1, 1)
    assert lay.mults_per_batch == 2 and lay.rotations_per_batch == rotation_count(25) == 6
    big = squaring_layout(3, 200, 4096)           # d_in > √N: tiles of 63 = 21·3 ≤ 64
    assert big.order == 63 and big.col_blocks == 4 and big.order ** 2 <= 4096
    with pytest.raises(ValueError, match="multiple"):
        squaring_layout(2, 49, 4096, order=65)
    with pytest.raises(ValueError, match="positive"):
        squaring_layout(0, 4, 4096)


def test_bad_inputs_raise():
    lay = squaring_layout(2, 4, 16)
    with pytest.raises(ValueError, match="shape"):
        pack_model(np.ones((2, 5)), lay)
    with pytest.raises(ValueError, match="NaN"):
        pack_model(np.full((2, 4), np.nan), lay)
    with pytest.raises(ValueError, match="at most 4"):
        pack_data(np.ones((4, 5)), lay)
    with pytest.raises(ValueError, match="do not multiply"):
        squaring_product(np.ones((2, 4)), np.ones((3, 2)), slot_count=16)
    with pytest.raises(ValueError, match="results"):
        unpack_product([np.zeros(16)] * 2, lay, 3)


def test_homomorphic_matrix_squaring_equals_matmul():
    from flwr_fedeval.fhe.backend import create_context, load_context

    ctx = create_context("tenseal")
    server = load_context(ctx.public_bytes())
    r = np.random.default_rng(9)
    A, B = r.normal(size=(2, 100)), r.uniform(0, 1, size=(100, 40))   # K = 2 column blocks of 64
    lay = squaring_layout(2, 100, ctx.slot_count)
    enc_a = [ctx.encrypt(v) for v in pack_model(A, lay).reshape(-1, lay.order ** 2)]
    enc_b = [ctx.encrypt(v) for v in pack_data(B, lay).reshape(-1, lay.order ** 2)]
    wire = [server.deserialize_ciphertext(ctx.serialize_ciphertext(c)) for c in enc_a + enc_b]
    res = matrix_squaring(server, wire[: len(enc_a)], wire[len(enc_a):], lay)
    plain = [ctx.decrypt(ctx.deserialize_ciphertext(server.serialize_ciphertext(c))) for c in res]
    np.testing.assert_allclose(unpack_product(plain, lay, 40), A @ B, atol=1e-6)
    with pytest.raises(ValueError, match="ciphertexts"):
        matrix_squaring(server, wire[:1], wire[len(enc_a):], lay)


def test_backend_rotate_is_a_left_rotation_and_needs_the_keys():
    from flwr_fedeval.fhe.backend import create_context, load_context

    ctx = create_context("tenseal")
    v = np.arange(ctx.slot_count, dtype=float) / 100
    for steps in (1, 5, 100, ctx.slot_count - 3):
        np.testing.assert_allclose(ctx.decrypt(ctx.rotate(ctx.encrypt(v), steps)), np.roll(v, -steps), atol=1e-6)
    keyless = load_context(ctx.public_bytes(rotation_keys=False))
    with pytest.raises(ValueError, match="rotation"):
        keyless.rotate(keyless.encrypt(v), 1)
