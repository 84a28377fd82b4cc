"""Client side of the DP AUC phases (DPAUC_Lap, DPAUC_RR, FedAUC_RR, FedAUC_Lap).

Each function here serves one step of :mod:`flwr_fedeval.protocol.dp_auc`:
``(request, context, y_true, y_score) -> reply payload``, the request already
parsed and checked; :func:`~flwr_fedeval.clients.auc_handlers.register_dp_handlers`
wraps them (``protocol.handler``) and registers them. The DP math is in
:mod:`flwr_fedeval.dp` (these functions only keep the client's state).

Privacy budget
    Every client holds a diffprivlib ``BudgetAccountant`` whose total is the
    client's own configuration (``dp-budget``, or ``dp-epsilon`` when
    ``dp-budget = 0``), *not* a value the server sends. The server's request
    names the ε of one evaluation; the :mod:`flwr_fedeval.dp` client step
    charges it before any noise is drawn. The spends are kept in
    ``context.state["dp-accountant"]`` (a ConfigRecord of floats), so repeated
    evaluations in one run accumulate. A request the accountant cannot afford
    is refused (:class:`flwr_fedeval.protocol.dp_auc.BudgetError`, code
    ``BUDGET_EXHAUSTED``): the error reply reads ``BudgetError: ...`` and
    nothing noisy is sent.

Randomized response
    Labels are flipped **once** per ε (DPAUC_RR Step 1) and kept in
    ``context.state["dp-rr-labels"]``; later RR evaluations at the same ε reuse
    them for free (post-processing), DPAUC_RR and FedAUC_RR alike.

Randomness
    ``dp-seed = 0``: every draw is seeded from :mod:`secrets`. ``dp-seed > 0``:
    one ``RandomState`` per request seeded from ``(dp-seed, partition-id,
    request counter)`` — reproducible runs, but never the same noise twice.

FedAUC round trips
    1. :func:`fedauc_scores`: shuffle the scores, keep the permutation (secret)
       and the server's session id in ``context.state["fedauc-shuffle"]``, send
       the shuffled scores. The budget is checked (not spent) here, so a client
       that could not pay is left out *before* the server ranks anything.
    2. :func:`fedauc_stats`: unshuffle the global ranks, send
       ``(localSum, localP, localN)`` (RR labels or Laplace noise). The stored
       permutation is used once and deleted.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from diffprivlib import BudgetAccountant
from flwr.app import Array, ArrayRecord, ConfigRecord, Context

from flwr_fedeval.clients.auc_handlers import register_dp_handlers  # also importable from here
from flwr_fedeval.dp import (
    BudgetError,
    DPAUCLaplaceParams,
    FedAUCLaplaceParams,
    RandomizedResponseParams,
    charge,
    dpauc_laplace_client,
    fedauc_laplace_client,
    fedauc_local_stats,
    fedauc_shuffle_scores,
    fedauc_unshuffle_ranks,
    randomize_labels,
)
from flwr_fedeval.metrics.counts import threshold_counts
from flwr_fedeval.protocol import Refused, dp_auc
from flwr_fedeval.protocol.auc import ThresholdCounts

__all__ = [
    "CLIENT_DP_DEFAULTS",
    "STATE_ACCOUNTANT",
    "STATE_FEDAUC",
    "STATE_RR_LABELS",
    "dpauc_laplace",
    "dpauc_rr",
    "fedauc_scores",
    "fedauc_stats",
    "register_dp_handlers",
    "spent_epsilon",
]

logger = logging.getLogger(__name__)

#: ConfigRecord: ``epsilon-spent`` (list of float, one per charge), ``epsilon-total``.
STATE_ACCOUNTANT = "dp-accountant"
#: ArrayRecord ``labels`` (flipped, int64) + ConfigRecord ``dp-rr-labels.meta`` (ε, fingerprint).
STATE_RR_LABELS = "dp-rr-labels"
#: ArrayRecord ``permutation`` + ConfigRecord ``fedauc-shuffle.meta`` (session id).
STATE_FEDAUC = "fedauc-shuffle"
_STATE_RNG = "dp-rng"


#: The client's own DP settings (run-config keys) and their defaults; the
#: defaults equal ``JobConfig``'s (validated there, checked by a test).
CLIENT_DP_DEFAULTS = {"dp-epsilon": 1.0, "dp-budget": 0.0, "dp-seed": 0}


class _Settings:
    """``dp-epsilon``, ``dp-budget``, ``dp-seed`` from the client's run config."""

    def __init__(self, run_config) -> None:
        get = lambda k: run_config.get(k, CLIENT_DP_DEFAULTS[k])
        self.dp_epsilon = float(get("dp-epsilon"))
        self.dp_budget = float(get("dp-budget"))
        self.dp_seed = int(get("dp-seed"))
        if not self.dp_epsilon > 0 or not self.dp_budget >= 0 or self.dp_seed < 0:
            raise Refused("run config 'dp-epsilon' must be > 0, 'dp-budget' >= 0 and 'dp-seed' >= 0")


# --- budget and randomness ---------------------------------------------------
def _config(context: Context) -> _Settings:
    return _Settings(dict(context.run_config))


def _accountant(context: Context, cfg: _Settings) -> BudgetAccountant:
    """This client's accountant, rebuilt from ``context.state`` (raises BudgetError if overspent)."""
    total = cfg.dp_budget if cfg.dp_budget > 0 else cfg.dp_epsilon
    spent: list[float] = []
    if STATE_ACCOUNTANT in context.state:
        spent = [float(e) for e in context.state[STATE_ACCOUNTANT]["epsilon-spent"]]
    return BudgetAccountant(epsilon=total, delta=0.0, spent_budget=[(e, 0.0) for e in spent])


def _save_accountant(context: Context, accountant: BudgetAccountant) -> None:
    context.state[STATE_ACCOUNTANT] = ConfigRecord(
        {
            "epsilon-spent": [float(e) for e, _ in accountant.spent_budget],
            "epsilon-total": float(accountant.epsilon),
        }
    )


def spent_epsilon(context: Context) -> float:
    """Total ε this client has spent in the run (0.0 before any DP evaluation)."""
    if STATE_ACCOUNTANT not in context.state:
        return 0.0
    return float(sum(context.state[STATE_ACCOUNTANT]["epsilon-spent"]))


def _can_afford(accountant: BudgetAccountant, epsilon: float) -> None:
    """Raise BudgetError if ``epsilon`` cannot be charged (charges a copy only)."""
    if epsilon == 0.0:
        return
    trial = BudgetAccountant(epsilon=accountant.epsilon, delta=0.0, spent_budget=list(accountant.spent_budget))
    charge(trial, epsilon)


def _random_state(context: Context, cfg: _Settings):
    """``None`` (secrets-seeded) or a fresh per-request ``RandomState`` (``dp-seed > 0``)."""
    counter = int(context.state[_STATE_RNG]["requests"]) if _STATE_RNG in context.state else 0
    context.state[_STATE_RNG] = ConfigRecord({"requests": counter + 1})
    if cfg.dp_seed == 0:
        return None
    pid = int(context.node_config.get("partition-id", context.node_id))
    seq = np.random.SeedSequence([cfg.dp_seed, pid, counter])
    return np.random.RandomState(np.random.MT19937(seq))


@contextmanager
def _refuse_over_budget() -> Iterator[None]:
    """diffprivlib's ``BudgetError`` becomes the protocol's refusal (code ``BUDGET_EXHAUSTED``)."""
    try:
        yield
    except BudgetError as exc:
        raise dp_auc.BudgetError(str(exc)) from exc


def _dp_request(context: Context, step: Callable[[_Settings, BudgetAccountant, Any], Any]) -> Any:
    """``step(cfg, accountant, random_state)``; always persist the spends.

    A refused budget (raised as :class:`~flwr_fedeval.protocol.dp_auc.BudgetError`) or an
    invalid request becomes an error reply in ``protocol.handler``; the state, including any
    spend already charged, is kept (the engines only persist ``context`` when the handler returns).
    """
    cfg = _config(context)
    with _refuse_over_budget():
        accountant = _accountant(context, cfg)
    try:
        with _refuse_over_budget():
            return step(cfg, accountant, _random_state(context, cfg))
    finally:
        _save_accountant(context, accountant)


def _fingerprint(y_true: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(y_true, dtype=np.int64).tobytes()).hexdigest()


def _stored_rr_labels(context: Context, y_true: np.ndarray, epsilon: float) -> np.ndarray | None:
    meta_key = f"{STATE_RR_LABELS}.meta"
    if STATE_RR_LABELS not in context.state or meta_key not in context.state:
        return None
    meta = context.state[meta_key]
    if float(meta["epsilon"]) != epsilon or meta["fingerprint"] != _fingerprint(y_true):
        return None
    return context.state[STATE_RR_LABELS]["labels"].numpy()


def _rr_labels(context: Context, y_true, epsilon: float, accountant, rng) -> np.ndarray:
    """The flipped labels at ``epsilon``: stored ones (free) or flipped now (charged)."""
    y_true = np.asarray(y_true, dtype=np.int64)
    stored = _stored_rr_labels(context, y_true, epsilon)
    if stored is not None:
        return stored
    flipped = randomize_labels(y_true, RandomizedResponseParams(epsilon), accountant=accountant, random_state=rng)
    context.state[STATE_RR_LABELS] = ArrayRecord({"labels": Array(np.ascontiguousarray(flipped, dtype=np.int64))})
    context.state[f"{STATE_RR_LABELS}.meta"] = ConfigRecord(
        {"epsilon": float(epsilon), "fingerprint": _fingerprint(y_true)}
    )
    return flipped


# --- DPAUC ---------------------------------------------------------------------
def dpauc_laplace(request: dp_auc.DPAUCRequest, context: Context, y_true: np.ndarray,
                  y_score: np.ndarray) -> dp_auc.NoisyCounts:
    """DPAUC_Lap client: Laplace-noised TP/FP/TN/FN at the server's decision points.

    ``request.epsilon`` (ε of this evaluation) is split equally over the 4N counts.

    Raises
    ------
    flwr_fedeval.protocol.dp_auc.BudgetError
        If this client's budget cannot pay ε (nothing is sent).
    """

    def step(cfg, accountant, rng):
        params = DPAUCLaplaceParams(request.epsilon, request.thresholds.size)
        counts = threshold_counts(y_true, y_score, request.thresholds)
        return dp_auc.NoisyCounts(*dpauc_laplace_client(counts, params, accountant=accountant, random_state=rng))

    return _dp_request(context, step)


def dpauc_rr(request: dp_auc.DPAUCRequest, context: Context, y_true: np.ndarray,
             y_score: np.ndarray) -> ThresholdCounts:
    """DPAUC_RR client: exact counts (int64, as the plaintext phase) of the randomized-response labels.

    Raises
    ------
    flwr_fedeval.protocol.dp_auc.BudgetError
        If the labels must be flipped at a new ε this client's budget cannot pay.
    """

    def step(cfg, accountant, rng):
        flipped = _rr_labels(context, y_true, request.epsilon, accountant, rng)
        return ThresholdCounts.of(threshold_counts(flipped, y_score, request.thresholds))

    return _dp_request(context, step)


# --- FedAUC --------------------------------------------------------------------
def _fedauc_cost(request: dp_auc.FedAUCScoresRequest, context: Context, y_true) -> float:
    """The ε round 2 will charge: ε, or 0 for RR labels already flipped at this ε."""
    eps = request.epsilon
    if request.mechanism == "rr" and _stored_rr_labels(context, np.asarray(y_true, dtype=np.int64), eps) is not None:
        return 0.0
    return eps


def fedauc_scores(request: dp_auc.FedAUCScoresRequest, context: Context, y_true: np.ndarray,
                  y_score: np.ndarray) -> dp_auc.ShuffledScores:
    """FedAUC round 1: the scores in a secret random order (float64, shape (n_k,)).

    Checks, without spending, that round 2 is affordable.

    Raises
    ------
    flwr_fedeval.protocol.dp_auc.BudgetError
        If round 2 would exceed this client's budget (the client is left out before any ranking).
    """

    def step(cfg, accountant, rng):
        _can_afford(accountant, _fedauc_cost(request, context, y_true))
        shuffled, perm = fedauc_shuffle_scores(y_score, random_state=rng)
        context.state[STATE_FEDAUC] = ArrayRecord({"permutation": Array(perm)})
        context.state[f"{STATE_FEDAUC}.meta"] = ConfigRecord({"session": request.session})
        return dp_auc.ShuffledScores(shuffled)

    return _dp_request(context, step)


def _pop_permutation(context: Context, session: str) -> np.ndarray:
    meta_key = f"{STATE_FEDAUC}.meta"
    if STATE_FEDAUC not in context.state or meta_key not in context.state:
        raise Refused("no shuffled scores pending (round 1 missing)")
    if context.state[meta_key]["session"] != session:
        raise Refused("session id does not match the pending round 1")
    perm = context.state[STATE_FEDAUC]["permutation"].numpy()
    del context.state[STATE_FEDAUC]
    del context.state[meta_key]
    return perm


def fedauc_stats(request: dp_auc.FedAUCStatsRequest, context: Context, y_true: np.ndarray,
                 y_score: np.ndarray | None = None) -> dp_auc.LocalStatsReply:
    """FedAUC round 2: ``(localSum, localP, localN)`` from the global ranks (RR labels or Laplace noise).

    ``y_score`` is not needed (the ranks replace it).

    Raises
    ------
    flwr_fedeval.protocol.Refused
        If no round 1 of ``request.session`` is pending.
    flwr_fedeval.protocol.dp_auc.BudgetError
        If this client's budget cannot pay ε.
    """

    def step(cfg, accountant, rng):
        perm = _pop_permutation(context, request.session)
        ranks = fedauc_unshuffle_ranks(request.ranks, perm)
        if request.mechanism == "rr":
            flipped = _rr_labels(context, y_true, request.epsilon, accountant, rng)
            return dp_auc.LocalStatsReply(*fedauc_local_stats(ranks, flipped))
        params = FedAUCLaplaceParams(request.epsilon, sensitivity=request.sensitivity, allocation=request.allocation,
                                     alpha=request.alpha, beta=request.beta)
        return dp_auc.LocalStatsReply(*fedauc_laplace_client(ranks, y_true, params, max_rank=request.max_rank,
                                                      accountant=accountant, random_state=rng))

    return _dp_request(context, step)
