"""Per-process node cache (flwr_fedeval.app.node_cache): load once, never a stale answer."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from flwr_fedeval.app import client_app, task
from flwr_fedeval.app.node_cache import NodeCache, weights_digest
from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.testing import InProcessGrid

RUN_CONFIG = {"local-epochs": 1}


@pytest.fixture()
def counted(monkeypatch):
    """Count model builds and data loads behind the cache."""
    calls = {"build": 0, "load": 0}
    real_build, real_load = task.build_model, task.load_client_data

    def build(cfg):
        calls["build"] += 1
        return real_build(cfg)

    def load(*a, **k):
        calls["load"] += 1
        return real_load(*a, **k)

    from flwr_fedeval.app import node_cache

    monkeypatch.setattr(node_cache, "build_model", build)
    monkeypatch.setattr(node_cache, "load_client_data", load)
    monkeypatch.setattr(client_app, "CACHE", NodeCache())
    return calls


def _send(grid, message_type, arrays, **config):
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": 1, **config})})
    msgs = [grid.create_message(content, message_type, n, "g") for n in grid.node_ids]
    replies = list(grid.send_and_receive(msgs))
    assert all(not r.has_error() for r in replies), [r.error for r in replies if r.has_error()]
    return replies


@pytest.mark.slow  # trains the demo model (Keras fit), three times
def test_many_messages_load_once_and_train_like_a_fresh_model(counted):
    grid = InProcessGrid(client_app.app, 2, RUN_CONFIG)
    initial = ArrayRecord(build_model(JobConfig()).get_weights())
    first = _send(grid, "train", initial)
    second = _send(grid, "train", initial)                  # same weights again: same result
    _send(grid, "evaluate", initial)
    assert counted["build"] == 1 and counted["load"] == 2   # one model per process, one split per client
    for a, b in zip(first, second):
        for x, y in zip(a.content["arrays"].to_numpy_ndarrays(), b.content["arrays"].to_numpy_ndarrays()):
            np.testing.assert_array_equal(x, y)            # no optimizer/RNG state leaked between messages
    # a process that never saw another message trains to the same weights
    client_app.CACHE = NodeCache()
    fresh = _send(InProcessGrid(client_app.app, 2, RUN_CONFIG), "train", initial)
    for a, b in zip(first, fresh):
        for x, y in zip(a.content["arrays"].to_numpy_ndarrays(), b.content["arrays"].to_numpy_ndarrays()):
            np.testing.assert_array_equal(x, y)


def test_scores_follow_the_weights_and_the_run(counted):
    cache = client_app.CACHE
    cfg_ctx = Context(run_id=7, node_id=1, node_config={}, state=RecordDict(), run_config=RUN_CONFIG)
    cfg = cache.config(cfg_ctx)
    w0 = ArrayRecord(build_model(cfg).get_weights())
    w1 = ArrayRecord([w * 1.5 for w in w0.to_numpy_ndarrays()])
    assert weights_digest(w0) != weights_digest(w1)

    def scorer(arrays):
        def compute():
            adapter = cache.model(cfg, arrays)
            split = cache.split(cfg, 0, 3)
            return split.y_test, adapter.predict_scores(split.x_test)
        return compute

    s0 = cache.scores(cfg, 0, 3, w0, scorer(w0))
    s0_again = cache.scores(cfg, 0, 3, w0, lambda: pytest.fail("recomputed"))
    s1 = cache.scores(cfg, 0, 3, w1, scorer(w1))
    np.testing.assert_array_equal(s0[1], s0_again[1])
    assert not np.array_equal(s0[1], s1[1])                 # new weights, new scores
    builds = counted["build"]
    cache.config(Context(run_id=8, node_id=1, node_config={}, state=RecordDict(), run_config=RUN_CONFIG))
    cache.scores(cfg, 0, 3, w0, scorer(w0))                  # a new run starts from scratch
    assert counted["build"] == builds + 1


def test_an_auc_phase_after_evaluate_scores_from_the_node_state_as_a_fresh_process_would(counted):
    """On the deployment engine every message is a fresh process (an empty NodeCache): the AUC phase
    of the model the App's ``evaluate`` just scored answers from ``context.state``, loading neither
    data nor model, and gives the AUC the same phase gives when it computes the scores itself."""
    from flwr_fedeval.clients.local_scores import STATE_KEY
    from flwr_fedeval.strategies.auc_phase import PlaintextAUCPhase

    class FreshProcessGrid(InProcessGrid):
        def push_messages(self, messages):
            client_app.CACHE = NodeCache()  # a process per message
            return super().push_messages(messages)

    arrays = ArrayRecord(build_model(JobConfig()).get_weights())
    grid = FreshProcessGrid(client_app.app, 2, RUN_CONFIG)
    _send(grid, "evaluate", arrays)
    assert all(STATE_KEY in grid.contexts[n].state for n in grid.node_ids)
    before = dict(counted)
    kept = PlaintextAUCPhase(50, min_nodes=2).run(grid, arrays)
    assert counted == before  # no model built, no split loaded
    computed = PlaintextAUCPhase(50, min_nodes=2).run(FreshProcessGrid(client_app.app, 2, RUN_CONFIG), arrays)
    assert counted["build"] > before["build"]
    assert kept.auc == computed.auc and kept.contributors != [] and len(kept.contributors) == 2
