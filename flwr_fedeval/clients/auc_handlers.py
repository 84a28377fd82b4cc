"""ClientApp handlers of the plaintext AUC phase, and the one-call registration of the AUC phases.

Every AUC phase starts from the same two things a client knows: the labels
and the scores of its local test split under the global model. Give them as

* ``test_scores(msg, context) -> (y_true, y_score)``: ``y_true`` int of shape
  ``(n_test,)`` (0/1), ``y_score`` float of shape ``(n_test,)``, the
  positive-class score of each test sample under the global model carried in
  ``msg.content["arrays"]``;
* ``test_labels(context) -> y_true``: the same labels, for the steps whose
  request carries no model (FHE step 1 reports a bound on the test-set size;
  FedAUC round 2 needs the labels only);

and one call adds every handler of a phase to your ``ClientApp``:

==========================================  ======================================  ===========================
call                                        message types                           server side
==========================================  ======================================  ===========================
:func:`register_auc_handlers`               ``evaluate.threshold_counts``           ``PlaintextAUCPhase``
:func:`register_dp_handlers`                ``evaluate.dpauc_laplace``,             ``DPAUCLaplacePhase``,
                                            ``evaluate.dpauc_rr``,                  ``DPAUCRRPhase``,
                                            ``evaluate.fedauc_scores``,             ``FedAUCRRPhase``,
                                            ``evaluate.fedauc_stats``               ``FedAUCLaplacePhase``
:func:`~flwr_fedeval.clients.fhe_handlers.  ``query.fhe_pubkey``, ``query.fhe_keygen``,  ``FHEAUCPhase``
register_fhe_handlers`                      ``evaluate.fhe_counts``, ``query.fhe_result``
==========================================  ======================================  ===========================

The DP handlers import diffprivlib only when a DP request arrives (it costs
~2 s per process in the deployment engine, which starts one per message).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Context, Message, RecordDict

from flwr_fedeval.fhe.counts import threshold_counts
from flwr_fedeval.messages import (
    COUNTS_KEY,
    EVALUATE_DPAUC_LAPLACE,
    EVALUATE_DPAUC_RR,
    EVALUATE_FEDAUC_SCORES,
    EVALUATE_FEDAUC_STATS,
    EVALUATE_THRESHOLD_COUNTS,
    EVALUATION_KEY,
    counts_to_record,
)

__all__ = ["TestLabels", "TestScores", "register_auc_handlers", "register_dp_handlers", "threshold_counts_reply"]

#: ``(msg, context) -> (y_true, y_score)`` of the local test split under the global model in ``msg``.
TestScores = Callable[[Message, Context], "tuple[np.ndarray, np.ndarray]"]
#: ``context -> y_true`` of the local test split.
TestLabels = Callable[[Context], np.ndarray]


def _name(message_type: str) -> str:
    """``"evaluate.threshold_counts"`` -> ``"threshold_counts"`` (the ClientApp decorator's argument)."""
    return message_type.split(".", 1)[1]


def threshold_counts_reply(msg: Message, context: Context, y_true: np.ndarray, y_score: np.ndarray) -> Message:
    """Reply TP/FP/TN/FN of ``(y_true, y_score)`` at the decision points of the request.

    The plaintext AUC phase (``evaluate.threshold_counts``): the request's
    ArrayRecord ``evaluation`` holds ``thresholds`` (float64, shape (N,)); the
    reply's ArrayRecord ``counts`` holds int64 arrays of shape (N,)
    (:func:`flwr_fedeval.messages.counts_to_record`). Decision points inside
    [0, 1] are probabilities (scores outside [0, 1] are refused); otherwise
    the scores are real numbers in the decision points' units (logits,
    ``decision_function`` outputs).
    """
    thresholds = msg.content[EVALUATION_KEY]["thresholds"].numpy().astype(np.float64)
    probability = bool(thresholds.size) and 0.0 <= thresholds.min() and thresholds.max() <= 1.0
    counts = threshold_counts(y_true, y_score, thresholds, score_range=(0.0, 1.0) if probability else None)
    return Message(content=RecordDict({COUNTS_KEY: counts_to_record(counts)}), reply_to=msg)


def register_auc_handlers(app, *, test_scores: TestScores) -> None:
    """Register the plaintext AUC phase's handler (``evaluate.threshold_counts``) on ``app``.

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
    test_scores : callable
        ``(msg, context) -> (y_true, y_score)`` (see the module docstring).
    """

    def evaluate_threshold_counts(msg: Message, context: Context) -> Message:
        return threshold_counts_reply(msg, context, *test_scores(msg, context))

    app.evaluate(_name(EVALUATE_THRESHOLD_COUNTS))(evaluate_threshold_counts)


def register_dp_handlers(app, *, test_scores: TestScores, test_labels: TestLabels) -> None:
    """Register the four DP AUC handlers (DPAUC_Lap, DPAUC_RR, FedAUC rounds 1 and 2) on ``app``.

    Each client charges its own budget (run config ``dp-epsilon``,
    ``dp-budget``, ``dp-seed``; see :mod:`flwr_fedeval.clients.dp_handlers`)
    and refuses a request it cannot afford with a ``BUDGET_EXHAUSTED`` error reply.

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
    test_scores : callable
        ``(msg, context) -> (y_true, y_score)`` (see the module docstring).
    test_labels : callable
        ``context -> y_true`` (FedAUC round 2 carries no model).
    """

    def evaluate_dpauc_laplace(msg: Message, context: Context) -> Message:
        from flwr_fedeval.clients import dp_handlers

        return dp_handlers.dpauc_laplace(msg, context, *test_scores(msg, context))

    def evaluate_dpauc_rr(msg: Message, context: Context) -> Message:
        from flwr_fedeval.clients import dp_handlers

        return dp_handlers.dpauc_rr(msg, context, *test_scores(msg, context))

    def evaluate_fedauc_scores(msg: Message, context: Context) -> Message:
        from flwr_fedeval.clients import dp_handlers

        return dp_handlers.fedauc_scores(msg, context, *test_scores(msg, context))

    def evaluate_fedauc_stats(msg: Message, context: Context) -> Message:
        from flwr_fedeval.clients import dp_handlers

        return dp_handlers.fedauc_stats(msg, context, np.asarray(test_labels(context)), None)

    app.evaluate(_name(EVALUATE_DPAUC_LAPLACE))(evaluate_dpauc_laplace)
    app.evaluate(_name(EVALUATE_DPAUC_RR))(evaluate_dpauc_rr)
    app.evaluate(_name(EVALUATE_FEDAUC_SCORES))(evaluate_fedauc_scores)
    app.evaluate(_name(EVALUATE_FEDAUC_STATS))(evaluate_fedauc_stats)
