"""Secure aggregation composed with Flower: FedAdam / FedProx wrapped by ``SecureAggregation``, and
Flower's client-side DP clipping (``fixedclipping_mod`` / ``adaptiveclipping_mod`` inside
``xmkckks_mod``, ``DifferentialPrivacyClientSide*Clipping`` around the wrapper), over the serializing
grid with the real handlers and roster identities.

Decoding bound: XMKFedAvg's decrypted mean agrees with the plaintext weighted mean to 1e-6 per value
at ``max_abs_value=1e4`` (``test_xmk_fedavg``: smudging noise M·B_smudge/Δ plus float32 storage).
FedAdam's first step ``w + η·δ/(|δ| + 10τ)`` (β1 = 0.9, β2 = 0.99, bias-corrected) has slope at
most η/(10τ) = 10 in δ at η = 0.1, τ = 1e-3, so the two FedAdam models agree to 10 · 1e-6 plus
float32 rounding: we assert 2e-5.
"""

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    FedAdam,
    FedAvg,
    FedMedian,
    FedProx,
    FedYogi,
    Krum,
)
from xmk_app import RUN_CONFIG, flat, initial, make_app, num_examples, plain_fedavg, run, update

from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod
from flwr_fedeval.strategies.secure_aggregation import SecureAggregation
from flwr_fedeval.testing import InProcessGrid

MEAN_BOUND = 1e-6  # decrypted weighted mean vs plaintext (test_xmk_fedavg)
ADAM_BOUND = 2e-5  # 10 × MEAN_BOUND + float32 rounding (module docstring)


def _secure(strategy):
    return SecureAggregation(strategy, max_abs_value=1e4)


def _clipping_app(mods):
    """xmk_app's clients with extra mods (the train handler is the same)."""
    app = ClientApp()
    register_xmkckks_handlers(app)

    @app.train(mods=mods)
    def train(msg, context):
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        w = msg.content["arrays"].to_numpy_ndarrays()
        new = [a + d for a, d in zip(w, update(pid, rnd))]
        metrics = MetricRecord({"train-loss": float(pid), "num-examples": num_examples(pid)})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    return app


def _clipped_mean(partitions, clipping_norm):
    """w + Σ n_i·clip(Δw_i) / Σ n_i, clip as Flower's ``compute_clip_model_update`` (scale by
    min(1, C/‖Δw_i‖₂) over all arrays)."""
    n = np.array([num_examples(p) for p in partitions], dtype=np.float64)
    deltas = []
    for p in partitions:
        d = flat(update(p, 1))
        deltas.append(d * min(1.0, clipping_norm / np.linalg.norm(d)))
    return flat(initial()) + np.sum([ni * d for ni, d in zip(n, deltas)], axis=0) / n.sum()


def test_fedadam_with_secure_aggregation_gives_plain_fedadams_model():
    plain = run(InProcessGrid(make_app(), 3, RUN_CONFIG), FedAdam(fraction_evaluate=0.0))
    strategy = _secure(FedAdam(fraction_evaluate=0.0))
    secure = run(InProcessGrid(make_app(), 3, RUN_CONFIG), strategy)
    got, expected = flat(secure.arrays.to_numpy_ndarrays()), flat(plain.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - expected)) <= ADAM_BOUND
    # the server optimizer was applied: the model is not FedAvg's mean
    assert np.max(np.abs(got - plain_fedavg(initial(), range(3), 1))) > 1e-2
    assert len(strategy.key_sets) == 1 and not strategy.aborted_attempts


def test_fedadam_two_rounds_keep_its_optimizer_state():
    plain = run(InProcessGrid(make_app(), 3, RUN_CONFIG), FedYogi(fraction_evaluate=0.0), rounds=2)
    secure = run(InProcessGrid(make_app(), 3, RUN_CONFIG), _secure(FedYogi(fraction_evaluate=0.0)), rounds=2)
    got, expected = flat(secure.arrays.to_numpy_ndarrays()), flat(plain.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - expected)) <= 2 * ADAM_BOUND


def test_train_updates_never_leave_a_client_in_clear_under_the_wrapper():
    replies = []

    def spy(node, msg, reply):
        if msg.metadata.message_type == "train":
            replies.append(reply)
        return reply

    run(InProcessGrid(make_app(), 3, RUN_CONFIG, fault=spy), _secure(FedAdam(fraction_evaluate=0.0)))
    assert len(replies) == 3
    assert all("arrays" not in r.content and "num-examples" not in r.content["metrics"] for r in replies)


def test_fedprox_sends_its_proximal_mu_and_aggregates_the_weighted_mean():
    configs = []

    def spy(node, msg, reply):
        if msg.metadata.message_type == "train":
            configs.append(dict(msg.content["config"]))
        return reply

    result = run(InProcessGrid(make_app(), 3, RUN_CONFIG, fault=spy),
                 _secure(FedProx(fraction_evaluate=0.0, proximal_mu=0.25)))
    assert [c["proximal-mu"] for c in configs] == [0.25] * 3
    expected = plain_fedavg(initial(), range(3), 1)
    assert np.max(np.abs(flat(result.arrays.to_numpy_ndarrays()) - expected)) <= MEAN_BOUND
    assert result.train_metrics_clientapp[1]["num-examples"] == sum(num_examples(p) for p in range(3))


def test_fixedclipping_mod_inside_xmkckks_mod_clips_what_is_aggregated():
    clipping_norm = 1.0
    grid = InProcessGrid(_clipping_app([xmkckks_mod, fixedclipping_mod]), 3, RUN_CONFIG)
    strategy = DifferentialPrivacyClientSideFixedClipping(
        _secure(FedAvg(fraction_evaluate=0.0)), noise_multiplier=0.0, clipping_norm=clipping_norm,
        num_sampled_clients=3)
    result = run(grid, strategy)
    got = flat(result.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - _clipped_mean(range(3), clipping_norm))) <= MEAN_BOUND
    # the updates were clipped (each ‖Δw_i‖ ≈ 18 > 1): the unclipped mean is far away
    assert np.max(np.abs(got - plain_fedavg(initial(), range(3), 1))) > 0.1
    assert [ok for _, t, ok in grid.log if t == "train"] == [True] * 3


def test_adaptiveclipping_mod_inside_xmkckks_mod_clips_and_adapts_the_norm_as_without_it():
    def adaptive(inner):
        return DifferentialPrivacyClientSideAdaptiveClipping(
            inner, noise_multiplier=0.0, num_sampled_clients=3, initial_clipping_norm=1.0,
            clipped_count_stddev=0.0)

    app = _clipping_app([xmkckks_mod, adaptiveclipping_mod])
    plain = adaptive(FedAvg(fraction_evaluate=0.0))
    run(InProcessGrid(app, 3, RUN_CONFIG), plain)
    strategy = adaptive(_secure(FedAvg(fraction_evaluate=0.0)))
    result = run(InProcessGrid(app, 3, RUN_CONFIG), strategy)
    got = flat(result.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - _clipped_mean(range(3), 1.0))) <= MEAN_BOUND
    # the clients' norm bits reached the wrapper: the norm moved, exactly as without secure aggregation
    assert strategy.clipping_norm != 1.0
    assert strategy.clipping_norm == pytest.approx(plain.clipping_norm, rel=1e-12)


def test_clipping_mod_outside_xmkckks_mod_is_refused_and_nothing_aggregated():
    grid = InProcessGrid(_clipping_app([fixedclipping_mod, xmkckks_mod]), 3, RUN_CONFIG)
    strategy = DifferentialPrivacyClientSideFixedClipping(
        _secure(FedAvg(fraction_evaluate=0.0)), noise_multiplier=0.0, clipping_norm=1.0, num_sampled_clients=3)
    result = run(grid, strategy)
    assert [ok for _, t, ok in grid.log if t == "train"] == [False] * 3
    assert 1 not in result.train_metrics_clientapp  # nothing aggregated in the round


@pytest.mark.parametrize("inner", [FedMedian(), Krum()])
def test_per_client_aggregators_are_refused(inner):
    with pytest.raises(TypeError, match="each client's update"):
        SecureAggregation(inner)


def test_other_weighting_key_is_refused():
    with pytest.raises(ValueError, match="num-examples"):
        SecureAggregation(FedAvg(weighted_by_key="samples"))


def test_deviating_server_rerunning_a_wrapped_round_gets_nothing():
    """A server that re-runs FedAdam's round on the same global model through the wrapper (same round:
    refused before any key is shared; next round number: refused at train) gets no second sum, and the
    inner optimizer sees nothing (no retries, issue 21)."""
    from flwr.app import ConfigRecord

    from flwr_fedeval.protocol import ReplyCode

    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    strategy = _secure(FedAdam(fraction_evaluate=0.0))
    run(grid, strategy)
    assert strategy.configure_train(1, ArrayRecord(initial()), ConfigRecord({}), grid) == []
    reasons = [r for _, exc in strategy.aborted_attempts for r in exc.failed.values()]
    assert len(reasons) == 3 and all(f"code {int(ReplyCode.ALREADY_CONTRIBUTED)}" in r for r in reasons)
    messages = strategy.configure_train(2, ArrayRecord(initial()), ConfigRecord({}), grid)
    assert len(messages) == 3  # the key shares pass: the round number is new
    replies = grid.send_and_receive(messages)
    assert [r.error.code for r in replies] == [ReplyCode.ALREADY_CONTRIBUTED] * 3
    assert strategy.aggregate_train(2, replies) == (None, None)


def test_inner_strategy_sending_different_configs_is_refused_before_any_key_set():
    class Uneven(FedAvg):
        def configure_train(self, server_round, arrays, config, grid):
            messages = list(super().configure_train(server_round, arrays, config, grid))
            messages[0].content = RecordDict({"arrays": arrays,  # one client's config differs
                                              "config": ConfigRecord({**dict(config), "lr": 1.0})})
            return messages

    from flwr.app import ConfigRecord

    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    strategy = _secure(Uneven(fraction_evaluate=0.0))
    with pytest.raises(ValueError, match="one global model"):
        strategy.configure_train(1, ArrayRecord(initial()), ConfigRecord({}), grid)
    assert not any(t.startswith("query.xmk") for _, t, _ in grid.log)


def test_xmkfedavg_refuses_a_train_metrics_function_it_could_not_apply():
    from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg

    with pytest.raises(ValueError, match="train_metrics_aggr_fn"):
        XMKFedAvg(train_metrics_aggr_fn=lambda records, key: MetricRecord())
