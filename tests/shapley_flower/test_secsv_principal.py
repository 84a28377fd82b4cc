"""SecSV against the principal server P (issue 22, symptoms 3 and 4), over the serializing grid
with the real client handlers and roster identities.

Symptom 3 (honest-but-curious P, the paper's model): P reconstructed Ŷ − Y before testing it for
zero; on a binary task ±1 on a misclassified sample is its label. Now P opens r·(Ŷ − Y) with a
multiplier it does not know (flwr_fedeval.shapley.zero_test): its view per (sample, coalition)
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
from flwr_fedeval.shapley.zero_test import open_zero_test
from flwr_fedeval.strategies.shapley_phase import SecSVPhase


@pytest.fixture(scope="module")
def trained():
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
