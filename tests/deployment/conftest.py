"""The ``deployment`` fixture of the deployment-engine tests: a torn-down ``LocalDeployment``."""

from __future__ import annotations

import signal

import pytest
from deployment_support import BUDGET_S, bin_dir

from flwr_fedeval.testing.deployment import LocalDeployment

#: The FABs built in this pytest process, by app folder: the apps do not change during a session,
#: and each build walks the repository's venvs (~4 CPU s).
FAB_CACHE: dict = {}


@pytest.fixture
def deployment(tmp_path):
    """A :class:`LocalDeployment` in ``tmp_path`` (TLS); every process is stopped afterwards,
    and the test fails if one is left running."""
    def interrupt(signum, frame):  # SIGTERM (scripts/run-tests.sh stopping early): tear down first
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    dep = LocalDeployment(tmp_path, bin_dir=bin_dir(), max_wait_time=BUDGET_S, fab_cache=FAB_CACHE)
    try:
        yield dep
    finally:
        signal.signal(signal.SIGTERM, previous)
        leftovers = dep.stop()
        assert not leftovers, f"processes left running after teardown: {leftovers}"
