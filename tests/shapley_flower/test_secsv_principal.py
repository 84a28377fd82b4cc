"""SecSV against the principal server P (issue 22, symptoms 3 and 4), over the serializing grid
with the real client handlers and roster identities.

Symptom 3 (honest-but-curious P, the paper's model): P reconstructed Ŷ − Y before testing it for
zero; on a binary task ±1 on a misclassified sample is its label. Now P opens r·(Ŷ − Y) with a
multiplier it does not know (flwr_fedeval.shapley.zerotest): its view per (sample, coalition)
is the correct/incorrect bit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_secsv_phase import client_data, make_grid, plaintext_reference, train_two_rounds

from flwr_fedeval.shapley.sharing import LABEL_PRIME
from flwr_fedeval.shapley.zerotest import open_zero_test
from flwr_fedeval.strategies.shapley_phase import SecSVPhase, ShapleyPhaseError


@pytest.fixture
def trained():
    """A new run per test: the auxiliary server zero-tests each (round, coalition, sample) of a run's
    models once (its node ledger), so a second SecSV phase over one run's models is refused."""
    grid = make_grid()
    aux = train_two_rounds(grid)
    return grid, aux


class CuriousP(SecSVPhase):
    """Follows the protocol, keeps everything it opens: ``(round, coalition, sample id, z)``."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.view: list[tuple[int, frozenset, int, int]] = []

    def _open(self, t, S, ids, deal_p, e, f, z_aux):
        ok, z = open_zero_test(deal_p, e, f, z_aux)
        self.view += [(t, S, int(i), int(v)) for i, v in zip(ids, z)]
        return super()._open(t, S, ids, deal_p, e, f, z_aux)


def test_label_recovery_attack_recovers_nothing(trained):
    grid, aux = trained
    clients = sorted(n for n in grid.node_ids if n != aux)
    y = np.concatenate([client_data(grid.contexts[n].node_config["partition-id"])[3] for n in clients])
    ref, _, _ = plaintext_reference(grid, aux, frac_bits=10)
    phase = CuriousP(sample_skip=False)
    res = phase.run(grid)
    # an unmodified run: the Shapley values are the plaintext ones
    assert np.abs(np.array([res.fsv[n] for n in clients]) - ref.fsv).max() < 1e-3

    wrong = [(t, S, i, z) for t, S, i, z in phase.view if z != 0]
    assert len(wrong) > 200                              # enough misclassified (sample, coalition) pairs
    # The symptom-3 attack: the centred opened value −1 means Ŷ − Y = −1, so y = 1.
    guess = np.array([int(z > LABEL_PRIME // 2) for _, _, _, z in wrong])
    truth = np.array([y[i] for _, _, i, _ in wrong])
    learned = {i for (_, _, i, z) in wrong if z in (1, LABEL_PRIME - 1)}
    assert not learned                                   # the paper's opening gave ±1 on every one
    accuracy = float(np.mean(guess == truth))
    n = len(wrong)
    assert abs(accuracy - 0.5) < 4.5 * 0.5 / np.sqrt(n), (accuracy, n)   # chance level
    # the same sample misclassified by several coalitions: a fresh uniform value every time
    assert len({z for *_, z in wrong}) == n
    # and each sample's view is exactly the correct/incorrect bit of the plaintext reference
    for t_idx, u in enumerate(ref.utilities):
        t = t_idx + 1
        got = {S: np.mean([z == 0 for (tt, SS, _, z) in phase.view if tt == t and SS == S]) for S in u}
        assert got == pytest.approx(dict(u), abs=1e-12)


# --- symptom 4: a deviating P (A and the clients honest) ----------------------------------------------
class DeviatingP(SecSVPhase):
    """P that applies ``edit(contents, st)`` to what it sends with message type ``mtype``."""

    def __init__(self, mtype, edit, **kw):
        super().__init__(**kw)
        self.target, self.edit = mtype, edit
        self.sent: list = []

    def _exchange(self, grid, contents, mtype, parse, step, **kw):
        if mtype == self.target:
            self.edit(contents, kw["st"])
            self.sent.append(contents)
        return super()._exchange(grid, contents, mtype, parse, step, **kw)


def _forged_model(st) -> bytes:
    """A model P makes itself under the clients' public key: θ = 1 on the first feature only
    (scores = that feature: the first step of reading the test features through A)."""
    from flwr_fedeval.fhe.backend import pack_blobs
    from flwr_fedeval.shapley.parties import encrypt_model

    A = np.zeros((st.d_out, st.params.n_features + 1))
    A[0, 0] = 2 ** st.params.model_frac_bits
    return pack_blobs([st.ctx.serialize_ciphertext(c) for c in encrypt_model(st.ctx, A, st.m)])


@pytest.mark.parametrize("forgery", ["own-model", "unsigned", "other-round", "other-node"])
def test_aux_refuses_a_round_model_its_client_did_not_sign(trained, forgery):
    grid, aux = trained
    first_round: dict = {}

    def edit(contents, st):
        (content,) = contents.values()
        if "shapley-round-models" not in content:
            return
        models, sigs = content["shapley-round-models"], content["shapley-round-models-signatures"]
        node, other = sorted(models.keys())[:2]
        rnd = content["shapley"]["round"]
        if forgery == "own-model":
            from flwr_fedeval.protocol import bytes_array
            models[node] = bytes_array(_forged_model(st))
        elif forgery == "unsigned":
            del sigs[node]
        elif forgery == "other-node":       # a genuine signed model, relayed as another node's
            models[node], sigs[node] = models[other], sigs[other]
        elif rnd == 1:                       # other-round: keep round 1's, replay it in round 2
            first_round.update(model=models[node], sig=sigs[node])
        else:
            models[node], sigs[node] = first_round["model"], first_round["sig"]

    phase = DeviatingP("query.shapley_aux_eval", edit)
    with pytest.raises(ShapleyPhaseError) as info:
        phase.run(grid)
    assert set(info.value.failed) == {aux} and "aux products" in info.value.step
    why = info.value.failed[aux]
    assert "IdentityError" in why
    assert ("not signed" in why) if forgery == "unsigned" else ("does not verify" in why), why
    if forgery == "other-round":
        assert "round 2" in info.value.step
    # A answered the forged round with an error (no products), and nothing was decrypted after it
    aux_evals = [i for i, (n, t, _) in enumerate(grid.log) if n == aux and t == "query.shapley_aux_eval"]
    assert grid.log[aux_evals[-1]][2] is False
    assert not any(t == "query.shapley_helper" for _, t, _ in grid.log[aux_evals[-1]:])


@pytest.mark.parametrize("forgery", ["client-model", "other-samples", "other-coalition", "unsigned-half"])
def test_helper_decrypts_only_what_a_signed_for_the_job(trained, forgery):
    """The key holders decrypt only the sum of P's half and A's signed half of one job of this
    phase: a client's encrypted model passed off as scores, A's half re-labelled for other samples
    or another coalition, or a half A never signed is refused before any decryption."""
    grid, aux = trained
    models: dict = {}
    replies = []

    def keep_models(node, msg, reply):
        if msg.metadata.message_type == "query.shapley_models" and not reply.has_error():
            models[node] = reply.content["shapley-model"]["cts"]
        if msg.metadata.message_type == "query.shapley_helper":
            replies.append(reply)
        return reply

    def edit(contents, st):
        from flwr.app import Array

        for content in contents.values():
            batches, proofs = content["shapley-batches"], content["shapley-batch-proofs"]
            j = sorted(k.rpartition("-")[2] for k in batches if k.startswith("aux-"))[0]
            if forgery == "client-model":
                batches[f"aux-{j}"] = next(iter(models.values()))
            elif forgery == "other-samples":
                ids = batches[f"ids-{j}"].numpy()
                batches[f"ids-{j}"] = Array((ids + 1) % st.num_samples)
            elif forgery == "other-coalition":
                members = list(proofs[f"members-{j}"])
                others = [str(n) for n in st.clients if str(n) not in members]
                proofs[f"members-{j}"] = members[:-1] + others[:1] if others else members[:-1]
            else:
                from flwr_fedeval.protocol import bytes_array
                batches[f"aux-{j}"] = bytes_array(_forged_model(st))

    original, grid.fault = grid.fault, keep_models
    try:
        phase = DeviatingP("query.shapley_helper", edit)
        with pytest.raises(ShapleyPhaseError) as info:
            phase.run(grid)
    finally:
        grid.fault = original
    assert info.value.step == "helper decryption"
    refusals = [r.error.reason for r in replies if r.has_error()]
    assert refusals and all("IdentityError" in why and "secsv-products aux key" in why for why in refusals), refusals
    assert not any(not r.has_error() for r in replies)           # nothing was decrypted for P


def test_helper_decrypts_each_round_coalition_and_sample_once(trained):
    """P replays a helper request (to bisect a score with another offset in its own half): the
    helper refuses it; the honest run goes on and its values are unchanged."""
    from flwr.app import Message

    grid, aux = trained
    ref, clients, _ = plaintext_reference(grid, aux, frac_bits=10)
    replayed = []

    class ReplayingP(SecSVPhase):
        def _exchange(self, grid, contents, mtype, parse, step, **kw):
            out = super()._exchange(grid, contents, mtype, parse, step, **kw)
            if mtype == "query.shapley_helper" and not replayed:
                msgs = [Message(content=c, dst_node_id=h, message_type=mtype) for h, c in contents.items()]
                replayed.extend(grid.send_and_receive(msgs))
            return out

    res = ReplayingP(sample_skip=True).run(grid)
    assert replayed and all(r.has_error() and "decrypted before" in r.error.reason for r in replayed)
    assert np.abs(np.array([res.fsv[n] for n in clients]) - ref.fsv).max() < 1e-3


def test_aux_refuses_a_zero_test_deal_moved_to_other_samples(trained):
    """P hands A a job's sealed deal with another job's sample ids (to compare a prediction with
    another sample's label): A refuses, the deal names the samples it was dealt for."""
    grid, aux = trained

    def edit(contents, st):
        from flwr.app import Array

        (content,) = contents.values()
        preds = content["shapley-preds"]
        first = sorted(k for k in preds if k.startswith("ids-"))[0]
        preds[first] = Array(((preds[first].numpy() + 1) % st.num_samples).astype(np.int64))

    phase = DeviatingP("query.shapley_aux_diff", edit)
    with pytest.raises(ShapleyPhaseError) as info:
        phase.run(grid)
    assert set(info.value.failed) == {aux} and "aux differences" in info.value.step
    assert "dealt this zero test for other samples" in info.value.failed[aux]
