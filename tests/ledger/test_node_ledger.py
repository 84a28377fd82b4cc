"""The node privacy ledger below Flower (:mod:`flwr_fedeval.ledger`): persistence, refusals, the
bound, two processes at once, a ``kill -9`` between the write and the reply, the schema."""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import os
import signal
import sqlite3

import numpy as np
import pytest

from flwr_fedeval.ledger import (
    SCHEMA_VERSION,
    AlreadyGiven,
    BudgetExhausted,
    LedgerError,
    LedgerFull,
    NodeLedger,
)

_FORK = multiprocessing.get_context("fork")


def _h(i: int) -> bytes:
    return hashlib.sha256(f"model {i}".encode()).digest()


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "node-0.ledger.sqlite"
    NodeLedger.create(p)
    return p


# --- persistence and refusals ------------------------------------------------------------------
def test_a_trained_model_is_refused_by_a_new_connection(path):
    NodeLedger(path).record_training(_h(1))
    again = NodeLedger(path)  # another object, another connection: as a new run's process
    with pytest.raises(AlreadyGiven):
        again.record_training(_h(1))
    again.record_training(_h(2))
    assert again.trained(_h(1)) and again.trained(_h(2)) and not again.trained(_h(3))


def test_a_model_is_refused_under_another_phase(path):
    NodeLedger(path).record_training(_h(1), phase="train")
    with pytest.raises(AlreadyGiven):
        NodeLedger(path).record_training(_h(1), phase="resume")


def test_epsilon_accumulates_across_connections_and_is_refused_when_spent(path):
    assert NodeLedger(path).spend_epsilon("test", 0.4, 1.0) == pytest.approx(0.6)
    assert NodeLedger(path).spend_epsilon("test", 0.4, 1.0) == pytest.approx(0.2)
    with pytest.raises(BudgetExhausted):
        NodeLedger(path).spend_epsilon("test", 0.4, 1.0)
    assert NodeLedger(path).spent("test") == pytest.approx(0.8)  # the refused spend is not recorded
    assert NodeLedger(path).spend_epsilon("other", 1.0, 1.0) == pytest.approx(0.0, abs=1e-12)  # per dataset
    with pytest.raises(BudgetExhausted):  # a budget tightened below what was spent
        NodeLedger(path).remaining("test", 0.5)


def test_infinite_epsilon_only_against_an_infinite_budget(path):
    with pytest.raises(BudgetExhausted):
        NodeLedger(path).spend_epsilon("test", math.inf, 1.0)
    assert NodeLedger(path).spend_epsilon("test", math.inf, math.inf) == math.inf


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan"), True])
def test_a_bad_epsilon_is_an_error_not_a_spend(path, epsilon):
    with pytest.raises((TypeError, ValueError)):
        NodeLedger(path).spend_epsilon("test", epsilon, 1.0)
    assert NodeLedger(path).spent("test") == 0.0


def test_randomized_response_is_permanent_and_charged_once(path):
    draws = []

    def draw():
        draws.append(1)
        return np.array([1, 0, 1, 1], dtype=np.int64) if len(draws) == 1 else np.zeros(4, dtype=np.int64)

    first = NodeLedger(path).randomized_response("test", b"labels", draw, epsilon=1.0, budget=1.0)
    second = NodeLedger(path).randomized_response("test", b"labels", draw, epsilon=1.0, budget=1.0)
    np.testing.assert_array_equal(first, second)
    assert second.dtype == np.int64 and draws == [1]
    assert NodeLedger(path).spent("test") == 1.0
    with pytest.raises(BudgetExhausted):  # another key needs a fresh draw: the budget is spent
        NodeLedger(path).randomized_response("test", b"other", draw, epsilon=1.0, budget=1.0)
    assert draws == [1]


def test_evaluations_count_over_all_phases(path):
    ledger = NodeLedger(path)
    assert ledger.record_evaluation(_h(1), "dp-auc", 2) == 0
    assert ledger.record_evaluation(_h(1), "fhe-auc", 2) == 1
    with pytest.raises(AlreadyGiven):
        NodeLedger(path).record_evaluation(_h(1), "plaintext-auc", 2)
    assert NodeLedger(path).evaluations(_h(1)) == 2
    assert NodeLedger(path).record_evaluation(_h(2), "dp-auc", 1) == 0


def test_a_deal_is_answered_once(path):
    NodeLedger(path).record_deal(b"deal-1")
    with pytest.raises(AlreadyGiven):
        NodeLedger(path).record_deal(b"deal-1")


def test_a_batch_is_recorded_all_or_nothing(path):
    NodeLedger(path).record_batch(1, ["node-1", "node-0"], ["node-2/0", "node-2/1"])
    with pytest.raises(AlreadyGiven):  # one sample overlaps: nothing of this batch is recorded
        NodeLedger(path).record_batch(1, ["node-0", "node-1"], ["node-2/5", "node-2/1"])
    NodeLedger(path).record_batch(1, ["node-0", "node-1"], ["node-2/5"])  # so node-2/5 is still free
    NodeLedger(path).record_batch(2, ["node-0", "node-1"], ["node-2/1"])  # another round
    NodeLedger(path).record_batch(1, ["node-0"], ["node-2/1"])  # another coalition
    NodeLedger(path).record_batch(1, ["node-0", "node-1"], ["node-2/1"], scope="run 2")  # another scope
    assert NodeLedger(path).summary().batch_samples == 6


# --- the bound: refuse, never forget ---------------------------------------------------------
def test_at_the_bound_every_new_record_is_refused_and_nothing_is_forgotten(path):
    ledger = NodeLedger(path, cap=5)
    for i in range(5):
        ledger.record_training(_h(i))
    with pytest.raises(LedgerFull):
        ledger.record_training(_h(99))
    with pytest.raises(AlreadyGiven):  # the first model is still there
        ledger.record_training(_h(0))
    assert not ledger.trained(_h(99))
    with pytest.raises(LedgerFull):
        NodeLedger(path, cap=2).record_batch(1, ["a"], ["s/0", "s/1", "s/2"])
    NodeLedger(path, cap=2).record_deal(b"d")  # the bound is per table


# --- the file -------------------------------------------------------------------------------------
def test_create_refuses_to_overwrite_and_a_missing_ledger_is_an_error(tmp_path, path):
    NodeLedger(path).record_training(_h(1))
    with pytest.raises(LedgerError, match="overwrite"):
        NodeLedger.create(path)
    assert NodeLedger(path).trained(_h(1))
    with pytest.raises(LedgerError, match="no node ledger"):
        NodeLedger(tmp_path / "missing.sqlite")


def test_the_database_is_private_wal_and_versioned(path):
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    db.commit()
    db.close()
    with pytest.raises(LedgerError, match="schema"):
        NodeLedger(path)


def test_a_file_that_is_not_a_ledger_is_refused(tmp_path):
    other = tmp_path / "other.sqlite"
    other.write_bytes(b"not a database" * 100)
    with pytest.raises(LedgerError):
        NodeLedger(other)


# --- two processes at once ------------------------------------------------------------------------
def _train_all(path, models, out):
    ledger = NodeLedger(path)
    granted = []
    for i in models:
        try:
            ledger.record_training(_h(i))
            granted.append(i)
        except AlreadyGiven:
            pass
    out.put(granted)


def _spend_all(path, times, out):
    ledger = NodeLedger(path)
    granted = 0
    for _ in range(times):
        try:
            ledger.spend_epsilon("test", 0.125, 1.0)
            granted += 1
        except BudgetExhausted:
            pass
    out.put(granted)


def _run_processes(target, args_per_process):
    out = _FORK.Queue()
    procs = [_FORK.Process(target=target, args=(*args, out)) for args in args_per_process]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def test_two_processes_never_both_get_the_same_model(path):
    models = list(range(60))
    granted = _run_processes(_train_all, [(path, models), (path, models[::-1])])
    assert sorted(granted[0] + granted[1]) == models  # each model granted exactly once


def test_two_processes_never_overspend_epsilon(path):
    granted = _run_processes(_spend_all, [(path, 8), (path, 8), (path, 8)])
    assert sum(granted) == 8  # 8 × 0.125 = 1.0, the budget, and not one more
    assert NodeLedger(path).spent("test") == pytest.approx(1.0)


# --- kill -9 between the write and the reply -------------------------------------------------------
def _record_then_die(path, reply):
    NodeLedger(path).record_training(_h(7))
    os.kill(os.getpid(), signal.SIGKILL)  # dies before it could reply
    reply.send("reply")


def test_kill_9_after_the_write_leaves_a_ledger_that_refuses_the_repeat(path):
    receive, send = _FORK.Pipe(duplex=False)
    child = _FORK.Process(target=_record_then_die, args=(path, send))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    assert not receive.poll(0)  # no reply was sent
    with pytest.raises(AlreadyGiven):
        NodeLedger(path).record_training(_h(7))
