"""The App's FAB (what ``flwr run .`` ships to every SuperNode) holds every module of the package.

Flower's build leaves out files its patterns call tests (``test_*.py``, ``*_test.py``) and others;
a package module so named would be missing on every node of the deployment engine only.
"""

import io
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_module_is_in_the_fab():
    from flwr.cli.build import build_fab_from_disk

    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(ROOT))) as fab:
        shipped = {name for name in fab.namelist() if name.startswith("flwr_fedeval/")}
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "flwr_fedeval").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert len(modules) > 100
    assert modules - shipped == set()
