"""Matrix Reducing (Zheng et al., PVLDB 16(7) 2023, §5.2, Algorithm 5).

``AB`` for a ``d_out × d_in`` matrix ``A`` (the model, encrypted) and a
``d_in × m`` matrix ``B`` (a batch of samples as columns, plaintext shares) as
``Σ_{o=1}^{d_in} Ã^(o) ⊙ B̃^(o)``: ``d_in`` slot-wise ciphertext×plaintext
products and no rotation. With ``Ā = (A | … | A)`` (``⌈m/d_in⌉`` copies, Lemma 5.3),

* ``Ā^(o) = ξ^{o−1}(σ(Ā))`` — row ``j`` rotated left by ``j``, then all columns by ``o−1``;
* ``B̄^(o) = ψ^{o−1}(τ(B))`` — column ``k`` rotated up by ``k``, then all rows by ``o−1``;
* reduction: ``Ã^(o) = Ā^(o)[:d_out, :m]``, ``B̃^(o) = B̄^(o)[:d_out, :m]``.

Entry-wise this is ``Ã^(o)[j,k] = A[j, (j+k+o) mod d_in]`` and
``B̃^(o)[j,k] = B[(j+k+o) mod d_in, k]`` (0-based ``o``), so that
``Σ_o Ã^(o)[j,k] B̃^(o)[j,k] = (AB)[j,k]``. :func:`reduce_model` and
:func:`reduce_data` use this closed form (vectorised); the literal σ/τ/ξ/ψ
construction is :func:`reduce_literal` (tests check both agree). The closed
form also covers ``d_out > d_in``, which the paper's reduction (rows of ``B̄``)
does not.

A reduced matrix is flattened row-major into ``d_out·m`` ciphertext slots, so a
batch holds ``m ≤ slots / d_out`` samples (Table 1).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

_T = TypeVar("_T", bound=np.generic)  # the element type: floats (plaintext) or ring elements

__all__ = ["matrix_reducing", "max_batch", "reduce_data", "reduce_literal", "reduce_model"]


def max_batch(slot_count: int, d_out: int) -> int:
    """Largest batch ``m = ⌊slots / d_out⌋`` (Algorithm 5 input condition)."""
    if d_out < 1 or slot_count < d_out:
        raise ValueError(f"d_out={d_out} does not fit {slot_count} slots")
    return slot_count // d_out


def _index(d_out: int, d_in: int, m: int) -> NDArray[np.intp]:
    j = np.arange(d_out)[None, :, None]
    k = np.arange(m)[None, None, :]
    o = np.arange(d_in)[:, None, None]
    return (j + k + o) % d_in  # shape (d_in, d_out, m)


def reduce_model(A: NDArray[_T], m: int) -> NDArray[_T]:
    """``Ã^(o)`` for ``o = 0..d_in−1``: array of shape ``(d_in, d_out, m)``.

    ``A`` has shape ``(d_out, d_in)``; copies of ``A`` are packed when ``m > d_in``.
    """
    A = np.asarray(A)
    d_out, d_in = A.shape
    idx = _index(d_out, d_in, m)
    rows = np.arange(d_out)[None, :, None]
    out: NDArray[_T] = A[rows, idx]
    return out


def reduce_data(B: NDArray[_T], d_out: int) -> NDArray[_T]:
    """``B̃^(o)`` for ``o = 0..d_in−1``: array of shape ``(d_in, d_out, m)`` (``B`` is ``d_in × m``)."""
    B = np.asarray(B)
    d_in, m = B.shape
    idx = _index(d_out, d_in, m)
    cols = np.arange(m)[None, None, :]
    out: NDArray[_T] = B[idx, cols]
    return out


def reduce_literal(A: NDArray[_T], B: NDArray[_T]) -> tuple[NDArray[_T], NDArray[_T]]:
    """Steps 1–2 of δ(Ā, B) exactly as written in §5.2 (needs ``d_out ≤ d_in``)."""
    A = np.asarray(A)
    B = np.asarray(B)
    d_out, d_in = A.shape
    m = B.shape[1]
    if d_out > d_in:
        raise ValueError("the literal reduction needs d_out <= d_in")
    copies = max(1, -(-m // d_in))
    Abar = np.hstack([A] * copies)
    sig = np.stack([np.roll(Abar[j], -j) for j in range(d_out)])          # σ
    tau = np.stack([np.roll(B[:, k], -k) for k in range(m)], axis=1)      # τ
    At = np.stack([np.roll(sig, -o, axis=1)[:d_out, :m] for o in range(d_in)])   # ξ^o, reduce
    Bt = np.stack([np.roll(tau, -o, axis=0)[:d_out, :m] for o in range(d_in)])   # ψ^o, reduce
    return At, Bt


def matrix_reducing(A: NDArray[np.float64], B: NDArray[np.float64]) -> NDArray[np.float64]:
    """Plaintext δ(Ā, B) = ``Σ_o Ã^(o) ⊙ B̃^(o)`` (equals ``A @ B``)."""
    A = np.asarray(A)
    B = np.asarray(B)
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"shapes {A.shape} and {B.shape} do not multiply")
    a_red, b_red = reduce_model(A, B.shape[1]), reduce_data(B, A.shape[0])
    out: NDArray[np.float64] = (a_red * b_red).sum(axis=0)
    return out
