"""Federated AUC under FHE against a malicious aggregator (Baykara et al. 2025, §IV-D, App. C).

Clients are semi-honest and share, besides the CKKS secret key, a secret
random ``seed`` (relayed with :func:`flwr_fedeval.keyshare.seal_bundle`;
the server never sees it). From ``seed`` and a public per-evaluation
``nonce`` every client derives the same *common randomness* for each of the
two runs ρ ∈ {0, 1} (§IV-D1):

* multipliers ``r3 … r8`` (log-uniform on ``r_range``), ``r0 = r3 r4``,
  ``r1 = r5 r6``, ``r2 = r7 r8``;
* zero-sum offsets ``tr[m, ·]``, ``fr[m, ·]`` (uniform, last party's row is
  minus the sum of the others, so ``Σ_m tr[m, n] = 0``);
* split bits ``b[n]`` and a permutation ``π`` of the ``S·(N+1)`` shares.

Client ``m`` then computes (§IV-D2 steps 3–5, counts divided by ``K``)::

    T_m^n = r3 (T^n_m + tr[m,n]),       F_m^n = r4 (F^n_m + fr[m,n])        n < N
    T_m^N = r5 (TP^{N-1}_m + tr[m,N]),  F_m^N = r6 (FP^{N-1}_m + fr[m,N])
    DT_m  = r7 (TP^{N-1}_m + tr[m,N+1]), DF_m = r8 (FP^{N-1}_m + fr[m,N+1])

splits ``T_m^n`` (if ``b[n] = 0``) or ``F_m^n`` (if ``b[n] = 1``) into ``S``
additive shares with its *own* CSPRNG and repeats the other factor ``S``
times (step 6), permutes both share vectors by ``π`` (step 7) and packs
them with the ``DT``/``DF`` correction slots exactly as the semi-honest
layout (:mod:`flwr_fedeval.fhe.auc`)::

    X_m = [π(T shares) (S(N+1) slots), DT_m - Σ π(T shares), 0]
    Y_m = [π(F shares),                0, DF_m - Σ π(F shares)]

so that ``Σ_slots X⊙Y = r0·num + r1·TP·FP`` (step 10, first line),
``Σ_slots X · Σ_slots Y = r2·TP·FP`` (step 10, second line), every slot
before the mask holds one of those two values only, and the aggregator's
work per run is identical to the semi-honest one (steps 9–11), with an
independent mask ``c_ρ`` per run. Both runs use independent randomness
(the paper's "double execution").

Verification (§IV-D3), per run::

    AUC_ρ = (c(r0 num + r1 TP FP) / (c r2 TP FP) · r2 − r1) / (2 r0)

and the client accepts ``AUC_0`` iff ``|AUC_0 − AUC_1| ≤ tolerance``
(default 1e-5, "5 decimals") and both lie in ``[0, 1]``; otherwise it raises
:class:`TamperingDetectedError`.

Differences from the authors' C++ (mdppml/FHAUC), which this follows the
paper against: non-zero zero-sum offsets, six independent multipliers per
run, a secret permutation, and a second run with fresh randomness.
CKKS headroom bounds the multipliers (``r_range``) — the paper's "32-bit"
multipliers would overflow the decryption modulus; soundness rests on the
verification tolerance being far below the spread of ``r1/r0`` and of the
offsets, not on their bit length.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from flwr_fedeval.fhe.auc import FHEAUCConfig, _check_counts, _load_client_messages, random_mask
from flwr_fedeval.fhe.backend import CKKSContext, pack_blobs, unpack_blobs
from flwr_fedeval.fhe.counts import ConfusionCounts, tf_vectors
from flwr_fedeval.metrics.auc import UndefinedAUCError

__all__ = [
    "MaliciousAUCConfig",
    "MaliciousAUCResult",
    "RunRandomness",
    "TamperingDetectedError",
    "aggregate_auc_malicious",
    "client_decrypt_auc_malicious",
    "client_encrypt_counts_malicious",
    "common_randomness",
    "new_seed",
    "required_slots",
]

N_RUNS = 2


class TamperingDetectedError(RuntimeError):
    """The two runs disagree (or a run is out of range): the aggregator deviated."""


@dataclass(frozen=True)
class MaliciousAUCConfig(FHEAUCConfig):
    """Public configuration of the malicious-aggregator protocol.

    Parameters
    ----------
    n_points, count_scale, mask_range
        As :class:`~flwr_fedeval.fhe.auc.FHEAUCConfig`.
    n_splits : int, default=4
        ``S``, the number of additive shares per value (§IV-D, step 6). The
        aggregator guesses the share layout with probability
        ``(S!(SN−S)!/(SN)!)^2`` (App. C): 2^-60 at N=100, S=4.
    tolerance : float, default=1e-5
        Largest accepted ``|AUC_0 − AUC_1|`` (verification to 5 decimals).
    r_range : (float, float), default=(0.5, 2.0)
        Support of the multipliers ``r3 … r8`` (log-uniform).
    offset_range : float, default=1.0
        Zero-sum offsets are uniform on ``[-offset_range, offset_range]``
        (in units of ``count_scale``).
    share_range : float, default=1.0
        The first ``S−1`` shares are uniform on ``[-share_range, share_range]``.
    """

    n_splits: int = 4
    tolerance: float = 1e-5
    r_range: tuple[float, float] = (0.5, 2.0)
    offset_range: float = 1.0
    share_range: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.n_splits, bool) or not isinstance(self.n_splits, (int, np.integer)) or self.n_splits < 2:
            raise ValueError(f"n_splits must be an integer >= 2, got {self.n_splits!r}")
        if not (0 < self.tolerance < 1e-2):
            raise ValueError(f"tolerance must be in (0, 1e-2), got {self.tolerance!r}")
        lo, hi = self.r_range
        if not (0 < lo <= hi and math.isfinite(hi)):
            raise ValueError(f"r_range must satisfy 0 < low <= high < inf, got {self.r_range!r}")
        for name in ("offset_range", "share_range"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")


def required_slots(n_points: int, n_splits: int) -> int:
    """Slots one ciphertext needs: ``S·(N+1) + 2``."""
    return n_splits * (n_points + 1) + 2


def new_seed() -> bytes:
    """A fresh 32-byte common seed (key holder; shared with :mod:`flwr_fedeval.keyshare`)."""
    return secrets.token_bytes(32)


class _XOF:
    """Deterministic stream from (seed, nonce, run, label) — SHAKE-256."""

    def __init__(self, seed: bytes, nonce: bytes, run: int, label: str) -> None:
        if not isinstance(seed, (bytes, bytearray)) or len(seed) < 32:
            raise ValueError("seed must be at least 32 bytes (use new_seed())")
        nonce = bytes(nonce)
        self._key = (b"flwr-fedeval fhe-auc-malicious v1" + struct.pack(">I", len(seed)) + bytes(seed)
                     + struct.pack(">I", len(nonce)) + nonce + struct.pack(">B", run) + label.encode())

    def uint64(self, count: int) -> np.ndarray:
        return np.frombuffer(hashlib.shake_256(self._key).digest(8 * count), dtype=">u8").astype(np.uint64)

    def uniform(self, count: int) -> np.ndarray:
        """Floats in [0, 1) with 53 random bits."""
        return (self.uint64(count) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class RunRandomness(NamedTuple):
    """Common randomness of one run (every client derives the same)."""

    r: np.ndarray  # r[0..8]; r[0]=r3 r4, r[1]=r5 r6, r[2]=r7 r8
    tr: np.ndarray  # (M, N+2), columns sum to zero over parties
    fr: np.ndarray  # (M, N+2)
    b: np.ndarray  # (N+1,) bits
    perm: np.ndarray  # (S(N+1),) permutation


def common_randomness(seed: bytes, *, config: MaliciousAUCConfig, n_parties: int, run: int,
                      nonce: bytes = b"") -> RunRandomness:
    """The common randomness of run ``run`` (§IV-D1), derived from the shared seed."""
    if isinstance(n_parties, bool) or not isinstance(n_parties, (int, np.integer)) or n_parties < 1:
        raise ValueError(f"n_parties must be an integer >= 1, got {n_parties!r}")
    if run not in (0, 1):
        raise ValueError(f"run must be 0 or 1, got {run!r}")
    n, s = config.n_points, config.n_splits
    lo, hi = (math.log(v) for v in config.r_range)
    r = np.empty(9)
    r[3:9] = np.exp(lo + _XOF(seed, nonce, run, "r").uniform(6) * (hi - lo))
    r[0], r[1], r[2] = r[3] * r[4], r[5] * r[6], r[7] * r[8]
    offsets = []
    for label in ("tr", "fr"):
        u = _XOF(seed, nonce, run, label).uniform(n_parties * (n + 2)).reshape(n_parties, n + 2)
        o = (2.0 * u - 1.0) * config.offset_range
        o[-1] = 0.0
        o[-1] = -o[:-1].sum(axis=0)
        offsets.append(o)
    bits = (_XOF(seed, nonce, run, "b").uint64(n + 1) & np.uint64(1)).astype(np.int8)
    # Fisher–Yates; 64-bit draws reduced mod i+1 (bias <= S(N+1)/2^64).
    size = s * (n + 1)
    draws = _XOF(seed, nonce, run, "pi").uint64(size)
    perm = np.arange(size)
    for i in range(size - 1, 0, -1):
        j = int(draws[i] % np.uint64(i + 1))
        perm[i], perm[j] = perm[j], perm[i]
    return RunRandomness(r=r, tr=offsets[0], fr=offsets[1], b=bits, perm=perm)


def _private_shares(values: np.ndarray, n_splits: int, share_range: float) -> np.ndarray:
    """Additive shares (rows sum to ``values``) from the OS CSPRNG (``secrets``)."""
    k = values.size * (n_splits - 1)
    raw = np.frombuffer(secrets.token_bytes(8 * k), dtype="<u8") >> np.uint64(11)
    free = ((raw.astype(np.float64) / float(1 << 53)) * 2.0 - 1.0).reshape(values.size, n_splits - 1) * share_range
    return np.concatenate([free, (values - free.sum(axis=1))[:, None]], axis=1)


def client_vectors_malicious(counts: ConfusionCounts, rnd: RunRandomness, *, config: MaliciousAUCConfig,
                             party_index: int, slot_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Plaintext layout ``(X_m, Y_m)`` of one run (steps 3–7; see module docstring)."""
    n, s = config.n_points, config.n_splits
    m = party_index
    need = required_slots(n, s)
    if need > slot_count:
        raise ValueError(f"N={n}, S={s} need {need} slots, the batch has {slot_count}")
    t, f = tf_vectors(counts.tp, counts.fp)
    k = float(config.count_scale)
    tp_tot, fp_tot = counts.tp[-1] / k, counts.fp[-1] / k
    r, tr, fr = rnd.r, rnd.tr[m], rnd.fr[m]
    tv = np.empty(n + 1)
    fv = np.empty(n + 1)
    tv[:n] = r[3] * (t / k + tr[:n])                      # step 3
    fv[:n] = r[4] * (f / k + fr[:n])
    tv[n] = r[5] * (tp_tot + tr[n])                       # step 4
    fv[n] = r[6] * (fp_tot + fr[n])
    dt = r[7] * (tp_tot + tr[n + 1])                      # step 5
    df = r[8] * (fp_tot + fr[n + 1])
    split_t = _private_shares(tv, s, config.share_range)  # step 6
    split_f = _private_shares(fv, s, config.share_range)
    rep_t = np.repeat(tv[:, None], s, axis=1)
    rep_f = np.repeat(fv[:, None], s, axis=1)
    bsel = rnd.b.astype(bool)[:, None]
    t_all = np.where(bsel, rep_t, split_t).reshape(-1)    # step 7: index n*S + s
    f_all = np.where(bsel, split_f, rep_f).reshape(-1)
    size = s * (n + 1)
    x = np.zeros(slot_count)
    y = np.zeros(slot_count)
    x[rnd.perm] = t_all                                   # common permutation π
    y[rnd.perm] = f_all
    x[size] = dt - x[:size].sum()
    y[size + 1] = df - y[:size].sum()
    return x, y


def _check_party(party_index: int, n_parties: int) -> None:
    if not (isinstance(party_index, (int, np.integer)) and 0 <= party_index < n_parties):
        raise ValueError(f"party_index must be in [0, {n_parties}), got {party_index!r}")


def client_encrypt_counts_malicious(ctx: CKKSContext, counts: ConfusionCounts, *, config: MaliciousAUCConfig,
                                    seed: bytes, party_index: int, n_parties: int, nonce: bytes = b"") -> bytes:
    """Steps 1–8 for both runs: the client's message to the aggregator (4 ciphertexts).

    Parameters
    ----------
    seed : bytes
        Common secret seed (≥ 32 bytes) shared by the clients only.
    party_index, n_parties : int
        This client's position ``m`` in the ordered list of ``M`` participants
        of this evaluation (set by the server; a lie breaks the zero sums and
        is detected).
    nonce : bytes
        Public, unique per evaluation (e.g. the server round); keeps runs of
        different evaluations independent under one seed.
    """
    _check_counts(counts, config.n_points)
    _check_party(party_index, n_parties)
    blobs = []
    for run in range(N_RUNS):
        rnd = common_randomness(seed, config=config, n_parties=n_parties, run=run, nonce=nonce)
        x, y = client_vectors_malicious(counts, rnd, config=config, party_index=party_index,
                                        slot_count=ctx.slot_count)
        blobs += [ctx.serialize_ciphertext(ctx.encrypt(x)), ctx.serialize_ciphertext(ctx.encrypt(y))]
    return pack_blobs(blobs)


def _aggregate_run(ctx: CKKSContext, xs: list, ys: list, c: float) -> list[bytes]:
    a = ctx.add_many(xs)                                   # step 9
    b = ctx.add_many(ys)
    num = ctx.sum_slots(ctx.multiply(a, b))                # step 10
    den = ctx.multiply(ctx.sum_slots(a), ctx.sum_slots(b))
    return [ctx.serialize_ciphertext(ctx.multiply_plain(num, [c])),   # step 11
            ctx.serialize_ciphertext(ctx.multiply_plain(den, [c]))]


def aggregate_auc_malicious(ctx: CKKSContext, messages: Sequence[bytes], *, config: MaliciousAUCConfig) -> bytes:
    """Steps 9–11 for both runs (aggregator, public context only).

    Returns
    -------
    bytes
        Four ciphertexts: ``E(c_ρ(r0 num + r1 TP FP))``, ``E(c_ρ r2 TP FP)`` for ρ = 0, 1.
    """
    loaded = _load_client_messages(ctx, messages, 2 * N_RUNS)
    out = []
    for run in range(N_RUNS):
        out += _aggregate_run(ctx, [m[2 * run] for m in loaded], [m[2 * run + 1] for m in loaded],
                              random_mask(config.mask_range))
    return pack_blobs(out)


class MaliciousAUCResult(NamedTuple):
    """The verified AUC and the two per-run values it was checked from."""

    auc: float
    auc_runs: tuple[float, float]


def client_decrypt_auc_malicious(ctx: CKKSContext, result: bytes, *, config: MaliciousAUCConfig,
                                 seed: bytes, n_parties: int, nonce: bytes = b"") -> MaliciousAUCResult:
    """Step 12 and verification (§IV-D3).

    Raises
    ------
    TamperingDetectedError
        If the runs disagree by more than ``config.tolerance``, a value is
        not finite, or an AUC lies outside ``[0, 1]``.
    UndefinedAUCError
        If both runs decrypt to ``0/0`` (pooled data with a single class —
        or an aggregator that zeroed everything, which no client can tell
        apart; no AUC value is accepted either way).
    """
    blobs = unpack_blobs(result, expected=2 * N_RUNS)
    vals = [float(ctx.decrypt(ctx.deserialize_ciphertext(b))[0]) for b in blobs]
    floor = config.mask_range[0] * config.r_range[0] ** 2 / float(config.count_scale) ** 2
    aucs, zero_runs = [], 0
    for run in range(N_RUNS):
        x, y = vals[2 * run], vals[2 * run + 1]
        r = common_randomness(seed, config=config, n_parties=n_parties, run=run, nonce=nonce).r
        if not (math.isfinite(x) and math.isfinite(y)):
            raise TamperingDetectedError(f"run {run}: non-finite decryption")
        if abs(y) < floor:
            zero_runs += int(abs(x) < floor)
            aucs.append(float("nan"))
            continue
        aucs.append((x / y * r[2] - r[1]) / (2.0 * r[0]))
    if zero_runs == N_RUNS:
        raise UndefinedAUCError(
            "global AUC is undefined: both runs decrypt to 0/0 (single-class pooled data, "
            "or an aggregator that zeroed the result)"
        )
    tol = config.tolerance
    if any(not (-tol <= a <= 1.0 + tol) for a in aucs):  # nan fails too
        raise TamperingDetectedError(f"AUC out of range or undefined in one run: {aucs}")
    if abs(aucs[0] - aucs[1]) > tol:
        raise TamperingDetectedError(
            f"the two runs disagree: {aucs[0]:.8f} vs {aucs[1]:.8f} (tolerance {tol:g})"
        )
    return MaliciousAUCResult(auc=float(aucs[0]), auc_runs=(float(aucs[0]), float(aucs[1])))
