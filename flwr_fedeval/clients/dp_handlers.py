"""Client side of the DP AUC phases (DPAUC_Lap, DPAUC_RR, FedAUC_RR, FedAUC_Lap).

Each handler is a plain function ``(msg, context, y_true, y_score) -> Message``
registered in :mod:`flwr_fedeval.app.client_app`; the DP math is in
:mod:`flwr_fedeval.dp` (these functions only decode the request, keep the
client's state and encode the reply).

Privacy budget
    Every client holds a diffprivlib ``BudgetAccountant`` whose total is the
    client's own configuration (``dp-budget``, or ``dp-epsilon`` when
    ``dp-budget = 0``), *not* a value the server sends. The server's request
    names the ε of one evaluation; the :mod:`flwr_fedeval.dp` client step
    charges it before any noise is drawn. The spends are kept in
    ``context.state["dp-accountant"]`` (a ConfigRecord of floats), so repeated
    evaluations in one run accumulate. A request the accountant cannot afford
    gets an error reply ``BudgetError: ...`` and nothing noisy is sent.

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
from collections.abc import Callable
from typing import Any

import numpy as np
from diffprivlib import BudgetAccountant
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

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
from flwr_fedeval.clients.auc_handlers import register_dp_handlers  # noqa: F401  (also importable from here)
from flwr_fedeval.clients.replies import error_reply
from flwr_fedeval.fhe.counts import threshold_counts
from flwr_fedeval.messages import (
    ReplyCode,
    COUNTS_KEY,
    DP_KEY,
    EVALUATION_KEY,
    FEDAUC_KEY,
    NOISY_COUNTS_KEY,
    SCORES_KEY,
    STATS_KEY,
    counts_to_record,
    local_stats_to_record,
    noisy_counts_to_record,
)

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
        get = lambda k: run_config.get(k, CLIENT_DP_DEFAULTS[k])  # noqa: E731
        self.dp_epsilon = float(get("dp-epsilon"))
        self.dp_budget = float(get("dp-budget"))
        self.dp_seed = int(get("dp-seed"))
        if not self.dp_epsilon > 0 or not self.dp_budget >= 0 or self.dp_seed < 0:
            raise ValueError("config 'dp-epsilon' must be > 0, 'dp-budget' >= 0 and 'dp-seed' >= 0")


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


def _error_reply(msg: Message, exc: BaseException) -> Message:
    code = ReplyCode.BUDGET_EXHAUSTED if isinstance(exc, BudgetError) else None
    return error_reply(msg, exc, "DP AUC", code=code)


def _dp_request(msg: Message, context: Context, step: Callable[[_Settings, BudgetAccountant, Any], RecordDict]) -> Message:
    """Run ``step(cfg, accountant, random_state)``; always persist the spends.

    A refused budget or an invalid request becomes an error reply (and the
    state, including any spend already charged, is kept: the engines only
    persist ``context`` when the handler returns).
    """
    try:
        cfg = _config(context)
        accountant = _accountant(context, cfg)
    except (BudgetError, ValueError) as exc:
        return _error_reply(msg, exc)
    try:
        content = step(cfg, accountant, _random_state(context, cfg))
    except (BudgetError, ValueError, TypeError, KeyError) as exc:
        return _error_reply(msg, exc)
    finally:
        _save_accountant(context, accountant)
    return Message(content=content, reply_to=msg)


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


def _thresholds(msg: Message) -> np.ndarray:
    return msg.content[EVALUATION_KEY]["thresholds"].numpy().astype(np.float64)


def _epsilon(msg: Message) -> float:
    eps = msg.content[DP_KEY]["epsilon"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"request 'epsilon' must be a number, got {eps!r}")
    return float(eps)


# --- DPAUC ---------------------------------------------------------------------
def dpauc_laplace(msg: Message, context: Context, y_true: np.ndarray, y_score: np.ndarray) -> Message:
    """DPAUC_Lap client: Laplace-noised TP/FP/TN/FN at the server's decision points.

    Request: ``evaluation.thresholds`` (N,), ``dp.epsilon`` (ε of this
    evaluation, split equally over the 4N counts). Reply: ``noisy-counts``
    (float64 arrays of shape (N,)).
    """

    def step(cfg, accountant, rng):
        thresholds = _thresholds(msg)
        params = DPAUCLaplaceParams(_epsilon(msg), thresholds.size)
        counts = threshold_counts(y_true, y_score, thresholds)
        noisy = dpauc_laplace_client(counts, params, accountant=accountant, random_state=rng)
        return RecordDict({NOISY_COUNTS_KEY: noisy_counts_to_record(noisy)})

    return _dp_request(msg, context, step)


def dpauc_rr(msg: Message, context: Context, y_true: np.ndarray, y_score: np.ndarray) -> Message:
    """DPAUC_RR client: exact counts of the randomized-response labels.

    Request: ``evaluation.thresholds`` (N,), ``dp.epsilon``. Reply: ``counts``
    (int64, as the plaintext phase) computed on the flipped labels.
    """

    def step(cfg, accountant, rng):
        thresholds = _thresholds(msg)
        flipped = _rr_labels(context, y_true, _epsilon(msg), accountant, rng)
        counts = threshold_counts(flipped, y_score, thresholds)
        return RecordDict({COUNTS_KEY: counts_to_record(counts)})

    return _dp_request(msg, context, step)


# --- FedAUC --------------------------------------------------------------------
def _fedauc_cost(msg: Message, context: Context, y_true) -> float:
    conf = msg.content[DP_KEY]
    eps = _epsilon(msg)
    mechanism = conf["mechanism"]
    if mechanism == "laplace":
        return eps
    if mechanism == "rr":
        return 0.0 if _stored_rr_labels(context, np.asarray(y_true, dtype=np.int64), eps) is not None else eps
    raise ValueError(f"request 'mechanism' must be 'rr' or 'laplace', got {mechanism!r}")


def fedauc_scores(msg: Message, context: Context, y_true: np.ndarray, y_score: np.ndarray) -> Message:
    """FedAUC round 1: send the scores in a secret random order.

    Request: the global model, ``dp.session`` (str), ``dp.mechanism``
    (``"rr"`` / ``"laplace"``), ``dp.epsilon``. Reply: ``scores.scores``
    (float64, shape (n_k,)). Checks, without spending, that round 2 is
    affordable; otherwise replies ``BudgetError``.
    """

    def step(cfg, accountant, rng):
        _can_afford(accountant, _fedauc_cost(msg, context, y_true))
        session = str(msg.content[DP_KEY]["session"])
        shuffled, perm = fedauc_shuffle_scores(y_score, random_state=rng)
        context.state[STATE_FEDAUC] = ArrayRecord({"permutation": Array(perm)})
        context.state[f"{STATE_FEDAUC}.meta"] = ConfigRecord({"session": session})
        return RecordDict({SCORES_KEY: ArrayRecord({"scores": Array(np.ascontiguousarray(shuffled))})})

    return _dp_request(msg, context, step)


def _pop_permutation(context: Context, session: str) -> np.ndarray:
    meta_key = f"{STATE_FEDAUC}.meta"
    if STATE_FEDAUC not in context.state or meta_key not in context.state:
        raise ValueError("no shuffled scores pending (round 1 missing)")
    if context.state[meta_key]["session"] != session:
        raise ValueError("session id does not match the pending round 1")
    perm = context.state[STATE_FEDAUC]["permutation"].numpy()
    del context.state[STATE_FEDAUC]
    del context.state[meta_key]
    return perm


def fedauc_stats(msg: Message, context: Context, y_true: np.ndarray, y_score: np.ndarray | None = None) -> Message:
    """FedAUC round 2: ``(localSum, localP, localN)`` from the global ranks.

    Request: ``fedauc.ranks`` (float64, aligned with the shuffled scores of
    round 1), ``dp.session``, ``dp.mechanism``, ``dp.epsilon`` and, for
    ``"laplace"``, ``dp.sensitivity``, ``dp.allocation``, ``dp.alpha``,
    ``dp.beta`` (float or ``"adaptive"``), ``dp.max-rank`` (``M-1``). Reply:
    ``stats`` ConfigRecord ``local-sum``, ``local-p``, ``local-n``.
    ``y_score`` is not needed (the ranks replace it).
    """

    def step(cfg, accountant, rng):
        conf = msg.content[DP_KEY]
        eps = _epsilon(msg)
        perm = _pop_permutation(context, str(conf["session"]))
        ranks = fedauc_unshuffle_ranks(msg.content[FEDAUC_KEY]["ranks"].numpy(), perm)
        if conf["mechanism"] == "rr":
            stats = fedauc_local_stats(ranks, _rr_labels(context, y_true, eps, accountant, rng))
        elif conf["mechanism"] == "laplace":
            params = FedAUCLaplaceParams(
                eps,
                sensitivity=str(conf["sensitivity"]),
                allocation=str(conf["allocation"]),
                alpha=float(conf["alpha"]),
                beta=conf["beta"],
            )
            stats = fedauc_laplace_client(
                ranks, y_true, params, max_rank=float(conf["max-rank"]), accountant=accountant, random_state=rng
            )
        else:
            raise ValueError(f"request 'mechanism' must be 'rr' or 'laplace', got {conf['mechanism']!r}")
        return RecordDict({STATS_KEY: local_stats_to_record(stats)})

    return _dp_request(msg, context, step)
