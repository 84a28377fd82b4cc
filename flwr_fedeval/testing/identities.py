"""Throwaway node identities for in-process runs: keys, roster and node policies in a temporary folder.

The xMK-CKKS and FHE steps refuse to run without a node identity and a roster
(:mod:`flwr_fedeval.keys`); a benchmark or a test of your own App over
:class:`~flwr_fedeval.testing.InProcessGrid` needs one set, and no more than
for the run: :func:`throwaway_identities` makes it with
:func:`flwr_fedeval.keys.create` and removes it when the process exits.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr_fedeval.keys import create

__all__ = ["throwaway_identities"]


def throwaway_identities(num_nodes: int, *, policy: Mapping[str, Any] | None = None) -> str:
    """Create identities ``node-0`` … ``node-<num_nodes - 1>`` in a new temporary folder; return the folder.

    The folder holds ``node-<i>.key``, ``roster.json`` and ``node-<i>.policy.toml`` (the documented
    defaults, overridden by ``policy``); pass ``{"fedeval-identity-dir": folder}`` in a grid's run
    config. It is removed when the interpreter exits.

    Raises
    ------
    ValueError
        If ``num_nodes`` < 1 (and whatever :func:`flwr_fedeval.keys.create` raises for ``policy``).
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be an integer >= 1, got {num_nodes!r}")
    root = Path(tempfile.mkdtemp(prefix="fedeval-ids-"))
    atexit.register(shutil.rmtree, root, True)
    create(root / "ids", [f"node-{i}" for i in range(num_nodes)], policy=dict(policy or {}))
    return str(root / "ids")
