"""The demo App's checkpoints: the library's :mod:`flwr_fedeval.strategies.checkpoint` (kept importable here)."""

from flwr_fedeval.strategies.checkpoint import *  # noqa: F403
from flwr_fedeval.strategies.checkpoint import (  # noqa: F401  (names the App and its tests use)
    CHECKPOINT_DIR,
    EXCLUDED_KEYS,
    FORMAT,
    STATE_FILE,
    __all__,
    strategy_state,
)
