"""The README's "In your own App" blocks, executed as written, over the serializing grid.

A quickstart-style task (a small Keras model, 3 clients with synthetic
two-class data) stands in for the user's ``my_app.task``; every
``<!-- snippet: NAME -->`` block of the README is extracted and executed, so
the README cannot drift from the API.
"""

from __future__ import annotations

import logging
import re
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from identities import IDENTITY_DIR, node_configs
from sklearn.metrics import roc_auc_score

from flwr_fedeval.metrics.auc import auc_from_counts
from flwr_fedeval.metrics.counts import decision_points, threshold_counts
from flwr_fedeval.testing import InProcessGrid

README = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "own-app.md"
W_TRUE = np.array([1.5, -1.0, 0.8, -0.5], dtype=np.float32)
NUM_CLIENTS = 3
#: Every node's roster identity (README: "every node needs its roster identity").
RUN_CONFIG = {"fedeval-identity-dir": IDENTITY_DIR}


def snippets() -> dict[str, str]:
    """``{name: code}`` of every ``<!-- snippet: name -->`` python block of the README."""
    found = re.findall(r"<!-- snippet: ([\w-]+) -->\n```python\n(.*?)```", README.read_text(), re.S)
    return dict(found)


# --- the user's task module (what Flower's quickstart-tensorflow provides) -------------------
def load_model():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def load_data(context):
    """Client ``partition-id``'s (x_train, y_train, x_test, y_test); features in [-1, 1]."""
    pid = int(context.node_config["partition-id"])
    rng = np.random.default_rng(10 + pid)
    x = rng.uniform(-1, 1, (60 + 10 * pid, 4)).astype(np.float32)
    y = (x @ W_TRUE + rng.normal(scale=0.4, size=len(x)) > 0).astype(np.int64)
    return x[:40], y[:40], x[40:], y[40:]


@pytest.fixture
def task(monkeypatch):
    package = types.ModuleType("my_app")
    module = types.ModuleType("my_app.task")
    module.load_model, module.load_data = load_model, load_data
    package.task = module
    monkeypatch.setitem(sys.modules, "my_app", package)
    monkeypatch.setitem(sys.modules, "my_app.task", module)
    return module


def _exec(code: str, namespace: dict | None = None) -> dict:
    namespace = {"__name__": "readme_snippet"} if namespace is None else namespace
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


@contextmanager
def flwr_records():
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def _contexts(n=NUM_CLIENTS):
    return [types.SimpleNamespace(node_config={"partition-id": i}) for i in range(n)]


def _pooled(arrays: ArrayRecord):
    """Pooled test labels and scores under ``arrays`` (the ground truth every phase is checked against)."""
    model = load_model()
    model.set_weights(arrays.to_numpy_ndarrays())
    ys, ss = [], []
    for ctx in _contexts():
        _, _, x, y = load_data(ctx)
        ys.append(y)
        ss.append(model.predict(x, verbose=0)[:, 1])
    return np.concatenate(ys), np.concatenate(ss)


def _counts_auc(y, s, n=100):
    return auc_from_counts(threshold_counts(y, s, decision_points(n)))


def test_readme_has_a_snippet_for_every_phase():
    names = set(snippets())
    for phase in ("quickstart", "plain", "fhe", "dp", "xmkckks", "shapley"):
        assert {f"{phase}-client", f"{phase}-server"} <= names, phase


@pytest.mark.snippet
def test_quickstart_adds_xmkckks_fhe_and_dp_in_at_most_15_lines(task, capsys, monkeypatch):
    blocks = snippets()
    added = [ln for k in ("quickstart-client", "quickstart-server")
             for ln in blocks[k].splitlines() if re.search(r"#\s*\+", ln)]
    assert len(added) <= 15, added

    from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase

    evaluated = []  # the global model the FHE phase evaluates (the one xMK-CKKS FedAvg produced)
    run = FHEAUCPhase.run
    monkeypatch.setattr(FHEAUCPhase, "run",
                        lambda self, grid, arrays: evaluated.append(arrays) or run(self, grid, arrays))
    client = _exec(blocks["quickstart-client"])
    server = _exec(blocks["quickstart-server"])
    # two phases evaluate the final model: the nodes' policy allows it (README, under the snippet)
    grid = InProcessGrid(client["app"], NUM_CLIENTS, RUN_CONFIG,
                         node_configs=node_configs(NUM_CLIENTS, fedeval_evaluations_per_model=2))
    with flwr_records() as records:
        server["main"](grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    out = capsys.readouterr().out
    fhe_auc = float(re.search(r"FHE AUC ([\d.]+) ± [\d.]+ \(resolution bound", out).group(1))
    dp_auc = float(re.search(r"AUC \(dpauc-laplace\[.*?\]\) ([\d.-]+)", out).group(1))
    types_ok = {(t, ok) for _, t, ok in grid.log}
    for t in ("query.xmk_keygen", "train", "query.xmk_pdec", "query.fhe_pubkey", "query.fhe_keygen",
              "evaluate.fhe_counts", "query.fhe_result", "evaluate.dpauc_laplace"):
        assert (t, True) in types_ok and (t, False) not in types_ok, t
    # the clients' FHE AUC is the AUC of the trained model's pooled counts ...
    y, s = _pooled(evaluated[0])
    assert fhe_auc == pytest.approx(_counts_auc(y, s), abs=1e-4)
    assert len(evaluated) == 1 and [a.shape for a in evaluated[0].to_numpy_ndarrays()] == [(4, 2), (2,)]
    assert 0.0 <= dp_auc <= 1.0
    # ... and every protocol step was logged with its duration
    text = "\n".join(r.getMessage() for r in records)
    for step in ("step 1 (key generation) done in", "step 3 (partial decryption) done in",
                 "step 5 (aggregation, public context only) done in", "noisy counts done in"):
        assert step in text, step


def _client(blocks, name, namespace_from, *, train_plain=True):
    """A fresh ClientApp with the quickstart's train handler, plus the snippet ``name``-client."""
    app = ClientApp()
    if train_plain:
        app.train()(namespace_from["train"])
    ns = {"app": app, "train": namespace_from["train"], "test_scores": namespace_from["test_scores"],
          "test_labels": namespace_from["test_labels"], "load_data": load_data}
    _exec(blocks[f"{name}-client"], ns)
    return app


def _trained(grid, rounds=1):
    return FedAvg(fraction_evaluate=0.0, min_available_nodes=NUM_CLIENTS, min_train_nodes=NUM_CLIENTS).start(
        grid=grid, initial_arrays=ArrayRecord(load_model().get_weights()), num_rounds=rounds)


@pytest.mark.snippet
@pytest.mark.parametrize("name", ["plain", "fhe", "dp"])
def test_each_auc_phase_snippet_runs_as_written(task, name):
    blocks = snippets()
    quick = _exec(blocks["quickstart-client"])
    policy = node_configs(NUM_CLIENTS, fedeval_evaluations_per_model=2, fedeval_dp_budget=2.0)  # two DP phases
    grid = InProcessGrid(_client(blocks, name, quick), NUM_CLIENTS, {**RUN_CONFIG, "fedeval-dp-budget": 2.0},
                         node_configs=policy)
    result = _trained(grid)
    ns = _exec(blocks[f"{name}-server"], {"grid": grid, "result": result})
    y, s = _pooled(result.arrays)
    if name == "plain":
        assert abs(ns["auc"] - roc_auc_score(y, s)) < 0.02
        assert ns["auc"] == pytest.approx(_counts_auc(y, s), abs=1e-12)
    elif name == "fhe":
        assert ns["fhe"].details["variant"] == "malicious"
        assert ns["auc"] == pytest.approx(_counts_auc(y, s), abs=1e-4)
    else:
        assert ns["lap"].details["epsilon"] == 0.5 and ns["fed"].details["epsilon"] == 0.5
        assert np.isfinite(ns["auc"]) and ns["lap"].contributors == sorted(grid.node_ids)


@pytest.mark.snippet
def test_xmkckks_snippet_runs_as_written(task):
    blocks = snippets()
    quick = _exec(blocks["quickstart-client"])
    grid = InProcessGrid(_client(blocks, "xmkckks", quick, train_plain=False), NUM_CLIENTS, RUN_CONFIG)
    start = types.SimpleNamespace(arrays=ArrayRecord(load_model().get_weights()))
    ns = _exec(blocks["xmkckks-server"], {"grid": grid, "result": start})
    assert ("query.xmk_pdec", True) in {(t, ok) for _, t, ok in grid.log}
    new = np.concatenate([a.ravel() for a in ns["result"].arrays.to_numpy_ndarrays()])
    old = np.concatenate([a.ravel() for a in start.arrays.to_numpy_ndarrays()])
    assert np.isfinite(new).all() and not np.allclose(new, old)


@pytest.mark.snippet
def test_shapley_snippet_runs_as_written(task):
    blocks = snippets()
    quick = _exec(blocks["quickstart-client"])
    app = _client(blocks, "shapley", quick, train_plain=False)
    trust = {"fedeval-secsv-trust-principal": True}    # every node accepts an honest-but-curious P
    configs = [{"partition-id": i, **trust} for i in range(NUM_CLIENTS)] + [
        {"fedeval-role": "shapley-aux", "partition-id": NUM_CLIENTS, **trust}]      # its identity: node-3.key
    grid = InProcessGrid(app, NUM_CLIENTS + 1, RUN_CONFIG, node_configs=configs)
    ns = _exec(blocks["shapley-server"], {"grid": grid, "initial": ArrayRecord(load_model().get_weights())})
    fsv = ns["fsv"]
    assert set(fsv) == set(grid.node_ids[:NUM_CLIENTS])
    assert all(np.isfinite(v) for v in fsv.values())
