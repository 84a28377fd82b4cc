"""Shared test setup: make ``tests/`` helpers importable, quiet TensorFlow."""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent))

#: ``../shared/data`` relative to the repository root (absent on some machines).
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
