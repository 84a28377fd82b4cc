"""Checkpointing as a library feature: ``train_with_checkpoints`` runs any strategy, keeps every round's
model, and composes with a server-side ``evaluate_fn`` (called with the true round numbers, also after a
resume). Before, it lived in the demo App, took no ``evaluate_fn`` and kept the last round's model only.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, MetricRecord
from xmk_app import RUN_CONFIG, flat, initial, make_app

from flwr_fedeval.strategies import XMKFedAvg, load_checkpoint, train_with_checkpoints
from flwr_fedeval.strategies.base import ReadableFedAvg
from flwr_fedeval.testing import InProcessGrid


def _saved(folder, server_round):
    with np.load(folder / "checkpoint" / f"model-round-{server_round:04d}.npz", allow_pickle=False) as npz:
        return flat([npz[str(i)] for i in range(len(npz.files))])


@pytest.mark.parametrize(
    "make",
    [lambda: ReadableFedAvg(fraction_evaluate=0.0), lambda: XMKFedAvg(fraction_evaluate=0.0, max_abs_value=1e4)],
    ids=["FedAvg", "XMKFedAvg"],
)
def test_every_rounds_model_is_kept_and_evaluate_fn_sees_it(tmp_path, make):
    seen: dict[int, np.ndarray] = {}

    def evaluate_fn(server_round, arrays):
        seen[server_round] = flat(arrays.to_numpy_ndarrays())
        return MetricRecord({"norm": float(np.linalg.norm(seen[server_round]))})

    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    result = train_with_checkpoints(
        make(),
        grid,
        ArrayRecord(initial()),
        num_rounds=3,
        run_config={"x": 1},
        folder=tmp_path,
        evaluate_fn=evaluate_fn,
    )
    assert sorted(seen) == [0, 1, 2, 3] and sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3]
    for r in (1, 2, 3):
        assert np.array_equal(_saved(tmp_path, r), seen[r])  # each round's checkpoint is that round's model
    assert not np.array_equal(seen[1], seen[2])
    assert np.array_equal(seen[3], flat(result.arrays.to_numpy_ndarrays()))
    assert load_checkpoint(tmp_path, run_config={"x": 1}, like=ArrayRecord(initial())).round == 3


def test_a_resumed_run_evaluates_under_the_true_round_numbers(tmp_path):
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    train_with_checkpoints(
        ReadableFedAvg(fraction_evaluate=0.0),
        grid,
        ArrayRecord(initial()),
        num_rounds=1,
        run_config={"x": 1},
        folder=tmp_path,
    )
    rounds = []
    result = train_with_checkpoints(
        ReadableFedAvg(fraction_evaluate=0.0),
        grid,
        ArrayRecord(initial()),
        num_rounds=3,
        run_config={"x": 1},
        folder=tmp_path,
        resume_from=tmp_path,
        evaluate_fn=lambda r, a: rounds.append(r) or MetricRecord({"r": r}),
    )
    assert rounds == [2, 3] and sorted(result.evaluate_metrics_serverapp) == [2, 3]
    assert sorted(p.name for p in (tmp_path / "checkpoint").glob("*.npz")) == [
        "model-round-0001.npz",
        "model-round-0002.npz",
        "model-round-0003.npz",
    ]


def test_keep_last_keeps_one_model(tmp_path):
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    train_with_checkpoints(
        ReadableFedAvg(fraction_evaluate=0.0),
        grid,
        ArrayRecord(initial()),
        num_rounds=2,
        run_config={},
        folder=tmp_path,
        keep="last",
    )
    assert [p.name for p in (tmp_path / "checkpoint").glob("*.npz")] == ["model-round-0002.npz"]
    with pytest.raises(ValueError, match="keep"):
        train_with_checkpoints(
            ReadableFedAvg(), grid, ArrayRecord(initial()), num_rounds=1, run_config={}, folder=tmp_path, keep="some"
        )
