"""SecSV against a deviating principal server P that holds no roster key (issue 12, items 2, 5, 6).

P runs :class:`SecSVPhase` but alters what it relays (a subclass overriding
``_exchange``): each relayed X25519 key substituted in turn — the clients'
(at the leader's key generation and at A's setup), the leader's, A's (at the
share and the helper step), a helper's (at A's difference step). The real
node handlers must refuse with an :class:`IdentityError`; P then learns no
test set: nothing is sealed for, or opened with, a key P holds.
"""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord

from flwr_fedeval.testing import InProcessGrid

sys.path.insert(0, str(Path(__file__).parent))
from test_secsv_phase import TRUST, app, make_grid, train_two_rounds

from flwr_fedeval import keyshare
from flwr_fedeval.clients import shapley_handlers
from flwr_fedeval.clients.shapley_handlers import Refused, read_raw_npz
from flwr_fedeval.protocol import bytes_array, secsv
from flwr_fedeval.strategies.base import NodeNotConfigured
from flwr_fedeval.strategies.shapley_phase import SecSVPhase, ShapleyPhaseError


@pytest.fixture
def trained():
    """A new run per test: the auxiliary server zero-tests each (round, coalition, sample) of a run's
    models once (its node ledger), so a second SecSV phase over one run's models is refused."""
    grid = make_grid()
    aux = train_two_rounds(grid)
    return grid, aux


class DeviatingP(SecSVPhase):
    """P that applies ``edit(mtype, contents, attacker)`` to what it sends; ``attacker`` is P's own key pair."""

    def __init__(self, mtype, edit, **kw):
        super().__init__(**kw)
        self.target, self.edit = mtype, edit
        self.attacker = keyshare.generate_keypair()
        self.sent: list = []

    def _exchange(self, grid, contents, mtype, parse, step, **kw):
        if mtype == self.target:
            self.edit(contents, self.attacker)
            self.sent.append(contents)
        return super()._exchange(grid, contents, mtype, parse, step, **kw)


def _run_deviating(grid, mtype, edit):
    phase = DeviatingP(mtype, edit)
    with pytest.raises(ShapleyPhaseError) as info:
        phase.run(grid)
    return phase, info.value


def _set_request(contents, **values):
    for c in contents.values():
        rec = dict(c[shapley_handlers.REQUEST_KEY]) if shapley_handlers.REQUEST_KEY in c else {}
        rec.update(values)
        c[shapley_handlers.REQUEST_KEY] = ConfigRecord(rec)


def _first_node(record: ConfigRecord) -> str:
    return sorted(record.keys())[0]


def test_leader_refuses_a_substituted_client_key(trained):
    grid, _ = trained

    def edit(contents, attacker):
        (content,) = contents.values()
        peers = content["shapley-peers"]
        peers[_first_node(peers)] = attacker.public

    _, err = _run_deviating(grid, secsv.KEYGEN.message_type, edit)
    assert err.step == "keygen"
    (why,) = err.failed.values()
    assert "IdentityError" in why and "does not verify" in why


@pytest.mark.parametrize("key", ["leader", "aux", "aux-is-a-client"])
def test_clients_refuse_a_substituted_leader_or_aux_key(trained, key):
    """P substitutes the leader's key (to hand out its own CKKS key) or A's key (to open A's shares
    and rebuild every test set from both shares); or names a data client as A."""
    grid, _ = trained

    def edit(contents, attacker):
        if key == "leader":
            _set_request(contents, **{"leader-public-key": attacker.public})
        elif key == "aux":
            _set_request(contents, **{"aux-public-key": attacker.public})
        else:      # a data client's real key and hello signature (role "client") offered as A's
            first = next(iter(contents.values()))[shapley_handlers.REQUEST_KEY]
            _set_request(contents, **{"aux-public-key": first["leader-public-key"],
                                      "aux-signer": first["leader-signer"],
                                      "aux-signature": first["leader-signature"]})

    phase, err = _run_deviating(grid, secsv.SHARE.message_type, edit)
    assert err.step == "share" and len(err.failed) == 3
    assert all("IdentityError" in why for why in err.failed.values()), err.failed
    role = "key-holder" if key == "leader" else "aux"
    assert all(f"secsv {role} key" in why for why in err.failed.values()), err.failed


def test_helper_refuses_an_aux_key_other_than_the_checked_one(trained):
    grid, _ = trained
    replies = []

    def spy(node, msg, reply):
        if msg.metadata.message_type == secsv.HELPER.message_type:
            replies.append(reply)
        return reply

    original, grid.fault = grid.fault, spy
    try:
        phase, err = _run_deviating(
            grid, secsv.HELPER.message_type,
            lambda contents, attacker: _set_request(contents, **{"aux-public-key": attacker.public}))
    finally:
        grid.fault = original
    assert err.step == "helper decryption" and phase.sent
    assert replies and all(r.has_error() for r in replies)   # no helper sealed a share for P's key
    assert all("auxiliary server's key differs" in r.error.reason for r in replies)


def test_aux_refuses_a_substituted_client_key_and_share(trained):
    """P replaces a client's key and sealed share at A's setup with its own (a share of its choosing)."""
    grid, _ = trained

    def edit(contents, attacker):
        (content,) = contents.values()
        keys = content["shapley-aux-keys"]
        node = _first_node(keys)
        keys[node] = attacker.public
        content["shapley-aux-shares"][f"sealed-{node}"] = bytes_array(b"\0" * 64)

    _, err = _run_deviating(grid, secsv.AUX_SETUP.message_type, edit)
    assert err.step == "aux setup"
    (why,) = err.failed.values()
    assert "IdentityError" in why and "does not verify" in why


def test_aux_refuses_a_prediction_share_from_a_key_it_did_not_check(trained):
    grid, aux = trained

    def edit(contents, attacker):
        (content,) = contents.values()
        keys = content["shapley-helper-keys"]
        j = sorted(keys.keys())[0]
        keys[j] = attacker.public

    _, err = _run_deviating(grid, secsv.AUX_DIFF.message_type, edit)
    assert set(err.failed) == {aux}
    assert "not one of the clients' keys checked at setup" in err.failed[aux]


def test_without_identities_the_phase_refuses_naming_the_config_keys(trained):
    configs = [{"partition-id": i, "num-partitions": 3, **TRUST} for i in range(3)] + [
        {"fedeval-role": "shapley-aux", **TRUST}]
    grid = InProcessGrid(app, 4, {}, node_configs=configs)
    with pytest.raises(NodeNotConfigured) as info:  # a configuration refusal stops the run (issue 23 item 4)
        SecSVPhase().run(grid)
    assert info.value.step.endswith("hello")
    assert sorted(info.value.failures) == sorted(grid.node_ids)
    assert {"node config fedeval-identity-key", "run config fedeval-identity-dir"} <= set(info.value.keys)


# --- A reads raw arrays only ----------------------------------------------------------------------
def _npz(compressed=False, **arrays):
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


X_OK = {"x": (np.uint64, lambda s: len(s) == 2 and s[1] == 3)}


def test_read_raw_npz_accepts_exactly_the_expected_raw_arrays():
    x = np.arange(12, dtype=np.uint64).reshape(4, 3)
    (got,) = read_raw_npz(_npz(x=x), X_OK)
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("case, match", [
    ("compressed", "compressed"),
    ("dtype", "float64"),
    ("shape", r"\(4, 2\)"),
    ("extra-member", "members"),
    ("object", "object|pickle|malformed"),
    ("fortran", "Fortran"),
    ("truncated", "bytes|malformed"),
    ("not-zip", "malformed array bundle"),
])
def test_read_raw_npz_refuses(case, match):
    x = np.arange(12, dtype=np.uint64).reshape(4, 3)
    if case == "compressed":
        # 1000x inflation: 8 MB of zeros in ~8 kB; refused before anything is decompressed
        data = _npz(compressed=True, x=np.zeros((350_000, 3), dtype=np.uint64))
        assert len(data) < 100_000
    elif case == "dtype":
        data = _npz(x=x.astype(np.float64))
    elif case == "shape":
        data = _npz(x=np.zeros((4, 2), dtype=np.uint64))
    elif case == "extra-member":
        data = _npz(x=x, y=x)
    elif case == "object":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf, zf.open("x.npy", "w") as f:
            np.lib.format.write_array(f, np.array([1, "a"], dtype=object), allow_pickle=True)
        data = buf.getvalue()
    elif case == "fortran":
        data = _npz(x=np.asfortranarray(x))
    elif case == "truncated":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
            inner = io.BytesIO()
            np.lib.format.write_array(inner, x)
            zf.writestr("x.npy", inner.getvalue()[:-8])
        data = buf.getvalue()
    else:
        data = b"PK\x03\x04 not a zip"
    with pytest.raises(Refused, match=match):
        read_raw_npz(data, X_OK)


def test_aux_refuses_a_compressed_share_from_a_client(trained, monkeypatch):
    """A deviating client seals a compressed npz for A: A refuses it before decompressing anything."""
    grid, aux = trained

    def compressed(**arrays):
        return _npz(compressed=True, **arrays)

    monkeypatch.setattr(shapley_handlers, "_pack_arrays", compressed)
    with pytest.raises(ShapleyPhaseError) as info:
        SecSVPhase().run(grid)
    assert info.value.step == "aux setup" and "compressed" in info.value.failed[aux]
