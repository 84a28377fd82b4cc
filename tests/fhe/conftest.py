"""Backend selection for the FHE tests.

The backend comes from ``FHE_BACKEND`` (``tenseal`` by default, ``openfhe``
in the Python 3.10 venv driven by ``scripts/test-openfhe.sh``). Key sets are
expensive, so they are made once per session and per batch size.
"""

from __future__ import annotations

import pytest

from flwr_fedeval.fhe.backend import CKKSParams, create_context, default_backend, load_context


@pytest.fixture(scope="session")
def backend_name() -> str:
    name = default_backend()
    if name == "tenseal":
        pytest.importorskip("tenseal")
    else:
        pytest.importorskip("openfhe")
    return name


class KeySet:
    """Key holder, another client (secret context via bytes) and the server (public bytes)."""

    def __init__(self, params: CKKSParams) -> None:
        self.holder = create_context(params=params)
        self.public_bytes = self.holder.public_bytes()
        self.secret_bytes = self.holder.secret_bytes()
        self.client = load_context(self.secret_bytes)
        self.server = load_context(self.public_bytes)


@pytest.fixture(scope="session")
def keysets(backend_name):
    cache: dict[int, KeySet] = {}

    def get(needed_slots: int = 64) -> KeySet:
        params = CKKSParams.for_slots(needed_slots, backend_name)
        key = params.slot_count
        if key not in cache:
            cache[key] = KeySet(params)
        return cache[key]

    return get
