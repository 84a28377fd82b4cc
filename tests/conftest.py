"""Shared test setup: make ``tests/`` helpers importable, quiet TensorFlow."""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).parent))

import flwr_fedeval  # noqa: F401  (loads TenSEAL before any test imports TensorFlow)
