"""Check a run of the main job before round 1: config, data, partitioning.

The ServerApp runs :func:`job_problems` before it trains; ``scripts/run-local.sh``
(``make run*``) runs the same checks before it starts Flower at all, so that a
bad configuration ends in one readable line per problem instead of a round of
training followed by a wall of client tracebacks::

    python -m flwr_fedeval.app.preflight --num-supernodes 5 "local-epochs=2" "local-epochs=1"

merges the ``key=value`` lists (Flower's ``--run-config`` format; a later
value wins, so ``RUN_CONFIG`` can override what a ``make`` target sets),
checks the result against ``[tool.flwr.app.config]`` of ``pyproject.toml``,
prints the merged list on stdout (one ``--run-config`` value) and exits 0;
on a problem it prints one line per problem on stderr and exits 2. A
relative ``resume-from`` is made absolute (the ServerApp runs in another
folder) and must hold a checkpoint of exactly this run config.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser (tomli, a dependency of flwr)
    import tomli as tomllib  # type: ignore[no-redef,unused-ignore]
from pathlib import Path
from typing import Any

from flwr_fedeval.app.task import XRAY_TASKS, ConfigError, JobConfig, load_pooled_data

__all__ = ["merge_overrides", "format_overrides", "num_data_clients", "job_problems", "resume_problems",
           "check_run", "main"]

# Flower's own pattern for `--run-config "k1=v1 k2='v 2'"` (flwr.common.config.parse_config_args).
_PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")


def merge_overrides(*lists: str) -> dict[str, Any]:
    """Merge Flower ``key=value`` lists; a key given again takes the later value.

    Values are TOML (``1``, ``0.5``, ``true``, ``'text'``); an unquoted word
    that is not TOML (``data-dir=/data/bank``) is taken as a string.

    Raises
    ------
    ConfigError
        For text that is not ``key=value`` pairs with TOML values.
    """
    merged: dict[str, Any] = {}
    problems = []
    for text in lists:
        text = text.strip()
        if not text:
            continue
        pairs = _PAIR.findall(text)
        leftover = _PAIR.sub("", text).strip()
        if leftover:
            problems.append(f"run config {leftover!r} is not key=value (e.g. local-epochs=1 dataset='chest-xray')")
        for key, raw in pairs:
            try:
                merged[key] = tomllib.loads(f"v = {raw}")["v"]
            except tomllib.TOMLDecodeError:
                if raw[0] in "'\"[{":
                    problems.append(f"run config '{key}': {raw} is not a TOML value (quote strings: {key}='...')")
                else:
                    merged[key] = raw  # an unquoted word such as a path: a string
    if problems:
        raise ConfigError(problems)
    return merged


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    text = str(value)
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text and "\\" not in text:
        return f'"{text}"'
    raise ConfigError([f"run config value {text!r} holds both quote characters"])


def format_overrides(values: dict[str, Any]) -> str:
    """The ``key=value`` list for ``flwr run --run-config`` (inverse of :func:`merge_overrides`)."""
    return " ".join(f"{k}={_toml_value(v)}" for k, v in values.items())


def num_data_clients(cfg: JobConfig, num_nodes: int) -> int:
    """Nodes holding data: all but the Shapley auxiliary server, if one of them is it."""
    return num_nodes - (1 if 0 <= cfg.shapley_aux_partition_id < num_nodes else 0)


def _output_problems(cfg: JobConfig) -> list[str]:
    """``output-dir`` must exist or be creatable, and be writable, on the server."""
    path = Path(cfg.output_dir).expanduser().resolve()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK):
        return [f"config 'output-dir' = '{cfg.output_dir}': {existing} is not a writable folder on the server"]
    return []


def _data_problems(cfg: JobConfig) -> list[str]:
    if cfg.dataset == "breast-cancer":
        return []
    path = Path(cfg.data_dir).expanduser()
    where = f"config 'data-dir' = '{cfg.data_dir}'"
    if cfg.dataset == "bank-marketing":
        if path.is_file() or (path / "bank-full.csv").is_file():
            return []
        return [f"{where}: no such file, nor a folder holding bank-full.csv, on the server "
                "(the ServerApp loads it for the pooled reference)"]
    if not path.is_dir():
        return [f"{where}: no such folder on the server (the ServerApp loads it for the pooled reference)"]
    missing = [c for c in XRAY_TASKS[cfg.xray_task] if not (path / c).is_dir()]
    if missing:
        return [f"{where}: class folder(s) {', '.join(missing)} missing for xray-task '{cfg.xray_task}'"]
    return []


def job_problems(cfg: JobConfig, num_clients: int | None) -> list[str]:
    """What stops this job from running, one line each (empty: ready).

    Checks what :meth:`JobConfig.problems` cannot see alone: the data folder
    on this (the server's) side, the split of every client for
    ``num_clients`` data clients (:func:`flwr_fedeval.data.partition.check_partitions`),
    and the library's own validation of the strategy and of every phase the
    job will run (built here, before round 1).
    """
    problems = _output_problems(cfg)
    data = _data_problems(cfg)
    problems += data
    if not data and num_clients is not None:
        from flwr_fedeval.app.task import client_partitions
        from flwr_fedeval.data.partition import PartitionError, check_partitions

        if num_clients < cfg.min_nodes:
            problems.append(f"{num_clients} data client(s), fewer than min-nodes = {cfg.min_nodes}")
        else:
            try:
                _, y, _ = load_pooled_data(cfg)
                parts = client_partitions(cfg, num_clients)
                check_partitions(y, parts, test_fraction=cfg.test_fraction, method=cfg.partitioning)
            except PartitionError as exc:
                problems.append(str(exc))
            except (OSError, ValueError) as exc:
                problems.append(f"data ({cfg.dataset}): {exc}")
    problems += _library_problems(cfg)
    return problems


def _library_problems(cfg: JobConfig) -> list[str]:
    """Build the strategy and the phases (their constructors validate) and report refusals."""
    from flwr_fedeval.app.server_app import make_strategy
    from flwr_fedeval.strategies.phases import make_auc_phase

    problems = []
    for what, build in (("secure-aggregation", lambda: make_strategy(cfg)),
                        ("auc-method", lambda: make_auc_phase(cfg))):
        try:
            build()
        except (ValueError, TypeError) as exc:
            problems.append(f"config '{what}' = '{getattr(cfg, what.replace('-', '_'))}': {exc}")
    if cfg.shapley != "none":
        from flwr_fedeval.app.server_app import make_shapley_phase

        try:
            make_shapley_phase(cfg)
        except (ValueError, TypeError) as exc:
            problems.append(f"config 'shapley' = '{cfg.shapley}': {exc}")
    return problems


def resume_problems(cfg: JobConfig) -> list[str]:
    """``resume-from``: a run folder holding a checkpoint of exactly this run config (else one line).

    The ServerApp checks it again, with the model's shapes and the file's hash
    (:func:`flwr_fedeval.strategies.checkpoint.load_checkpoint`); this catches a wrong
    folder or config before Flower starts.
    """
    if not cfg.resume_from:
        return []
    from flwr_fedeval.strategies.checkpoint import CHECKPOINT_DIR, STATE_FILE, config_hash

    where = f"config 'resume-from' = '{cfg.resume_from}'"
    folder = Path(cfg.resume_from).expanduser()
    state_file = next((p for p in (folder / CHECKPOINT_DIR / STATE_FILE, folder / STATE_FILE) if p.is_file()), None)
    if state_file is None:
        return [f"{where}: no {CHECKPOINT_DIR}/{STATE_FILE} there; give the run folder of the interrupted run "
                "(<output-dir>/<dataset>-<UTC stamp>)"]
    try:
        saved = json.loads(state_file.read_text()).get("config_sha256")
    except (ValueError, AttributeError):
        return [f"{where}: {state_file} is not a checkpoint's state.json"]
    if saved != config_hash(cfg.as_dict()):
        return [f"{where}: the checkpoint belongs to another run config; resume with exactly the interrupted "
                "run's RUN_CONFIG plus resume-from (only resume-from and output-dir may differ)"]
    return []


def check_run(run_config: dict[str, Any], num_nodes: int | None) -> JobConfig:
    """Validate a whole run (config, data, partitioning, library objects, ``resume-from``).

    Raises
    ------
    ConfigError
        With one line per problem.
    """
    cfg = JobConfig.from_run_config(run_config)
    clients = None if num_nodes is None else num_data_clients(cfg, num_nodes)
    problems = job_problems(cfg, clients) + resume_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def main(argv: list[str] | None = None) -> int:
    """Command line of ``scripts/run-local.sh`` (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m flwr_fedeval.app.preflight", description=__doc__.split("\n")[0])
    ap.add_argument("--num-supernodes", type=int, default=None)
    ap.add_argument("--pyproject", default="pyproject.toml")
    ap.add_argument("overrides", nargs="*", help="key=value lists; later ones win")
    args = ap.parse_args(argv)
    try:
        overrides = merge_overrides(*args.overrides)
        if overrides.get("resume-from"):  # the ServerApp runs in another folder: make it absolute
            overrides["resume-from"] = str(Path(str(overrides["resume-from"])).expanduser().resolve())
        app_config = tomllib.loads(Path(args.pyproject).read_text())["tool"]["flwr"]["app"]["config"]
        check_run({**app_config, **overrides}, args.num_supernodes)
    except ConfigError as exc:
        for line in exc.problems:
            print(f"run config: {line}", file=sys.stderr)
        return 2
    print(format_overrides(overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
