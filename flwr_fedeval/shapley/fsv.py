"""Plaintext Federated Shapley Values (the reference every secure variant is tested against).

Zheng, Cao, Yoshikawa, "Secure Shapley Value for Cross-Silo Federated
Learning", PVLDB 16(7), 2023, §3 (FSV, after Wang et al. 2020):

* the model of a coalition ``S ⊆ I^t`` in round ``t`` is the FedAvg aggregate
  ``θ_S = Σ_{i∈S} ω_{i|S} θ_i`` with ``ω_{i|S} = w_i / Σ_{j∈S} w_j``;
  the empty coalition is the global model ``θ^t`` of the round;
* the utility ``v(θ_S)`` is the accuracy on the union of the clients' test sets;
* the single-round SV ``φ_i^t = Σ_{S⊆I^t∖{i}} |S|!(|I^t|−|S|−1)!/|I^t)! (v(S∪{i}) − v(S))``
  and the FSV ``φ_i = Σ_t φ_i^t``.

SampleSkip (Algorithms 6–7) is implemented here as well, on plaintext models:
coalitions are evaluated by increasing size, and a sample that both halves of
some split ``(S', S∖S')`` predict correctly is counted correct without being
evaluated. For linear classifiers this never changes the utility (Theorem 6.3).

Models are linear classifiers given as arrays of shape ``(n_classes, n_features + 1)``
(last column = bias); the prediction is ``argmax_j (θ [x; 1])_j``.

No flwr and no TensorFlow imports.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import factorial
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Coalition",
    "FSVResult",
    "coalitions",
    "fedavg",
    "federated_shapley",
    "fsv_from_utilities",
    "find_skippable",
    "predict",
    "round_utilities",
    "sample_skip_utilities",
    "shapley_values",
]

#: A coalition of players (client indices).
Coalition = frozenset[int]


def coalitions(players: Sequence[int], *, min_size: int = 1) -> list[Coalition]:
    """All subsets of ``players`` with at least ``min_size`` members, by increasing size."""
    players = list(players)
    return [frozenset(c) for r in range(min_size, len(players) + 1)
            for c in itertools.combinations(players, r)]


def fedavg(models: Mapping[int, NDArray[np.floating[Any]]], weights: Mapping[int, float],
           members: Iterable[int]) -> NDArray[np.float64]:
    """Example-weighted FedAvg ``Σ_{i∈S} w_i θ_i / Σ_{i∈S} w_i`` of the members of ``S``."""
    order = sorted(members)
    if not order:
        raise ValueError("fedavg needs a non-empty coalition")
    total = float(sum(weights[i] for i in order))
    if not total > 0:
        raise ValueError("aggregation weights of a coalition must sum to > 0")
    terms = [float(weights[i]) * np.asarray(models[i], dtype=np.float64) for i in order]
    acc = terms[0]
    for t in terms[1:]:
        acc = acc + t
    return acc / total


def predict(model: NDArray[np.floating[Any]], X: NDArray[np.floating[Any]]) -> NDArray[np.intp]:
    """Predicted labels ``argmax_j (W x + b)_j`` of a linear model of shape ``(c, d+1)``."""
    model = np.asarray(model, dtype=np.float64)
    scores = X @ model[:, :-1].T + model[:, -1]
    labels: NDArray[np.intp] = np.argmax(scores, axis=1)
    return labels


def _correct(model: NDArray[np.floating[Any]], X: NDArray[np.floating[Any]],
             y: NDArray[np.integer[Any]]) -> NDArray[np.bool_]:
    ok: NDArray[np.bool_] = predict(model, X) == y
    return ok


def shapley_values(utilities: Mapping[Coalition, float], players: Sequence[int],
                   empty_utility: float) -> NDArray[np.float64]:
    """Exact Shapley values from the utilities of every non-empty coalition.

    Parameters
    ----------
    utilities : mapping frozenset -> float
        ``v(S)`` for every non-empty ``S ⊆ players``.
    players : sequence of int
    empty_utility : float
        ``v(∅)``.

    Returns
    -------
    ndarray of shape (len(players),)
        ``φ_i`` in the order of ``players``; ``Σ φ_i = v(players) − v(∅)`` (efficiency).
    """
    players = list(players)
    n = len(players)
    util = dict(utilities)
    util[frozenset()] = float(empty_utility)
    missing = [S for S in coalitions(players) if S not in util]
    if missing:
        raise ValueError(f"utilities lack {len(missing)} coalitions, e.g. {sorted(missing[0])}")
    coef = [factorial(s) * factorial(n - s - 1) / factorial(n) for s in range(n)]
    phi = np.zeros(n)
    for a, i in enumerate(players):
        others = [p for p in players if p != i]
        for r in range(n):
            for combo in itertools.combinations(others, r):
                S = frozenset(combo)
                phi[a] += coef[r] * (util[S | {i}] - util[S])
    return phi


def find_skippable(S: Coalition, correct: Mapping[Coalition, NDArray[np.bool_]]) -> NDArray[np.bool_]:
    """Algorithm 7 (FindSkippable): union over splits ``(S', S∖S')`` of ``Φ_{S'} ∩ Φ_{S∖S'}``.

    ``correct`` maps coalitions already evaluated to boolean masks of the samples
    they predict correctly; the result is a boolean mask of the skippable samples.
    """
    members = sorted(S)
    first, rest = members[0], members[1:]
    skip = None
    # Each unordered pair {S', S∖S'} once: S' contains the smallest member.
    for r in range(0, len(rest)):
        for extra in itertools.combinations(rest, r):
            left = frozenset((first, *extra))
            right = S - left
            if left in correct and right in correct:
                both = correct[left] & correct[right]
                skip = both if skip is None else (skip | both)
    if skip is None:
        n = len(next(iter(correct.values()))) if correct else 0
        return np.zeros(n, dtype=bool)
    return skip


@dataclass
class RoundEvaluation:
    """Utilities of one round and the work it took."""

    utilities: dict[Coalition, float]
    correct: dict[Coalition, NDArray[np.bool_]]
    evaluated_samples: int = 0
    skipped_samples: int = 0


def round_utilities(models: Mapping[int, NDArray[np.floating[Any]]], weights: Mapping[int, float],
                    X: NDArray[np.floating[Any]], y: NDArray[np.integer[Any]]) -> RoundEvaluation:
    """Accuracy of the FedAvg model of every non-empty coalition on ``(X, y)``."""
    players = sorted(models)
    out = RoundEvaluation({}, {})
    for S in coalitions(players):
        ok = _correct(fedavg(models, weights, S), X, y)
        out.correct[S] = ok
        out.utilities[S] = float(ok.mean())
        out.evaluated_samples += len(y)
    return out


def sample_skip_utilities(
    models: Mapping[int, NDArray[np.floating[Any]]],
    weights: Mapping[int, float],
    X: NDArray[np.floating[Any]],
    y: NDArray[np.integer[Any]],
    *,
    evaluate: Callable[[Coalition, NDArray[np.intp]], NDArray[np.bool_]] | None = None,
) -> RoundEvaluation:
    """Algorithm 6 (SampleSkip): coalition utilities, skipping samples both halves of a split get right.

    Parameters
    ----------
    models, weights : mappings client -> model ``(c, d+1)`` / aggregation weight
    X : ndarray of shape (M, d)
    y : ndarray of shape (M,)
    evaluate : callable, optional
        ``evaluate(S, idx) -> bool mask`` of correct predictions of ``θ_S`` on the
        samples ``idx`` (the secure protocols plug their testing in here);
        defaults to plaintext FedAvg + argmax.

    Returns
    -------
    RoundEvaluation
        Utilities of every non-empty coalition, the masks ``Φ_S``, and the number of
        evaluated and skipped (sample, model) pairs.
    """
    players = sorted(models)
    M = len(y)
    if evaluate is None:
        def evaluate(S: Coalition, idx: NDArray[np.intp]) -> NDArray[np.bool_]:
            return _correct(fedavg(models, weights, S), X[idx], y[idx])
    out = RoundEvaluation({}, {})
    everything = np.arange(M)
    for S in coalitions(players):  # increasing size: halves are recorded first
        if len(S) == 1:
            ok = np.asarray(evaluate(S, everything), dtype=bool)
        else:
            skip = find_skippable(S, out.correct)
            idx = np.flatnonzero(~skip)
            ok = skip.copy()
            if idx.size:
                ok[idx] = np.asarray(evaluate(S, idx), dtype=bool)
            out.skipped_samples += int(skip.sum())
            out.evaluated_samples += int(idx.size)
            out.correct[S] = ok
            out.utilities[S] = float(ok.mean())
            continue
        out.evaluated_samples += M
        out.correct[S] = ok
        out.utilities[S] = float(ok.mean())
    return out


@dataclass
class FSVResult:
    """Federated Shapley values of a run.

    Attributes
    ----------
    fsv : ndarray of shape (n_clients,)
        ``φ_i = Σ_t φ_i^t`` in the order of ``clients``.
    ssv : ndarray of shape (T, n_clients)
        Single-round SVs (0 for a client absent from a round).
    utilities : list of dict
        Per round, ``v(θ_S^t)`` of every non-empty coalition.
    empty_utilities : list of float
        Per round, ``v(θ_∅^t)``.
    clients : list of int
    evaluated_samples, skipped_samples : int
        (sample, model) pairs tested and skipped (SampleSkip).
    """

    fsv: NDArray[np.float64]
    ssv: NDArray[np.float64]
    utilities: list[dict[Coalition, float]]
    empty_utilities: list[float]
    clients: list[int]
    evaluated_samples: int = 0
    skipped_samples: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def federated_shapley(
    rounds: Sequence[Mapping[int, NDArray[np.floating[Any]]]],
    weights: Mapping[int, float] | Sequence[Mapping[int, float]],
    X: NDArray[np.floating[Any]],
    y: NDArray[np.integer[Any]],
    *,
    n_classes: int,
    sample_skip: bool = False,
    empty_utilities: Sequence[float] | None = None,
    round_evaluator: (Callable[[int, Mapping[int, NDArray[np.floating[Any]]], Mapping[int, float]], RoundEvaluation]
                      | None) = None,
) -> FSVResult:
    """Exact Federated Shapley Values over all coalitions of every round (plaintext).

    Parameters
    ----------
    rounds : sequence of mapping client -> ndarray of shape (n_classes, d+1)
        The local models ``θ_i^t`` of the clients ``I^t`` of each round.
    weights : mapping client -> float, or one mapping per round
        FedAvg weights ``w_i`` (example counts; the secure protocols need small
        positive integers, see :func:`flwr_fedeval.shapley.secsv.quantize_weights`).
    X : ndarray of shape (M, d)
        The union of the clients' test sets.
    y : ndarray of shape (M,), int
    n_classes : int
        ``v(∅)`` of round 1 is ``1 / n_classes`` (a random guess).
    sample_skip : bool, default=False
        Use SampleSkip (Algorithms 6–7).
    empty_utilities : sequence of float, optional
        ``v(θ_∅^t)`` per round. Default: ``1/n_classes`` in round 1, then the
        previous round's full-coalition accuracy (the global model of round
        ``t`` is the FedAvg of round ``t−1``).
    round_evaluator : callable, optional
        ``(t, models, weights) -> RoundEvaluation``; overrides the plaintext
        evaluation (used by HESV/SecSV).

    Returns
    -------
    FSVResult
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"X must be (M, d) and y (M,), got {X.shape} and {y.shape}")
    if n_classes < 2:
        raise ValueError(f"n_classes must be >= 2, got {n_classes!r}")
    per_round_w = weights if isinstance(weights, Sequence) else [weights] * len(rounds)
    evaluations = []
    for t, models in enumerate(rounds):
        w = per_round_w[t]
        if round_evaluator is not None:
            evaluations.append(round_evaluator(t, models, w))
        elif sample_skip:
            evaluations.append(sample_skip_utilities(models, w, X, y))
        else:
            evaluations.append(round_utilities(models, w, X, y))
    players = [sorted(models) for models in rounds]
    return fsv_from_utilities([ev.utilities for ev in evaluations], players, n_classes=n_classes,
                              empty_utilities=empty_utilities,
                              evaluated_samples=sum(ev.evaluated_samples for ev in evaluations),
                              skipped_samples=sum(ev.skipped_samples for ev in evaluations))


def fsv_from_utilities(
    utilities: Sequence[Mapping[Coalition, float]],
    players: Sequence[Sequence[int]],
    *,
    n_classes: int,
    empty_utilities: Sequence[float] | None = None,
    evaluated_samples: int = 0,
    skipped_samples: int = 0,
) -> FSVResult:
    """Federated Shapley values from the coalition utilities of every round (FSV_i = Σ_t φ_i^t).

    Parameters
    ----------
    utilities : sequence of mapping frozenset -> float
        Per round ``t``, ``v(θ_S^t)`` of every non-empty ``S ⊆ I^t``.
    players : sequence of sequence of int
        Per round, the clients ``I^t``.
    n_classes : int
        ``v(∅)`` of round 1 is ``1 / n_classes``.
    empty_utilities : sequence of float, optional
        ``v(θ_∅^t)`` per round; default: the previous round's full-coalition utility.

    Raises
    ------
    ValueError
        Lengths differ, a coalition's utility is missing, ``n_classes < 2``.
    """
    if len(utilities) != len(players):
        raise ValueError(f"{len(utilities)} rounds of utilities but {len(players)} player lists")
    if n_classes < 2:
        raise ValueError(f"n_classes must be >= 2, got {n_classes!r}")
    if empty_utilities is not None and len(empty_utilities) != len(utilities):
        raise ValueError("empty_utilities needs one value per round")
    clients = sorted(set().union(*[set(p) for p in players])) if players else []
    col = {c: a for a, c in enumerate(clients)}
    ssv = np.zeros((len(utilities), len(clients)))
    utils, empties = [], []
    prev_full = 1.0 / n_classes
    for t, (util, members) in enumerate(zip(utilities, players)):
        members = sorted(members)
        empty = float(empty_utilities[t]) if empty_utilities is not None else prev_full
        phi = shapley_values(util, members, empty)
        for p, v in zip(members, phi):
            ssv[t, col[p]] = v
        utils.append(dict(util))
        empties.append(empty)
        prev_full = util[frozenset(members)]
    return FSVResult(ssv.sum(axis=0), ssv, utils, empties, clients, evaluated_samples, skipped_samples)
