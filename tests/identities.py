"""One set of node keys and a roster for the tests (``python -m flwr_fedeval.keys create`` in a temp dir).

``IDENTITY_DIR`` holds ``node-0.key`` … ``node-15.key`` and ``roster.json``; pass
``{"identity-dir": IDENTITY_DIR}`` in a grid's run config. The test server never
reads a private key: it gets the roster at most.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from flwr_fedeval.keys import create

NUM_IDENTITIES = 16

_dir = Path(tempfile.mkdtemp(prefix="fedeval-ids-"))
atexit.register(shutil.rmtree, _dir, True)
create(_dir / "ids", [f"node-{i}" for i in range(NUM_IDENTITIES)])

IDENTITY_DIR = str(_dir / "ids")
ROSTER_PATH = str(_dir / "ids" / "roster.json")
