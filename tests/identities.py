"""One set of node keys and a roster for the tests (``python -m flwr_fedeval.keys create`` in a temp dir).

``IDENTITY_DIR`` holds ``node-0.key`` … ``node-15.key``, ``roster.json`` and one node policy
file per node (``node-<i>.policy.toml``, :mod:`flwr_fedeval.clients.policy`) with the documented
defaults except ``fedeval-share-auc = true`` (as the demo App's ``make run``), so that honest runs
report a number, and ``fedeval-fhe-min-protocol = "semi-honest"`` (the operator's explicit consent to
the semi-honest FHE AUC while sharing, also as ``make run``); tests of the default policy make their
own directory. Pass
``{"fedeval-identity-dir": IDENTITY_DIR}`` in a grid's run config. The test server never reads a private
key: it gets the roster at most.
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
#: The policy of every node of ``IDENTITY_DIR`` (besides the defaults).
TEST_POLICY = {"fedeval-share-auc": True, "fedeval-fhe-min-protocol": "semi-honest"}
create(_dir / "ids", [f"node-{i}" for i in range(NUM_IDENTITIES)], policy=TEST_POLICY)

IDENTITY_DIR = str(_dir / "ids")
ROSTER_PATH = str(_dir / "ids" / "roster.json")


def node_configs(num_nodes: int, **policy) -> list[dict]:
    """Simulation node configs (``partition-id``, ``num-partitions``) with node policy keys
    (``fedeval_evaluations_per_model=3`` → ``fedeval-evaluations-per-model = 3``), which override the
    policy file: e.g. a test that runs several phases on one global model in one grid."""
    extra = {k.replace("_", "-"): v for k, v in policy.items()}
    return [{"partition-id": i, "num-partitions": num_nodes, **extra} for i in range(num_nodes)]
