"""A node's test labels, and its test scores under one global model, kept for the run in ``context.state``.

Every AUC phase starts from the labels of a node's test split and the scores of that split under
the global model (:data:`~flwr_fedeval.clients.auc_handlers.TestScores`). Flower's deployment
engine starts one process per message, so without this a phase's steps, a second phase over the
same model, and the App's own ``evaluate`` of that model would each load the data and the model
again (the framework's import alone: ~4 CPU s for TensorFlow, ~1.5 s for PyTorch, per message).

A node's ``context.state`` lives on its SuperNode for the run (a new run starts empty; nothing of
it is sent to the SuperLink), and in simulation with the node's context. This keeps there

* the labels ``y_true`` (the split does not change within a run), and
* the scores ``y_score`` of the one global model scored last, with that model's digest
  (:func:`~flwr_fedeval.clients.policy.message_model_digest`: names, dtypes, shapes and bytes of
  every array), so that other weights are never answered with these scores.

Arrays are kept as given (dtype and shape) and returned as copies. Nothing here is a record of
what the node gave: that is the node's privacy ledger (:mod:`flwr_fedeval.ledger`), which every
phase consults before these scores leave the node in any form.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message

from flwr_fedeval.clients import policy

__all__ = ["STATE_KEY", "cached_test_labels", "cached_test_scores", "remember_test_scores"]

#: The ``context.state`` record holding ``y_true`` and, for one model, ``model`` and ``y_score``.
STATE_KEY = "fedeval.test-split"

TestScores = Callable[[Message, Context], "tuple[np.ndarray, np.ndarray]"]
TestLabels = Callable[[Context], np.ndarray]


def _record(context: Context) -> ArrayRecord | None:
    record = context.state.get(STATE_KEY)
    return record if isinstance(record, ArrayRecord) else None


def _digest_array(model: bytes) -> np.ndarray:
    return np.frombuffer(model, dtype=np.uint8).copy()


def _keep(context: Context, model: bytes | None, y_true: np.ndarray, y_score: np.ndarray | None) -> None:
    """Put the labels, and with a model digest the scores under that model, in ``context.state``."""
    try:
        arrays = {"y_true": Array(np.array(y_true, copy=True))}
        if model is not None:
            arrays |= {"model": Array(_digest_array(model)), "y_score": Array(np.array(y_score, copy=True))}
    except (TypeError, ValueError):  # not arrays Flower can hold: the phase's handler refuses them, uncached
        return
    context.state[STATE_KEY] = ArrayRecord(arrays)


def remember_test_scores(msg: Message, context: Context, y_true: np.ndarray, y_score: np.ndarray) -> None:
    """Keep ``y_true`` and ``y_score`` as the test split's labels and its scores under the global
    model ``msg`` carries (for the rest of the run on this node; replaces the model kept before).

    A message that carries no model keeps the labels only.

    Parameters
    ----------
    msg : flwr.app.Message
        The request whose ArrayRecord is the scored global model.
    context : flwr.app.Context
        The node's context; the arrays go to ``context.state[STATE_KEY]``.
    y_true : ndarray of shape (n_test,)
    y_score : ndarray of shape (n_test,)
    """
    _keep(context, policy.message_model_digest(msg), y_true, y_score)


def cached_test_scores(test_scores: TestScores) -> TestScores:
    """``test_scores`` computed once per global model and run on a node.

    The returned callable answers from ``context.state`` when the model in ``msg`` is the one scored
    last on this node (:func:`remember_test_scores`), else calls ``test_scores`` and keeps its
    result. Returns copies: ``(y_true, y_score)``, dtypes and shapes as ``test_scores`` gave them.
    """

    def scores(msg: Message, context: Context) -> tuple[np.ndarray, np.ndarray]:
        model = policy.message_model_digest(msg)
        record = _record(context)
        if (model is not None and record is not None and "model" in record
                and record["model"].numpy().tobytes() == model):
            return record["y_true"].numpy().copy(), record["y_score"].numpy().copy()
        y_true, y_score = test_scores(msg, context)
        _keep(context, model, y_true, y_score)  # the digest above: the model is hashed once
        return y_true, y_score

    return scores


def cached_test_labels(test_labels: TestLabels) -> TestLabels:
    """``test_labels`` called once per run on a node (or never, when scores kept the labels).

    Returns a copy of the kept ``y_true``, else ``test_labels(context)``, which it keeps.
    """

    def labels(context: Context) -> np.ndarray:
        record = _record(context)
        if record is not None and "y_true" in record:
            return record["y_true"].numpy().copy()
        y_true = test_labels(context)
        _keep(context, None, y_true, None)
        return y_true

    return labels
