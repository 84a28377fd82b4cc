"""``examples/quickstart-pytorch`` runs as a Flower App on the deployment engine (issue 23).

Flower's quickstart-pytorch shape (a PyTorch ``state_dict`` travels as a named ``ArrayRecord``)
with xMK-CKKS secure aggregation, the FHE AUC (malicious protocol) and DPAUC_Lap: one SuperLink
and three SuperNodes with TLS, every node with its roster identity, ``flwr run
examples/quickstart-pytorch``. Checked: the run completes (Control API status), the final model
is a ``state_dict`` with the example's names, and the FHE AUC equals ``roc_auc_score`` of that
model on the pooled test splits within the certified resolution bound.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deployment_support import check_example_aucs, import_example, run_example

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-pytorch"
NUM_NODES = 3
# One round: every round sends the same messages; two rounds on the deployment engine (a fresh
# xMK-CKKS key set, the model changing between rounds) are test_example_advanced_pytorch.py's.
ROUNDS = 1

pytestmark = [pytest.mark.deployment, pytest.mark.slow]


def test_quickstart_pytorch_on_deployment_engine(deployment, tmp_path):
    import torch  # the [dev] extra pins torch==2.13.0 (the CPU wheel) on Python 3.11

    task = import_example(EXAMPLE, "pytorchexample.task")
    results, out = run_example(deployment, tmp_path, EXAMPLE, NUM_NODES, rounds=ROUNDS)
    state = torch.load(out / "final_model.pt")
    net = task.Net()
    assert list(state) == list(net.state_dict()), list(state)  # the state_dict's names survived
    net.load_state_dict(state)
    splits = [task.load_data(k, NUM_NODES) for k in range(NUM_NODES)]
    check_example_aucs(results, [y for *_, y in splits], [task.scores(net, x) for _, _, x, _ in splits], NUM_NODES)
