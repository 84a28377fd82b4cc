"""SecSV: two-server secure Shapley values (Zheng et al., PVLDB 16(7) 2023, §5, Algorithms 3–7).

Parties (simulated in one process; every ciphertext that crosses a party
boundary is serialized and deserialized, and its bytes are counted):

* a **leader client** generates the CKKS keys (Algorithm 3, steps 1–2) and the
  other clients get the secret key; the two servers get the public context only;
* each client encrypts its local model of every round (Matrix Reducing layout,
  Algorithm 5) and splits its test set into additive shares over ``Z_{2^k}``,
  one for the principal server ``P`` and one for the auxiliary server ``A``;
* ``P`` and ``A`` each aggregate the coalition model under HE and multiply it
  with *their* share of a batch (``d_in`` ciphertext×plaintext products, no
  rotation); ``A`` sends its encrypted result to ``P``, who adds both and sends
  the sum to a helper client (Algorithm 4, steps 4–7);
* the helper client decrypts, reduces mod ``2^k``, takes the argmax and
  deals the zero test of :mod:`.zerotest` (replacing steps 11–14): ``P``
  opens ``r·(Ŷ − Y)`` for a random ``r ∈ F_p^*`` it does not know, so it
  learns only which samples are predicted correctly, never ``Ŷ − Y``.

Fixed point and the modular reduction
-------------------------------------
``X' + X'' = X + 2^k c`` (``c`` = carry), so ``A X' + A X'' ≡ A X (mod 2^k)``
only if the model ``A`` is an *integer* matrix. The clients therefore encrypt
``w_i · round(θ_i · 2^f_A)`` — the fixed-point model already multiplied by its
integer FedAvg weight ``w_i`` — so that the coalition model ``Σ_{i∈S} w_i A_i``
is an integer matrix obtained by additions only (no level, and ``argmax`` is
invariant to the positive factor ``Σ w_i``). The carry term makes the
pre-reduction values ~``2^k`` times larger than the result, and CKKS decodes
integers exactly only up to ~2^45 (measured with TenSEAL, N = 8192, no
rescale). The servers therefore split their shares into ``⌈k/b⌉`` limbs of
``b`` bits and evaluate each limb separately; the helper client recombines
``Σ_l 2^{bl} · round(dec_l) mod 2^k`` exactly. :class:`SecSVParams` checks
both bounds (exactness per limb, no wrap-around of the true scores) on
construction.

Randomness for shares comes from ``os.urandom`` (:mod:`.sharing`).
No flwr and no TensorFlow imports.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fedeval.fhe.backend import CKKSContext, CKKSParams, create_context, load_context
from flwr_fedeval.shapley.fsv import (
    Coalition,
    FSVResult,
    RoundEvaluation,
    coalitions,
    federated_shapley,
    sample_skip_utilities,
)
from flwr_fedeval.shapley.matrix_reducing import max_batch
from flwr_fedeval.shapley.parties import (
    add_products,
    check_test_set,
    choose_batches,
    encrypt_model,
    helper_predict,
    model_matrix,
    plan_batches,
    server_plaintexts,
    server_products,
    share_test_set,
)
from flwr_fedeval.shapley.sharing import LABEL_PRIME, share_field
from flwr_fedeval.shapley.zerotest import aux_share, deal, mask_label_share, open_zero_test

__all__ = ["SecSV", "SecSVParams", "ShapleyStats", "quantize_weights", "shapley_ckks_params"]

log = logging.getLogger(__name__)

#: CKKS decodes integer-valued slots exactly (|error| < 0.05) up to this many bits
#: when the products are not rescaled (TenSEAL, N = 8192, Δ = 2^49; measured).
EXACT_BITS = 45


def shapley_ckks_params(backend: str = "tenseal") -> CKKSParams:
    """CKKS parameters for HESV/SecSV: the project's TenSEAL default (128-bit classical).

    TenSEAL only: SecSV needs integer results exact up to ~2^45, which the
    TenSEAL ``dot_plain`` (no rescale, scale Δ²) gives; the OpenFHE default
    set leaves only ``2^(60−50−1)`` of headroom after its rescale.

    TenSEAL: ``N = 8192``, primes ``[60, 49, 49, 60]`` (218 bits = the
    HomomorphicEncryption.org bound), Δ = 2^49. After FedAvg of 3 models the
    scores are off by ~1e-9 relative (the issue measured 0.18 absolute with
    the authors' N = 4096, Δ = 2^23 and 1.1e-5 with N = 8192, Δ = 2^40).
    """
    return CKKSParams.default(backend)


def quantize_weights(counts: Mapping[int, int], bits: int = 8) -> dict[int, int]:
    """Integer FedAvg weights ``max(1, round((2^bits − 1) · n_i / max n))``.

    The secure protocols need small positive integer weights (see the module
    docstring); use the same weights in the plaintext reference to compare.
    """
    if not 1 <= bits <= 16:
        raise ValueError(f"bits must be in [1, 16], got {bits!r}")
    top = max(counts.values())
    if top <= 0:
        raise ValueError("example counts must be positive")
    return {i: max(1, int(round((2 ** bits - 1) * n / top))) for i, n in counts.items()}


@dataclass(frozen=True)
class SecSVParams:
    """Fixed-point, ring and CKKS parameters of SecSV, validated on construction.

    Parameters
    ----------
    ring_bits : int, default=42
        ``k``: shares live in ``Z_{2^k}``.
    data_frac_bits : int, default=10
        Fractional bits of the test features.
    model_frac_bits : int, default=10
        Fractional bits of the model parameters.
    limb_bits : int, default=14
        ``b``: the servers evaluate their shares in ``⌈k/b⌉`` limbs of ``b`` bits.
    weight_bits : int, default=8
        FedAvg weights are integers in ``[1, 2^weight_bits − 1]`` (:func:`quantize_weights`).
    model_bound : float, default=8.0
        Public bound on ``|θ|`` (clients refuse to encrypt larger parameters).
    feature_bound : float, default=16.0
        Public bound on ``|x|`` of the test features (scale them, e.g. min-max).
    max_clients : int, default=5
    n_features : int, default=48
    ckks : CKKSParams, optional
        Defaults to :func:`shapley_ckks_params`.
    """

    ring_bits: int = 42
    data_frac_bits: int = 10
    model_frac_bits: int = 10
    limb_bits: int = 14
    weight_bits: int = 8
    model_bound: float = 8.0
    feature_bound: float = 16.0
    max_clients: int = 5
    n_features: int = 48
    ckks: CKKSParams = field(default_factory=shapley_ckks_params)

    def __post_init__(self) -> None:
        if not 8 <= self.ring_bits <= 62:
            raise ValueError(f"ring_bits must be in [8, 62], got {self.ring_bits!r}")
        if not 1 <= self.limb_bits <= self.ring_bits:
            raise ValueError(f"limb_bits must be in [1, ring_bits], got {self.limb_bits!r}")
        ckks = self.ckks
        if ckks.backend != "tenseal":
            raise ValueError(f"SecSV needs the tenseal backend (exact integers up to 2^{EXACT_BITS}), "
                             f"got {ckks.backend!r}")
        d_in = self.n_features + 1
        w_sum = self.max_clients * (2 ** self.weight_bits - 1)
        a_max = w_sum * self.model_bound * 2 ** self.model_frac_bits
        # Per limb, P decrypts Σ_o A_S ⊙ (B'_l + B''_l): at most d_in·|A_S|·2^(b+1).
        garbage = math.log2(d_in * a_max) + self.limb_bits + 1
        if garbage > EXACT_BITS:
            raise ValueError(
                f"limb values reach 2^{garbage:.1f} > 2^{EXACT_BITS} (CKKS exact-integer range): "
                f"lower limb_bits, model_frac_bits or weight_bits")
        scores = math.log2(d_in * a_max * max(self.feature_bound, 1.0)) + self.data_frac_bits
        if scores >= self.ring_bits - 1:
            raise ValueError(
                f"scores may reach 2^{scores:.1f} >= 2^{self.ring_bits - 1} and wrap around in "
                f"Z_2^{self.ring_bits}: raise ring_bits or lower the fractional bits")

    @property
    def n_limbs(self) -> int:
        return -(-self.ring_bits // self.limb_bits)

    @classmethod
    def for_bounds(cls, *, n_features: int, max_clients: int, model_bound: float = 8.0,
                   feature_bound: float = 16.0, data_frac_bits: int = 10, model_frac_bits: int = 10,
                   weight_bits: int = 8, ckks: CKKSParams | None = None) -> SecSVParams:
        """The smallest ring ``k`` (and the widest limbs ``b``) valid for these public bounds.

        ``k = ⌈log2(d_in · |A_S|max · max(1, feature_bound)) + data_frac_bits⌉ + 2`` and
        ``b = ⌊45 − log2(d_in · |A_S|max) − 1⌋`` (the two checks of the constructor).

        Raises
        ------
        ValueError
            If no ``k ≤ 62`` or no ``b ≥ 1`` fits (bounds too large for fixed point).
        """
        if n_features < 1 or max_clients < 1:
            raise ValueError("n_features and max_clients must be >= 1")
        if not (model_bound > 0 and feature_bound > 0 and math.isfinite(model_bound * feature_bound)):
            raise ValueError("model_bound and feature_bound must be finite and > 0")
        d_in = n_features + 1
        a_bits = math.log2(d_in * max_clients * (2 ** weight_bits - 1) * model_bound) + model_frac_bits
        ring_bits = math.ceil(a_bits + math.log2(max(feature_bound, 1.0)) + data_frac_bits) + 2
        limb_bits = min(ring_bits, math.floor(EXACT_BITS - a_bits - 1))
        if ring_bits > 62 or limb_bits < 1:
            raise ValueError(
                f"no fixed-point parameters fit: scores need a {ring_bits}-bit ring (max 62) and limbs of "
                f"{limb_bits} bits (min 1); lower model_bound, feature_bound or the fractional bits")
        return cls(ring_bits=ring_bits, limb_bits=limb_bits, data_frac_bits=data_frac_bits,
                   model_frac_bits=model_frac_bits, weight_bits=weight_bits, model_bound=model_bound,
                   feature_bound=feature_bound, max_clients=max_clients, n_features=n_features,
                   ckks=ckks if ckks is not None else shapley_ckks_params())

    def to_config(self) -> dict[str, int | float]:
        """The public parameters as a flat dict (no CKKS set: it travels in the context)."""
        return {f: getattr(self, f) for f in ("ring_bits", "data_frac_bits", "model_frac_bits", "limb_bits",
                                               "weight_bits", "model_bound", "feature_bound",
                                               "max_clients", "n_features")}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], ckks: CKKSParams | None = None) -> SecSVParams:
        """Inverse of :meth:`to_config`; validates (``ValueError`` on bad or missing values)."""
        ints = ("ring_bits", "data_frac_bits", "model_frac_bits", "limb_bits", "weight_bits",
                "max_clients", "n_features")
        try:
            values = {f: int(config[f]) for f in ints}
            model_bound, feature_bound = float(config["model_bound"]), float(config["feature_bound"])
        except KeyError as exc:
            raise ValueError(f"SecSV parameters lack {exc.args[0]!r}") from None
        return cls(**values, model_bound=model_bound, feature_bound=feature_bound,
                   ckks=ckks if ckks is not None else shapley_ckks_params())


@dataclass
class ShapleyStats:
    """Work and traffic of a secure run."""

    seconds: float = 0.0
    setup_seconds: float = 0.0
    ct_pt_mults: int = 0
    ct_ct_mults: int = 0
    encryptions: int = 0
    decryptions: int = 0
    batches: int = 0
    bytes_sent: int = 0
    evaluated_samples: int = 0
    skipped_samples: int = 0
    helper_fallbacks: int = 0
    #: Seconds in the comparison (Algorithm 4 steps 11–14: the zero test, or the paper's opening).
    compare_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class _Wire:
    """Serialize a ciphertext at the sender, deserialize at the receiver, count bytes."""

    def __init__(self, stats: ShapleyStats) -> None:
        self.stats = stats

    def send(self, sender: CKKSContext, receiver: CKKSContext, ct: Any) -> Any:
        data = sender.serialize_ciphertext(ct)
        self.stats.bytes_sent += len(data)
        return receiver.deserialize_ciphertext(data)


def pick_helper(clients: Sequence[int], avoid_strict: set[int], avoid: set[int], start: int) -> tuple[int, bool]:
    """A client outside ``avoid_strict ∪ avoid`` (round-robin from ``start``); else outside
    ``avoid_strict``; returns ``(client, fell_back)``. Raises if none is available."""
    order = list(clients[start % len(clients):]) + list(clients[:start % len(clients)])
    for c in order:
        if c not in avoid_strict and c not in avoid:
            return c, False
    for c in order:
        if c not in avoid_strict:
            return c, True
    raise ValueError("no client can act as helper: every client owns data in the batch")


class SecSV:
    """Two-server secure Federated Shapley values (Algorithm 3).

    Parameters
    ----------
    X : ndarray of shape (M, d)
        Union of the clients' test sets (each row stays with its owner; only
        shares reach the servers).
    y : ndarray of shape (M,), int
    owners : ndarray of shape (M,), int
        Owner client of every test sample (sample IDs are public, §5.3).
    n_classes : int
    params : SecSVParams, optional
    batch_size : int, optional
        Samples per ciphertext; default ``slots // d_out`` (Table 1).
    binary_margin : bool, default=False
        With 2 classes, encrypt the single row ``θ_1 − θ_0`` (``d_out = 1``,
        predict 1 iff the margin is > 0, the same decision as the argmax):
        twice the samples per ciphertext. Clients then check
        ``|θ_1 − θ_0| ≤ model_bound`` instead of ``|θ| ≤ model_bound``.
    zero_test : bool, default=True
        P opens ``r·(Ŷ − Y)`` (:mod:`.zerotest`); ``False``: the paper's steps 11–14, P opens
        ``Ŷ − Y`` itself (leaks the label of a misclassified binary sample; for measuring the
        zero test's cost only).
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, owners: np.ndarray, *, n_classes: int,
                 params: SecSVParams | None = None, batch_size: int | None = None,
                 binary_margin: bool = False, zero_test: bool = True) -> None:
        X, y, owners = check_test_set(X, y, owners)
        self.params = params or SecSVParams(n_features=X.shape[1])
        if self.params.n_features != X.shape[1]:
            raise ValueError(f"params.n_features={self.params.n_features} but X has {X.shape[1]} features")
        if np.abs(X).max(initial=0) > self.params.feature_bound:
            raise ValueError(f"test features exceed feature_bound={self.params.feature_bound}; scale them first")
        self.X, self.y, self.owners = X, y, owners
        self.n_classes = int(n_classes)
        self.d_out = 1 if (binary_margin and self.n_classes == 2) else self.n_classes
        self.clients = sorted(set(owners.tolist()))
        assert self.params.ckks is not None  # SecSVParams.__post_init__ sets it
        slots = self.params.ckks.slot_count
        self.m = batch_size or max_batch(slots, self.d_out)
        if self.m * self.d_out > slots:
            raise ValueError(f"batch_size {self.m} x {self.n_classes} classes exceeds {slots} slots")
        self.zero_test = bool(zero_test)
        self.stats = ShapleyStats()
        self._wire = _Wire(self.stats)
        self._helper_turn = 0
        self._plain_cache: dict[tuple[str, bytes], list[list[Any]]] = {}
        self._setup_done = False

    # -- Algorithm 3, steps 1-3 -------------------------------------------
    def setup(self) -> None:
        """Key generation by a random leader; data shares to P and A; public contexts to the servers."""
        t0 = time.perf_counter()
        p = self.params
        self.leader = secrets.choice(self.clients)
        self.client_ctx = create_context(params=p.ckks)          # leader; relayed to the others
        pub = self.client_ctx.public_bytes()
        self.stats.bytes_sent += 2 * len(pub)
        self.ctx_P = load_context(pub)
        self.ctx_A = load_context(pub)
        (self.X_P, self.y_P), (self.X_A, self.y_A) = share_test_set(self.X, self.y, p)  # per owner
        self.stats.bytes_sent += 2 * (self.X_P.size + self.y_P.size) * math.ceil(p.ring_bits / 8)
        self._setup_done = True
        self.stats.setup_seconds += time.perf_counter() - t0

    # -- clients: encrypt the round's models (Algorithm 5, steps 1-3) -------
    def encrypt_models(self, models: Mapping[int, NDArray[np.floating[Any]]], weights: Mapping[int, float],
                       ) -> tuple[dict[int, list[Any]], dict[int, list[Any]]]:
        """Each client ``i`` encrypts the reduced matrices of ``w_i · round(θ_i 2^f_A)``;
        returns the deserialized ciphertexts held by P and by A."""
        enc_P: dict[int, list[Any]] = {}
        enc_A: dict[int, list[Any]] = {}
        for i, theta in models.items():
            try:
                A = model_matrix(theta, weights[i], self.params, n_classes=self.n_classes, d_out=self.d_out)
            except ValueError as exc:
                raise ValueError(f"client {i}: {exc}") from None
            cts = encrypt_model(self.client_ctx, A, self.m)
            self.stats.encryptions += len(cts)
            enc_P[i] = [self._wire.send(self.client_ctx, self.ctx_P, c) for c in cts]
            enc_A[i] = [self._wire.send(self.client_ctx, self.ctx_A, c) for c in cts]
        return enc_P, enc_A

    # -- Algorithm 4: Π_Sec -----------------------------------------------
    def _server_product(self, ctx: CKKSContext, enc_model: list[Any], share_rows: NDArray[np.uint64],
                        key: tuple[str, bytes] | None = None) -> list[Any]:
        """``[[A_S B̃_l]]`` for every limb ``l`` of one server's share (``d_in`` ct×pt each);
        the encoded batches of the whole test set are cached (``key``)."""
        if key is not None and key in self._plain_cache:
            plains = self._plain_cache[key]
        else:
            plains = server_plaintexts(ctx, share_rows, self.params, m=self.m, d_out=self.d_out)
            if key is not None:
                self._plain_cache[key] = plains
        self.stats.ct_pt_mults += sum(len(p) for p in plains)
        return server_products(ctx, enc_model, plains)

    def secure_test(self, S: Coalition, enc_P: list[Any], enc_A: list[Any], idx: ArrayLike) -> NDArray[np.bool_]:
        """Π_Sec(⟦θ_S⟧, (D', D'')) on the samples ``idx``: boolean mask of correct predictions.

        Batches come from :func:`~flwr_fedeval.shapley.parties.choose_batches` (the
        cached whole-test-set batches, or the samples gathered into new ones)."""
        p = self.params
        rows: NDArray[np.int64] = np.asarray(idx, dtype=np.int64)
        if not hasattr(self, "_full_batches"):
            self._full_batches = [np.arange(len(self.y))[pos]
                                  for pos in plan_batches(self.owners, self.m, self.clients)]
            self._full_keys = {b.tobytes() for b in self._full_batches}
        by_id = np.zeros(len(self.y), dtype=bool)
        for ids in choose_batches(rows, self.owners, self.m, self.clients, self._full_batches):
            self.stats.batches += 1
            key = ids.tobytes() if ids.tobytes() in self._full_keys else None
            key_A, key_P = (None, None) if key is None else (("A", key), ("P", key))
            res_A = self._server_product(self.ctx_A, enc_A, self.X_A[ids], key_A)  # step 4
            res_A = [self._wire.send(self.ctx_A, self.ctx_P, c) for c in res_A]
            res_P = self._server_product(self.ctx_P, enc_P, self.X_P[ids], key_P)  # step 5
            total = add_products(self.ctx_P, res_P, res_A)                              # step 6
            helper, fb = pick_helper(self.clients, set(self.owners[ids].tolist()), set(S), self._helper_turn)
            self._helper_turn += 1
            self.stats.helper_fallbacks += int(fb)
            total = [self._wire.send(self.ctx_P, self.client_ctx, ct) for ct in total]  # step 7 (helper)
            pred = helper_predict(self.client_ctx, total, len(ids), p, m=self.m, d_out=self.d_out)
            self.stats.decryptions += len(total)
            t_cmp = time.perf_counter()
            if self.zero_test:
                deal_P, deal_A = deal(pred)                   # zero test (steps 11-14): helper deals
                e = mask_label_share(self.y_P[ids], deal_P)   # P -> A
                f, z_A = aux_share(deal_A, self.y_A[ids], e)  # A -> P
                by_id[ids] = open_zero_test(deal_P, e, f, z_A)[0]
                self.stats.bytes_sent += 10 * len(ids) * 4      # 3 + 4 (sealed) + 1 + 2 field elements
            else:                                             # the paper's steps 11-14: P opens Ŷ − Y
                pred_P, pred_A = share_field(pred, LABEL_PRIME)
                diff = (pred_P + pred_A + 2 * np.uint64(LABEL_PRIME) - self.y_P[ids] - self.y_A[ids])
                by_id[ids] = diff % np.uint64(LABEL_PRIME) == 0
                self.stats.bytes_sent += 3 * len(ids) * 4
            self.stats.compare_seconds += time.perf_counter() - t_cmp
        out: NDArray[np.bool_] = by_id[rows]
        return out

    # -- Algorithm 3, steps 4-13 / Algorithm 6 ------------------------------
    def round_evaluation(self, models: Mapping[int, NDArray[np.floating[Any]]], weights: Mapping[int, float],
                         *, sample_skip: bool = False) -> RoundEvaluation:
        """Utilities of every coalition of one round (SampleSkip optional)."""
        if not self._setup_done:
            self.setup()
        t0 = time.perf_counter()
        enc_P, enc_A = self.encrypt_models(models, weights)
        cache: dict[Coalition, tuple[list[Any], list[Any]]] = {}

        def aggregate(S: Coalition) -> tuple[list[Any], list[Any]]:
            if S not in cache:   # Algorithm 3 step 9: both servers aggregate under HE
                members = sorted(S)
                agg_P = [self.ctx_P.add_many([enc_P[i][o] for i in members]) for o in range(len(enc_P[members[0]]))]
                agg_A = [self.ctx_A.add_many([enc_A[i][o] for i in members]) for o in range(len(enc_A[members[0]]))]
                cache[S] = (agg_P, agg_A)
            return cache[S]

        def evaluate(S: Coalition, idx: NDArray[np.intp]) -> NDArray[np.bool_]:
            agg_P, agg_A = aggregate(S)
            return self.secure_test(S, agg_P, agg_A, np.asarray(idx))

        M = len(self.y)
        if sample_skip:
            ev = sample_skip_utilities(models, weights, self.X, self.y, evaluate=evaluate)
        else:
            ev = RoundEvaluation({}, {})
            for S in coalitions(sorted(models)):
                ok = evaluate(S, np.arange(M))
                ev.correct[S] = ok
                ev.utilities[S] = float(ok.sum()) / M
                ev.evaluated_samples += M
        self.stats.evaluated_samples += ev.evaluated_samples
        self.stats.skipped_samples += ev.skipped_samples
        log.info("SecSV round: %d coalitions, %d (sample, model) pairs tested, %d skipped, %.1fs",
                 len(ev.utilities), ev.evaluated_samples, ev.skipped_samples, time.perf_counter() - t0)
        return ev

    def run(self, rounds: Sequence[Mapping[int, NDArray[np.floating[Any]]]], weights: Mapping[int, float],
            *, sample_skip: bool = False, empty_utilities: Sequence[float] | None = None) -> FSVResult:
        """Federated Shapley values of all rounds; :attr:`stats` holds time and work."""
        t0 = time.perf_counter()
        res = federated_shapley(
            rounds, weights, self.X, self.y, n_classes=self.n_classes,
            empty_utilities=empty_utilities,
            round_evaluator=lambda t, models, w: self.round_evaluation(models, w, sample_skip=sample_skip),
        )
        self.stats.seconds += time.perf_counter() - t0
        res.extra["stats"] = self.stats
        return res
