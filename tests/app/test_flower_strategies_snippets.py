"""docs/how-to/flower-strategies.md, every ``<!-- snippet: NAME -->`` block executed as written over the
serializing grid (3 clients, roster identities), with xmk_app's numpy clients as "your train handler".

Each snippet is checked against the same strategy run without secure aggregation on the same client
updates (decoding bound: tests/secagg/test_secure_aggregation.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, FedAdam
from identities import IDENTITY_DIR, node_configs
from xmk_app import flat, initial, num_examples, update

from flwr_fedeval.clients import register_auc_handlers
from flwr_fedeval.metrics.auc import auc_from_counts
from flwr_fedeval.metrics.counts import decision_points, threshold_counts
from flwr_fedeval.testing import InProcessGrid

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "flower-strategies.md"
RUN_CONFIG = {"fedeval-identity-dir": IDENTITY_DIR}
ADAM_BOUND = 2e-5  # tests/secagg/test_secure_aggregation.py


def snippets() -> dict[str, str]:
    return dict(re.findall(r"<!-- snippet: ([\w-]+) -->\n```python\n(.*?)```", PAGE.read_text(), re.S))


def train(msg, context):
    """The user's train handler: xmk_app's fixed update of partition p, 10 + 7p examples."""
    pid = int(context.node_config["partition-id"])
    rnd = int(msg.content["config"]["server-round"])
    new = [a + d for a, d in zip(msg.content["arrays"].to_numpy_ndarrays(), update(pid, rnd))]
    metrics = MetricRecord({"num-examples": num_examples(pid)})
    return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)


def _data(pid):
    rng = np.random.default_rng(50 + pid)
    x = rng.normal(size=(40, 30))
    return x, (x[:, 0] + rng.normal(scale=0.5, size=40) > 0).astype(np.int64)


def scores_of(msg, context):
    """Labels and scores under the global model: a sigmoid of the first weight column."""
    x, y = _data(int(context.node_config["partition-id"]))
    w = msg.content["arrays"].to_numpy_ndarrays()[0][:, 0]
    return y, 1.0 / (1.0 + np.exp(-(x @ w)))


def _exec(code: str, namespace: dict) -> dict:
    exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace


def _plain(strategy, rounds):
    app = ClientApp()
    app.train()(train)
    return strategy.start(grid=InProcessGrid(app, 3, RUN_CONFIG), initial_arrays=ArrayRecord(initial()),
                          num_rounds=rounds)


def test_page_has_the_snippets():
    assert {"fedadam-client", "fedadam-server", "dp-clipping-client", "dp-clipping-server",
            "phase-metrics-server"} <= set(snippets())


def test_fedadam_snippets_give_plain_fedadams_model():
    blocks = snippets()
    client = _exec(blocks["fedadam-client"], {"train": train})
    grid = InProcessGrid(client["app"], 3, RUN_CONFIG)
    ns = _exec(blocks["fedadam-server"], {"grid": grid, "arrays": ArrayRecord(initial())})
    plain = _plain(FedAdam(fraction_evaluate=0.0, eta=0.1), rounds=2)
    got, expected = flat(ns["result"].arrays.to_numpy_ndarrays()), flat(plain.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - expected)) <= 2 * ADAM_BOUND
    assert ("query.xmk_pdec", True) in {(t, ok) for _, t, ok in grid.log}


def test_dp_clipping_snippets_aggregate_the_clipped_updates():
    blocks = snippets()
    client = _exec(blocks["dp-clipping-client"], {"train": train})
    grid = InProcessGrid(client["app"], 3, RUN_CONFIG)
    ns = _exec(blocks["dp-clipping-server"], {"grid": grid, "arrays": ArrayRecord(initial())})
    strategy = ns["strategy"]
    assert isinstance(strategy, DifferentialPrivacyClientSideFixedClipping)
    n = np.array([num_examples(p) for p in range(3)], dtype=np.float64)
    deltas = [flat(update(p, 1)) for p in range(3)]
    clipped = [d * min(1.0, strategy.clipping_norm / np.linalg.norm(d)) for d in deltas]
    mean = flat(initial()) + np.sum([ni * d for ni, d in zip(n, clipped)], axis=0) / n.sum()
    got = flat(ns["result"].arrays.to_numpy_ndarrays())
    # Gaussian noise of stdev σ·C/m per value (Flower's compute_stdv): its 6σ bound, far below the
    # clipping's effect on the mean (the unclipped mean differs by > 0.1)
    stdev = strategy.noise_multiplier * strategy.clipping_norm / strategy.num_sampled_clients
    assert np.max(np.abs(got - mean)) <= 6 * stdev
    unclipped = flat(initial()) + np.sum([ni * d for ni, d in zip(n, deltas)], axis=0) / n.sum()
    assert np.max(np.abs(unclipped - mean)) > 0.1 + 6 * stdev  # the check above can tell the two apart


def test_phase_metrics_snippet_puts_the_auc_in_flowers_result():
    blocks = snippets()
    client = _exec(blocks["fedadam-client"], {"train": train})
    register_auc_handlers(client["app"], test_scores=scores_of)
    grid = InProcessGrid(client["app"], 3, RUN_CONFIG, node_configs=node_configs(3))
    ns = _exec(blocks["phase-metrics-server"], {"grid": grid, "arrays": ArrayRecord(initial())})
    final = ns["result"].arrays.to_numpy_ndarrays()[0][:, 0]
    ys, ss = zip(*[(y, 1.0 / (1.0 + np.exp(-(x @ final)))) for x, y in map(_data, range(3))])
    expected = auc_from_counts(threshold_counts(np.concatenate(ys), np.concatenate(ss), decision_points(100)))
    assert ns["auc"] == pytest.approx(expected, abs=1e-12)
    assert ns["phase"].results[2].auc == ns["auc"]
