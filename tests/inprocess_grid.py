"""Kept for a smooth merge only: the grid is public API in :mod:`flwr_fedeval.testing`."""
from flwr_fedeval.testing import Fault, InProcessGrid  # noqa: F401
