"""Node identities, the roster, signed keys and the keys CLI (flwr_fedeval.identity, flwr_fedeval.keys)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from flwr_fedeval import identity as idm
from flwr_fedeval.identity import IdentityError, NodeIdentity, Roster, SignedKey
from flwr_fedeval.keys import create, main

STMT = dict(protocol="fhe-auc", session="s1", round=0, role="client", key=b"k" * 32)


@pytest.fixture(scope="module")
def nodes():
    return [NodeIdentity.generate(f"node-{i}") for i in range(3)]


@pytest.fixture(scope="module")
def roster(nodes):
    return Roster.from_identities(nodes)


def test_sign_and_verify(nodes, roster):
    sig = idm.sign_key(nodes[0], **STMT)
    idm.verify_key(roster, "node-0", sig, **STMT)   # no exception


def test_forged_signature_refused(nodes, roster):
    sig = bytearray(idm.sign_key(nodes[0], **STMT))
    sig[-1] ^= 1
    with pytest.raises(IdentityError, match="node-0"):
        idm.verify_key(roster, "node-0", bytes(sig), **STMT)
    # a key the roster does not hold signs under a roster name
    outsider = NodeIdentity.generate("node-0")
    with pytest.raises(IdentityError, match="does not verify"):
        idm.verify_key(roster, "node-0", idm.sign_key(outsider, **STMT), **STMT)
    # another member's valid signature, claimed under the victim's name
    with pytest.raises(IdentityError, match="node-1"):
        idm.verify_key(roster, "node-1", idm.sign_key(nodes[0], **STMT), **STMT)


@pytest.mark.parametrize("field, value", [("protocol", "secsv"), ("session", "s2"), ("round", 1),
                                          ("role", "key-holder"), ("key", b"K" * 32)])
def test_wrong_statement_field_refused(nodes, roster, field, value):
    sig = idm.sign_key(nodes[1], **STMT)
    with pytest.raises(IdentityError, match="node-1"):
        idm.verify_key(roster, "node-1", sig, **{**STMT, field: value})


def test_statement_is_unambiguous():
    a = idm.key_statement(protocol="ab", session="c", round=0, role="r", key=b"k")
    b = idm.key_statement(protocol="a", session="bc", round=0, role="r", key=b"k")
    assert a != b
    with pytest.raises(IdentityError):
        idm.key_statement(protocol="", session="s", round=0, role="r", key=b"k")
    with pytest.raises(IdentityError):
        idm.key_statement(protocol="p", session="s", round=-1, role="r", key=b"k")
    with pytest.raises(IdentityError):
        idm.key_statement(protocol="p", session="s", round=True, role="r", key=b"k")


def test_unknown_signer_refused(nodes, roster):
    stranger = NodeIdentity.generate("node-9")
    with pytest.raises(IdentityError, match="unknown signer 'node-9'"):
        idm.verify_key(roster, "node-9", idm.sign_key(stranger, **STMT), **STMT)
    assert "node-9" not in roster and "node-2" in roster


def test_key_set_checks(nodes, roster):
    def entry(ident, key):
        return SignedKey(ident.name, key, idm.sign_key(ident, **{**STMT, "key": key}))

    good = {10: entry(nodes[1], b"a" * 32), 11: entry(nodes[2], b"b" * 32)}
    kw = {k: v for k, v in STMT.items() if k != "key"}
    assert idm.verify_key_set(roster, good, floor=3, own="node-0", **kw) == {10: "node-1", 11: "node-2"}
    with pytest.raises(IdentityError, match="at least 4"):
        idm.verify_key_set(roster, good, floor=4, own="node-0", **kw)
    with pytest.raises(IdentityError, match="twice"):     # one member under two node IDs
        idm.verify_key_set(roster, {10: good[10], 12: entry(nodes[1], b"c" * 32)}, floor=1, **kw)
    with pytest.raises(IdentityError, match="lists this node"):
        idm.verify_key_set(roster, {10: entry(nodes[0], b"a" * 32)}, floor=1, own="node-0", **kw)
    with pytest.raises(IdentityError, match="another member's key"):
        idm.verify_key_set(roster, {10: good[10], 11: entry(nodes[2], b"a" * 32)}, floor=1, **kw)


def test_roster_file_roundtrip_and_tampering(tmp_path, nodes, roster):
    path = roster.save(tmp_path / "roster.json")
    loaded = Roster.load(path)
    assert loaded.names == roster.names and loaded.fingerprint() == roster.fingerprint()
    sig = idm.sign_key(nodes[2], **STMT)
    idm.verify_key(loaded, "node-2", sig, **STMT)

    # an entry replaced by an attacker's key: the node's real signature no longer verifies,
    # the attacker's does only under the changed roster, and the fingerprint changes
    doc = json.loads(path.read_text())
    attacker = NodeIdentity.generate("node-2")
    doc["nodes"][2]["public-key"] = attacker.public_key_bytes().decode()
    path.write_text(json.dumps(doc))
    tampered = Roster.load(path)
    assert tampered.fingerprint() != roster.fingerprint()
    with pytest.raises(IdentityError):
        idm.verify_key(tampered, "node-2", sig, **STMT)

    # duplicate names, one key under two names, extra fields, wrong format
    for bad in (
        {**doc, "nodes": doc["nodes"] + [doc["nodes"][0]]},
        {**doc, "nodes": doc["nodes"] + [{"name": "node-7", "public-key": doc["nodes"][0]["public-key"]}]},
        {**doc, "nodes": [{**doc["nodes"][0], "role": "x"}]},
        {**doc, "format": "something-else"},
        {**doc, "nodes": [{"name": "node-0", "public-key": "ssh-ed25519 AAAA"}]},
        {**doc, "nodes": []},
    ):
        path.write_text(json.dumps(bad))
        with pytest.raises(IdentityError):
            Roster.load(path)

    # a group/world-writable roster could be changed by anyone on the machine
    roster.save(path)
    os.chmod(path, 0o666)
    with pytest.raises(IdentityError, match="writable by group or others"):
        Roster.load(path)


def test_key_file_permissions(tmp_path):
    ident = NodeIdentity.generate("node-0")
    path = ident.save(tmp_path / "node-0.key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = NodeIdentity.load(path)
    assert loaded.name == "node-0" and loaded.public_key_bytes() == ident.public_key_bytes()
    for mode in (0o640, 0o604, 0o644):
        os.chmod(path, mode)
        with pytest.raises(IdentityError, match="chmod 600"):
            NodeIdentity.load(path)
    os.chmod(path, 0o600)
    with pytest.raises(FileExistsError):
        ident.save(path)                      # never overwritten
    with pytest.raises(IdentityError, match="does not exist"):
        NodeIdentity.load(tmp_path / "missing.key")


def test_key_format_is_flower_supernode_auth_format(tmp_path):
    """The private key loads the way ``flower-supernode --auth-supernode-private-key`` loads it."""
    path = NodeIdentity.generate("node-0").save(tmp_path / "node-0.key")
    key = serialization.load_ssh_private_key(path.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1)
    from flwr.supercore.primitives.asymmetric import uses_nist_ec_curve

    assert uses_nist_ec_curve(key.public_key())


@pytest.mark.process
def test_keys_cli(tmp_path):
    out = tmp_path / "ids"
    rc = subprocess.run([sys.executable, "-m", "flwr_fedeval.keys", "create", "--out", str(out), "--nodes", "3"],
                        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert rc.returncode == 0, rc.stderr
    roster = Roster.load(out / "roster.json")
    assert roster.names == ("node-0", "node-1", "node-2")
    assert roster.fingerprint() in rc.stdout
    for i in range(3):
        ident = NodeIdentity.load(out / f"node-{i}.key")
        assert roster.public_key_bytes(ident.name) == ident.public_key_bytes()
        assert (out / f"node-{i}.pub").read_bytes().strip() == ident.public_key_bytes()
        assert stat.S_IMODE((out / f"node-{i}.key").stat().st_mode) == 0o600
    # never overwrites
    assert main(["create", "--out", str(out), "--nodes", "3"]) == 1
    # custom names
    r2 = create(tmp_path / "named", ["hospital-a", "hospital-b", "aux"])
    assert r2.names == ("aux", "hospital-a", "hospital-b")
    with pytest.raises(IdentityError):
        create(tmp_path / "dup", ["a", "a"])
