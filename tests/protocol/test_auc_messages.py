"""Messages of the plaintext AUC phase and the DP AUC baselines (flwr_fedeval.protocol.auc, .dp_auc),
over Flower's serialization; the client handlers they are registered with."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ConfigRecord, Context, Message, RecordDict

from flwr_fedeval._compat import set_serverapp_identity
from flwr_fedeval.clients.auc_handlers import register_auc_handlers, register_dp_handlers
from flwr_fedeval.clients.dp_handlers import spent_epsilon
from flwr_fedeval.ledger import NodeLedger
from flwr_fedeval.metrics.counts import ConfusionCounts, decision_points, threshold_counts
from flwr_fedeval.protocol import MalformedMessage, Refused, ReplyCode, auc, dp_auc
from flwr_fedeval.testing.grid import _roundtrip_message

NODE = 12345678901234567890
THETA = decision_points(5)
Y = np.array([0, 1, 1, 0, 1, 0, 0, 1])
S = np.array([0.1, 0.9, 0.65, 0.3, 0.45, 0.8, 0.05, 0.7])


def _message(content: RecordDict, message_type: str = "evaluate.x") -> Message:
    set_serverapp_identity(run_id=1)
    msg, _ = _roundtrip_message(Message(content=content, dst_node_id=5, message_type=message_type))
    return msg


def roundtrip(content: RecordDict) -> RecordDict:
    """``content`` after Flower's protobuf serialization (as on the deployment engine)."""
    return _message(content).content


def _counts() -> auc.ThresholdCounts:
    return auc.ThresholdCounts.of(threshold_counts(Y, S, THETA))


def _stats_request(mechanism: str = "laplace") -> dp_auc.FedAUCStatsRequest:
    ranks = np.array([3.0, 0.0, 1.5, 1.5])
    if mechanism == "rr":
        return dp_auc.FedAUCStatsRequest(ranks, "s1", "rr", 2.0)
    return dp_auc.FedAUCStatsRequest(ranks, "s1", "laplace", math.inf, sensitivity="local", allocation="orthogonal",
                                     alpha=0.5, beta="adaptive", max_rank=7.0)


# --- wire format: record keys, field names and value types of every payload --------------------
def test_wire_format_of_every_payload():
    req = auc.ThresholdCountsRequest(THETA).to_record()
    assert list(req.array_records) == ["evaluation"] and list(req["evaluation"]) == ["thresholds"]
    assert req["evaluation"]["thresholds"].numpy().tolist() == THETA.tolist()
    counts = _counts().to_record()
    assert list(counts["counts"]) == ["tp", "fp", "tn", "fn"]
    assert all(counts["counts"][k].numpy().dtype == np.int64 for k in ("tp", "fp", "tn", "fn"))
    dp = dp_auc.DPAUCRequest(THETA, 1.0).to_record()
    assert list(dp.array_records) == ["evaluation"] and dict(dp["dp"]) == {"epsilon": 1.0}
    noisy = dp_auc.NoisyCounts(*(np.full(5, 0.5),) * 4).to_record()
    assert list(noisy["noisy-counts"]) == ["tp", "fp", "tn", "fn"]
    assert noisy["noisy-counts"]["fn"].numpy().dtype == np.float64
    assert dict(dp_auc.FedAUCScoresRequest("s1", "rr", 1.0).to_record()["dp"]) == {
        "session": "s1", "mechanism": "rr", "epsilon": 1.0}
    assert list(dp_auc.ShuffledScores(S).to_record()["scores"]) == ["scores"]
    rr = _stats_request("rr").to_record()
    assert list(rr["fedauc"]) == ["ranks"] and dict(rr["dp"]) == {"session": "s1", "mechanism": "rr", "epsilon": 2.0}
    lap = _stats_request().to_record()
    assert list(lap["dp"]) == ["session", "mechanism", "epsilon", "sensitivity", "allocation", "alpha", "beta",
                               "max-rank"]
    assert dict(dp_auc.LocalStatsReply(3.0, 2.0, 2.0).to_record()["stats"]) == {
        "local-sum": 3.0, "local-p": 2.0, "local-n": 2.0}


# --- round trips through Flower's serialization ------------------------------------------------
def test_plain_payloads_round_trip():
    back = auc.ThresholdCountsRequest.from_record(roundtrip(auc.ThresholdCountsRequest(THETA).to_record()), node=NODE)
    assert back.thresholds.tolist() == THETA.tolist() and back.thresholds.dtype == np.float64
    sent = _counts()
    got = auc.ThresholdCounts.from_record(roundtrip(sent.to_record()), node=NODE, num_points=THETA.size)
    assert isinstance(got.counts(), ConfusionCounts)
    assert [a.tolist() for a in got.counts()] == [a.tolist() for a in threshold_counts(Y, S, THETA)]


def test_dp_payloads_round_trip():
    req = dp_auc.DPAUCRequest.from_record(roundtrip(dp_auc.DPAUCRequest(THETA, math.inf).to_record()), node=NODE)
    assert req.epsilon == math.inf and req.thresholds.tolist() == THETA.tolist()
    noisy = dp_auc.NoisyCounts(*(np.linspace(-1.5, 2.5, 5) + i for i in range(4)))
    got = dp_auc.NoisyCounts.from_record(roundtrip(noisy.to_record()), node=NODE, num_points=5)
    assert [a.tolist() for a in got.values()] == [a.tolist() for a in noisy.values()]
    scores_req = dp_auc.FedAUCScoresRequest.from_record(
        roundtrip(dp_auc.FedAUCScoresRequest("s1", "laplace", 0.5).to_record()), node=NODE)
    assert (scores_req.session, scores_req.mechanism, scores_req.epsilon) == ("s1", "laplace", 0.5)
    assert dp_auc.ShuffledScores.from_record(roundtrip(dp_auc.ShuffledScores(S).to_record())).scores.tolist() == \
        S.tolist()
    for mechanism in ("rr", "laplace"):
        sent = _stats_request(mechanism)
        back = dp_auc.FedAUCStatsRequest.from_record(roundtrip(sent.to_record()), node=NODE)
        assert back.ranks.tolist() == sent.ranks.tolist()
        assert back.replace(ranks=None) == sent.replace(ranks=None)
    stats = dp_auc.LocalStatsReply.from_record(roundtrip(dp_auc.LocalStatsReply(-3.25, 2.5, 1.5).to_record()),
                                               node=NODE, num_scores=4)
    assert stats.values() == (-3.25, 2.5, 1.5)


# --- malformed fields name the field and the node ----------------------------------------------
def _set(record: str, field: str, value):
    def edit(content):
        content[record][field] = Array(value) if isinstance(value, np.ndarray) else value
    return edit


def _drop(record: str, field: str | None = None):
    def edit(content):
        if field is None:
            del content[record]
        else:
            del content[record][field]
    return edit


MALFORMED = [
    # (payload, parse kwargs, edit, field, reason fragment)
    (auc.ThresholdCountsRequest(THETA), {}, _set("evaluation", "thresholds", THETA[::-1].copy()),
     "evaluation.thresholds", "strictly descending"),
    (auc.ThresholdCountsRequest(THETA), {}, _set("evaluation", "thresholds", THETA.astype(np.float32)),
     "evaluation.thresholds", "dtype float32"),
    (auc.ThresholdCountsRequest(THETA), {}, _drop("evaluation"), "evaluation", "missing"),
    (_counts(), {"num_points": 5}, _set("counts", "tp", np.array([-1, 0, 0, 0, 0])), "counts.tp", "negative"),
    (_counts(), {"num_points": 5}, _set("counts", "fn", np.arange(5)), "counts.fn", "TP+FN"),
    (_counts(), {"num_points": 6}, lambda c: None, "counts.tp", "shape (5,), expected (6,)"),
    (_counts(), {"num_points": 5}, _set("counts", "fp", np.zeros(5, dtype=np.int32)), "counts.fp", "dtype int32"),
    (dp_auc.DPAUCRequest(THETA, 1.0), {}, _set("dp", "epsilon", "1.0"), "dp.epsilon", "expected int or float"),
    (dp_auc.DPAUCRequest(THETA, 1.0), {}, _set("dp", "epsilon", -1.0), "dp.epsilon", "must be > 0"),
    (dp_auc.DPAUCRequest(THETA, 1.0), {}, _set("dp", "epsilon", math.nan), "dp.epsilon", "not finite"),
    (dp_auc.NoisyCounts(*(np.zeros(5),) * 4), {"num_points": 5},
     _set("noisy-counts", "tn", np.array([0.0, np.inf, 0, 0, 0])), "noisy-counts.tn", "NaN or infinite"),
    (dp_auc.NoisyCounts(*(np.zeros(5),) * 4), {"num_points": 5}, _set("noisy-counts", "fn", np.zeros(4)),
     "noisy-counts.fn", "shape (4,), expected (5,)"),
    (dp_auc.FedAUCScoresRequest("s1", "rr", 1.0), {}, _set("dp", "mechanism", "gaussian"), "dp.mechanism",
     "not one of"),
    (dp_auc.FedAUCScoresRequest("s1", "rr", 1.0), {}, _drop("dp", "session"), "dp.session", "missing"),
    (dp_auc.ShuffledScores(S), {}, _set("scores", "scores", S.astype(np.float32)), "scores.scores", "float64"),
    (dp_auc.ShuffledScores(S), {}, _set("scores", "scores", S.reshape(2, 4)), "scores.scores", "shape (2, 4)"),
    (_stats_request(), {}, _set("fedauc", "ranks", np.array([1.0, -2.0, 0.0, 3.0])), "fedauc.ranks", "below 0"),
    (_stats_request(), {}, _drop("dp", "max-rank"), "dp.max-rank", "missing"),
    (_stats_request(), {}, _set("dp", "beta", 1.5), "dp.beta", "above 1"),
    (_stats_request(), {}, _set("dp", "sensitivity", "smooth"), "dp.sensitivity", "not one of"),
    (dp_auc.LocalStatsReply(1.0, 2.0, 2.0), {"num_scores": 4}, _set("stats", "local-sum", math.inf),
     "stats.local-sum", "not finite"),
    (dp_auc.LocalStatsReply(1.0, 2.0, 2.0), {"num_scores": 5}, lambda c: None, "stats.local-n",
     "local-p + local-n = 4, but the client sent 5 scores"),
]


@pytest.mark.parametrize("payload, kwargs, edit, field, reason", MALFORMED,
                         ids=[f"{type(m[0]).__name__}-{m[3]}-{m[4][:12]}" for m in MALFORMED])
def test_malformed_field_names_the_field_and_the_node(payload, kwargs, edit, field, reason):
    content = roundtrip(payload.to_record())
    edit(content)
    with pytest.raises(MalformedMessage) as err:
        type(payload).from_record(content, node=NODE, **kwargs)
    assert err.value.field == field and err.value.node == NODE and reason in err.value.reason
    assert str(err.value).startswith(f"node {NODE}: field {field!r}")


# --- step tables and the one registration idiom ------------------------------------------------
def test_step_tables():
    assert [(s.message_type, s.request, s.reply) for s in auc.STEPS] == [
        ("query.auc_join", auc.JoinRequest, auc.JoinReply),  # issue 22: the members sign who takes part
        ("evaluate.threshold_counts", auc.ThresholdCountsRequest, auc.ThresholdCounts)]
    assert [(s.message_type, s.reply) for s in dp_auc.STEPS] == [
        ("evaluate.dpauc_laplace", dp_auc.NoisyCounts), ("evaluate.dpauc_rr", auc.ThresholdCounts),
        ("evaluate.fedauc_scores", dp_auc.ShuffledScores), ("evaluate.fedauc_stats", dp_auc.LocalStatsReply),
        ("query.dp_join", auc.JoinReply)]
    refusal = dp_auc.BudgetError("epsilon 2 exceeds the budget")
    assert isinstance(refusal, Refused) and refusal.code == ReplyCode.BUDGET_EXHAUSTED


class _App:
    """Records what the registration idiom registers, as flwr.clientapp.ClientApp would."""

    def __init__(self):
        self.handlers = {}

    def evaluate(self, name):
        return lambda fn: self.handlers.setdefault(f"evaluate.{name}", fn)

    def query(self, name):
        return lambda fn: self.handlers.setdefault(f"query.{name}", fn)


def _context(node_policy=None, **run_config) -> Context:
    """A node with a fresh privacy ledger (node config ``fedeval-ledger``)."""
    ledger = Path(tempfile.mkdtemp(prefix="fedeval-ledger-")) / "node.ledger.sqlite"
    NodeLedger.create(ledger)
    node_config = {"partition-id": 0, "fedeval-ledger": str(ledger), **(node_policy or {})}
    return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(), run_config=run_config)


def test_plain_handler_replies_counts_and_refuses_a_malformed_request():
    app = _App()
    register_auc_handlers(app, test_scores=lambda msg, ctx: (Y, S))
    assert list(app.handlers) == ["query.auc_join", "evaluate.threshold_counts"]
    serve = app.handlers["evaluate.threshold_counts"]
    reply = serve(_message(auc.ThresholdCountsRequest(THETA).to_record()), _context())
    counts = auc.ThresholdCounts.from_record(roundtrip(reply.content), node=5, num_points=THETA.size).counts()
    assert [a.tolist() for a in counts] == [a.tolist() for a in threshold_counts(Y, S, THETA)]
    bad = auc.ThresholdCountsRequest(THETA).to_record()
    bad["evaluation"]["thresholds"] = Array(np.array([0.5, np.nan]))
    reply = serve(_message(bad), _context())
    assert reply.has_error() and reply.error.code == ReplyCode.REFUSED
    assert "evaluation.thresholds" in reply.error.reason and "NaN" in reply.error.reason


def test_dp_handlers_budget_refusal_and_malformed_request():
    app = _App()
    register_dp_handlers(app, test_scores=lambda msg, ctx: (Y, S), test_labels=lambda ctx: Y)
    assert list(app.handlers) == [s.message_type for s in dp_auc.STEPS]
    serve = app.handlers["evaluate.dpauc_laplace"]
    ctx = _context(**{"fedeval-dp-epsilon": 1.0})
    reply = serve(_message(dp_auc.DPAUCRequest(THETA, 1.0).to_record()), ctx)
    noisy = dp_auc.NoisyCounts.from_record(roundtrip(reply.content), node=5, num_points=THETA.size)
    assert all(np.isfinite(a).all() for a in noisy.values())
    assert spent_epsilon(ctx) == 1.0
    reply = serve(_message(dp_auc.DPAUCRequest(THETA, 1.0).to_record()), ctx)  # the budget (1.0) is spent
    assert reply.has_error() and reply.error.code == ReplyCode.BUDGET_EXHAUSTED
    assert reply.error.reason.startswith("BudgetError: ")
    assert spent_epsilon(ctx) == 1.0
    bad = dp_auc.DPAUCRequest(THETA, 1.0).to_record()
    bad["dp"] = ConfigRecord({"epsilon": True})
    reply = app.handlers["evaluate.dpauc_rr"](_message(bad), _context())
    assert reply.has_error() and reply.error.code == ReplyCode.REFUSED and "dp.epsilon" in reply.error.reason


def test_fedauc_handlers_round_trip_and_session_check():
    app = _App()
    register_dp_handlers(app, test_scores=lambda msg, ctx: (Y, S), test_labels=lambda ctx: Y)
    ctx = _context({"fedeval-dp-epsilon": math.inf}, **{"fedeval-dp-epsilon": math.inf})
    reply = app.handlers["evaluate.fedauc_scores"](_message(dp_auc.FedAUCScoresRequest("s1", "rr", math.inf)
                                                            .to_record()), ctx)
    shuffled = dp_auc.ShuffledScores.from_record(roundtrip(reply.content), node=5).scores
    assert sorted(shuffled.tolist()) == sorted(S.tolist())
    ranks = np.argsort(np.argsort(shuffled)).astype(np.float64)  # ranks of the shuffled scores, all from this node
    wrong = dp_auc.FedAUCStatsRequest(ranks, "other", "rr", math.inf).to_record()
    reply = app.handlers["evaluate.fedauc_stats"](_message(wrong), ctx)
    assert reply.has_error() and reply.error.code == ReplyCode.REFUSED and "session" in reply.error.reason
    ok = dp_auc.FedAUCStatsRequest(ranks, "s1", "rr", math.inf).to_record()
    reply = app.handlers["evaluate.fedauc_stats"](_message(ok), ctx)
    stats = dp_auc.LocalStatsReply.from_record(roundtrip(reply.content), node=5, num_scores=S.size)
    assert stats.values() == (float(np.sum(np.argsort(np.argsort(S)) * Y)), 4.0, 4.0)  # localSum = Σ r_i y_i
