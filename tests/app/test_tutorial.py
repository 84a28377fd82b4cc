"""The tutorial (docs/tutorials/private-quickstart-pytorch.md), executed as written, as a reader would.

The page is read top to bottom, as one terminal session in a temporary folder:

* ``<!-- tutorial: install -->`` — the ``pip install`` line, run with ``--dry-run --no-index`` and the
  project itself (``flwr-fedeval @ git+<repo-url>``: this checkout) named by its installed name: every
  requirement must already be satisfied by the environment the tests run in, offline;
* ``<!-- tutorial: write PATH -->`` / ``<!-- tutorial: append PATH -->`` — the next code block written
  to (appended to) ``PATH`` in the current folder;
* ``<!-- tutorial: run -->`` — the next ``bash`` block, run with ``bash -e``; its working directory and
  environment (``cd``, ``export``) carry over to the next one;
* ``<!-- tutorial: output -->`` — every line of the next block appears in the previous command's output.

Both ``flwr run`` commands run on Flower's simulation engine with a local SuperLink of this test's own
(``FLWR_HOME`` in the temporary folder, free ports); every process it started is stopped at the end.
Checked besides: both runs end ``finished:completed`` (Control API, ``flwr ls --format json``), and
the FHE AUC the private run prints equals ``roc_auc_score`` of its saved ``final_model.pt`` on the
three nodes' pooled test splits within the certified resolution bound it prints.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from flwr_fedeval.testing.deployment import MARKER, _marked_pids

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorials" / "private-quickstart-pytorch.md"
STEP_TIMEOUT_S = float(os.environ.get("FEDEVAL_TUTORIAL_STEP_TIMEOUT_S", 20 * 60))
NUM_NODES = 3

BLOCK = re.compile(r"<!-- tutorial: (install|run|output|write|append)\s*([^ ]*?)\s*-->\n```(\w+)\n(.*?)```", re.S)


def steps() -> list[tuple[str, str, str]]:
    """``(action, path, text)`` of every marked block of the page, in order."""
    return [(action, path, text) for action, path, _lang, text in BLOCK.findall(TUTORIAL.read_text())]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_tutorial_has_every_kind_of_step_and_no_unmarked_command():
    found = steps()
    assert [a for a, _, _ in found].count("install") == 1
    commands = "\n".join(text for action, _, text in found if action == "run")
    for needed in ("python -m flwr_fedeval.keys create", "flwr run .", "flwr ls"):
        assert needed in commands, needed
    # every bash block of the page is executed (install or run)
    page = TUTORIAL.read_text()
    assert page.count("```bash") == sum(1 for a, _, _ in found if a in ("install", "run"))
    written = {path for action, path, _ in found if action == "write"}
    assert {"pyproject.toml", "pytorchexample/client_app.py", "pytorchexample/server_app.py"} <= written


def _install(line: str) -> None:
    """The page's ``pip install`` line, offline and without installing: all satisfied already."""
    words = shlex.split(line.split("#")[0])
    assert words[:2] == ["pip", "install"], words
    reqs = ["flwr-fedeval" if w.startswith("flwr-fedeval @ ") else w for w in words[2:]]
    assert "flwr-fedeval" in reqs and "torch==2.13.0" in reqs and any(r.startswith("flwr[simulation]") for r in reqs)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", *reqs],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Would install" not in done.stdout, done.stdout


class Session:
    """A bash session: each block runs in the previous block's working directory and environment."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.cwd = folder
        self.token = uuid.uuid4().hex
        bin_dir = Path(sys.executable).parent
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
        self.env.update(
            {
                "PATH": f"{bin_dir}{os.pathsep}{self.env.get('PATH', '')}",
                "VIRTUAL_ENV": str(bin_dir.parent),
                "PYTHONPATH": str(ROOT),  # this checkout's flwr_fedeval, also in the simulated nodes
                "FLWR_HOME": str(folder / ".flwr-home"),  # a local SuperLink of this test's own
                "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),
                "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port()),
                "FLWR_TELEMETRY_ENABLED": "0",
                "FLWR_DISABLE_UPDATE_CHECK": "1",
                "OMP_NUM_THREADS": "1",
                MARKER: self.token,  # every process started from here carries it (teardown)
            }
        )

    def run(self, script: str) -> str:
        state = self.folder / ".session-env"
        wrapped = f"{script}\nenv -0 > {shlex.quote(str(state))}\n"
        done = subprocess.run(
            ["bash", "-e", "-c", wrapped],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
            start_new_session=True,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"$ {script}\n{output[-4000:]}"
        env = dict(item.split("=", 1) for item in state.read_text().split("\0") if "=" in item)
        self.cwd = Path(env.pop("PWD", str(self.cwd)))
        self.env = {k: v for k, v in env.items() if k not in ("OLDPWD", "SHLVL", "_")}
        return output

    def runs(self) -> list[dict]:
        """The local SuperLink's runs, from its Control API."""
        done = subprocess.run(
            ["flwr", "ls", "--format", "json"], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=120
        )
        return json.loads(done.stdout[done.stdout.index("{") :])["runs"]

    def stop(self) -> list[int]:
        """Stop every process this session started (the local SuperLink and what it spawned)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _marked_pids(self.token):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + 10
            while _marked_pids(self.token) and time.monotonic() < deadline:
                time.sleep(0.25)
        return _marked_pids(self.token)


def _fhe_auc(output: str) -> tuple[float, float, float]:
    """The AUC and bound of the line the ServerApp prints (``print(fhe)``: at a line's start), and the
    rounding the printed figures may hide (half a unit of each one's last printed digit)."""
    found = re.findall(r"^FHE AUC ([\d.]+) ± ([\d.]+) \(resolution bound", output, re.M)
    assert len(found) == 1, output[-4000:]
    auc, bound = found[0]
    rounding = sum(0.5 * 10.0 ** -len(figure.partition(".")[2]) for figure in (auc, bound))
    return float(auc), float(bound), rounding


def _reference_auc(project: Path) -> float:
    """``roc_auc_score`` of the saved final model on the three nodes' pooled test splits."""
    import numpy as np
    import torch
    from sklearn.metrics import roc_auc_score

    sys.path.insert(0, str(project))
    try:
        from pytorchexample.task import Net, load_data
    finally:
        sys.path.remove(str(project))
    net = Net()
    net.load_state_dict(torch.load(project / "final_model.pt"))
    net.eval()
    labels, scores = [], []
    with torch.no_grad():
        for k in range(NUM_NODES):
            x, y = load_data(k, NUM_NODES, 16)[1].dataset.tensors
            labels.append(y.numpy())
            scores.append(torch.softmax(net(x), dim=1)[:, 1].numpy())
    return roc_auc_score(np.concatenate(labels), np.concatenate(scores))


@pytest.mark.snippet
def test_the_tutorial_runs_as_written(tmp_path):
    import torch  # noqa: F401  (the [dev] extra pins torch==2.13.0, the CPU wheel, on Python 3.11)

    session = Session(tmp_path)
    flwr_runs: list[str] = []
    last_output = ""
    try:
        for action, path, text in steps():
            if action == "install":
                _install(text.strip())
            elif action in ("write", "append"):
                target = session.cwd / path
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "w" if action == "write" else "a") as fh:
                    fh.write(text)
            elif action == "output":
                shown = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
                seen = {" ".join(line.split()) for line in last_output.splitlines()}
                missing = [line for line in shown if line not in seen]
                assert not missing, f"not in the output: {missing}\n{last_output}"
            else:
                last_output = session.run(text)
                if "flwr run" in text:
                    flwr_runs.append(last_output)
        assert len(flwr_runs) == 2  # the plain quickstart, then the private one
        statuses = [r["status"] for r in sorted(session.runs(), key=lambda r: r["pending-at"])]
        assert statuses == ["finished:completed"] * 2, (statuses, [out[-3000:] for out in flwr_runs])
        project = session.cwd
        auc, bound, rounding = _fhe_auc(flwr_runs[1])
        reference = _reference_auc(project)
        assert 0 <= bound <= 0.01  # logit-spaced decision points: no resolution warning
        # the certified bound holds for the exact figures; the printed ones are rounded
        assert abs(auc - reference) <= bound + rounding, (auc, bound, rounding, reference)
        assert "FHE AUC" not in flwr_runs[0]
        assert not list(project.rglob("*.key"))  # the private keys stay out of the App's folder (its FAB)
    finally:
        left = session.stop()
    assert not left, f"processes left running: {left}"
