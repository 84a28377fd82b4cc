"""Shared by the deployment-engine tests (tests/deployment): where Flower's tools are, the time budget."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Hard bound per test (start-up and every run). Overridable for slower hosts.
BUDGET_S = float(os.environ.get("FEDEVAL_DEPLOYMENT_BUDGET_S", 25 * 60))


def bin_dir() -> Path:
    """The venv's bin dir: the repo's ``.venv/bin``, else ``sys.executable``'s."""
    for candidate in (REPO_ROOT / ".venv" / "bin", Path(sys.executable).parent):
        if (candidate / "flower-superlink").exists():
            return candidate
    pytest.fail("flower-superlink not found in .venv/bin (run scripts/bootstrap.sh)")
