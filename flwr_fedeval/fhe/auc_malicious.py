"""Federated AUC under FHE against a malicious aggregator (Baykara et al. 2025, §IV-D, App. C).

Clients are semi-honest and share, besides the CKKS secret key, a secret
random ``seed`` (relayed with :func:`flwr_fedeval.keyshare.seal_bundle`;
the server never sees it). From ``seed`` and a public per-evaluation
``nonce`` every client derives the same *common randomness* for each of the
two runs ρ ∈ {0, 1} (§IV-D1):

* multipliers ``r3 … r10`` (log-uniform on ``r_range``), ``r0 = r3 r4``,
  ``r1 = r5 r6``, ``r2 = r7 r8``;
* zero-sum offsets ``tr[m, ·]``, ``fr[m, ·]``, ``pr[m, ·]`` (uniform, last
  party's row is minus the sum of the others, so ``Σ_m tr[m, n] = 0``);
* split bits ``b[n]`` and a permutation ``π`` of the ``S·(N+2)`` shares.

Client ``m`` then computes (§IV-D2 steps 3–5, counts divided by the derived
``K``, ``T``/``F`` of the curve closed at (1, 1), ``n = 0..N``; ``P_m``,
``N_m`` its positives and negatives, ``p_m^n`` its positives per bin)::

    T_m^n = r3 (T^n_m + tr[m,n]),       F_m^n = r4 (F^n_m + fr[m,n])        n <= N
    T_m^{N+1} = r5 (P_m + tr[m,N+1]),   F_m^{N+1} = r6 (N_m + fr[m,N+1])
    DT_m  = r7 (P_m + tr[m,N+2]),       DF_m = r8 (N_m + fr[m,N+2])
    R_m^n = r9 (p^n_m + pr[m,n]) (n <= N),  R_m^{N+1} = r10 (P_m + pr[m,N+1])

splits ``T_m^n`` and ``R_m^n`` (if ``b[n] = 0``) or ``F_m^n`` (if ``b[n] = 1``)
into ``S`` additive shares with its *own* CSPRNG and repeats the other factor
``S`` times (step 6), permutes the share vectors by ``π`` (step 7) and packs
them with the ``DT``/``DF`` correction slots as the semi-honest layout
(:mod:`flwr_fedeval.fhe.auc`)::

    X_m = [π(T shares) (S(N+2) slots), DT_m - Σ π(T shares), 0]
    Y_m = [π(F shares),                0, DF_m - Σ π(F shares)]
    Z_m = [π(R shares),                0, 0]

so that ``Σ_slots X⊙Y = r0·num + r1·P·N`` (step 10, first line),
``Σ_slots X · Σ_slots Y = r2·P·N`` (step 10, second line) and
``Σ_slots Z⊙Y = r9 r4·res + r10 r6·P·N`` (the resolution bound's numerator
``res = Σ_b p_b n_b``, masked the same way), every slot before the mask holds
one of those values only, and the aggregator's work per run is the
semi-honest one (steps 9–11), with an independent mask ``c_ρ`` per run. Both
runs use independent randomness (the paper's "double execution").

Verification (§IV-D3), per run::

    AUC_ρ   = (c(r0 num + r1 P N) / (c r2 P N) · r2 − r1) / (2 r0)
    bound_ρ = (c(r9 r4 res + r10 r6 P N) / (c r2 P N) · r2 − r10 r6) / (2 r9 r4)

and the client accepts ``AUC_0`` iff ``|AUC_0 − AUC_1|`` and
``|bound_0 − bound_1|`` are at most ``tolerance`` (default 1e-5, "5
decimals") and both lie in range; otherwise it raises
:class:`TamperingDetectedError`. Runs further apart than ``tolerance`` plus
both runs' estimated CKKS error are tampering whatever the precision (no honest
run gets there). Otherwise, a run whose estimated CKKS error exceeds
``max_error`` (a tiny minority class among many rows) raises
:class:`~flwr_fedeval.fhe.auc.AUCPrecisionError` — never a false tampering
alarm: ``tolerance >= 4·max_error`` by construction. The count encoding is
derived from ``max_rows`` with ``R/K <= 4`` (final values ``<= 6·(R/K)² = 96``,
inside both parameter sets' headroom), so honest runs never raise
:class:`TamperingDetectedError` at any supported size; the supported maximum
is that of :func:`flwr_fedeval.fhe.auc.max_pooled_rows`. *Privacy cost of
the bound*: the clients learn ``res/(P N)`` (the fraction of pairs sharing a
bin), the server nothing more.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from flwr_fedeval.fhe.auc import (
    AUCPrecisionError,
    FHEAUCConfig,
    _check_counts,
    _check_rows,
    _load_client_messages,
    certify,
    check_supported,
    random_mask,
)
from flwr_fedeval.fhe.backend import CKKSContext, pack_blobs, unpack_blobs
from flwr_fedeval.metrics.auc import UndefinedAUCError
from flwr_fedeval.metrics.counts import ConfusionCounts, bin_counts, closed_tf_vectors

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
    n_points, max_rows, mask_range, max_error
        As :class:`~flwr_fedeval.fhe.auc.FHEAUCConfig` (``K`` derived with
        ``R/K <= 4``).
    n_splits : int, default=4
        ``S``, the number of additive shares per value (§IV-D, step 6). The
        aggregator guesses the share layout with probability
        ``(S!(SN−S)!/(SN)!)^2`` (App. C): 2^-60 at N=100, S=4.
    tolerance : float, default=1e-5
        Largest accepted ``|AUC_0 − AUC_1|`` (verification to 5 decimals);
        at least ``4 · max_error``.
    r_range : (float, float), default=(0.5, 2.0)
        Support of the multipliers ``r3 … r10`` (log-uniform), within
        ``[0.5, 2]`` (CKKS headroom).
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

    _shift = 2
    _error_safety = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.n_splits, bool) or not isinstance(self.n_splits, (int, np.integer)) or self.n_splits < 2:
            raise ValueError(f"n_splits must be an integer >= 2, got {self.n_splits!r}")
        if not (0 < self.tolerance < 1e-2):
            raise ValueError(f"tolerance must be in (0, 1e-2), got {self.tolerance!r}")
        if self.tolerance < 4 * self.max_error:
            raise ValueError(
                f"tolerance ({self.tolerance:g}) must be >= 4 * max_error ({self.max_error:g}), "
                "so that CKKS noise of honest runs never looks like tampering"
            )
        lo, hi = self.r_range
        if not (0.5 <= lo <= hi <= 2.0):
            raise ValueError(f"r_range must satisfy 0.5 <= low <= high <= 2, got {self.r_range!r}")
        for name in ("offset_range", "share_range"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")


def required_slots(n_points: int, n_splits: int) -> int:
    """Slots one ciphertext needs: ``S·(N+2) + 2``."""
    return n_splits * (n_points + 2) + 2


def new_seed() -> bytes:
    """A fresh 32-byte common seed (key holder; shared with :mod:`flwr_fedeval.keyshare`)."""
    return secrets.token_bytes(32)


class _XOF:
    """Deterministic stream from (seed, nonce, participant-list digest, run, label) — SHAKE-256."""

    def __init__(self, seed: bytes, nonce: bytes, run: int, label: str, transcript: bytes = b"") -> None:
        if not isinstance(seed, (bytes, bytearray)) or len(seed) < 32:
            raise ValueError("seed must be at least 32 bytes (use new_seed())")
        nonce, transcript = bytes(nonce), bytes(transcript)
        self._key = (b"flwr-fedeval fhe-auc-malicious v3" + struct.pack(">I", len(seed)) + bytes(seed)
                     + struct.pack(">I", len(nonce)) + nonce + struct.pack(">I", len(transcript)) + transcript
                     + struct.pack(">B", run) + label.encode())

    def uint64(self, count: int) -> NDArray[np.uint64]:
        words: NDArray[np.uint64] = np.frombuffer(hashlib.shake_256(self._key).digest(8 * count), dtype=">u8")
        return words.astype(np.uint64)

    def uniform(self, count: int) -> NDArray[np.float64]:
        """Floats in [0, 1) with 53 random bits."""
        top: NDArray[np.float64] = (self.uint64(count) >> np.uint64(11)).astype(np.float64)
        return top / float(1 << 53)


class RunRandomness(NamedTuple):
    """Common randomness of one run (every client derives the same)."""

    r: np.ndarray  # r[0..10]; r[0]=r3 r4, r[1]=r5 r6, r[2]=r7 r8
    tr: np.ndarray  # (M, N+3), columns sum to zero over parties
    fr: np.ndarray  # (M, N+3)
    pr: np.ndarray  # (M, N+2)
    b: np.ndarray  # (N+2,) bits
    perm: np.ndarray  # (S(N+2),) permutation


def common_randomness(seed: bytes, *, config: MaliciousAUCConfig, n_parties: int, run: int,
                      nonce: bytes = b"", transcript: bytes = b"") -> RunRandomness:
    """The common randomness of run ``run`` (§IV-D1), derived from the shared seed.

    The XOF key is (seed, ``nonce``, ``transcript``, run, label): ``transcript`` is the digest of
    the signed participant list the offsets are drawn for
    (:meth:`flwr_fedeval.protocol.fhe_auc.ParticipantList.digest`), so parties that were shown
    different lists draw unrelated randomness and the double execution disagrees.
    """
    if isinstance(n_parties, bool) or not isinstance(n_parties, (int, np.integer)) or n_parties < 1:
        raise ValueError(f"n_parties must be an integer >= 1, got {n_parties!r}")
    if run not in (0, 1):
        raise ValueError(f"run must be 0 or 1, got {run!r}")
    n, s = config.n_points, config.n_splits
    lo, hi = (math.log(v) for v in config.r_range)
    r = np.empty(11)
    r[3:11] = np.exp(lo + _XOF(seed, nonce, run, "r", transcript).uniform(8) * (hi - lo))
    r[0], r[1], r[2] = r[3] * r[4], r[5] * r[6], r[7] * r[8]
    offsets = []
    for label, width in (("tr", n + 3), ("fr", n + 3), ("pr", n + 2)):
        u = _XOF(seed, nonce, run, label, transcript).uniform(n_parties * width).reshape(n_parties, width)
        o = (2.0 * u - 1.0) * config.offset_range
        o[-1] = 0.0
        o[-1] = -o[:-1].sum(axis=0)
        offsets.append(o)
    bits = (_XOF(seed, nonce, run, "b", transcript).uint64(n + 2) & np.uint64(1)).astype(np.int8)
    # Fisher–Yates; 64-bit draws reduced mod i+1 (bias <= S(N+2)/2^64).
    size = s * (n + 2)
    draws = _XOF(seed, nonce, run, "pi", transcript).uint64(size)
    perm = np.arange(size)
    for i in range(size - 1, 0, -1):
        j = int(draws[i] % np.uint64(i + 1))
        perm[i], perm[j] = perm[j], perm[i]
    return RunRandomness(r=r, tr=offsets[0], fr=offsets[1], pr=offsets[2], b=bits, perm=perm)


def _private_shares(values: np.ndarray, n_splits: int, share_range: float) -> np.ndarray:
    """Additive shares (rows sum to ``values``) from the OS CSPRNG (``secrets``)."""
    k = values.size * (n_splits - 1)
    raw = np.frombuffer(secrets.token_bytes(8 * k), dtype="<u8") >> np.uint64(11)
    free = ((raw.astype(np.float64) / float(1 << 53)) * 2.0 - 1.0).reshape(values.size, n_splits - 1) * share_range
    return np.concatenate([free, (values - free.sum(axis=1))[:, None]], axis=1)


def client_vectors_malicious(counts: ConfusionCounts, rnd: RunRandomness, *, config: MaliciousAUCConfig,
                             party_index: int, slot_count: int,
                             declared_rows: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plaintext layout ``(X_m, Y_m, Z_m)`` of one run (steps 3–7; see module docstring).

    Raises
    ------
    CountBoundError
        If the client's rows exceed ``config.max_rows`` or ``declared_rows``.
    """
    _check_counts(counts, config.n_points)
    _check_rows(counts, config, declared_rows)
    n, s = config.n_points, config.n_splits
    m = party_index
    need = required_slots(n, s)
    if need > slot_count:
        raise ValueError(f"N={n}, S={s} need {need} slots, the batch has {slot_count}")
    t, f = closed_tf_vectors(counts)
    pb, _ = bin_counts(counts)
    k = float(config.count_scale)
    p_tot, n_tot = counts.n_positive / k, counts.n_negative / k
    r, tr, fr, pr = rnd.r, rnd.tr[m], rnd.fr[m], rnd.pr[m]
    tv = np.empty(n + 2)
    fv = np.empty(n + 2)
    pv = np.empty(n + 2)
    tv[: n + 1] = r[3] * (t / k + tr[: n + 1])                    # step 3
    fv[: n + 1] = r[4] * (f / k + fr[: n + 1])
    pv[: n + 1] = r[9] * (pb / k + pr[: n + 1])
    tv[n + 1] = r[5] * (p_tot + tr[n + 1])                        # step 4
    fv[n + 1] = r[6] * (n_tot + fr[n + 1])
    pv[n + 1] = r[10] * (p_tot + pr[n + 1])
    dt = r[7] * (p_tot + tr[n + 2])                               # step 5
    df = r[8] * (n_tot + fr[n + 2])
    split_t = _private_shares(tv, s, config.share_range)          # step 6
    split_f = _private_shares(fv, s, config.share_range)
    split_p = _private_shares(pv, s, config.share_range)
    bsel = rnd.b.astype(bool)[:, None]
    t_all = np.where(bsel, np.repeat(tv[:, None], s, axis=1), split_t).reshape(-1)  # index n*S + s
    p_all = np.where(bsel, np.repeat(pv[:, None], s, axis=1), split_p).reshape(-1)
    f_all = np.where(bsel, split_f, np.repeat(fv[:, None], s, axis=1)).reshape(-1)
    size = s * (n + 2)
    x = np.zeros(slot_count)
    y = np.zeros(slot_count)
    z = np.zeros(slot_count)
    x[rnd.perm] = t_all                                           # step 7: common permutation π
    y[rnd.perm] = f_all
    z[rnd.perm] = p_all
    x[size] = dt - x[:size].sum()
    y[size + 1] = df - y[:size].sum()
    return x, y, z


def _check_party(party_index: int, n_parties: int) -> None:
    if not (isinstance(party_index, (int, np.integer)) and 0 <= party_index < n_parties):
        raise ValueError(f"party_index must be in [0, {n_parties}), got {party_index!r}")


def client_encrypt_counts_malicious(ctx: CKKSContext, counts: ConfusionCounts, *, config: MaliciousAUCConfig,
                                    seed: bytes, party_index: int, n_parties: int, nonce: bytes = b"",
                                    declared_rows: int | None = None, transcript: bytes = b"") -> bytes:
    """Steps 1–8 for both runs: the client's message to the aggregator (6 ciphertexts).

    Parameters
    ----------
    seed : bytes
        Common secret seed (≥ 32 bytes) shared by the clients only.
    party_index, n_parties : int
        This client's position ``m`` in the ordered list of ``M`` participants
        of this evaluation, derived by the client from the signed participant list
        (never a server field).
    nonce : bytes
        Public, unique per evaluation (e.g. the server round); keeps runs of
        different evaluations independent under one seed.
    declared_rows : int, optional
        The bound this client declared on its test rows; counts beyond it are refused.
    transcript : bytes, optional
        Digest of the signed participant list, bound into the XOF key (:func:`common_randomness`).

    Raises
    ------
    CountBoundError
        If ``config.max_rows`` exceeds the parameter set's maximum, or the
        client's rows exceed ``config.max_rows`` or ``declared_rows``.
    """
    _check_counts(counts, config.n_points)
    _check_party(party_index, n_parties)
    check_supported(config, ctx.params)
    blobs = []
    for run in range(N_RUNS):
        rnd = common_randomness(seed, config=config, n_parties=n_parties, run=run, nonce=nonce,
                                transcript=transcript)
        vecs = client_vectors_malicious(counts, rnd, config=config, party_index=party_index,
                                        slot_count=ctx.slot_count, declared_rows=declared_rows)
        blobs += [ctx.serialize_ciphertext(ctx.encrypt(v)) for v in vecs]
    return pack_blobs(blobs)


def _aggregate_run(ctx: CKKSContext, xs: list[Any], ys: list[Any], zs: list[Any], c: float) -> list[bytes]:
    a = ctx.add_many(xs)                                   # step 9
    b = ctx.add_many(ys)
    z = ctx.add_many(zs)
    num = ctx.sum_slots(ctx.multiply(a, b))                # step 10
    den = ctx.multiply(ctx.sum_slots(a), ctx.sum_slots(b))
    res = ctx.sum_slots(ctx.multiply(z, b))
    return [ctx.serialize_ciphertext(ctx.multiply_plain(v, [c])) for v in (num, den, res)]  # step 11


def aggregate_auc_malicious(ctx: CKKSContext, messages: Sequence[bytes], *, config: MaliciousAUCConfig) -> bytes:
    """Steps 9–11 for both runs (aggregator, public context only).

    Returns
    -------
    bytes
        Six ciphertexts: ``E(c_ρ(r0 num + r1 P N))``, ``E(c_ρ r2 P N)``,
        ``E(c_ρ(r9 r4 res + r10 r6 P N))`` for ρ = 0, 1.

    Raises
    ------
    SerializationError
        If a message is not six ciphertexts of this key set.
    """
    per = 3
    loaded = _load_client_messages(ctx, messages, per * N_RUNS)
    out = []
    for run in range(N_RUNS):
        xs, ys, zs = ([m[per * run + i] for m in loaded] for i in range(per))
        out += _aggregate_run(ctx, xs, ys, zs, random_mask(config.mask_range))
    return pack_blobs(out)


class MaliciousAUCResult(NamedTuple):
    """The verified AUC, its resolution bound and CKKS error, and the per-run values."""

    auc: float
    auc_runs: tuple[float, float]
    resolution_bound: float = math.nan
    ckks_error: float = math.nan


def client_decrypt_auc_malicious(ctx: CKKSContext, result: bytes, *, config: MaliciousAUCConfig,
                                 seed: bytes, n_parties: int, nonce: bytes = b"",
                                 transcript: bytes = b"") -> MaliciousAUCResult:
    """Step 12 and verification (§IV-D3); ``n_parties``, ``nonce`` and ``transcript`` as at encryption.

    Raises
    ------
    TamperingDetectedError
        If the runs disagree by more than ``config.tolerance`` (AUC or
        resolution bound), a value is not finite, or a value lies outside
        its range (AUC ``[0, 1]``, bound ``[0, ½]``).
    AUCPrecisionError
        If a run's estimated CKKS error exceeds ``config.max_error`` (a tiny
        minority class among many rows; or an aggregator that shrank the
        denominator, which only denies the result).
    UndefinedAUCError
        If both runs decrypt to ``0/0`` (pooled data with a single class —
        or an aggregator that zeroed everything, which no client can tell
        apart; no AUC value is accepted either way).
    """
    blobs = unpack_blobs(result, expected=3 * N_RUNS)
    vals = [float(ctx.decrypt(ctx.deserialize_ciphertext(b))[0]) for b in blobs]
    floor = config.mask_range[0] * config.r_range[0] ** 2 / float(config.count_scale) ** 2
    def eps(v: float) -> float:
        return config.ckks_error(ctx.params, v)

    aucs, bounds, errs, zero_runs = [], [], [], 0
    for run in range(N_RUNS):
        x, y, w = vals[3 * run: 3 * run + 3]
        r = common_randomness(seed, config=config, n_parties=n_parties, run=run, nonce=nonce,
                              transcript=transcript).r
        if not all(math.isfinite(v) for v in (x, y, w)):
            raise TamperingDetectedError(f"run {run}: non-finite decryption")
        if abs(y) < floor:
            zero_runs += int(abs(x) < floor)
            aucs.append(float("nan"))
            bounds.append(float("nan"))
            errs.append(0.0)
            continue
        auc = (x / y * r[2] - r[1]) / (2.0 * r[0])
        bound = (w / y * r[2] - r[10] * r[6]) / (2.0 * r[9] * r[4])
        # d AUC = r2/(2 r0) · (dx + |x/y| dy)/|y|; same form for the bound.
        err = max(r[2] * (eps(x) + abs(x / y) * eps(y)) / (2.0 * r[0] * abs(y)),
                  r[2] * (eps(w) + abs(w / y) * eps(y)) / (2.0 * r[9] * r[4] * abs(y)))
        aucs.append(auc)
        bounds.append(bound)
        errs.append(err)
    if zero_runs == N_RUNS:
        raise UndefinedAUCError(
            "global AUC is undefined: both runs decrypt to 0/0 (single-class pooled data, "
            "or an aggregator that zeroed the result)"
        )
    tol = config.tolerance
    if all(math.isfinite(a) for a in aucs):
        # Runs further apart than tolerance + both runs' CKKS error bounds: no honest run gets
        # there, however imprecise, so this is tampering (e.g. the aggregator swapped the runs),
        # reported as such before the precision check below could only deny the result.
        slack = tol + errs[0] + errs[1]
        if abs(aucs[0] - aucs[1]) > slack or abs(bounds[0] - bounds[1]) > slack:
            raise TamperingDetectedError(
                f"the two runs disagree beyond their CKKS error: AUC {aucs[0]:.8f} vs {aucs[1]:.8f}, "
                f"resolution bound {bounds[0]:.8f} vs {bounds[1]:.8f} (tolerance {tol:g} + CKKS error "
                f"{errs[0] + errs[1]:.2g})"
            )
    if max(errs) > config.max_error and all(math.isfinite(a) for a in aucs):
        raise AUCPrecisionError(
            f"malicious FHE AUC: the CKKS error may reach {max(errs):.2g} > max_error={config.max_error:g}: the "
            f"minority class is tiny relative to the pooled bound max_rows={config.max_rows}; fix: a "
            "parameter set with a larger scaling factor, or more samples of the minority class"
        )
    if any(not (-tol <= a <= 1.0 + tol) for a in aucs) or any(not (-tol <= b <= 0.5 + tol) for b in bounds):
        raise TamperingDetectedError(
            f"AUC or resolution bound out of range or undefined in one run: AUC {aucs}, bound {bounds}"
        )
    if abs(aucs[0] - aucs[1]) > tol or abs(bounds[0] - bounds[1]) > tol:
        raise TamperingDetectedError(
            f"the two runs disagree: AUC {aucs[0]:.8f} vs {aucs[1]:.8f}, resolution bound "
            f"{bounds[0]:.8f} vs {bounds[1]:.8f} (tolerance {tol:g})"
        )
    auc, bound = certify(aucs[0], bounds[0], errs[0], config, "malicious FHE AUC")
    return MaliciousAUCResult(auc=auc, auc_runs=(float(aucs[0]), float(aucs[1])),
                              resolution_bound=bound, ckks_error=float(max(errs)))
