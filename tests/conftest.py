"""Shared test setup: make ``tests/`` helpers importable, quiet TensorFlow."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).parent))

import flwr_fedeval  # noqa: F401  (loads TenSEAL before any test imports TensorFlow)

#: Markers that imply ``slow`` (``make test-fast`` = ``-m "not slow"`` leaves them out; ``make test`` runs them).
SLOW_MARKERS = ("process", "snippet")


@pytest.hookimpl(tryfirst=True)  # before the -m deselection
def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)
