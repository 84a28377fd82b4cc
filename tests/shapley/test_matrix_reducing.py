"""Matrix Reducing (Algorithm 5) equals A @ B, in plaintext and under CKKS."""

import numpy as np
import pytest

from flwr_fedeval.shapley.matrix_reducing import matrix_reducing, reduce_data, reduce_literal, reduce_model


@pytest.mark.parametrize("d_out,d_in,m", [(2, 4, 6), (2, 4, 3), (3, 7, 20), (1, 5, 5), (4, 4, 11),
                                          (2, 49, 2048), (7, 3, 10)])
def test_matrix_reducing_equals_matmul(d_out, d_in, m):
    r = np.random.default_rng(d_out * 100 + d_in + m)
    A, B = r.normal(size=(d_out, d_in)), r.normal(size=(d_in, m))
    np.testing.assert_allclose(matrix_reducing(A, B), A @ B, atol=1e-12)


@pytest.mark.parametrize("d_out,d_in,m", [(2, 4, 6), (3, 5, 3), (2, 6, 13)])
def test_closed_form_equals_literal_sigma_tau_xi_psi(d_out, d_in, m):
    r = np.random.default_rng(m)
    A, B = r.normal(size=(d_out, d_in)), r.normal(size=(d_in, m))
    At, Bt = reduce_literal(A, B)
    np.testing.assert_array_equal(At, reduce_model(A, m))
    np.testing.assert_array_equal(Bt, reduce_data(B, d_out))


def test_homomorphic_matrix_reducing_uses_d_in_products_and_equals_matmul():
    from flwr_fedeval.fhe.backend import create_context

    ctx = create_context("tenseal")
    r = np.random.default_rng(7)
    d_out, d_in, m = 2, 9, 40          # m > d_in: copies of A are packed
    A = r.integers(-500, 500, size=(d_out, d_in)).astype(float)
    B = r.integers(0, 2**14, size=(d_in, m)).astype(float)
    enc = [ctx.encrypt(a.ravel()) for a in reduce_model(A, m)]
    red = reduce_data(B, d_out)
    out = ctx.decrypt(ctx.dot_plain(enc, [b.ravel() for b in red]))[: d_out * m].reshape(d_out, m)
    np.testing.assert_array_equal(np.rint(out), A @ B)   # exact integers
