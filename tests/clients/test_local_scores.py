"""A node's test labels and scores kept for the run in ``context.state`` (flwr_fedeval.clients.local_scores):
computed once per global model, never answered for other weights, gone with the run."""

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flwr_fedeval._compat import set_serverapp_identity
from flwr_fedeval.clients.local_scores import (
    STATE_KEY,
    cached_test_labels,
    cached_test_scores,
    remember_test_scores,
)
from flwr_fedeval.testing.grid import _roundtrip_context, _roundtrip_message

Y_TRUE = np.array([0, 1, 1, 0, 1], dtype=np.int64)


def _context() -> Context:
    return Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})


def _request(weights: list[np.ndarray] | None) -> Message:
    """A request as a ClientApp process receives it (Flower's protobuf serialization)."""
    content = RecordDict({"config": ConfigRecord({"server-round": 1})})
    if weights is not None:
        content["arrays"] = ArrayRecord(weights)
    set_serverapp_identity(run_id=1)
    return _roundtrip_message(Message(content=content, dst_node_id=7, message_type="evaluate.fhe_counts"))[0]


def _next_process(ctx: Context) -> Context:
    """The node's context as the next message's process gets it from its SuperNode (serialized)."""
    return _roundtrip_context(ctx)


def _counting_scores():
    calls = []

    def test_scores(msg: Message, context: Context):
        weights = msg.content["arrays"].to_numpy_ndarrays()
        calls.append(float(weights[0].sum()))
        return Y_TRUE.copy(), np.linspace(0.1, 0.9, Y_TRUE.size) * float(weights[0].sum())

    return test_scores, calls


def test_scores_are_computed_once_per_model_and_never_answered_for_other_weights():
    test_scores, calls = _counting_scores()
    scores = cached_test_scores(test_scores)
    ctx = _context()
    w0, w1 = [np.ones(3, dtype=np.float32)], [np.full(3, 2.0, dtype=np.float32)]

    y0, s0 = scores(_request(w0), ctx)
    ctx = _next_process(ctx)
    y0_again, s0_again = scores(_request(w0), ctx)  # another message (another process), the same model
    assert calls == [3.0]
    np.testing.assert_array_equal(y0_again, y0)
    np.testing.assert_array_equal(s0_again, s0)
    assert s0_again.dtype == s0.dtype and y0_again.dtype == Y_TRUE.dtype

    y1, s1 = scores(_request(w1), ctx)              # other weights: computed, never the kept scores
    assert calls == [3.0, 6.0]
    np.testing.assert_allclose(s1, 2 * s0)
    # only the last model is kept: the first one is computed again
    scores(_request(w0), ctx)
    assert calls == [3.0, 6.0, 3.0]


def test_a_model_differing_only_in_an_array_name_or_dtype_is_another_model():
    test_scores, calls = _counting_scores()
    scores = cached_test_scores(test_scores)
    ctx = _context()
    scores(_request([np.ones(3, dtype=np.float32)]), ctx)
    scores(_request([np.ones(3, dtype=np.float64)]), ctx)
    assert len(calls) == 2


def test_returned_arrays_are_copies():
    test_scores, calls = _counting_scores()
    scores = cached_test_scores(test_scores)
    ctx = _context()
    request = _request([np.ones(3, dtype=np.float32)])
    y, s = scores(request, ctx)
    y[:] = 9
    s[:] = -1.0
    y2, s2 = scores(request, ctx)
    np.testing.assert_array_equal(y2, Y_TRUE)
    assert np.all(s2 > 0) and calls == [3.0]


def test_a_new_run_is_a_fresh_state_and_computes_again():
    test_scores, calls = _counting_scores()
    scores = cached_test_scores(test_scores)
    request = _request([np.ones(3, dtype=np.float32)])
    scores(request, _context())
    scores(request, _context())
    assert calls == [3.0, 3.0]


def test_labels_come_from_kept_scores_or_once_from_test_labels():
    label_calls = []

    def test_labels(context):
        label_calls.append(1)
        return Y_TRUE.copy()

    labels = cached_test_labels(test_labels)
    ctx = _context()
    np.testing.assert_array_equal(labels(ctx), Y_TRUE)
    np.testing.assert_array_equal(labels(ctx), Y_TRUE)
    assert label_calls == [1]

    scored = _context()  # scores kept first (an evaluate of the model): no call at all
    remember_test_scores(_request([np.ones(2)]), scored, Y_TRUE, np.full(Y_TRUE.size, 0.5))
    np.testing.assert_array_equal(labels(_next_process(scored)), Y_TRUE)
    assert label_calls == [1]


def test_a_request_without_a_model_keeps_the_labels_only():
    ctx = _context()
    remember_test_scores(_request(None), ctx, Y_TRUE, np.full(Y_TRUE.size, 0.5))
    record = ctx.state[STATE_KEY]
    assert set(record) == {"y_true"}
    test_scores, calls = _counting_scores()
    cached_test_scores(test_scores)(_request([np.ones(3, dtype=np.float32)]), ctx)
    assert calls == [3.0]


def test_what_flower_cannot_hold_is_passed_on_uncached():
    ctx = _context()

    def bad_scores(msg, context):
        return Y_TRUE, [object()] * Y_TRUE.size  # the phase's handler refuses this, with its own error

    y, s = cached_test_scores(bad_scores)(_request([np.ones(3)]), ctx)
    assert s[0] is not None and STATE_KEY not in ctx.state
