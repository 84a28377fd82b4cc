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
:func:`register_auc_handlers`               ``query.auc_join``,                     ``PlaintextAUCPhase``
                                            ``evaluate.threshold_counts``
:func:`register_dp_handlers`                ``evaluate.dpauc_laplace``,             ``DPAUCLaplacePhase``,
                                            ``evaluate.dpauc_rr``,                  ``DPAUCRRPhase``,
                                            ``evaluate.fedauc_scores``,             ``FedAUCRRPhase``,
                                            ``evaluate.fedauc_stats``,              ``FedAUCLaplacePhase``
                                            ``query.dp_join``
:func:`~flwr_fedeval.clients.fhe_handlers.  ``query.fhe_pubkey``, ``query.fhe_keygen``,  ``FHEAUCPhase``
register_fhe_handlers`                      ``evaluate.fhe_counts``, ``query.fhe_result``
==========================================  ======================================  ===========================

Who takes part: each phase starts with a join step; a node with a roster identity
signs its joining of the session and answers the evaluation request only if it carries the
members' signed list with itself in it and at least its floor of members
(:func:`flwr_fedeval.clients.identity.check_participants`); it answers one evaluation per
global model (node policy ``fedeval-evaluations-per-model``).

The DP handlers import diffprivlib only when a DP request arrives (it costs
~2 s per process in the deployment engine, which starts one per message).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Context, Message

from flwr_fedeval.clients.identity import check_participants, serve_join
from flwr_fedeval.clients.local_scores import cached_test_labels, cached_test_scores
from flwr_fedeval.metrics.counts import threshold_counts
from flwr_fedeval.protocol import Payload, Step, auc, dp_auc, handler, register

if TYPE_CHECKING:
    from flwr.clientapp import ClientApp

__all__ = ["TestLabels", "TestScores", "register_auc_handlers", "register_dp_handlers", "threshold_counts_reply"]

#: ``(msg, context) -> (y_true, y_score)`` of the local test split under the global model in ``msg``.
TestScores = Callable[[Message, Context], "tuple[np.ndarray, np.ndarray]"]
#: ``context -> y_true`` of the local test split.
TestLabels = Callable[[Context], np.ndarray]
#: ``context.state`` record: the session of the join step this node signed (plaintext, DP phases).
STATE_AUC_JOINED = "auc-evaluation.joined"
STATE_DP_JOINED = "dp-evaluation.joined"


def _counts(request: auc.ThresholdCountsRequest, y_true: np.ndarray, y_score: np.ndarray, *,
            msg: Message | None = None, context: Context | None = None) -> auc.ThresholdCounts:
    """TP/FP/TN/FN of ``(y_true, y_score)`` at the request's decision points.

    Decision points inside [0, 1] are probabilities (scores outside [0, 1] are refused with
    ``ValueError``); otherwise the scores are real numbers in the decision points' units
    (logits, ``decision_function`` outputs). With ``msg`` and ``context``, the evaluation of the
    request's global model is counted first (node policy ``fedeval-evaluations-per-model``,
    :func:`flwr_fedeval.clients.policy.record_evaluation`; refused beyond it).
    """
    if msg is not None and context is not None:
        from flwr_fedeval.clients import policy

        check_participants(context, request.participants, STATE_AUC_JOINED, "plaintext AUC")
        policy.record_evaluation(context, policy.message_model_digest(msg), "plaintext AUC")
    theta = request.thresholds
    probability = theta.min() >= 0.0 and theta.max() <= 1.0
    return auc.ThresholdCounts.of(threshold_counts(y_true, y_score, theta,
                                                   score_range=(0.0, 1.0) if probability else None))


def threshold_counts_reply(msg: Message, context: Context, y_true: np.ndarray, y_score: np.ndarray) -> Message:
    """Reply TP/FP/TN/FN of ``(y_true, y_score)`` at the decision points of the request.

    The plaintext AUC phase (``evaluate.threshold_counts``): the request is a
    :class:`~flwr_fedeval.protocol.auc.ThresholdCountsRequest` (decision points, float64 of
    shape (N,)), the reply a :class:`~flwr_fedeval.protocol.auc.ThresholdCounts` (int64 of
    shape (N,)). A malformed request gets an error reply (``ReplyCode.REFUSED``).
    """
    serve = handler(auc.THRESHOLD_COUNTS, lambda request, m, c: _counts(request, y_true, y_score, msg=m, context=c),
                    label="AUC")
    return serve(msg, context)


def register_auc_handlers(app: ClientApp, *, test_scores: TestScores) -> None:
    """Register the plaintext AUC phase's handler (``evaluate.threshold_counts``) on ``app``.

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
    test_scores : callable
        ``(msg, context) -> (y_true, y_score)`` (see the module docstring); called once per global
        model and run on a node (:mod:`flwr_fedeval.clients.local_scores`).
    """
    test_scores = cached_test_scores(test_scores)

    def serve(request: auc.ThresholdCountsRequest, msg: Message, context: Context) -> auc.ThresholdCounts:
        return _counts(request, *test_scores(msg, context), msg=msg, context=context)

    register(app, auc.STEPS, {
        auc.EVALUATE_THRESHOLD_COUNTS: handler(auc.THRESHOLD_COUNTS, serve, label="AUC"),
        auc.JOIN.message_type: handler(auc.JOIN, lambda request, msg, context: serve_join(request, context,
                                                                                        STATE_AUC_JOINED),
                                       label="AUC", errors=(ValueError,)),
    })


def register_dp_handlers(app: ClientApp, *, test_scores: TestScores, test_labels: TestLabels) -> None:
    """Register the four DP AUC handlers (DPAUC_Lap, DPAUC_RR, FedAUC rounds 1 and 2) on ``app``.

    Each client charges its own budget (node policy ``fedeval-dp-epsilon``,
    ``fedeval-dp-budget``, which run config ``fedeval-dp-epsilon``, ``fedeval-dp-budget`` may only
    lower; see :mod:`flwr_fedeval.clients.dp_handlers`), refuses a request it
    cannot afford with a ``BUDGET_EXHAUSTED`` error reply
    (:class:`~flwr_fedeval.protocol.dp_auc.BudgetError`), a looser request with a
    ``REFUSED`` one naming the node key, and a second evaluation of one global
    model unless ``fedeval-evaluations-per-model`` allows it.

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
    test_scores : callable
        ``(msg, context) -> (y_true, y_score)`` (see the module docstring).
    test_labels : callable
        ``context -> y_true`` (FedAUC round 2 carries no model).

    ``test_scores`` is called once per global model and run on a node, ``test_labels`` once per run
    (kept in ``context.state``: :mod:`flwr_fedeval.clients.local_scores`).
    """
    test_scores = cached_test_scores(test_scores)
    test_labels = cached_test_labels(test_labels)

    def labels_only(msg: Message, context: Context) -> tuple[np.ndarray, None]:
        return np.asarray(test_labels(context)), None

    def lazy(step: Step, data: Callable[[Message, Context], tuple[np.ndarray, np.ndarray | None]],
             ) -> Callable[[Message, Context], Message]:
        def serve(request: Any, msg: Message, context: Context) -> Payload:
            from flwr_fedeval.clients import dp_handlers, policy  # lazy: diffprivlib/sklearn cost ~2 s per process

            serve_step: Callable[..., Payload] = getattr(dp_handlers, step.handler_name)
            if step is dp_auc.FEDAUC_STATS:  # carries ranks, not the model
                return serve_step(request, context, *data(msg, context))
            return serve_step(request, context, *data(msg, context), model=policy.message_model_digest(msg))

        # ValueError: a value flwr_fedeval.dp rejects (a DP parameter, ranks of another length)
        return handler(step, serve, label="DP AUC", errors=(ValueError,))

    handlers = {s.message_type: lazy(s, labels_only if s is dp_auc.FEDAUC_STATS else test_scores)
                for s in dp_auc.STEPS if s is not dp_auc.DP_JOIN}
    handlers[dp_auc.DP_JOIN.message_type] = handler(
        dp_auc.DP_JOIN, lambda request, msg, context: serve_join(request, context, STATE_DP_JOINED), label="DP AUC",
        errors=(ValueError,))
    register(app, dp_auc.STEPS, handlers)
