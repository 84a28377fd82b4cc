"""Checkpoint after every round and resume after a crash (issue 16), numpy clients, fixed seeds."""

import json

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedAvg
from xmk_app import RUN_CONFIG, flat, initial, make_app

from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.strategies.checkpoint import CheckpointError, load_checkpoint, train_with_checkpoints
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid

CONFIG = {"num-server-rounds": 3, "secure-aggregation": "xmkckks", "seed": 42}


class Crash(Exception):
    pass


def _strategy(xmk):
    common = dict(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=3)
    return XMKFedAvg(max_abs_value=1e4, **common) if xmk else FedAvg(**common)


def _train(grid, xmk, folder, resume_from=None, config=CONFIG):
    return train_with_checkpoints(_strategy(xmk), grid, ArrayRecord(initial()), num_rounds=3, run_config=config,
                                  folder=folder, resume_from=resume_from, train_config=ConfigRecord({}))


@pytest.mark.parametrize("xmk", [False, True], ids=["fedavg", "xmkckks"])
def test_resume_after_a_crash_equals_the_uninterrupted_run(tmp_path, xmk):
    full = _train(InProcessGrid(make_app(), 3, RUN_CONFIG), xmk, tmp_path / "full")

    # The ServerApp dies in round 2 (for xMK-CKKS: during the key shares, before any client trained on the
    # round-2 model: a crash after an upload cannot be resumed on the same model, see the next test).
    crash_at = "query.xmk_shares" if xmk else "train"
    pdec_keys = []

    def fault(node, msg, reply):
        if msg.metadata.message_type == "query.xmk_pdec":
            pdec_keys.append((msg.content["xmk"]["key-id"], int(msg.content["xmk"]["round"]), node))
        if fault.armed and msg.metadata.message_type == crash_at and int(
                msg.content["xmk"]["round"] if xmk else msg.content["config"]["server-round"]) == 2:
            raise Crash("ServerApp killed")
        return reply

    fault.armed = True
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG, fault=fault)  # the SuperNodes stay up
    run = tmp_path / "run"
    with pytest.raises(Crash):
        _train(grid, xmk, run)
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    assert state["round"] == 1 and state["arrays"][0]["shape"] == [30, 20]
    assert [p.name for p in (run / "checkpoint").iterdir() if p.suffix == ".npz"] == ["model-round-0001.npz"]

    fault.armed = False
    resumed = _train(grid, xmk, run, resume_from=run)
    assert set(resumed.train_metrics_clientapp) == {2, 3}
    diff = np.max(np.abs(flat(resumed.arrays.to_numpy_ndarrays()) - flat(full.arrays.to_numpy_ndarrays())))
    assert diff <= 1e-6
    assert json.loads((run / "checkpoint" / "state.json").read_text())["round"] == 3
    if xmk:
        # Re-keyed: round 2 after the resume under a new key set; no node decrypted twice for one key set.
        assert len(pdec_keys) == len(set(pdec_keys))
        round2 = {k for k, r, _ in pdec_keys if r == 2}
        assert len(round2) == 1


def test_resume_after_uploads_is_refused_by_every_client_that_trained(tmp_path):
    """No retries (issue 21): the ServerApp dies in round 2 after every client uploaded; the resumed run asks
    them to train on the same global model again and each refuses (ALREADY_CONTRIBUTED): re-running the
    round would let the server difference two sums. The model stays at the round-1 checkpoint."""
    codes = []

    def fault(node, msg, reply):
        kind = msg.metadata.message_type
        if fault.armed and kind == "query.xmk_contributors" and int(msg.content["xmk"]["round"]) == 2:
            raise Crash("ServerApp killed")
        if not fault.armed and kind == "train":
            codes.append(reply.error.code if reply.has_error() else None)
        return reply

    fault.armed = True
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG, fault=fault)
    run = tmp_path / "run"
    with pytest.raises(Crash):
        _train(grid, True, run)
    round1 = load_checkpoint(run, run_config=CONFIG, like=ArrayRecord(initial())).arrays
    fault.armed = False
    resumed = _train(grid, True, run, resume_from=run)
    assert codes and set(codes) == {int(ReplyCode.ALREADY_CONTRIBUTED)}
    assert np.array_equal(flat(resumed.arrays.to_numpy_ndarrays()), flat(round1.to_numpy_ndarrays()))


def test_checkpoint_of_another_run_is_refused(tmp_path):
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    _train(grid, False, tmp_path)
    like = ArrayRecord(initial())
    assert load_checkpoint(tmp_path, run_config={**CONFIG, "output-dir": "elsewhere", "resume-from": "x"},
                           like=like).round == 3
    with pytest.raises(CheckpointError, match="another run config"):
        _train(grid, False, tmp_path, resume_from=tmp_path, config={**CONFIG, "seed": 43})
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(tmp_path, run_config=CONFIG, like=ArrayRecord([np.zeros((2, 2), np.float32)] * 4))
    with pytest.raises(CheckpointError, match="dtype"):
        load_checkpoint(tmp_path, run_config=CONFIG, like=ArrayRecord([a.astype(np.float64) for a in initial()]))
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nothing", run_config=CONFIG, like=like)
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    model = tmp_path / "checkpoint" / state["model_file"]  # every round's model is kept; state.json names the last
    data = bytearray(model.read_bytes())
    data[100] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_checkpoint(tmp_path, run_config=CONFIG, like=like)
