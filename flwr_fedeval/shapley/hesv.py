"""HESV: one-server secure Shapley values (Zheng et al., PVLDB 16(7) 2023, §4.1, Algorithms 1–2).

Models **and** test data are encrypted under CKKS by their owners; the server
aggregates coalition models under HE and evaluates the linear layer with
ciphertext×ciphertext products; a helper client ``i_{L+1}`` — neither the owner
of the batch nor (when possible) a member of the coalition — decrypts the
scores, takes the argmax and uploads ``⟦−Ŷ⟧``; the server adds ``⟦Y⟧`` and a
second helper ``i_{L+2}`` decrypts ``Ỹ = Y − Ŷ`` and returns only the *count*
of ``|Ỹ[k]| < 0.5`` (Algorithm 2, steps 8–9). The server learns one count per
(coalition, batch), never per-sample results.

Implementation choices (stated, not hidden):

* ``packing="reducing"`` (default): the linear layer uses the Matrix Reducing
  layout (Algorithm 5) with both operands encrypted (``d_in`` ct×ct products,
  relinearised and rescaled, no rotation, ``⌊N/d_out⌋`` samples per batch) —
  Table 4 of the paper shows it is the faster of the two, so this HESV is a
  *stronger* baseline than the paper's;
* ``packing="squaring"``: the paper's own HESV baseline, Matrix Squaring (§4.2,
  :mod:`~flwr_fedeval.shapley.matrix_squaring`): ``J·K·ℓ`` ct×ct products and
  ``J·(⌊log2(d/ℓ)⌋ + popcount(d/ℓ) − 1)`` rotations per batch of at most the
  tile order ``d ≤ ⌊√N⌋`` samples (Table 1); the evaluator's public context
  carries the rotation keys. Step 5's extraction happens after decryption, as
  the paper writes it: the helper ``i_{L+1}`` reads the ``ℓ × m`` scores from
  the first ``ℓ·d`` slots, and the other slots it decrypts hold partial sums of
  products of model and data entries (a leak Matrix Reducing does not have;
  masking them would need a level or noise flooding that costs the scores'
  precision, so this baseline runner — not wired into Flower — does not);
* as in the paper, batches cannot mix data owners (each client encrypts its
  own samples), so every owner's last batch is partly empty;
* clients encrypt ``w_i θ_i`` (model times its integer FedAvg weight) so that
  ``⟦Σ_{i∈S} w_i θ_i⟧`` needs additions only; ``argmax`` ignores the factor ``Σ w_i``.

No flwr and no TensorFlow imports.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fedeval.fhe.backend import CKKSContext, CKKSParams, create_context, load_context
from flwr_fedeval.shapley.fsv import Coalition, FSVResult, RoundEvaluation, coalitions, federated_shapley
from flwr_fedeval.shapley.matrix_reducing import max_batch, reduce_data, reduce_model
from flwr_fedeval.shapley.matrix_squaring import (
    SquaringLayout,
    matrix_squaring,
    pack_data,
    pack_model,
    squaring_layout,
    unpack_product,
)
from flwr_fedeval.shapley.parties import check_test_set
from flwr_fedeval.shapley.secsv import ShapleyStats, _Wire, pick_helper, shapley_ckks_params

__all__ = ["HESV", "PACKINGS"]

PACKINGS = ("reducing", "squaring")


class HESV:
    """One-server secure Federated Shapley values (Algorithm 1).

    Parameters
    ----------
    X : ndarray of shape (M, d)
        Union of the clients' test sets (each row is encrypted by its owner).
    y : ndarray of shape (M,), int
    owners : ndarray of shape (M,), int
    n_classes : int
    ckks : CKKSParams, optional
        Default :func:`~flwr_fedeval.shapley.secsv.shapley_ckks_params`.
    batch_size : int, optional
        Samples per batch; default the largest: ``slots // d_out`` (reducing),
        the tile order ``d`` (squaring).
    binary_margin : bool, default=False
        With 2 classes, evaluate the single row ``θ_1 − θ_0`` (``d_out = 1``);
        see :class:`~flwr_fedeval.shapley.secsv.SecSV`.
    packing : {"reducing", "squaring"}, default="reducing"
        Encrypted matrix product: Matrix Reducing (Algorithm 5) or the paper's
        HESV baseline Matrix Squaring (§4.2).

    Raises
    ------
    ValueError
        An unknown ``packing``, or a ``batch_size`` that does not fit one batch
        (``> slots // d_out`` reducing, ``>`` the tile order squaring).

    Notes
    -----
    :attr:`stats` counts ct×ct products, and ``stats.extra["rotations"]`` the
    rotations (0 under reducing).
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, owners: np.ndarray, *, n_classes: int,
                 ckks: CKKSParams | None = None, batch_size: int | None = None,
                 binary_margin: bool = False, packing: str = "reducing") -> None:
        if packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}, got {packing!r}")
        X, y, owners = check_test_set(X, y, owners)
        self.X, self.y, self.owners = X, y, owners
        self.n_classes = int(n_classes)
        self.d_out = 1 if (binary_margin and self.n_classes == 2) else self.n_classes
        self.ckks = ckks or shapley_ckks_params()
        self.clients = sorted(set(owners.tolist()))
        self.packing = packing
        self.layout: SquaringLayout | None = None
        if packing == "squaring":
            self.layout = squaring_layout(self.d_out, X.shape[1] + 1, self.ckks.slot_count)
            largest = self.layout.order
        else:
            largest = max_batch(self.ckks.slot_count, self.d_out)
        if batch_size is not None and not 1 <= batch_size <= largest:
            raise ValueError(f"batch_size must be in [1, {largest}] with packing={packing!r}, got {batch_size}")
        self.m = batch_size or largest
        self.stats = ShapleyStats()
        self.stats.extra["rotations"] = 0
        self._wire = _Wire(self.stats)
        self._turn = 0
        self._setup_done = False

    def setup(self) -> None:
        """Algorithm 1 steps 1–3: leader keys; every owner encrypts its test batches."""
        t0 = time.perf_counter()
        self.leader = secrets.choice(self.clients)
        self.client_ctx: CKKSContext = create_context(params=self.ckks)
        # only squaring rotates; the OpenFHE backend always ships its rotation keys
        pub = self.client_ctx.public_bytes(rotation_keys=self.layout is not None or self.ckks.backend != "tenseal")
        self.stats.bytes_sent += len(pub)
        self.ctx_S = load_context(pub)
        xa = np.hstack([self.X, np.ones((len(self.y), 1))])
        self.batches = []   # (owner, sample ids, [[B̃^(o)]] list, [[Y]])
        for c in self.clients:
            rows = np.flatnonzero(self.owners == c)
            for start in range(0, len(rows), self.m):
                ids = rows[start:start + self.m]
                B = np.zeros((xa.shape[1], self.m))
                B[:, :len(ids)] = xa[ids].T
                cts = [self._wire.send(self.client_ctx, self.ctx_S, self.client_ctx.encrypt(v))
                       for v in self._pack_batch(B)]
                ylay = np.zeros(self.m)
                ylay[:len(ids)] = self.y[ids]
                ct_y = self._wire.send(self.client_ctx, self.ctx_S, self.client_ctx.encrypt(ylay))
                self.stats.encryptions += len(cts) + 1
                self.batches.append((c, ids, cts, ct_y))
        self._setup_done = True
        self.stats.setup_seconds += time.perf_counter() - t0

    def encrypt_models(self, models: Mapping[int, NDArray[np.floating[Any]]], weights: Mapping[int, float],
                       ) -> dict[int, list[Any]]:
        enc: dict[int, list[Any]] = {}
        for i, theta in models.items():
            A = float(weights[i]) * np.asarray(theta, dtype=np.float64)
            if self.d_out == 1:
                A = A[1:] - A[:1]
            vecs = self._pack_model(A)
            enc[i] = [self._wire.send(self.client_ctx, self.ctx_S, self.client_ctx.encrypt(v)) for v in vecs]
            self.stats.encryptions += len(vecs)
        return enc

    # -- the packing (Algorithm 5 or §4.2) ---------------------------------
    def _pack_batch(self, B: NDArray[np.float64]) -> list[NDArray[np.float64]]:
        """Plaintext slot vectors of one batch ``B`` (``d_in × m``), as its owner encrypts them."""
        if self.layout is None:
            red = reduce_data(B, self.d_out)
            return [red[o].ravel() for o in range(red.shape[0])]
        return list(pack_data(B, self.layout).reshape(-1, self.layout.order ** 2))

    def _pack_model(self, A: NDArray[np.float64]) -> list[NDArray[np.float64]]:
        """Plaintext slot vectors of one (weighted) model ``A`` (``d_out × d_in``)."""
        if self.layout is None:
            red = reduce_model(A, self.m)
            return [red[o].ravel() for o in range(red.shape[0])]
        return list(pack_model(A, self.layout).reshape(-1, self.layout.order ** 2))

    def _linear(self, enc_model: list[Any], cts: list[Any]) -> list[Any]:
        """Algorithm 2 step 2 (server): encrypted scores of one batch."""
        ctx = self.ctx_S
        if self.layout is None:
            prods = [ctx.multiply(a, b) for a, b in zip(enc_model, cts)]
            self.stats.ct_ct_mults += len(prods)
            return [ctx.add_many(prods)]
        self.stats.ct_ct_mults += self.layout.mults_per_batch
        self.stats.extra["rotations"] += self.layout.rotations_per_batch
        return matrix_squaring(ctx, enc_model, cts, self.layout)

    def _scores(self, plain: list[NDArray[np.float64]], n: int) -> NDArray[np.float64]:
        """``d_out × n`` scores from the decrypted slots (client ``i_{L+1}``)."""
        if self.layout is None:
            out: NDArray[np.float64] = plain[0][: self.d_out * self.m].reshape(self.d_out, self.m)[:, :n]
            return out
        return unpack_product(plain, self.layout, n)

    def secure_count(self, S: Coalition, enc_model: list[Any]) -> int:
        """Π_HE (Algorithm 2) over every batch: total number of correct predictions."""
        ctx = self.ctx_S
        total = 0
        for owner, ids, cts, ct_y in self.batches:
            self.stats.batches += 1
            scores_cts = self._linear(enc_model, cts)                                   # step 2
            h1, fb = pick_helper(self.clients, {owner}, set(S), self._turn)
            self._turn += 1
            self.stats.helper_fallbacks += int(fb)
            # steps 3, 7 (client i_{L+1}): decrypt, argmax, upload ⟦−Ŷ⟧
            dec = [self.client_ctx.decrypt(self._wire.send(ctx, self.client_ctx, c)) for c in scores_cts]
            self.stats.decryptions += len(dec)
            scores = self._scores(dec, len(ids))
            pred = np.zeros(self.m)
            pred[: len(ids)] = (scores[0] > 0) if self.d_out == 1 else np.argmax(scores, axis=0)
            neg_pred = self._wire.send(self.client_ctx, ctx, self.client_ctx.encrypt(-pred))
            self.stats.encryptions += 1
            diff = ctx.add_many([ct_y, neg_pred])                                       # step 8
            # step 9 (client i_{L+2} ≠ i_{L+1}): decrypt and return only the count
            h2, _ = pick_helper(self.clients, {owner, h1}, set(S), self._turn)
            d = self.client_ctx.decrypt(self._wire.send(ctx, self.client_ctx, diff))
            self.stats.decryptions += 1
            total += int(np.sum(np.abs(d[: len(ids)]) < 0.5))
        return total

    def round_evaluation(self, models: Mapping[int, np.ndarray], weights: Mapping[int, float]) -> RoundEvaluation:
        if not self._setup_done:
            self.setup()
        enc = self.encrypt_models(models, weights)
        M = len(self.y)
        ev = RoundEvaluation({}, {})
        for S in coalitions(sorted(models)):
            members = sorted(S)
            agg = [self.ctx_S.add_many([enc[i][o] for i in members]) for o in range(len(enc[members[0]]))]
            ev.utilities[S] = self.secure_count(S, agg) / M                            # Algorithm 1 step 8
            ev.evaluated_samples += M
        self.stats.evaluated_samples += ev.evaluated_samples
        return ev

    def run(self, rounds: Sequence[Mapping[int, np.ndarray]], weights: Mapping[int, float],
            *, empty_utilities: Sequence[float] | None = None) -> FSVResult:
        """Federated Shapley values of all rounds; :attr:`stats` holds time and work."""
        t0 = time.perf_counter()
        res = federated_shapley(rounds, weights, self.X, self.y, n_classes=self.n_classes,
                                empty_utilities=empty_utilities,
                                round_evaluator=lambda t, models, w: self.round_evaluation(models, w))
        self.stats.seconds += time.perf_counter() - t0
        res.extra["stats"] = self.stats
        return res
