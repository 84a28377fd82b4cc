"""A ClientApp wired wrongly stops the run with one error naming the line to add, over the serializing
in-process grid: no handlers registered, ``xmkckks_mod`` missing, Flower's clipping mod outside it,
a ``client_fn``/``NumPyClient`` App, an FHE phase without its handlers. Before, each of these ran
every round on the initial model and returned it (an empty or initial model, exit 0).

One node with such a failure among working ones does not stop the run: the round completes with the
others.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.common.constant import ErrorCode
from flwr.serverapp.strategy import FedAvg
from identities import IDENTITY_DIR, node_configs
from xmk_app import flat, initial, make_app, num_examples, run, update

from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod
from flwr_fedeval.protocol import MESSAGE_API_GUIDE, xmk
from flwr_fedeval.strategies import ClientAppNotWired, SecureAggregation, XMKFedAvg
from flwr_fedeval.strategies.base import ReadableFedAvg
from flwr_fedeval.testing import InProcessGrid

RUN_CONFIG = {"fedeval-identity-dir": IDENTITY_DIR}


def _train(msg, context):
    pid = int(context.node_config["partition-id"])
    w = msg.content["arrays"].to_numpy_ndarrays()
    new = [a + d for a, d in zip(w, update(pid, 1))]
    metrics = MetricRecord({"num-examples": num_examples(pid)})
    return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)


def _app(*, handlers: bool = True, mods: list | None = None) -> ClientApp:
    app = ClientApp()
    if handlers:
        register_xmkckks_handlers(app)
    app.train(mods=[xmkckks_mod] if mods is None else mods)(_train)
    return app


class _Legacy(NumPyClient):
    def fit(self, parameters, config):
        return parameters, 1, {}


def _legacy_app() -> ClientApp:
    return ClientApp(client_fn=lambda context: _Legacy().to_client())


def _strategies():
    return [
        XMKFedAvg(fraction_evaluate=0.0, max_abs_value=1e4),
        SecureAggregation(FedAvg(fraction_evaluate=0.0), max_abs_value=1e4),
    ]


@pytest.mark.parametrize("strategy", _strategies(), ids=["XMKFedAvg", "SecureAggregation"])
@pytest.mark.parametrize(
    "app, names",
    [
        (lambda: _app(handlers=False), "register_xmkckks_handlers(app)"),
        (lambda: _app(mods=[]), "@app.train(mods=[xmkckks_mod])"),
        (lambda: _app(mods=[fixedclipping_mod, xmkckks_mod]), "mods=[xmkckks_mod, fixedclipping_mod]"),
        (_legacy_app, MESSAGE_API_GUIDE),
    ],
    ids=["no-handlers", "no-mod", "mods-in-wrong-order", "client_fn-app"],
)
def test_a_miswired_client_app_stops_the_run_with_one_error_naming_the_fix(strategy, app, names):
    grid = InProcessGrid(app(), 3, RUN_CONFIG)
    with pytest.raises(ClientAppNotWired) as info:
        run(grid, strategy, rounds=3)
    err = info.value
    (fix,) = err.fixes  # one fix for every node
    assert names in fix
    assert sorted(err.fixes[fix]) == sorted(grid.node_ids) == sorted(err.failures)
    # stopped at the step that failed in round 1: one key generation per node, no re-key, no round 2
    sent = [t for _, t, _ in grid.log]
    assert sent.count(xmk.KEYGEN.message_type) == 3 and sent.count("train") <= 3


def test_registering_on_a_client_fn_app_names_the_message_api_and_its_guide():
    with pytest.raises(TypeError) as info:
        register_xmkckks_handlers(_legacy_app())
    assert MESSAGE_API_GUIDE in str(info.value)


def test_a_client_app_without_a_train_handler_stops_flowers_fedavg():
    app = ClientApp()
    register_xmkckks_handlers(app)  # but no @app.train()
    grid = InProcessGrid(app, 3, RUN_CONFIG)
    with pytest.raises(ClientAppNotWired) as info:
        run(grid, ReadableFedAvg(fraction_evaluate=0.0))
    (fix,) = info.value.fixes
    assert "@app.train()" in fix


def test_an_fhe_phase_without_its_handlers_stops_naming_register_fhe_handlers():
    from flwr_fedeval.strategies import FHEAUCPhase

    grid = InProcessGrid(make_app(), 3, RUN_CONFIG, node_configs=node_configs(3))
    with pytest.raises(ClientAppNotWired) as info:
        FHEAUCPhase(min_nodes=2).run(grid, ArrayRecord(initial()))
    (fix,) = info.value.fixes
    assert "register_fhe_handlers(app" in fix


def test_one_node_without_the_handler_does_not_stop_the_round():
    """A node whose keygen reply is Flower's no-handler error is left out; the others' round completes."""
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    victim = grid.node_ids[0]

    def fault(node, msg, reply):
        if node == victim and msg.metadata.message_type == xmk.KEYGEN.message_type:
            reason = "ValueError: No query function registered with name 'xmk_keygen'"
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)
        return reply

    grid.fault = fault
    result = run(grid, XMKFedAvg(fraction_evaluate=0.0, max_abs_value=1e4))
    assert np.max(np.abs(flat(result.arrays.to_numpy_ndarrays()) - flat(initial()))) > 1e-2  # trained
