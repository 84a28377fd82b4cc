"""Shared phase machinery: readable failures, codes instead of reason text, step timing, summary()."""

import logging
from contextlib import contextmanager

import pytest
from flwr.app import Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from flwr_fedeval.fhe.auc_malicious import TamperingDetectedError
from flwr_fedeval.metrics.auc import UndefinedAUCError
from flwr_fedeval.protocol import ReplyCode, error_reply, reply_code
from flwr_fedeval.strategies.auc_phase import PlaintextAUCPhase
from flwr_fedeval.strategies.base import (
    EvaluationPhase,
    Failure,
    Failures,
    log_failures,
    one_line_reason,
)
from flwr_fedeval.strategies.failures import format_failures
from flwr_fedeval.testing import InProcessGrid


@contextmanager
def flwr_records(level):
    """The records Flower's logger emits inside the block (it does not propagate to the root logger)."""
    records = []
    handler = logging.Handler(level)
    handler.emit = records.append
    logger = logging.getLogger("flwr")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


TRACEBACK = (
    "<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException ClientAppException occurred. "
    "Message: Traceback (most recent call last):\n  File \"x.py\", line 3, in f\n    raise ValueError(...)\n"
    "ValueError: test split of 1 sample cannot hold both classes — lower num-supernodes or raise test-fraction\n'>"
)


def test_one_line_reason_of_a_remote_traceback_is_its_exception_line():
    assert one_line_reason(TRACEBACK) == (
        "ValueError: test split of 1 sample cannot hold both classes — lower num-supernodes or raise test-fraction")
    assert one_line_reason("<class 'ZeroDivisionError'>:<'division by zero'>") == "ZeroDivisionError: division by zero"
    assert one_line_reason("error reply: BudgetError: no budget") == "error reply: BudgetError: no budget"
    assert one_line_reason("") == "(no reason given)"


def test_failures_of_many_nodes_collapse_into_one_line_per_reason():
    failed = {n: Failure("train", ErrorCode.CLIENT_APP_RAISED_EXCEPTION, TRACEBACK) for n in range(100, 116)}
    failed[7] = Failure("train", ReplyCode.TIMEOUT, "no reply (timeout)")
    lines = format_failures(failed)
    assert len(lines) == 2
    assert lines[0].startswith("16 nodes: ValueError: test split of 1 sample cannot hold both classes")
    assert "nodes 100, 101" in lines[0] and "(8 more)" in lines[0]
    assert lines[1] == "1 node: no reply (timeout) [node 7]"
    with flwr_records(logging.DEBUG) as records:
        log_failures("FedAvg", "train", failed)
    warnings = [r for r in records if r.levelno == logging.WARNING]
    debug = [r for r in records if r.levelno == logging.DEBUG]
    assert len(warnings) == 2                      # one line per distinct reason, not 17
    assert len(debug) == 1 and "Traceback" in debug[0].getMessage()   # the traceback once, at DEBUG


def test_failures_are_classified_by_code_not_by_text():
    failures = Failures()
    failures.add(1, "step 6", ReplyCode.TAMPERING_DETECTED, "error reply: something else entirely")
    failures.add(2, "step 6", ReplyCode.REFUSED, "error reply: TamperingDetectedError in the text only")
    failures[3] = "duplicate X25519 public key"
    assert set(failures.with_code(ReplyCode.TAMPERING_DETECTED)) == {1}
    assert failures[3].code == ReplyCode.MALFORMED_REPLY
    assert failures.reasons()[3] == "duplicate X25519 public key"


def test_client_error_replies_carry_a_code_per_exception_type():
    assert reply_code(TamperingDetectedError("x")) == ReplyCode.TAMPERING_DETECTED
    assert reply_code(UndefinedAUCError("x")) == ReplyCode.UNDEFINED_AUC
    assert reply_code(ValueError("x")) == ReplyCode.REFUSED
    app = ClientApp()

    @app.query("refuse")
    def refuse(msg, context):
        return error_reply(msg, TamperingDetectedError("offsets do not cancel"), "test")

    grid = InProcessGrid(app, 1)
    (reply,) = grid.send_and_receive([Message(RecordDict(), dst_node_id=grid.node_ids[0],
                                              message_type="query.refuse")])
    assert reply.error.code == ReplyCode.TAMPERING_DETECTED      # survives serialization
    assert reply.error.reason == "TamperingDetectedError: offsets do not cancel"
    assert min(ReplyCode) > max(v for k, v in vars(ErrorCode).items() if k.isupper())


def test_phase_validates_at_construction_and_summarizes_in_flower_style():
    with pytest.raises(ValueError, match="min_nodes"):
        EvaluationPhase(min_nodes=0)
    with pytest.raises(ValueError, match="timeout"):
        EvaluationPhase(timeout=0)
    phase = PlaintextAUCPhase(20, min_nodes=3)
    with flwr_records(logging.INFO) as records:
        assert phase.summary() is None
    text = "\n".join(r.getMessage() for r in records)
    assert "PlaintextAUCPhase" in text and "N=20" in text and "Minimum nodes: 3" in text
    assert "minimum nodes 3" in phase.describe()


def test_fedavg_logs_16_identical_client_failures_as_one_line():
    import numpy as np
    from flwr.app import ArrayRecord, MetricRecord

    from flwr_fedeval.strategies.base import ReadableFedAvg

    app = ClientApp()

    @app.train()
    def train(msg, context):
        if int(context.node_config["partition-id"]) >= 4:
            raise ValueError("test split of 1 sample cannot hold both classes")
        reply = RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 5})})
        return Message(reply, reply_to=msg)

    grid = InProcessGrid(app, 20)
    with flwr_records(logging.DEBUG) as records:
        ReadableFedAvg(fraction_evaluate=0.0, min_available_nodes=20).start(
            grid=grid, initial_arrays=ArrayRecord([np.ones(2, np.float32)]), num_rounds=1)
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    failure_lines = [w for w in warnings if "cannot hold both classes" in w]
    assert len(failure_lines) == 1
    assert "16 nodes: ValueError: test split of 1 sample cannot hold both classes" in failure_lines[0]
    assert not any("Received error in reply from node" in r.getMessage() for r in records)
