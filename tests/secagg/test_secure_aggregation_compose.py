"""SecureAggregation composed with strategies that bring their own round loop or clip on the server.

* A FedAvg with its own ``start()`` (Flower's advanced-pytorch ``CustomFedAvg`` shape: its loop writes a
  checkpoint per round and schedules the learning rate in ``configure_train``) keeps its loop under
  ``SecureAggregation``: every round's checkpoint is written and is the securely aggregated model, equal to
  the same strategy's plain run within the decoding bound. Before, the override was never called.
* Flower's server-side DP wrappers are refused with a ``TypeError`` before any message is sent (around
  SecureAggregation) or at construction (inside it). Before, round 1 crashed in numpy broadcasting.

Decoding bound: 1e-6 per value per round at ``max_abs_value=1e4`` (``test_xmk_fedavg``); two rounds: 2e-6,
plus float32 rounding.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
    Result,
)
from xmk_app import RUN_CONFIG, flat, initial, make_app, run

from flwr_fedeval.strategies import SecureAggregation
from flwr_fedeval.testing import InProcessGrid

BOUND = 3e-6  # two rounds of the decoding bound (module docstring)


class CheckpointingFedAvg(FedAvg):
    """advanced-pytorch's shape: its own ``start()`` loop, a checkpoint per round, an LR schedule."""

    def __init__(self, save_path: Path, **kwargs):
        super().__init__(**kwargs)
        self.save_path = save_path
        self.lr_seen: list[float] = []

    def configure_train(self, server_round, arrays, config, grid):
        if server_round == 2:
            config["lr"] = config["lr"] * 0.5
        self.lr_seen.append(float(config["lr"]))
        return super().configure_train(server_round, arrays, config, grid)

    def start(
        self,
        grid,
        initial_arrays,
        num_rounds=3,
        timeout=3600,
        train_config=None,
        evaluate_config=None,
        evaluate_fn=None,
    ):
        self.summary()
        train_config = ConfigRecord() if train_config is None else train_config
        result, arrays = Result(), initial_arrays
        t0 = time.time()
        for current_round in range(1, num_rounds + 1):
            replies = grid.send_and_receive(
                messages=self.configure_train(current_round, arrays, train_config, grid), timeout=timeout
            )
            agg_arrays, agg_metrics = self.aggregate_train(current_round, replies)
            if agg_arrays is not None:
                result.arrays = arrays = agg_arrays
            if agg_metrics is not None:
                result.train_metrics_clientapp[current_round] = agg_metrics
            np.savez(self.save_path / f"model_round_{current_round}.npz", *arrays.to_numpy_ndarrays())
        self.seconds = time.time() - t0
        return result


def _run(strategy, rounds=2):
    return strategy.start(
        grid=InProcessGrid(make_app(), 3, RUN_CONFIG),
        initial_arrays=ArrayRecord(initial()),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": 0.1}),
    )


def test_a_strategy_with_its_own_start_keeps_its_loop_and_checkpoints_under_secure_aggregation(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "secure").mkdir()
    plain_inner = CheckpointingFedAvg(tmp_path / "plain", fraction_evaluate=0.0)
    plain = _run(plain_inner)
    inner = CheckpointingFedAvg(tmp_path / "secure", fraction_evaluate=0.0)
    secure = SecureAggregation(inner, max_abs_value=1e4)
    result = _run(secure)

    saved = sorted(p.name for p in (tmp_path / "secure").iterdir())
    assert saved == ["model_round_1.npz", "model_round_2.npz"]  # the override ran, every round
    assert inner.lr_seen == [0.1, 0.05] and hasattr(inner, "seconds")  # its own steps and state
    assert len(secure.key_sets) == 2 and not secure.aborted_attempts  # each round under xMK-CKKS
    got, expected = flat(result.arrays.to_numpy_ndarrays()), flat(plain.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - expected)) <= BOUND
    with np.load(tmp_path / "secure" / "model_round_2.npz") as npz:
        last = flat([npz[f"arr_{i}"] for i in range(len(npz.files))])
    assert np.array_equal(last, got)
    assert result.train_metrics_clientapp[2]["num-clients"] == 3


def test_a_strategy_whose_start_calls_flowers_loop_is_composed_too(tmp_path):
    calls = []

    class Counting(FedAvg):
        def start(self, grid, initial_arrays, **kwargs):
            calls.append(self)
            return super().start(grid, initial_arrays, **kwargs)

    secure = SecureAggregation(Counting(fraction_evaluate=0.0), max_abs_value=1e4)
    result = _run(secure, rounds=1)
    assert len(calls) == 1 and len(secure.key_sets) == 1
    assert np.max(np.abs(flat(result.arrays.to_numpy_ndarrays()) - flat(initial()))) > 1e-2  # trained


@pytest.mark.parametrize(
    "wrapper",
    [
        lambda s: DifferentialPrivacyServerSideFixedClipping(
            s, noise_multiplier=0.1, clipping_norm=1.0, num_sampled_clients=3
        ),
        lambda s: DifferentialPrivacyServerSideAdaptiveClipping(s, noise_multiplier=0.1, num_sampled_clients=3),
    ],
    ids=["fixed", "adaptive"],
)
def test_server_side_dp_around_secure_aggregation_is_refused_before_any_message(wrapper):
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    strategy = wrapper(SecureAggregation(FedAvg(fraction_evaluate=0.0), max_abs_value=1e4))
    with pytest.raises(TypeError, match="DifferentialPrivacyClientSideFixedClipping"):
        run(grid, strategy)
    assert grid.log == []  # nothing was sent


def test_dp_wrappers_inside_secure_aggregation_are_refused_at_construction():
    inner = FedAvg(fraction_evaluate=0.0)
    with pytest.raises(TypeError, match="client-side clipping"):
        SecureAggregation(DifferentialPrivacyServerSideFixedClipping(inner, 0.1, 1.0, 3))
    with pytest.raises(TypeError, match="goes around SecureAggregation"):
        SecureAggregation(DifferentialPrivacyClientSideFixedClipping(inner, 0.1, 1.0, 3))
