"""The examples' READMEs state how many lines flwr-fedeval adds; the marked lines are counted here."""

from __future__ import annotations

import re
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _marked(path: Path) -> int:
    """Lines carrying the ``# +`` marker (alone, or followed by a comment)."""
    return sum(1 for line in path.read_text().splitlines() if re.search(r"#\s\+(\s|$)", line))


def test_quickstart_pytorch_states_its_added_lines():
    app = EXAMPLES / "quickstart-pytorch"
    readme = (app / "README.md").read_text()
    python = {p.name: _marked(p) for p in (app / "pytorchexample").glob("*.py")}
    stated = re.search(r"\*\*(\d+) lines of Python\*\* \((\d+) in `client_app.py`.*?and (\d+) in `server_app.py`\)",
                       readme, re.S)
    assert stated, "the README must state the added lines"
    total, client, server = map(int, stated.groups())
    assert (client, server) == (python["client_app.py"], python["server_app.py"]), python
    assert total == sum(python.values()), python
    keys = re.search(r"and (\d+) run-config keys in `pyproject.toml`", readme)
    assert keys and int(keys.group(1)) == _marked(app / "pyproject.toml")
