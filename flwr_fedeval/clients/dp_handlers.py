"""Client side of the DP AUC phases (DPAUC_Lap, DPAUC_RR, FedAUC_RR, FedAUC_Lap).

Each function here serves one step of :mod:`flwr_fedeval.protocol.dp_auc`:
``(request, context, y_true, y_score) -> reply payload``, the request already
parsed and checked; :func:`~flwr_fedeval.clients.auc_handlers.register_dp_handlers`
wraps them (``protocol.handler``) and registers them. The DP math is in
:mod:`flwr_fedeval.dp` (these functions only keep the client's state).

Privacy budget (the node's policy, :mod:`flwr_fedeval.clients.policy`)
    Every client charges its ε to its **node privacy ledger** (:mod:`flwr_fedeval.clients.ledger`,
    :meth:`~flwr_fedeval.ledger.NodeLedger.spend_epsilon`), which keeps the spends of every run
    (dataset :data:`~flwr_fedeval.clients.ledger.TEST_SET`); diffprivlib's ``BudgetAccountant``
    checks each spend against the node's total (``fedeval-dp-budget``, or ``fedeval-dp-epsilon``
    when it is 0), which run config ``fedeval-dp-budget`` / ``fedeval-dp-epsilon`` may only lower;
    a run config asking more is refused naming the node key (a configuration refusal,
    ``NOT_CONFIGURED``: the server stops the run). The server's request names the ε of one
    evaluation: above the node's ``fedeval-dp-epsilon`` it is refused; otherwise it is charged to
    the ledger (committed) before any noise is drawn, and the :mod:`flwr_fedeval.dp` client step
    runs with an accountant of exactly that ε. A request the ledger cannot afford is refused
    (:class:`flwr_fedeval.protocol.dp_auc.BudgetError`, code ``BUDGET_EXHAUSTED``): the error reply
    reads ``BudgetError: ...`` and nothing noisy is sent. A new run does not give a new budget.

Randomized response (permanent, RAPPOR)
    Labels are flipped **once** per ε and label vector (DPAUC_RR Step 1) and the flipped labels are
    kept in the ledger (:meth:`~flwr_fedeval.ledger.NodeLedger.randomized_response`, Erlingsson et
    al. 2014): later RR evaluations at the same ε, in this run or any later one, reuse them for free
    (post-processing), DPAUC_RR and FedAUC_RR alike, so a server that asks again cannot average the
    flips away.

Evaluations per model
    DPAUC_Lap, DPAUC_RR and FedAUC round 1 (the requests that carry the global
    model) count one evaluation of that model
    (:func:`~flwr_fedeval.clients.policy.record_evaluation`); beyond node config
    ``fedeval-evaluations-per-model`` (default 1) the request is refused.

Randomness
    Every draw comes from the operating system's CSPRNG (:class:`SystemRandomState`,
    ``os.urandom``); no run-config key seeds it (a server-set seed would let the
    server remove the noise). Only the node's own ``fedeval-dp-seed > 0``
    seeds it, one ``RandomState`` per request from ``(fedeval-dp-seed,
    partition-id, request counter)``: reproducible runs, **no privacy** against
    anyone who knows the seed.

FedAUC round trips
    1. :func:`fedauc_scores`: shuffle the scores, keep the permutation (secret)
       and the server's session id in ``context.state["fedauc-shuffle"]``, send
       the shuffled scores. The budget is checked in the ledger (not spent) here, so
       a client that could not pay is left out *before* the server ranks anything.
    2. :func:`fedauc_stats`: unshuffle the global ranks, send
       ``(localSum, localP, localN)`` (RR labels or Laplace noise). The stored
       permutation is used once and deleted.
"""

from __future__ import annotations

import hashlib
import logging
import math
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, SupportsIndex, TypeVar, overload

import numpy as np
from diffprivlib import BudgetAccountant
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from numpy.typing import NDArray

from flwr_fedeval import config_keys
from flwr_fedeval.clients import policy
from flwr_fedeval.clients.ledger import TEST_SET, digest, ledger_refusals, node_ledger
from flwr_fedeval.dp import (
    DPAUCLaplaceParams,
    FedAUCLaplaceParams,
    RandomizedResponseParams,
    dpauc_laplace_client,
    fedauc_laplace_client,
    fedauc_local_stats,
    fedauc_shuffle_scores,
    fedauc_unshuffle_ranks,
    randomize_labels,
)
from flwr_fedeval.ledger import NodeLedger
from flwr_fedeval.metrics.counts import threshold_counts
from flwr_fedeval.protocol import (
    MalformedMessage,
    Refused,
    array_field,
    array_record,
    config_field,
    config_record,
    dp_auc,
)
from flwr_fedeval.protocol.auc import ThresholdCounts

__all__ = [
    "CLIENT_DP_DEFAULTS",
    "STATE_FEDAUC",
    "SystemRandomState",
    "dpauc_laplace",
    "dpauc_rr",
    "fedauc_scores",
    "fedauc_stats",
    "spent_epsilon",
]

logger = logging.getLogger(__name__)

#: ArrayRecord ``permutation`` + ConfigRecord ``fedauc-shuffle.meta`` (session id).
STATE_FEDAUC = "fedauc-shuffle"
_STATE_RNG = "dp-rng"


#: The run-config keys a client reads (tightening its node policy only) and the demo App's defaults
#: for them (``JobConfig``'s ``dp-epsilon``, ``dp-budget``, mapped by ``LIBRARY_RUN_CONFIG``; checked
#: by a test). Unset, the node's policy applies as it is.
CLIENT_DP_DEFAULTS = {config_keys.DP_EPSILON: 1.0, config_keys.DP_BUDGET: 0.0}


class SystemRandomState(np.random.RandomState):
    """The numpy ``RandomState`` interface the DP layer draws from, fed by ``os.urandom`` (a CSPRNG).

    ``random_sample``/``random`` (floats in [0, 1) with 53 random bits), ``permutation``
    (sorting 128-bit random keys; a tie has probability < n²/2¹²⁹) and diffprivlib's ``random()``
    are the draws :mod:`flwr_fedeval.dp` makes; every other method is refused, so no draw ever
    falls back to the Mersenne Twister underneath.
    """

    def __init__(self) -> None:
        super().__init__(np.random.MT19937(0))  # never drawn from (see the methods below)

    @overload
    def random_sample(self, size: None = None) -> float: ...

    @overload
    def random_sample(self, size: SupportsIndex | Sequence[SupportsIndex]) -> NDArray[np.float64]: ...

    def random_sample(self, size: SupportsIndex | Sequence[SupportsIndex] | None = None,
                      ) -> float | NDArray[np.float64]:
        if size is None:
            shape: tuple[int, ...] = ()
        elif isinstance(size, Sequence):
            shape = tuple(operator.index(d) for d in size)
        else:
            shape = (operator.index(size),)
        n = math.prod(shape)
        words = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
        out = words.astype(np.float64) * (1.0 / (1 << 53))
        return float(out[0]) if size is None else out.reshape(shape)

    random = random_sample

    def permutation(self, x: Any) -> np.ndarray:
        arr = np.arange(int(x)) if np.ndim(x) == 0 else np.array(x)
        keys = np.frombuffer(os.urandom(16 * len(arr)), dtype=np.uint64).reshape(-1, 2)
        return arr[np.lexsort((keys[:, 1], keys[:, 0]))]

    def __getattribute__(self, name: str) -> Any:
        if name in ("random_sample", "random", "permutation") or name.startswith("__") or name == "_refused":
            return object.__getattribute__(self, name)
        if callable(getattr(np.random.RandomState, name, None)):
            return object.__getattribute__(self, "_refused")(name)
        return object.__getattribute__(self, name)

    @staticmethod
    def _refused(name: str) -> Callable[..., NoReturn]:
        def refuse(*args: Any, **kwargs: Any) -> NoReturn:
            raise TypeError(f"SystemRandomState.{name}: not a CSPRNG draw the DP layer makes")
        return refuse


class _Settings:
    """The ε per evaluation, the total ε and the seed this node allows (:func:`policy.dp_limits`)."""

    def __init__(self, context: Context) -> None:
        self.dp_epsilon, self.dp_total, self.dp_seed = policy.dp_limits(context)


# --- budget and randomness ---------------------------------------------------
def _config(context: Context) -> _Settings:
    return _Settings(context)


def spent_epsilon(context: Context) -> float:
    """Total ε this node has spent on its test set, in every run (its privacy ledger; 0.0 before any
    DP evaluation).

    Raises
    ------
    flwr_fedeval.clients.ledger.LedgerNotConfigured
        The node has no privacy ledger.
    """
    return node_ledger(context).spent(TEST_SET)


def _charge(ledger: NodeLedger, cfg: _Settings, epsilon: float) -> BudgetAccountant:
    """Charge ``epsilon`` to the node's test set in its ledger (committed before any noise is
    drawn), and the accountant of exactly that ε the :mod:`flwr_fedeval.dp` step charges again."""
    with ledger_refusals("DP budget"):
        ledger.spend_epsilon(TEST_SET, epsilon, cfg.dp_total)
    return BudgetAccountant(epsilon=epsilon, delta=0.0)


def _can_afford(ledger: NodeLedger, cfg: _Settings, epsilon: float) -> None:
    """Raise BudgetError if ``epsilon`` cannot be charged now (records nothing)."""
    if epsilon == 0.0:
        return
    with ledger_refusals("DP budget"):
        ledger.check_spend(TEST_SET, epsilon, cfg.dp_total)


def _random_state(context: Context, cfg: _Settings) -> np.random.RandomState:
    """:class:`SystemRandomState` (CSPRNG), or, with the node's own ``fedeval-dp-seed > 0``, a
    fresh per-request ``RandomState`` (reproducible, no privacy)."""
    counter = (config_field(config_record(context.state, _STATE_RNG), _STATE_RNG, "requests", int)
               if _STATE_RNG in context.state else 0)
    context.state[_STATE_RNG] = ConfigRecord({"requests": counter + 1})
    if cfg.dp_seed == 0:
        return SystemRandomState()
    pid = int(context.node_config.get("partition-id", context.node_id))
    seq = np.random.SeedSequence([cfg.dp_seed, pid, counter])
    return np.random.RandomState(np.random.MT19937(seq))


_T = TypeVar("_T")


def _dp_request(context: Context, step: Callable[[_Settings, NodeLedger, np.random.RandomState], _T], *,
                epsilon: float | None = None, model: bytes | None = None, what: str = "DP AUC",
                participants: Any = False) -> _T:
    """``step(cfg, ledger, random_state)`` after the node's checks.

    ``epsilon`` (the request's ε) is checked against the node's ε per evaluation, and ``model``
    (the digest of the evaluated global model; ``None``: not counted) against
    ``fedeval-evaluations-per-model`` in the node's ledger, before anything is drawn. The step
    charges its ε to the ledger (:func:`_charge`) before it draws noise. A refused budget (raised as
    :class:`~flwr_fedeval.protocol.dp_auc.BudgetError`), a refused policy
    (:class:`~flwr_fedeval.protocol.Refused`) or an invalid request becomes an error reply in
    ``protocol.handler``; whatever the ledger recorded stays recorded (it commits per call).
    """
    cfg = _config(context)
    ledger = node_ledger(context)  # a node without a ledger refuses before anything else
    if participants is not False:  # the requests that start an evaluation: the members' signed list
        from flwr_fedeval.clients.auc_handlers import STATE_DP_JOINED
        from flwr_fedeval.clients.identity import check_participants

        check_participants(context, participants, STATE_DP_JOINED, what)
    if epsilon is not None:
        policy.check_epsilon(context, epsilon)
    if model is not None:
        policy.record_evaluation(context, model, what)
    return step(cfg, ledger, _random_state(context, cfg))


def _fingerprint(y_true: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(y_true, dtype=np.int64).tobytes()).hexdigest()


def _rr_key(y_true: np.ndarray, epsilon: float) -> bytes:
    """The ledger key of the flipped labels: the label vector and the ε (the decision points do not
    enter: the response is the flipped labels, whatever the thresholds)."""
    return digest("dpauc-rr/labels", repr(float(epsilon)), _fingerprint(y_true))


def _rr_labels(ledger: NodeLedger, cfg: _Settings, y_true: np.ndarray, epsilon: float,
               rng: np.random.RandomState) -> np.ndarray:
    """The flipped labels at ``epsilon``: the ledger's (free) or flipped now (ε charged in the same
    transaction, then kept for good: RAPPOR's permanent randomized response)."""
    y_true = np.asarray(y_true, dtype=np.int64)

    def draw() -> np.ndarray:
        accountant = BudgetAccountant(epsilon=epsilon, delta=0.0)  # the ledger charged ε just before
        flipped = randomize_labels(y_true, RandomizedResponseParams(epsilon), accountant=accountant,
                                   random_state=rng)
        return np.ascontiguousarray(flipped, dtype=np.int64)

    with ledger_refusals("DP budget"):
        return ledger.randomized_response(TEST_SET, _rr_key(y_true, epsilon), draw, epsilon=epsilon,
                                          budget=cfg.dp_total)


# --- DPAUC ---------------------------------------------------------------------
def dpauc_laplace(request: dp_auc.DPAUCRequest, context: Context, y_true: np.ndarray,
                  y_score: np.ndarray, *, model: bytes | None = None) -> dp_auc.NoisyCounts:
    """DPAUC_Lap client: Laplace-noised TP/FP/TN/FN at the server's decision points.

    ``request.epsilon`` (ε of this evaluation) is split equally over the 4N counts.

    Raises
    ------
    flwr_fedeval.protocol.dp_auc.BudgetError
        If this client's budget cannot pay ε (nothing is sent).
    """

    def step(cfg: _Settings, ledger: NodeLedger, rng: np.random.RandomState) -> dp_auc.NoisyCounts:
        params = DPAUCLaplaceParams(request.epsilon, request.thresholds.size)
        counts = threshold_counts(y_true, y_score, request.thresholds)
        accountant = _charge(ledger, cfg, request.epsilon)
        return dp_auc.NoisyCounts(*dpauc_laplace_client(counts, params, accountant=accountant, random_state=rng))

    return _dp_request(context, step, epsilon=request.epsilon, model=model, what="DPAUC_Lap",
                       participants=request.participants)


def dpauc_rr(request: dp_auc.DPAUCRequest, context: Context, y_true: np.ndarray,
             y_score: np.ndarray, *, model: bytes | None = None) -> ThresholdCounts:
    """DPAUC_RR client: exact counts (int64, as the plaintext phase) of the randomized-response labels.

    Raises
    ------
    flwr_fedeval.protocol.dp_auc.BudgetError
        If the labels must be flipped at a new ε this client's budget cannot pay.
    """

    def step(cfg: _Settings, ledger: NodeLedger, rng: np.random.RandomState) -> ThresholdCounts:
        flipped = _rr_labels(ledger, cfg, y_true, request.epsilon, rng)
        return ThresholdCounts.of(threshold_counts(flipped, y_score, request.thresholds))

    return _dp_request(context, step, epsilon=request.epsilon, model=model, what="DPAUC_RR",
                       participants=request.participants)


# --- FedAUC --------------------------------------------------------------------
def _fedauc_cost(request: dp_auc.FedAUCScoresRequest, ledger: NodeLedger, y_true: np.ndarray) -> float:
    """The ε round 2 will charge: ε, or 0 for RR labels already flipped at this ε (in any run)."""
    eps = request.epsilon
    if request.mechanism == "rr" and ledger.response(TEST_SET, _rr_key(np.asarray(y_true, dtype=np.int64), eps)) \
            is not None:
        return 0.0
    return eps


def fedauc_scores(request: dp_auc.FedAUCScoresRequest, context: Context, y_true: np.ndarray,
                  y_score: np.ndarray, *, model: bytes | None = None) -> dp_auc.ShuffledScores:
    """FedAUC round 1: the scores in a secret random order (float64, shape (n_k,)).

    Checks, without spending, that round 2 is affordable.

    Raises
    ------
    flwr_fedeval.protocol.dp_auc.BudgetError
        If round 2 would exceed this client's budget (the client is left out before any ranking).
    """

    def step(cfg: _Settings, ledger: NodeLedger, rng: np.random.RandomState) -> dp_auc.ShuffledScores:
        _can_afford(ledger, cfg, _fedauc_cost(request, ledger, y_true))
        shuffled, perm = fedauc_shuffle_scores(y_score, random_state=rng)
        context.state[STATE_FEDAUC] = ArrayRecord({"permutation": Array(perm)})
        context.state[f"{STATE_FEDAUC}.meta"] = ConfigRecord({"session": request.session})
        return dp_auc.ShuffledScores(shuffled)

    return _dp_request(context, step, epsilon=request.epsilon, model=model, what="FedAUC",
                       participants=request.participants)


def _pop_permutation(context: Context, session: str) -> np.ndarray:
    meta_key = f"{STATE_FEDAUC}.meta"
    if STATE_FEDAUC not in context.state or meta_key not in context.state:
        raise Refused("no shuffled scores pending (round 1 missing)")
    if config_field(config_record(context.state, meta_key), meta_key, "session", str) != session:
        raise Refused("session id does not match the pending round 1")
    perm = array_field(array_record(context.state, STATE_FEDAUC), STATE_FEDAUC, "permutation",
                       dtype=np.int64, shape=(None,))
    del context.state[STATE_FEDAUC]
    del context.state[meta_key]
    return perm


def _laplace_params(request: dp_auc.FedAUCStatsRequest) -> FedAUCLaplaceParams:
    """The FedAUC_Lap parameters of a ``"laplace"`` round-2 request (its parser requires every one)."""
    if request.sensitivity is None or request.allocation is None or request.alpha is None or request.beta is None:
        raise MalformedMessage(dp_auc.DP_KEY, "a Laplace field (sensitivity, allocation, alpha, beta) is missing")
    return FedAUCLaplaceParams(request.epsilon, sensitivity=request.sensitivity, allocation=request.allocation,
                               alpha=request.alpha, beta=request.beta)


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

    def step(cfg: _Settings, ledger: NodeLedger, rng: np.random.RandomState) -> dp_auc.LocalStatsReply:
        perm = _pop_permutation(context, request.session)
        ranks = fedauc_unshuffle_ranks(request.ranks, perm)
        if request.mechanism == "rr":
            flipped = _rr_labels(ledger, cfg, y_true, request.epsilon, rng)
            return dp_auc.LocalStatsReply(*fedauc_local_stats(ranks, flipped))
        params = _laplace_params(request)
        accountant = _charge(ledger, cfg, request.epsilon)
        return dp_auc.LocalStatsReply(*fedauc_laplace_client(ranks, y_true, params, max_rank=request.max_rank,
                                                      accountant=accountant, random_state=rng))

    return _dp_request(context, step, epsilon=request.epsilon)
