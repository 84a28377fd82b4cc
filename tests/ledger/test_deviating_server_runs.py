"""A deviating server that starts new runs meets the node privacy ledger (over the serializing grid).

"A new run" is what a SuperNode sees when the SuperLink starts one: an empty ``context.state``. Here
it is a new :class:`~flwr_fedeval.testing.InProcessGrid` over the same identity folder (made by
``python -m flwr_fedeval.keys create``, whose ledgers sit beside the keys; ``ledgers=None``: the
nodes find them as in deployment). Before the ledger, everything below lived in ``context.state``:

* symptom 1: DPAUC_RR asked once per run over 41 runs flipped the labels afresh each run, and the
  majority over the runs gave every label;
* symptom 3: the no-retry ledger kept the last 256 models, so 300 filler models pushed a model out;
* symptom 7: P sent every sealed deal of the SecSV zero test to A twice (label share + 1 the second
  time): ``z1 − z2 = r``, every misclassified label; or had a second helper decrypt a batch again.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from flwr_fedeval.clients import register_dp_handlers
from flwr_fedeval.clients.ledger import TEST_SET, LedgerNotConfigured, node_ledger, record_training
from flwr_fedeval.keys import create
from flwr_fedeval.metrics.counts import decision_points
from flwr_fedeval.protocol import Refused, ReplyCode, dp_auc
from flwr_fedeval.protocol.auc import ThresholdCounts
from flwr_fedeval.strategies.dp_phases import DPAUCRRPhase
from flwr_fedeval.testing import InProcessGrid

NODES = 3
SAMPLES = 40
POINTS = 4095


def _labels_scores(pid: int):
    rng = np.random.default_rng(1000 + pid)
    return rng.integers(0, 2, SAMPLES), rng.uniform(0, 1, SAMPLES)


def _dp_app() -> ClientApp:
    app = ClientApp()
    register_dp_handlers(
        app,
        test_scores=lambda msg, ctx: _labels_scores(int(ctx.node_config["partition-id"])),
        test_labels=lambda ctx: _labels_scores(int(ctx.node_config["partition-id"]))[0],
    )
    return app


@pytest.fixture
def ids(tmp_path):
    """A federation's identity folder with the default node policy (ε = 1 per evaluation, total ε 1,
    one evaluation per global model) and a ledger beside every key."""
    create(tmp_path / "ids", [f"node-{i}" for i in range(NODES)])
    return tmp_path / "ids"


def _new_run(app, ids, fault=None) -> InProcessGrid:
    """A new run over the same nodes: fresh ``context.state``, the same identity folder and ledgers."""
    configs = [{"partition-id": i, "num-partitions": NODES} for i in range(NODES)]
    return InProcessGrid(
        app, NODES, {"fedeval-identity-dir": str(ids)}, node_configs=configs, fault=fault, ledgers=None
    )


def _model(k: int) -> ArrayRecord:
    """Global model k: a 1e-9 nudge per run gives each run a new model digest."""
    return ArrayRecord([np.full((3, 2), 0.25 + 1e-9 * k, dtype=np.float64)])


def _flipped_labels_seen(tp: np.ndarray, scores: np.ndarray, thresholds: np.ndarray) -> dict[int, int]:
    """The server's view of one reply: the (flipped) label of every sample alone between two
    consecutive decision points, from the differences of TP (the positives scored >= θ)."""
    order = np.argsort(thresholds)
    th, tp = thresholds[order], tp[order]
    out = {}
    for k in range(len(th) - 1):
        inside = np.flatnonzero((scores >= th[k]) & (scores < th[k + 1]))
        if inside.size == 1:
            out[int(inside[0])] = int(tp[k] - tp[k + 1])
    return out


# --- symptom 1: every label through DPAUC_RR by starting new runs -----------------------------------
def test_41_runs_of_dpauc_rr_give_one_randomized_response_per_sample(ids):
    thresholds = decision_points(POINTS)
    replies: dict[int, list[np.ndarray]] = {i: [] for i in range(NODES)}

    def spy(node, msg, reply):
        if msg.metadata.message_type == dp_auc.DPAUC_RR.message_type and not reply.has_error():
            pid = int(grid.contexts[node].node_config["partition-id"])
            replies[pid].append(ThresholdCounts.from_record(reply.content, num_points=POINTS).tp)
        return reply

    aucs = []
    for run in range(41):
        grid = _new_run(_dp_app(), ids, fault=spy)
        aucs.append(DPAUCRRPhase(POINTS, epsilon=1.0).run(grid, _model(run)).auc)  # each run completes
    assert all(len(r) == 41 for r in replies.values())
    wrong_first = 0
    for pid in range(NODES):
        labels, scores = _labels_scores(pid)
        seen = [_flipped_labels_seen(r, scores, thresholds) for r in replies[pid]]
        assert len(seen[0]) > SAMPLES // 2  # the attack identifies most samples from one reply
        majority = {i: int(np.mean([s[i] for s in seen]) > 0.5) for i in seen[0]}
        assert majority == seen[0]  # 41 runs recover nothing beyond the first run's randomized response
        wrong_first += sum(majority[i] != labels[i] for i in majority)
        assert len({r.tobytes() for r in replies[pid]}) == 1  # the same response every run
        summary = node_ledger(grid.contexts[grid.node_ids[pid]]).summary()
        assert summary.responses == {TEST_SET: 1} and summary.epsilon[TEST_SET][0] == pytest.approx(1.0)
    assert wrong_first > 0  # the flips are real (ε = 1 flips each label with probability 0.27)
    assert len(set(aucs)) == 1


def test_a_new_run_finds_the_budget_spent_and_the_model_evaluated(ids):
    DPAUCRRPhase(64, epsilon=1.0).run(_new_run(_dp_app(), ids), _model(0))  # the honest run completes
    with pytest.raises(RuntimeError, match="fedeval-evaluations-per-model"):  # same model, new run
        DPAUCRRPhase(64, epsilon=1.0).run(_new_run(_dp_app(), ids), _model(0))
    with pytest.raises(RuntimeError, match="BudgetError"):  # new flips at another ε: the budget is spent
        DPAUCRRPhase(64, epsilon=0.5).run(_new_run(_dp_app(), ids), _model(1))
    grid = _new_run(_dp_app(), ids)
    assert all(node_ledger(c).spent(TEST_SET) == pytest.approx(1.0) for c in grid.contexts.values())


def test_a_node_without_a_ledger_refuses_naming_the_key(ids):
    for i in range(NODES):
        (ids / f"node-{i}.ledger.sqlite").unlink()  # the operator deleted the ledgers
    with pytest.raises(RuntimeError, match="fedeval-ledger"):
        DPAUCRRPhase(64, epsilon=1.0).run(_new_run(_dp_app(), ids), _model(0))


# --- symptom 3: the no-retry ledger forgets -------------------------------------------------------------
def _context(ids, run: int) -> Context:
    return Context(
        run_id=run,
        node_id=7,
        node_config={"partition-id": 0, "num-partitions": NODES},
        state=RecordDict(),
        run_config={"fedeval-identity-dir": str(ids)},
    )


def test_300_filler_models_do_not_push_a_model_out(ids):
    first = hashlib.sha256(b"global model 0").digest()
    record_training(_context(ids, 1), first)
    for k in range(300):  # cheap filler rounds, in this run and in later ones
        record_training(_context(ids, 1 + k // 100), hashlib.sha256(f"filler {k}".encode()).digest())
    with pytest.raises(Refused) as info:  # the first model again, in a new run: refused
        record_training(_context(ids, 9), first)
    assert info.value.code == ReplyCode.ALREADY_CONTRIBUTED
    record_training(_context(ids, 9), hashlib.sha256(b"global model 1").digest())  # a new model is trained on


def test_record_training_without_a_ledger_is_a_configuration_refusal(ids):
    (ids / "node-0.ledger.sqlite").unlink()
    with pytest.raises(LedgerNotConfigured) as info:
        record_training(_context(ids, 1), hashlib.sha256(b"m").digest())
    assert info.value.code == ReplyCode.NOT_CONFIGURED and "node config fedeval-ledger" in info.value.keys


# --- symptom 7: SecSV's zero test replayed ---------------------------------------------------------------
def test_a_replayed_deal_and_a_second_helper_are_refused_by_the_auxiliary_server(tmp_path):
    from shapley_flower.test_secsv_phase import app as secsv_app
    from shapley_flower.test_secsv_phase import train_two_rounds

    from flwr_fedeval.protocol import secsv as proto
    from flwr_fedeval.strategies.shapley_phase import SecSVPhase

    create(tmp_path / "ids", [f"node-{i}" for i in range(4)], policy={"fedeval-secsv-trust-principal": True})
    configs = [{"partition-id": i, "num-partitions": 3} for i in range(3)] + [
        {"fedeval-role": "shapley-aux", "partition-id": 3}
    ]
    grid = InProcessGrid(
        secsv_app, 4, {"fedeval-identity-dir": str(tmp_path / "ids")}, node_configs=configs, ledgers=None
    )
    train_two_rounds(grid)
    outcomes: list[tuple[str, Message]] = []

    class ReplayingP(SecSVPhase):
        """P runs the honest phase, and after the first zero test of a round replays it twice: the same
        sealed deal with its label share + 1, and the same job decrypted by a second helper."""

        def secure_test(self, grid, st, t, jobs, models, forward):
            from_aux = self.aux_products(grid, st, t, jobs, forward)
            own = self._own_products(st, jobs, models)
            preds = self.helper_decryption(grid, st, t, jobs, own, from_aux)
            result = self.aux_differences(grid, st, t, jobs, preds)  # the honest zero test
            if outcomes:
                return result
            S, ids = jobs[0]
            deal_p, sealed, helper = preds[0]
            replay = {
                0: (sealed, ids.astype(np.int64), st.pk[helper], (self._e(st, ids, deal_p) + 1) % proto.LABEL_PRIME)
            }
            outcomes.append(("same deal", self._ask(grid, st.aux, proto.AuxDiffRequest(st.public, replay))))
            owners = {st.clients[i] for i in set(st.owners[ids].tolist())}
            others = [c for c in st.clients if c != helper]
            second = next((c for c in others if c not in owners), others[0])
            members = tuple(str(n) for n in sorted(S))
            job = {0: (own[0], from_aux[0][0], ids.astype(np.int64), members, from_aux[0][1])}
            reply = self._ask(grid, second, proto.HelperRequest(st.public, st.pk[st.aux], t, job))
            deal_p2, sealed2 = proto.HelperReply.from_record(reply.content).preds[0]
            again = {0: (sealed2, ids.astype(np.int64), st.pk[second], self._e(st, ids, deal_p2))}
            outcomes.append(
                (
                    f"second helper (owner: {second in owners})",
                    self._ask(grid, st.aux, proto.AuxDiffRequest(st.public, again)),
                )
            )
            return result

        @staticmethod
        def _e(st, ids, deal_p):
            from flwr_fedeval.shapley.zerotest import mask_label_share

            return mask_label_share(st.y_P[ids], deal_p)

        @staticmethod
        def _ask(grid, node, payload):
            step = {proto.AuxDiffRequest: proto.AUX_DIFF, proto.HelperRequest: proto.HELPER}[type(payload)]
            msg = Message(payload.to_record(), dst_node_id=node, message_type=step.message_type)
            (reply,) = grid.send_and_receive([msg])
            return reply

    result = ReplayingP(sample_skip=True).run(grid)  # the honest phase beside the replays completes
    assert len(result.fsv) == 3
    (what, first), (what2, second) = outcomes
    assert first.has_error() and first.error.code == ReplyCode.ALREADY_CONTRIBUTED
    assert "answered before" in first.error.reason
    assert second.has_error(), what2
    if "owner: False" in what2:  # a helper that owns none of the batch: the batch was zero-tested
        assert second.error.code == ReplyCode.ALREADY_CONTRIBUTED and "decrypted before" in second.error.reason
    else:  # only owners were left: A refuses a helper that owns samples of the batch
        assert "owns samples" in second.error.reason
