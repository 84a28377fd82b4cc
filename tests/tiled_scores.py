"""The issue-15 data set of the FHE AUC tests (moved to :mod:`flwr_fedeval.testing.scores`)."""

from flwr_fedeval.testing.scores import tiled_counts

__all__ = ["tiled_counts"]
