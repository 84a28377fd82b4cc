"""Matrix Squaring (Zheng et al., PVLDB 16(7) 2023, §4.2): HESV's encrypted matrix product.

The paper's HESV baseline evaluates ``AB`` — ``A`` the ``d_out × d_in`` model,
``B`` a ``d_in × m`` batch of samples as columns, **both encrypted** — with the
square-matrix method of Jiang et al. (CCS 2018, the paper's [24]), split into
tiles that fit a ciphertext:

§4.2.1 (one tile, ``d_in ≤ ⌊√N⌋``), 0-based, ``d`` the tile order, ``ℓ`` rows of ``A``:

1. squaring: ``Ā = (A; …; A)`` (``d/ℓ`` copies stacked, ``d × d``),
   ``B̄ = (B | 0)`` (``d × d``);
2. linear transformation: ``σ(Ā)[i,t] = Ā[i, i+t]``, ``τ(B̄)[i,t] = B̄[i+t, t]``
   (indices mod ``d``), then ``Ā^(o) = ξ^o(σ(Ā))`` (columns shifted by ``o``) and
   ``B̄^(o) = ψ^o(τ(B̄))`` (rows shifted by ``o``) for ``o = 0..ℓ−1``;
3. each ``d × d`` matrix is flattened row-major into the first ``d²`` slots of one
   ciphertext (the model owner encrypts the ``Ā^(o)``, the data owner the ``B̄^(o)``);
4. entrywise: ``⟦H⟧ = Σ_{o<ℓ} ⟦Ā^(o)⟧ ⊙ ⟦B̄^(o)⟧`` — ``ℓ`` ct×ct products;
5. rotation and extraction: ``⟦H̃⟧ = Σ_{r<d/ℓ} Rot(⟦H⟧, r·ℓ·d)`` and
   ``AB = H̃[0:ℓ, 0:m]`` — the ``d/ℓ`` row blocks of ``H`` added up.

Entry-wise, ``H[rℓ+i, t] = Σ_{o<ℓ} A[i, (rℓ+i+t+o) mod d] · B̄[(rℓ+i+t+o) mod d, t]``;
as ``r`` runs over the ``d/ℓ`` blocks, ``rℓ + o`` runs over every residue mod ``d``
once, so ``H̃[i, t] = (AB)[i, t]``.

§4.2.2 (the paper's extension, ``d_in > ⌊√N⌋`` or ``d_out > ⌊√N⌋``): ``A`` is
split into ``K = ⌈d_in/d⌉`` column blocks and ``J = ⌈d_out/ℓ⌉`` row blocks, ``B``
into the matching ``K`` row blocks, ``AB = Σ_k A_(·,k) B_(k,·)`` and
``A_(·,k) B_(k,·) = (A_(1,k) B_(k,·); …; A_(J,k) B_(k,·))``. Step 5 is linear,
so the ``K`` products of a row block are added **before** rotating: one
rotate-and-sum per row block (a stronger baseline than rotating every pair).

Counts per batch of ``m ≤ d`` samples (Table 1): ``J·K·ℓ`` ct×ct products and,
with the repeated doubling of the paper's footnote 3, ``J·rotation_count(d/ℓ)``
rotations, ``rotation_count(c) = ⌊log2 c⌋ + popcount(c) − 1`` (``c − 1`` rotations
without doubling). Ciphertexts: ``J·K·ℓ`` per model, ``K·ℓ`` per batch, ``J``
results.

Padding (the paper's footnotes 2 and 4): ``ℓ = min(d_out, ⌊√N⌋)``, and the
tile order ``d`` is ``d_in`` rounded up to a multiple of ``ℓ`` when that fits in
``⌊√N⌋``, else the largest multiple of ``ℓ`` not above ``⌊√N⌋``; zero rows and
columns fill ``A`` and ``B``. The batch is ``m ≤ d`` (Table 1: ``m ≤ min(d_in, ⌊√N⌋)``
before padding).

No flwr and no TensorFlow imports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from flwr_fedeval.fhe.backend import CKKSContext

__all__ = [
    "SquaringLayout",
    "matrix_squaring",
    "pack_data",
    "pack_model",
    "rotate_and_sum",
    "rotation_count",
    "squaring_layout",
    "squaring_product",
    "unpack_product",
]

_C = TypeVar("_C")


@dataclass(frozen=True)
class SquaringLayout:
    """Tiling of a ``d_out × d_in`` by ``d_in × m`` product (§4.2).

    Attributes
    ----------
    d_out, d_in : int
        Shape of ``A`` (unpadded).
    order : int
        Tile order ``d`` (``d² ≤`` slots); also the largest batch ``m``.
    rows : int
        ``ℓ``, rows of ``A`` per tile; divides ``order``.
    row_blocks, col_blocks : int
        ``J = ⌈d_out/ℓ⌉`` and ``K = ⌈d_in/d⌉``.
    slot_count : int
        Slots per ciphertext ``N``.
    """

    d_out: int
    d_in: int
    order: int
    rows: int
    row_blocks: int
    col_blocks: int
    slot_count: int

    @property
    def copies(self) -> int:
        """``d/ℓ``: copies of a row tile stacked in ``Ā`` and row blocks summed in step 5."""
        return self.order // self.rows

    @property
    def model_ciphertexts(self) -> int:
        """``J·K·ℓ`` ciphertexts per encrypted model."""
        return self.row_blocks * self.col_blocks * self.rows

    @property
    def data_ciphertexts(self) -> int:
        """``K·ℓ`` ciphertexts per encrypted batch."""
        return self.col_blocks * self.rows

    @property
    def mults_per_batch(self) -> int:
        """ct×ct products per batch (step 4 over all tiles): ``J·K·ℓ``."""
        return self.model_ciphertexts

    @property
    def rotations_per_batch(self) -> int:
        """Rotations per batch (step 5 with repeated doubling): ``J·rotation_count(d/ℓ)``."""
        return self.row_blocks * rotation_count(self.copies)


def squaring_layout(d_out: int, d_in: int, slot_count: int, *, order: int | None = None) -> SquaringLayout:
    """The tiling of §4.2 for a ``d_out × d_in`` matrix under ``slot_count`` slots.

    Parameters
    ----------
    d_out, d_in : int
        Shape of ``A`` (≥ 1).
    slot_count : int
        CKKS slots ``N`` (``⌊√N⌋`` bounds the tile order).
    order : int, optional
        Tile order ``d``; default as in the module notes. Must be a multiple of
        ``ℓ = min(d_out, ⌊√N⌋)`` with ``d² ≤ N``.

    Raises
    ------
    ValueError
        Non-positive sizes, or an ``order`` that does not fit or is not a multiple of ``ℓ``.
    """
    if d_out < 1 or d_in < 1:
        raise ValueError(f"matrix shape must be positive, got {d_out} x {d_in}")
    root = math.isqrt(slot_count)
    if root < 1:
        raise ValueError(f"slot_count must be >= 1, got {slot_count}")
    rows = min(d_out, root)
    if order is None:
        order = -(-d_in // rows) * rows
        if order > root:
            order = root // rows * rows
    if order < rows or order % rows or order * order > slot_count:
        raise ValueError(f"tile order {order} must be a multiple of {rows} rows with order^2 <= {slot_count} slots")
    return SquaringLayout(d_out=d_out, d_in=d_in, order=order, rows=rows, row_blocks=-(-d_out // rows),
                          col_blocks=-(-d_in // order), slot_count=slot_count)


def rotation_count(copies: int) -> int:
    """Rotations of :func:`rotate_and_sum` for ``copies`` blocks: ``⌊log2 c⌋ + popcount(c) − 1``."""
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    return copies.bit_length() - 1 + bin(copies).count("1") - 1


def rotate_and_sum(h: _C, copies: int, step: int, rotate: Callable[[_C, int], _C],
                   add: Callable[[_C, _C], _C]) -> _C:
    """``Σ_{r<copies} Rot(h, r·step)`` by repeated doubling (§4.2.1 step 5, footnote 3).

    Reading the bits of ``copies`` from the top: ``S(2n) = S(n) + Rot(S(n), n·step)``
    and ``S(n+1) = h + Rot(S(n), step)``; :func:`rotation_count` rotations.
    ``rotate(x, k)`` rotates left by ``k`` slots (numpy: ``np.roll(x, -k)``).
    """
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    acc, n = h, 1
    for bit in bin(copies)[3:]:
        acc = add(acc, rotate(acc, n * step))
        n *= 2
        if bit == "1":
            acc = add(h, rotate(acc, step))
            n += 1
    return acc


def _pad(M: NDArray[np.float64], rows: int, cols: int) -> NDArray[np.float64]:
    out = np.zeros((rows, cols))
    out[: M.shape[0], : M.shape[1]] = M
    return out


def pack_model(A: NDArray[np.float64], layout: SquaringLayout) -> NDArray[np.float64]:
    """``ξ^o(σ(Ā_(j,k)))`` flattened, for every tile: shape ``(J, K, ℓ, d²)`` (steps 1–2, the model side).

    Raises
    ------
    ValueError
        If ``A`` is not ``d_out × d_in`` or holds NaN/inf.
    """
    A = np.asarray(A, dtype=np.float64)
    if A.shape != (layout.d_out, layout.d_in):
        raise ValueError(f"A has shape {A.shape}, layout expects {(layout.d_out, layout.d_in)}")
    if not np.isfinite(A).all():
        raise ValueError("A contains NaN or infinity")
    d, ell, J, K = layout.order, layout.rows, layout.row_blocks, layout.col_blocks
    Ap = _pad(A, J * ell, K * d)
    i = np.arange(d)[:, None]
    t = np.arange(d)[None, :]
    out = np.empty((J, K, ell, d * d))
    for j in range(J):
        for k in range(K):
            tile = Ap[j * ell:(j + 1) * ell, k * d:(k + 1) * d]      # ℓ × d
            bar = np.tile(tile, (layout.copies, 1))                     # Ā: d × d
            for o in range(ell):
                out[j, k, o] = bar[i, (i + t + o) % d].ravel()          # ξ^o(σ(Ā))[i,t] = Ā[i, i+t+o]
    return out


def pack_data(B: NDArray[np.float64], layout: SquaringLayout) -> NDArray[np.float64]:
    """``ψ^o(τ(B̄_(k,·)))`` flattened, for every column block: shape ``(K, ℓ, d²)`` (the data side).

    ``B`` is ``d_in × m`` with ``m ≤ d`` (samples as columns).

    Raises
    ------
    ValueError
        On a wrong number of rows, ``m > d``, or NaN/inf.
    """
    B = np.asarray(B, dtype=np.float64)
    if B.ndim != 2 or B.shape[0] != layout.d_in:
        raise ValueError(f"B must have {layout.d_in} rows, got shape {B.shape}")
    if B.shape[1] > layout.order:
        raise ValueError(f"a batch holds at most {layout.order} samples (the tile order), got {B.shape[1]}")
    if not np.isfinite(B).all():
        raise ValueError("B contains NaN or infinity")
    d, ell, K = layout.order, layout.rows, layout.col_blocks
    Bp = _pad(B, K * d, d)
    i = np.arange(d)[:, None]
    t = np.arange(d)[None, :]
    out = np.empty((K, ell, d * d))
    for k in range(K):
        tile = Bp[k * d:(k + 1) * d]                                    # B̄: d × d
        for o in range(ell):
            out[k, o] = tile[(i + t + o) % d, t].ravel()                # ψ^o(τ(B̄))[i,t] = B̄[i+t+o, t]
    return out


def unpack_product(results: Sequence[NDArray[np.float64]], layout: SquaringLayout, m: int) -> NDArray[np.float64]:
    """``AB`` (``d_out × m``) from the ``J`` decrypted results of step 5 (slots ``[0, ℓ·d)`` of each)."""
    if len(results) != layout.row_blocks:
        raise ValueError(f"expected {layout.row_blocks} results, got {len(results)}")
    d, ell = layout.order, layout.rows
    blocks = [np.asarray(r, dtype=np.float64)[: ell * d].reshape(ell, d)[:, :m] for r in results]
    out: NDArray[np.float64] = np.vstack(blocks)[: layout.d_out]
    return out


def squaring_product(A: NDArray[np.float64], B: NDArray[np.float64], *,
                     slot_count: int = 4096, order: int | None = None) -> NDArray[np.float64]:
    """Plaintext §4.2 on numpy vectors of ``slot_count`` slots (equals ``A @ B``); ``m ≤`` tile order."""
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"shapes {A.shape} and {B.shape} do not multiply")
    lay = squaring_layout(A.shape[0], A.shape[1], slot_count, order=order)
    a, b = pack_model(A, lay), pack_data(B, lay)

    def slots(v: NDArray[np.float64]) -> NDArray[np.float64]:
        out = np.zeros(slot_count)
        out[: v.size] = v
        return out

    res = []
    for j in range(lay.row_blocks):
        h = sum(slots(a[j, k, o] * b[k, o]) for k in range(lay.col_blocks) for o in range(lay.rows))
        res.append(rotate_and_sum(np.asarray(h), lay.copies, lay.rows * lay.order,
                                  lambda x, s: np.roll(x, -s), np.add))
    return unpack_product(res, lay, B.shape[1])


def matrix_squaring(ctx: CKKSContext, enc_model: Sequence[Any], enc_data: Sequence[Any],
                    layout: SquaringLayout) -> list[Any]:
    """Steps 4–5 under HE: ``J`` ciphertexts whose slots ``[0, ℓ·d)`` hold row blocks of ``AB``.

    Uses one level (ct×ct products, relinearised and rescaled) and
    :attr:`SquaringLayout.rotations_per_batch` rotations. Decrypt each result and
    pass the slots to :func:`unpack_product`.

    Parameters
    ----------
    ctx : CKKSContext
        The evaluator's (public) context, with relinearisation and rotation keys.
    enc_model : sequence of ciphertexts
        :func:`pack_model` encrypted, flattened in ``(j, k, o)`` order (``J·K·ℓ``).
    enc_data : sequence of ciphertexts
        :func:`pack_data` encrypted, flattened in ``(k, o)`` order (``K·ℓ``).
    layout : SquaringLayout
        From :func:`squaring_layout`.

    Raises
    ------
    ValueError
        On a wrong number of ciphertexts.
    """
    if len(enc_model) != layout.model_ciphertexts or len(enc_data) != layout.data_ciphertexts:
        raise ValueError(f"expected {layout.model_ciphertexts} model and {layout.data_ciphertexts} data "
                         f"ciphertexts, got {len(enc_model)} and {len(enc_data)}")
    per_row = layout.col_blocks * layout.rows
    out = []
    for j in range(layout.row_blocks):
        h = ctx.add_many([ctx.multiply(enc_model[j * per_row + q], enc_data[q]) for q in range(per_row)])
        out.append(rotate_and_sum(h, layout.copies, layout.rows * layout.order, ctx.rotate,
                                  lambda x, y: ctx.add_many([x, y])))
    return out
