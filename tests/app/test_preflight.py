"""Checks before round 1 (flwr_fedeval.app.preflight): merged overrides, one line per problem."""

import math
from pathlib import Path

import pytest

from flwr_fedeval.app.preflight import check_run, format_overrides, main, merge_overrides
from flwr_fedeval.app.task import ConfigError, JobConfig

XRAY = "dataset='chest-xray' data-dir='/work/shared/data/chest-xray' local-epochs=2 decision-point-spacing='logit'"


def test_later_lists_override_earlier_keys():
    merged = merge_overrides(XRAY, "local-epochs=1 decision-point-spacing='linear' output-dir='/tmp/a b'")
    assert merged["local-epochs"] == 1 and merged["decision-point-spacing"] == "linear"
    assert merged["dataset"] == "chest-xray" and merged["output-dir"] == "/tmp/a b"
    assert list(merged).count("local-epochs") == 1


@pytest.mark.parametrize("value", [1, 0.001, 1e-5, math.inf, True, False, "x y", "it's", "/a/b"])
def test_format_and_merge_round_trip(value):
    assert merge_overrides(format_overrides({"k": value})) == {"k": value}


def test_garbage_is_refused_with_one_line():
    with pytest.raises(ConfigError) as err:
        merge_overrides("local-epochs=1 oops", "dataset=chest xray", "seed='7")
    assert len(err.value.problems) >= 3
    assert any("'oops'" in p for p in err.value.problems)


def test_unquoted_words_are_strings():
    assert merge_overrides("data-dir=/work/shared/data/bank-marketing dataset=bank-marketing seed=3") == {
        "data-dir": "/work/shared/data/bank-marketing", "dataset": "bank-marketing", "seed": 3}


def test_every_problem_is_reported_one_line_each(capsys):
    rc = main(["--num-supernodes", "5", XRAY, "local-epochs=1 image-size=28 num-server-rounds=0 fhe-splits='4'"])
    assert rc == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3, lines
    assert any("'image-size' = 28" in line and ">= 36" in line for line in lines)
    assert any("'num-server-rounds'" in line for line in lines)
    assert any("'fhe-splits' must be an integer" in line for line in lines)


def test_too_many_clients_on_the_embedded_data_fail_in_one_line(capsys):
    assert main(["--num-supernodes", "100"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "569 samples into 100 clients" in line and "use at most" in line


def test_a_good_run_prints_the_merged_list(capsys):
    assert main(["--num-supernodes", "3", "local-epochs=2", "local-epochs=1 seed=7"]) == 0
    out = capsys.readouterr().out.strip()
    assert merge_overrides(out) == {"local-epochs": 1, "seed": 7}


def test_missing_data_folder_is_caught_on_the_server_side(tmp_path):
    with pytest.raises(ConfigError, match="no such folder on the server"):
        check_run({"dataset": "chest-xray", "data-dir": str(tmp_path / "nope")}, 3)
    (tmp_path / "normal").mkdir()
    with pytest.raises(ConfigError, match="pneumonia missing"):
        check_run({"dataset": "chest-xray", "data-dir": str(tmp_path)}, 3)
    with pytest.raises(ConfigError, match="bank-full.csv"):
        check_run({"dataset": "bank-marketing", "data-dir": str(tmp_path)}, 3)


def test_output_dir_must_be_writable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="'output-dir'"):
        check_run({"output-dir": str(blocker / "sub")}, 3)
    check_run({"output-dir": str(tmp_path / "new" / "dir")}, 3)
    assert not (tmp_path / "new").exists()          # checked, not created


def test_shapley_aux_node_is_not_a_data_client():
    cfg = check_run({"shapley-aux-partition-id": 2}, 3)
    assert isinstance(cfg, JobConfig)
    with pytest.raises(ConfigError, match="fewer than min-nodes"):
        check_run({"shapley-aux-partition-id": 1, "min-nodes": 2}, 2)


def test_library_refusals_surface_before_round_1(monkeypatch):
    from flwr_fedeval.strategies import phases

    def refuse(cfg):
        raise ValueError("the phase refuses this")

    monkeypatch.setattr(phases, "make_auc_phase", refuse)
    with pytest.raises(ConfigError, match="config 'auc-method' = 'plain': the phase refuses this"):
        check_run({}, None)


def test_seed_cnn_minimum_image_size_is_the_real_one():
    from flwr_fedeval.app.task import SEED_CNN_MIN_IMAGE_SIZE, seed_cnn_feature_side

    assert SEED_CNN_MIN_IMAGE_SIZE == 36
    assert seed_cnn_feature_side(36) == 1 and seed_cnn_feature_side(35) == 0
    assert JobConfig(dataset="chest-xray", data_dir="x", image_size=36).problems() == []
    assert JobConfig(image_size=28).problems() == []    # tabular data: no CNN


def test_server_app_refuses_before_round_1(tmp_path):
    """`flwr run .` without run-local.sh: the ServerApp's own check, before any train message."""
    from flwr.app import Context, RecordDict

    from flwr_fedeval.app import server_app
    from flwr_fedeval.app.client_app import app as client_app
    from flwr_fedeval.testing import InProcessGrid

    run_config = {"output-dir": str(tmp_path)}
    grid = InProcessGrid(client_app, 100, run_config)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    with pytest.raises(ConfigError) as err:
        server_app.main(grid, ctx)
    assert len(err.value.problems) == 1 and "100 clients" in err.value.problems[0]
    assert {t for _, t, _ in grid.log} <= {"query.fedeval_role"}   # nothing trained or evaluated


def test_resume_from_is_made_absolute_and_must_hold_a_checkpoint_of_this_config(tmp_path, monkeypatch, capsys):
    """make run*/run-deployment with resume-from: a relative folder becomes absolute (the ServerApp runs
    elsewhere); a folder without a checkpoint, or a checkpoint of another run config, is refused in one line."""
    import numpy as np
    from flwr.app import ArrayRecord

    from flwr_fedeval.strategies.checkpoint import write_checkpoint

    pyproject = str(Path(__file__).resolve().parents[2] / "pyproject.toml")
    config = f"num-server-rounds=3 local-epochs=1 model='logreg' output-dir='{tmp_path}'"
    from flwr_fedeval.app.preflight import tomllib  # tomli on Python 3.10

    app_config = tomllib.loads(Path(pyproject).read_text())["tool"]["flwr"]["app"]["config"]
    cfg = check_run({**app_config, **merge_overrides(config)}, 3)
    run = tmp_path / "breast-cancer-20260101T000000Z"
    write_checkpoint(run, 1, ArrayRecord([np.zeros((30, 2), np.float32)]), run_config=cfg.as_dict(), num_rounds=3)
    monkeypatch.chdir(tmp_path)

    assert main(["--pyproject", pyproject, "--num-supernodes", "3", config, f"resume-from='{run.name}'"]) == 0
    assert merge_overrides(capsys.readouterr().out)["resume-from"] == str(run)

    assert main(["--pyproject", pyproject, "--num-supernodes", "3", config, "local-epochs=2",
                 f"resume-from='{run.name}'"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "'resume-from'" in line and "another run config" in line

    assert main(["--pyproject", pyproject, "--num-supernodes", "3", config, f"resume-from='{tmp_path}'"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no checkpoint/state.json" in line
