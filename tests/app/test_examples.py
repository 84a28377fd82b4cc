"""The examples under ``examples/`` are Flower Apps in Flower's quickstart shape (issue 23 item 2).

Each example's README, and the project README, state how many lines flwr-fedeval adds; the lines
marked ``# +`` are counted here. The structure is Flower's: ``pyproject.toml`` with
``[tool.flwr.app.components]`` naming ``<pkg>.server_app:app`` and ``<pkg>.client_app:app``, and a
``task.py`` that knows nothing of flwr-fedeval. The ClientApps load neither the framework nor
scikit-learn (they are imported only where a handler needs the data or the model).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser (tomli, a dependency of flwr)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: example folder -> its Python package (Flower's names: ``pytorchexample``, ``tfexample``, ``pytorch_example``)
APPS = {"quickstart-pytorch": "pytorchexample", "quickstart-tensorflow": "tfexample",
        "advanced-pytorch": "pytorch_example"}


def _marked(path: Path) -> int:
    """Lines carrying the ``# +`` marker (alone, or followed by a comment)."""
    return sum(1 for line in path.read_text().splitlines() if re.search(r"#\s\+(\s|$)", line))


def _python(example: str) -> dict[str, int]:
    return {p.name: _marked(p) for p in (EXAMPLES / example / APPS[example]).glob("*.py")}


def test_every_example_is_listed():
    assert sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()) == sorted(APPS)


@pytest.mark.parametrize("example", sorted(APPS))
def test_example_states_its_added_lines(example):
    app = EXAMPLES / example
    readme = (app / "README.md").read_text()
    python = _python(example)
    stated = re.search(r"\*\*(\d+) lines of Python\*\* \((\d+) in `client_app.py`.*?and (\d+) in `server_app.py`\)",
                       readme, re.S)
    assert stated, "the README must state the added lines"
    total, client, server = map(int, stated.groups())
    assert (client, server) == (python["client_app.py"], python["server_app.py"]), python
    assert total == sum(python.values()), python
    keys = re.search(r"and (\d+) run-config keys? in `pyproject.toml`", readme)
    assert keys and int(keys.group(1)) == _marked(app / "pyproject.toml")


@pytest.mark.parametrize("example", sorted(APPS))
def test_project_readme_states_the_examples_added_lines(example):
    readme = (ROOT / "README.md").read_text()
    stated = re.search(rf"`examples/{example}`[^\n]*?\((\d+) added lines of Python", readme)
    assert stated, f"the README's examples section must name examples/{example} with its added lines"
    assert int(stated.group(1)) == sum(_python(example).values())


@pytest.mark.parametrize("example", sorted(APPS))
def test_example_has_flowers_structure(example):
    app, pkg = EXAMPLES / example, APPS[example]
    project = tomllib.loads((app / "pyproject.toml").read_text())
    assert project["project"]["name"] == pkg.replace("_", "-")  # Flower's app names have no "_"
    assert project["tool"]["flwr"]["app"]["components"] == {
        "serverapp": f"{pkg}.server_app:app", "clientapp": f"{pkg}.client_app:app"}
    assert {"num-server-rounds", "min-nodes", "output-dir"} <= set(project["tool"]["flwr"]["app"]["config"])
    for module in ("client_app", "server_app"):
        tree = ast.parse((app / pkg / f"{module}.py").read_text())
        assigned = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                    if isinstance(t, ast.Name)}
        assert "app" in assigned, f"{pkg}/{module}.py defines no module-level `app`"
    for own in ("task.py", "strategy.py"):  # the user's task (and strategy) stay as they are
        if (app / pkg / own).exists():
            assert _marked(app / pkg / own) == 0, own
            assert "flwr_fedeval" not in (app / pkg / own).read_text(), own


@pytest.mark.process
@pytest.mark.parametrize("example", sorted(APPS))
def test_example_client_apps_load_neither_the_framework_nor_the_data(example):
    """Importing the ClientApp (what every ClientApp process does, one per message on the deployment
    engine) loads no PyTorch, TensorFlow or scikit-learn: the steps that carry no model need none."""
    probe = (f"import sys, {APPS[example]}.client_app; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'tensorflow', 'keras', 'sklearn'}))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=EXAMPLES / example, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": f"{ROOT}:."}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_tensorflow_example_server_app_loads_without_tensorflow():
    """The TensorFlow example's ServerApp imports Keras only where it builds the model."""
    probe = ("import sys, tfexample.server_app; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=EXAMPLES / "quickstart-tensorflow", capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": f"{ROOT}:."}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
