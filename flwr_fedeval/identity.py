"""Node identities and the trust roster (DESIGN.md §7): who signed a relayed key.

Every node of a federation (data client, SecSV auxiliary server) holds a
long-term **signing key**; every node holds the **roster**, the list of the
federation's public keys, distributed out of band like the CA certificate
(the server can neither add nor change an entry). Keys that a node relays
through the server (X25519 keys of :mod:`flwr_fedeval.keyshare`, xMK-CKKS
shares) are signed over a domain-separated statement
(:func:`key_statement`: protocol, session/key-set id, round, role, key) and
checked against the roster before use (:func:`verify_key`,
:func:`verify_key_set`). Flower node IDs are assigned by the SuperLink and
prove nothing; roster names do.

Key format (chosen so that **one key per node serves both** this module and
Flower's SuperNode authentication, ``flower-supernode
--auth-supernode-private-key``, which loads an OpenSSH-format private key on
any NIST elliptic curve and signs with ECDSA-SHA256):

* private key: ECDSA **P-256** (SECP256R1, 128-bit security like the CKKS
  and RLWE parameters), OpenSSH private-key format
  (``-----BEGIN OPENSSH PRIVATE KEY-----``), unencrypted, file mode ``0600``;
  :meth:`NodeIdentity.load` refuses a file readable by group or others, as
  ``ssh`` does. P-256 rather than Flower's example curve P-384: a key holder
  verifies one signature per peer, and a P-256 verification costs ~7x less
  (measured: benchmarks/bench_identity.py). Keys on P-384 and P-521 load
  and verify too;
* public key: one OpenSSH line ``ecdsa-sha2-nistp256 AAAA...`` — the form
  ``flwr supernode register`` and the SuperLink's list of authorised
  SuperNodes take; its bytes (no comment) are the canonical encoding
  (:meth:`NodeIdentity.public_key_bytes`);
* signatures: ECDSA with SHA-256 (SHA-384/512 on P-384/521; FIPS 186-5), DER encoded;
* roster: JSON ``{"format": "flwr-fedeval-roster", "version": 1, "nodes":
  [{"name": "node-0", "public-key": "ecdsa-sha2-nistp256 AAAA..."}, ...]}``,
  names and keys distinct; refused when writable by group or others.

Only ``cryptography`` is used (no flwr, no TensorFlow).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

__all__ = [
    "IdentityError",
    "NodeIdentity",
    "Roster",
    "SignedKey",
    "key_statement",
    "sign_key",
    "verify_key",
    "verify_key_set",
    "ROSTER_FORMAT",
]

ROSTER_FORMAT = "flwr-fedeval-roster"
_ROSTER_VERSION = 1
_DOMAIN = b"flwr-fedeval/signed-key/v1"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_CURVES = (ec.SECP256R1, ec.SECP384R1, ec.SECP521R1)
_HASH: dict[type[ec.EllipticCurve], Callable[[], hashes.HashAlgorithm]] = {
    ec.SECP256R1: hashes.SHA256, ec.SECP384R1: hashes.SHA384, ec.SECP521R1: hashes.SHA512,
}


class IdentityError(ValueError):
    """A failed identity check; the message names the signer and what failed."""


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise IdentityError(f"node name must be 1-64 characters [A-Za-z0-9._-] starting with a letter or "
                            f"digit, got {name!r}")
    return name


def _hash_for(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> hashes.HashAlgorithm:
    return _HASH[type(key.curve)]()


def _public_bytes(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def _load_public(text: str | bytes, who: str) -> ec.EllipticCurvePublicKey:
    data = text.encode() if isinstance(text, str) else bytes(text)
    try:
        key = serialization.load_ssh_public_key(data.strip())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise IdentityError(f"{who}: not an OpenSSH public key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, _CURVES):
        raise IdentityError(f"{who}: public key must be ECDSA on P-256, P-384 or P-521")
    return key


def _check_permissions(path: Path, *, private: bool) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if os.name != "posix":
        return
    if private and mode & 0o077:
        raise IdentityError(f"private key {path} is accessible by group or others (mode {mode:04o}); "
                            f"run: chmod 600 {path}")
    if not private and mode & 0o022:
        raise IdentityError(f"roster {path} is writable by group or others (mode {mode:04o}): anyone on this "
                            f"machine could add a key; run: chmod 644 {path}")


class NodeIdentity:
    """Long-term signing key of one node (ECDSA P-256; see the module docstring).

    Parameters
    ----------
    name : str
        Roster name, e.g. ``"node-3"`` (simulation: partition id 3).
    private_key : cryptography EllipticCurvePrivateKey
        On P-256, P-384 or P-521.
    """

    def __init__(self, name: str, private_key: ec.EllipticCurvePrivateKey) -> None:
        if not isinstance(private_key, ec.EllipticCurvePrivateKey) or not isinstance(private_key.curve, _CURVES):
            raise IdentityError(f"identity {name!r}: key must be ECDSA on P-256, P-384 or P-521")
        self.name = _check_name(name)
        self._key = private_key

    def __repr__(self) -> str:
        return f"NodeIdentity({self.name!r}, fingerprint={self.fingerprint()})"

    @classmethod
    def generate(cls, name: str) -> NodeIdentity:
        """A fresh P-256 key (``os.urandom`` via OpenSSL)."""
        return cls(name, ec.generate_private_key(ec.SECP256R1()))

    @classmethod
    def load(cls, path: str | os.PathLike[str], name: str | None = None) -> NodeIdentity:
        """Load an OpenSSH (or PKCS#8 PEM) EC private key; ``name`` defaults to the file stem.

        Raises
        ------
        IdentityError
            Missing file, a file readable by group or others, not an EC key
            on a NIST curve, or an encrypted key.
        """
        path = Path(path).expanduser()
        if not path.is_file():
            raise IdentityError(f"private key file {path} does not exist")
        _check_permissions(path, private=True)
        data = path.read_bytes()
        try:
            key: PrivateKeyTypes
            if b"OPENSSH PRIVATE KEY" in data:
                key = serialization.load_ssh_private_key(data, password=None)
            else:
                key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise IdentityError(f"private key {path}: cannot load ({exc})") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise IdentityError(f"private key {path}: not an ECDSA key")
        return cls(name if name is not None else path.name.split(".")[0], key)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the private key (OpenSSH format, mode 0600; refuses to overwrite)."""
        path = Path(path)
        data = self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)
        return path

    def sign(self, data: bytes) -> bytes:
        """ECDSA signature (DER) of ``data`` with the curve's hash (SHA-256 on P-256)."""
        return self._key.sign(bytes(data), ec.ECDSA(_hash_for(self._key)))

    def public_key_bytes(self) -> bytes:
        """Canonical public key: the OpenSSH line without comment (as stored in the roster)."""
        return _public_bytes(self._key.public_key())

    def fingerprint(self) -> str:
        """SHA-256 of :meth:`public_key_bytes`, first 16 hex digits (for out-of-band comparison)."""
        return hashlib.sha256(self.public_key_bytes()).hexdigest()[:16]


class Roster:
    """The federation's public signing keys, by node name (distributed out of band).

    Parameters
    ----------
    keys : mapping of str to bytes or str
        Name → OpenSSH public key line. Names and keys must be distinct.

    Raises
    ------
    IdentityError
        Invalid names, unparsable keys, a key listed under two names.
    """

    def __init__(self, keys: Mapping[str, bytes | str]) -> None:
        self._keys: dict[str, ec.EllipticCurvePublicKey] = {}
        seen: dict[bytes, str] = {}
        for name, text in keys.items():
            _check_name(name)
            key = _load_public(text, f"roster entry {name!r}")
            canon = _public_bytes(key)
            if canon in seen:
                raise IdentityError(f"roster lists one public key under two names ({seen[canon]!r}, {name!r})")
            seen[canon] = name
            self._keys[name] = key
        if not self._keys:
            raise IdentityError("roster is empty")

    @property
    def names(self) -> tuple[str, ...]:
        """Roster names, sorted."""
        return tuple(sorted(self._keys))

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def public_key_bytes(self, name: str) -> bytes:
        """Canonical public key of ``name`` (raises :class:`IdentityError` if unknown)."""
        return _public_bytes(self._key(name))

    def name_of(self, public_key: bytes) -> str | None:
        """Roster name of a canonical public key, or ``None``."""
        for name, key in self._keys.items():
            if _public_bytes(key) == bytes(public_key).strip():
                return name
        return None

    def _key(self, name: str) -> ec.EllipticCurvePublicKey:
        if not isinstance(name, str) or name not in self._keys:
            raise IdentityError(f"unknown signer {name!r}: not in the roster")
        return self._keys[name]

    def verify(self, name: str, data: bytes, signature: bytes) -> None:
        """Check ``signature`` by roster member ``name`` over ``data``.

        Raises
        ------
        IdentityError
            Unknown signer or a signature that does not verify.
        """
        key = self._key(name)
        if not isinstance(signature, (bytes, bytearray)) or not signature:
            raise IdentityError(f"signature of {name!r} is missing or not bytes")
        try:
            key.verify(bytes(signature), bytes(data), ec.ECDSA(_hash_for(key)))
        except InvalidSignature:
            raise IdentityError(f"signature of {name!r} does not verify against the roster") from None

    def fingerprint(self) -> str:
        """SHA-256 of the canonical roster (sorted names and keys), 16 hex digits; compare out of band."""
        h = hashlib.sha256(ROSTER_FORMAT.encode())
        for name in self.names:
            h.update(_lp(name.encode()) + _lp(self.public_key_bytes(name)))
        return h.hexdigest()[:16]

    def to_json(self) -> str:
        """The roster file's text (see the module docstring)."""
        nodes = [{"name": n, "public-key": self.public_key_bytes(n).decode()} for n in self.names]
        return json.dumps({"format": ROSTER_FORMAT, "version": _ROSTER_VERSION, "nodes": nodes}, indent=2) + "\n"

    @classmethod
    def from_identities(cls, identities: Iterable[NodeIdentity]) -> Roster:
        """Roster of the public keys of ``identities`` (tests, the keys CLI)."""
        keys: dict[str, bytes] = {}
        for ident in identities:
            if ident.name in keys:
                raise IdentityError(f"two identities named {ident.name!r}")
            keys[ident.name] = ident.public_key_bytes()
        return cls(keys)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_json` with mode 0644."""
        path = Path(path)
        path.write_text(self.to_json(), encoding="utf-8")
        os.chmod(path, 0o644)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Roster:
        """Read a roster file.

        Raises
        ------
        IdentityError
            Missing file, writable by group or others, not a roster, or invalid entries.
        """
        path = Path(path).expanduser()
        if not path.is_file():
            raise IdentityError(f"roster file {path} does not exist")
        _check_permissions(path, private=False)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise IdentityError(f"roster {path}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != ROSTER_FORMAT or doc.get("version") != _ROSTER_VERSION:
            raise IdentityError(f"roster {path}: not a {ROSTER_FORMAT} version {_ROSTER_VERSION} file")
        nodes = doc.get("nodes")
        if not isinstance(nodes, list):
            raise IdentityError(f"roster {path}: 'nodes' must be a list")
        keys: dict[str, str] = {}
        for entry in nodes:
            if not isinstance(entry, dict) or set(entry) != {"name", "public-key"}:
                raise IdentityError(f"roster {path}: every node needs exactly 'name' and 'public-key'")
            name = entry["name"]
            if name in keys:
                raise IdentityError(f"roster {path}: node {name!r} listed twice")
            keys[name] = entry["public-key"]
        return cls(keys)


def _lp(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def key_statement(*, protocol: str, session: str, round: int, role: str, key: bytes) -> bytes:
    """Canonical, domain-separated bytes that a node signs for one relayed key.

    ``DOMAIN ‖ lp(protocol) ‖ lp(session) ‖ round (8 bytes, big endian) ‖
    lp(role) ‖ lp(key)`` with ``lp(x) = len(x) (4 bytes) ‖ x`` — no two field
    tuples give the same bytes.

    Parameters
    ----------
    protocol : str
        e.g. ``"fhe-auc"``, ``"secsv"``, ``"xmkckks"``.
    session : str
        Session or key-set id (chosen by the server; binds the key to one run of the phase).
    round : int
        Server round, ``0 <= round < 2**63`` (0 where a phase has no rounds).
    role : str
        What the key is for, e.g. ``"client"``, ``"key-holder"``, ``"aux"``.
    key : bytes
        The relayed public key or share.
    """
    for field, value in (("protocol", protocol), ("session", session), ("role", role)):
        if not isinstance(value, str) or not value:
            raise IdentityError(f"key statement: {field} must be a non-empty string, got {value!r}")
    if isinstance(round, bool) or not isinstance(round, int) or not 0 <= round < 2**63:
        raise IdentityError(f"key statement: round must be an integer in [0, 2**63), got {round!r}")
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise IdentityError("key statement: key must be non-empty bytes")
    return (_DOMAIN + _lp(protocol.encode()) + _lp(session.encode()) + struct.pack(">Q", round)
            + _lp(role.encode()) + _lp(bytes(key)))


def sign_key(identity: NodeIdentity, *, protocol: str, session: str, round: int, role: str,
             key: bytes) -> bytes:
    """``identity``'s signature over :func:`key_statement`."""
    return identity.sign(key_statement(protocol=protocol, session=session, round=round, role=role, key=key))


def verify_key(roster: Roster, signer: str, signature: bytes, *, protocol: str, session: str, round: int,
               role: str, key: bytes) -> None:
    """Check that roster member ``signer`` signed ``key`` for this protocol, session, round and role.

    Raises
    ------
    IdentityError
        Unknown signer, or a signature that does not verify (forged, or made
        for another key, protocol, session, round or role); the message names
        the signer, the role and the protocol.
    """
    statement = key_statement(protocol=protocol, session=session, round=round, role=role, key=key)
    try:
        roster.verify(signer, statement, signature)
    except IdentityError as exc:
        raise IdentityError(f"{protocol} {role} key of {signer!r} (session {session}, round {round}) "
                            f"refused: {exc}") from None


class SignedKey(NamedTuple):
    """A relayed key with its signer's roster name and signature."""

    signer: str
    key: bytes
    signature: bytes


def verify_key_set(roster: Roster, entries: Mapping[Any, SignedKey], *, protocol: str, session: str,
                   round: int, role: str, floor: int, own: str | None = None) -> dict[Any, str]:
    """Check a key set relayed by the server; ``{entry id: signer name}``.

    Every entry must be signed by its roster member for (protocol, session,
    round, role); signers and keys distinct; ``own`` (this node's name),
    if given, must not appear among ``entries`` (its own key is not relayed
    back to it); and the set, counting ``own``, must have at least ``floor``
    members.

    Raises
    ------
    IdentityError
        Naming the first offending signer, or the set size and the floor.
    """
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 1:
        raise IdentityError(f"key-set floor must be an integer >= 1, got {floor!r}")
    names: dict[Any, str] = {}
    seen_keys: set[bytes] = set()
    for eid, entry in entries.items():
        signer, key, sig = entry
        verify_key(roster, signer, sig, protocol=protocol, session=session, round=round, role=role, key=key)
        if signer == own:
            raise IdentityError(f"{protocol} key set of session {session} lists this node ({own!r}) as a peer")
        if signer in names.values():
            raise IdentityError(f"{protocol} key set of session {session} lists {signer!r} twice")
        if bytes(key) in seen_keys:
            raise IdentityError(f"{protocol} key set of session {session}: {signer!r} relays another member's key")
        seen_keys.add(bytes(key))
        names[eid] = signer
    size = len(names) + (own is not None)
    if size < floor:
        raise IdentityError(f"{protocol} key set of session {session} has {size} roster members, "
                            f"this node requires at least {floor}")
    return names
