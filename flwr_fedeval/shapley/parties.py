"""SecSV, one function per party and step (Zheng et al., PVLDB 16(7) 2023, Algorithms 3–5).

These are the pieces both runners share: :class:`~flwr_fedeval.shapley.secsv.SecSV`
(all parties in one process, for experiments and tests) and the Flower phase
(:mod:`flwr_fedeval.strategies.shapley_phase`, one party per node). Every
function works on one party's own data and returns what that party sends on.

=======================  ============================================================
party                    functions
=======================  ============================================================
client (model owner)     :func:`model_matrix`, :func:`encrypt_model` (Alg. 5 steps 1–3)
client (data owner)      :func:`share_test_set` (Alg. 3 step 3)
server P and server A    :func:`aggregate_model` (Alg. 3 step 9),
                         :func:`server_products` (Alg. 4 steps 4–5)
server P                 :func:`plan_batches`, :func:`add_products` (Alg. 4 step 6)
helper client            :func:`helper_predict` (Alg. 4 steps 7–11)
P, A and the helper      the zero test of :mod:`.zerotest` (replaces Alg. 4 steps 11–14:
                         P opens ``r·(Ŷ − Y)``, never ``Ŷ − Y``)
=======================  ============================================================

Shapes: a *share* of the test set is ``(M, d_in)`` uint64 (``d_in = d + 1``,
the last column is the bias feature 1) plus the labels ``(M,)`` uint64, both in
``Z_{2^k}`` for the features, ``F_p`` (:data:`~flwr_fedeval.shapley.sharing.LABEL_PRIME`)
for the labels. A model is ``d_in`` ciphertexts (the reduced matrices
``Ã^(o)``, each ``d_out·m`` slots). Products are one ciphertext per limb.

No flwr and no TensorFlow imports.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fedeval.fhe.backend import CKKSContext
from flwr_fedeval.shapley.matrix_reducing import reduce_data, reduce_model
from flwr_fedeval.shapley.sharing import LABEL_PRIME, encode_fixed, share, share_field, to_signed

_LOG = logging.getLogger(__name__)

if TYPE_CHECKING:  # secsv imports this module
    from flwr_fedeval.shapley.secsv import SecSVParams

#: One server's shares of the test set: features ``(M, d_in)`` and labels ``(M,)``, uint64.
_Shares = tuple[NDArray[np.uint64], NDArray[np.uint64]]

__all__ = [
    "ENCODE_COST",
    "add_products",
    "check_test_set",
    "choose_batches",
    "aggregate_model",
    "encrypt_model",
    "helper_predict",
    "limb_rows",
    "model_matrix",
    "plan_batches",
    "server_plaintexts",
    "server_products",
    "share_test_set",
]


def check_test_set(X: ArrayLike, y: ArrayLike, owners: ArrayLike,
                   ) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """The union of the test sets as ``X (M, d)`` float64, ``y (M,)`` and ``owners (M,)`` int64.

    Raises
    ------
    ValueError
        If the shapes do not match.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    owners = np.asarray(owners, dtype=np.int64)
    if X.ndim != 2 or y.shape != (X.shape[0],) or owners.shape != y.shape:
        raise ValueError(f"X (M, d), y (M,), owners (M,) expected, got {X.shape}, {y.shape}, {owners.shape}")
    return X, y, owners


def model_matrix(theta: ArrayLike, weight: float, params: SecSVParams, *, n_classes: int, d_out: int,
                 ) -> NDArray[np.float64]:
    """The integer matrix a client encrypts: ``w_i · round(θ_i · 2^f_A)`` (SecSV module docstring).

    Parameters
    ----------
    theta : ndarray of shape (n_classes, d_in)
        Linear classifier ``[W | b]``; predicted class ``argmax(θ [x; 1])``.
    weight : int
        Integer FedAvg weight ``w_i`` in ``[1, 2^weight_bits)``.
    params : SecSVParams
    n_classes : int
    d_out : int
        ``n_classes``, or 1 for the binary margin row ``θ_1 − θ_0``.

    Returns
    -------
    ndarray of shape (d_out, d_in), float64 holding integers

    Raises
    ------
    ValueError
        Wrong shape, NaN/inf, ``|θ|`` above ``params.model_bound`` (the public
        bound the parameters were validated for), weight out of range.
    """
    w = int(weight)
    if not 1 <= w < 2 ** params.weight_bits:
        raise ValueError(f"weight must be an integer in [1, 2^{params.weight_bits}), got {weight!r}")
    theta = np.asarray(theta, dtype=np.float64)
    if theta.shape != (n_classes, params.n_features + 1):
        raise ValueError(f"model has shape {theta.shape}, expected {(n_classes, params.n_features + 1)}")
    if not np.all(np.isfinite(theta)):
        raise ValueError("model has NaN or infinite parameters")
    A: NDArray[np.float64] = np.rint(theta * 2 ** params.model_frac_bits)
    if d_out == 1:
        theta = theta[1:] - theta[:1]
        A = A[1:] - A[:1]
    if np.abs(theta).max() > params.model_bound:
        raise ValueError(f"|θ| = {np.abs(theta).max():.3g} exceeds model_bound={params.model_bound}")
    return w * A


def encrypt_model(ctx: CKKSContext, A: NDArray[np.float64], m: int) -> list[Any]:
    """``⟦Ã^(o)⟧`` for ``o = 0..d_in−1`` (Algorithm 5 steps 1–3): ``d_in`` ciphertexts."""
    red = reduce_model(A, m)
    return [ctx.encrypt(red[o].ravel()) for o in range(red.shape[0])]


def share_test_set(X: ArrayLike, y: ArrayLike, params: SecSVParams) -> tuple[_Shares, _Shares]:
    """Fixed-point encode ``[X | 1]`` and the labels and split both into two additive shares.

    Returns
    -------
    (X_P, y_P), (X_A, y_A) : uint64 arrays of shapes (M, d_in) and (M,)
        The shares for the principal server P and the auxiliary server A: features over
        ``Z_{2^k}``, labels over ``F_p`` (``p`` = :data:`~flwr_fedeval.shapley.sharing.LABEL_PRIME`).

    Raises
    ------
    ValueError
        Wrong shapes, NaN, or ``|x|`` above ``params.feature_bound``.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    if X.ndim != 2 or X.shape[1] != params.n_features or y.shape != (X.shape[0],):
        raise ValueError(f"X (M, {params.n_features}) and y (M,) expected, got {X.shape} and {y.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("test features contain NaN or infinite values")
    if X.size and np.abs(X).max() > params.feature_bound:
        raise ValueError(f"test features reach |x| = {np.abs(X).max():.3g} > feature_bound={params.feature_bound}")
    if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= LABEL_PRIME):
        raise ValueError(f"labels must be integers in [0, {LABEL_PRIME})")
    k = params.ring_bits
    X_ring = encode_fixed(np.hstack([X, np.ones((X.shape[0], 1))]), params.data_frac_bits, k)
    X_P, X_A = share(X_ring, k)
    y_P, y_A = share_field(y.astype(np.uint64), LABEL_PRIME)
    return (X_P, y_P), (X_A, y_A)


def aggregate_model(ctx: CKKSContext, models: Sequence[list[Any]]) -> list[Any]:
    """``⟦Σ_{i∈S} w_i A_i⟧``: slot-wise sums of the members' reduced ciphertexts (no level used)."""
    if not models:
        raise ValueError("a coalition needs at least one model")
    n = len(models[0])
    if any(len(m) != n for m in models):
        raise ValueError("models of a coalition have different numbers of ciphertexts")
    return [ctx.add_many([m[o] for m in models]) for o in range(n)]


def limb_rows(share_rows: NDArray[np.uint64], params: SecSVParams) -> list[NDArray[np.float64]]:
    """The ``⌈k/b⌉`` limbs of ``b`` bits of a share (float64 arrays of the share's shape)."""
    b = params.limb_bits
    mask = np.uint64((1 << b) - 1)
    rows = np.asarray(share_rows, dtype=np.uint64)
    return [((rows >> np.uint64(b * l)) & mask).astype(np.float64) for l in range(params.n_limbs)]


def server_plaintexts(ctx: CKKSContext, share_rows: NDArray[np.uint64], params: SecSVParams, *, m: int, d_out: int,
                      ) -> list[list[Any]]:
    """Encoded ``B̃_l^(o)`` of one server's share of a batch (≤ m rows), per limb (Algorithm 5 step 4)."""
    if share_rows.shape[0] > m:
        raise ValueError(f"a batch holds at most m={m} samples, got {share_rows.shape[0]}")
    plains = []
    for limb in limb_rows(share_rows, params):
        B = np.zeros((limb.shape[1], m))
        B[:, :limb.shape[0]] = limb.T                        # d_in × m, zero-padded
        red = reduce_data(B, d_out)
        plains.append([ctx.encode_plain(red[o].ravel()) for o in range(red.shape[0])])
    return plains


def server_products(ctx: CKKSContext, enc_model: list[Any], plains: list[list[Any]]) -> list[Any]:
    """``⟦A_S B̃_l⟧`` per limb: ``d_in`` ciphertext×plaintext products each (Algorithm 4 steps 4–5)."""
    return [ctx.dot_plain(enc_model, p) for p in plains]


def add_products(ctx: CKKSContext, mine: list[Any], theirs: list[Any]) -> list[Any]:
    """P adds A's products to its own, limb by limb (Algorithm 4 step 6)."""
    if len(mine) != len(theirs):
        raise ValueError(f"{len(theirs)} limbs received, {len(mine)} expected")
    return [ctx.add_many([a, b]) for a, b in zip(mine, theirs)]


def helper_predict(ctx: CKKSContext, limb_cts: list[Any], n_samples: int, params: SecSVParams, *, m: int,
                   d_out: int, out_of_range: str = "raise") -> NDArray[np.uint64]:
    """Helper client: decrypt every limb, recombine ``Σ_l 2^{bl} round(dec_l) mod 2^k``, predict.

    Algorithm 4 steps 7–11: ``Σ_l 2^{bl} (A_S B'_l + A_S B''_l) ≡ A_S X (mod 2^k)``.

    ``out_of_range``: what a decrypted slot that is not finite or beyond 2^62 (wrong key, or a
    half the principal server P altered) does: ``"raise"`` a ``ValueError``, or ``"zero"``: the
    slot counts as 0 and the prediction goes on, logged on this node only. The helper of the
    Flower phase uses ``"zero"``: an error reply that appears or not with the decrypted value
    would tell P one bit of a score per job (a decryption oracle).

    Returns
    -------
    ndarray of shape (n_samples,), uint64
        Predicted labels (argmax, or margin > 0 when ``d_out = 1``).

    Raises
    ------
    ValueError
        Limb count or ``n_samples`` out of range; a decrypted value out of range with
        ``out_of_range="raise"``.
    """
    if out_of_range not in ("raise", "zero"):
        raise ValueError(f"out_of_range must be 'raise' or 'zero', got {out_of_range!r}")
    k, b = params.ring_bits, params.limb_bits
    if len(limb_cts) != params.n_limbs:
        raise ValueError(f"{len(limb_cts)} limb ciphertexts, expected {params.n_limbs}")
    if not 0 < n_samples <= m:
        raise ValueError(f"a batch has 1..{m} samples, got {n_samples}")
    acc = np.zeros(d_out * m, dtype=np.uint64)
    for l, ct in enumerate(limb_cts):
        dec = np.asarray(ctx.decrypt(ct)[: d_out * m], dtype=np.float64)
        bad = ~np.isfinite(dec) | (np.abs(np.nan_to_num(dec, nan=0.0, posinf=2.0 ** 63)) > 2.0 ** 62)
        if bad.any():
            if out_of_range == "raise":
                raise ValueError("decrypted scores are out of range (wrong key or malformed ciphertext)")
            _LOG.warning("SecSV helper: %d decrypted slot(s) of limb %d out of range, counted as 0", int(bad.sum()), l)
            dec = np.where(bad, 0.0, dec)
        v = np.rint(dec).astype(np.int64)
        acc += v.astype(np.uint64) << np.uint64(b * l)
    scores: NDArray[np.int64] = to_signed(acc & np.uint64((1 << k) - 1), k).reshape(d_out, m)[:, :n_samples]
    if d_out == 1:
        positive: NDArray[np.bool_] = scores[0] > 0
        return positive.astype(np.uint64)
    labels: NDArray[np.intp] = np.argmax(scores, axis=0)
    return labels.astype(np.uint64)


def plan_batches(owners: NDArray[np.int64], m: int, clients: Sequence[int]) -> list[NDArray[np.intp]]:
    """Positions (into ``owners``) of each batch: samples grouped by owner, ≤ ``m`` per batch,
    and never every client in one batch (a helper client must own none of it).
    """
    owners = np.asarray(owners)
    order = np.argsort(owners, kind="stable")
    everyone = set(clients)
    out = []
    for start in range(0, len(order), m):
        pos = order[start:start + m]
        own = owners[pos]
        if len(everyone) > 1 and set(own.tolist()) == everyone:
            last = own[-1]
            out.append(pos[own != last])
            out.append(pos[own == last])
        else:
            out.append(pos)
    return out


#: Cost of encoding one plaintext relative to one ct×pt product (TenSEAL, n = 8192,
#: 4096 slots: 1.4 ms vs 0.57 ms, measured here). A gathered batch costs both servers
#: ``d_in·limbs`` encodings and products; a cached batch of the whole test set only the products.
ENCODE_COST = 2.5


def choose_batches(idx: np.ndarray, owners: np.ndarray, m: int, clients: Sequence[int],
                   full_batches: Sequence[np.ndarray], *, encode_cost: float = ENCODE_COST) -> list[np.ndarray]:
    """The sample IDs of the batches that test the samples ``idx`` (SampleSkip's left-over samples).

    Either the left-over samples gathered into new batches (:func:`plan_batches`: fewer
    batches, but each must be encoded again), or the whole-test-set batches that
    contain at least one of them (their encodings are cached; the other samples in
    them are computed but their results are not used). Picks the cheaper by
    ``batches × (1 + encode_cost)`` vs ``batches × 1``.

    Parameters
    ----------
    idx : ndarray of int
        Sample IDs to test.
    owners : ndarray of shape (M,)
        Owner (client index) of every sample.
    full_batches : sequence of ndarray
        Sample IDs of the whole-test-set batches, ``[ids[pos] for pos in plan_batches(owners, m, clients)]``.

    Returns
    -------
    list of ndarray
        Sample IDs per batch; every sample of ``idx`` is in exactly one of them.
    """
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == 0:
        return []
    gathered = [idx[pos] for pos in plan_batches(owners[idx], m, clients)]
    needed = np.zeros(len(owners), dtype=bool)
    needed[idx] = True
    touched = [b for b in full_batches if needed[b].any()]
    if len(touched) <= len(gathered) * (1.0 + encode_cost):
        return touched
    return gathered
