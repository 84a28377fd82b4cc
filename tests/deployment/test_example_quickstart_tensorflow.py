"""``examples/quickstart-tensorflow`` runs as a Flower App on the deployment engine (issue 23).

Flower's quickstart-tensorflow shape (Keras weights travel as a list ``ArrayRecord``) on a binary
task, with xMK-CKKS secure aggregation, the FHE AUC (malicious protocol) and DPAUC_Lap: one
SuperLink and three SuperNodes with TLS, every node with its roster identity, ``flwr run
examples/quickstart-tensorflow``. Checked: the run completes (Control API status), the saved
``final_model.keras`` has the example's architecture, and the FHE AUC equals ``roc_auc_score`` of
that model on the pooled test splits within the certified resolution bound.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deployment_support import check_example_aucs, import_example, run_example

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-tensorflow"
NUM_NODES = 3
# One round: every round sends the same messages; two rounds on the deployment engine (a fresh
# xMK-CKKS key set, the model changing between rounds) are test_example_advanced_pytorch.py's.
ROUNDS = 1

pytestmark = [pytest.mark.deployment, pytest.mark.slow]


def test_quickstart_tensorflow_on_deployment_engine(deployment, tmp_path):
    import keras  # the [keras] extra (in [dev]); TensorFlow only here, lazily

    task = import_example(EXAMPLE, "tfexample.task")
    results, out = run_example(deployment, tmp_path, EXAMPLE, NUM_NODES, rounds=ROUNDS)
    model = keras.models.load_model(out / "final_model.keras", compile=False)
    expected = [w.shape for w in task.load_model().get_weights()]
    assert [w.shape for w in model.get_weights()] == expected  # the example's 30→16→2 MLP
    splits = [task.load_data(k, NUM_NODES) for k in range(NUM_NODES)]
    check_example_aucs(results, [y for *_, y in splits], [task.scores(model, x) for _, _, x, _ in splits], NUM_NODES)
