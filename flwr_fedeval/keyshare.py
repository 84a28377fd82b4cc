"""End-to-end relay of a secret from one client to the others through the server.

Used by the FHE AUC phase (Baykara et al. 2025, §IV-C1 "Setup"): the
key-holder client sends its CKKS secret context (and, for the malicious
protocol, the common random seed) to every other client; the server only
relays bytes it cannot open.

Construction: static X25519 key pairs (one per client, fresh per run or
long-lived), ``shared = X25519(sender_sk, recipient_pk)``, key =
HKDF-SHA256(shared, salt = 16 random bytes, info = label ‖ sender_pk ‖
recipient_pk), AES-256-GCM with a random 96-bit nonce and the header as
associated data. Static–static DH authenticates the sender to the recipient
*provided the public keys themselves are authentic*: the server relays them
too, so a malicious server could substitute its own keys (man in the
middle). The FHE AUC and SecSV phases therefore sign every relayed public
key with the node's roster key and check it before use
(:mod:`flwr_fedeval.identity`, DESIGN.md §7); :func:`fingerprint` remains
for out-of-band comparison.

All randomness comes from ``os.urandom`` (via ``cryptography`` and
``secrets``).

Standards: X25519 is the Diffie–Hellman function of RFC 7748 (§5; 32-byte
raw keys), HKDF-SHA256 the extract-and-expand KDF of RFC 5869, AES-256-GCM
the AEAD of NIST SP 800-38D (RFC 5116 interface), all from ``cryptography``.
Relation to HPKE (RFC 9180): the same building blocks as HPKE's suite
DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 / AES-256-GCM, and sender
authentication by a static–static DH as in HPKE's Auth mode, but *not*
HPKE and not interoperable with it: there is no ephemeral key (HPKE's Base
and Auth modes draw a fresh ephemeral sender key per message; here a later
leak of either static private key opens past bundles, so the FHE AUC and
SecSV phases make fresh key pairs for every run), and the key schedule is the HKDF call
above (random salt, info = label ‖ sender key ‖ recipient key) instead of
HPKE's LabeledExtract/LabeledExpand with suite identifiers. An HPKE Base-mode
API (as in recent ``cryptography`` releases) would leave the sender
anonymous, so it would need the sender's key to be authenticated otherwise
(signed keys, DESIGN.md §7).
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Mapping
from typing import NamedTuple, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "KeyShareError",
    "KeyPair",
    "SharedSecrets",
    "fingerprint",
    "generate_keypair",
    "open_bundle",
    "open_from",
    "seal_bundle",
    "seal_for",
    "seal_for_all",
]

_MAGIC = b"FFKS"
_VERSION = 1
_HDR = struct.Struct(">4sB32s32s16s12s")  # magic, version, sender pk, recipient pk, salt, nonce
_LABEL = b"flwr-fedeval keyshare v1"


class KeyShareError(ValueError):
    """A sealed message that cannot be opened (wrong key, tampered, malformed)."""


class KeyPair(NamedTuple):
    """Raw 32-byte X25519 keys; keep ``private`` in the node's state only."""

    private: bytes
    public: bytes


def generate_keypair() -> KeyPair:
    """A fresh X25519 key pair (raw bytes)."""
    sk = X25519PrivateKey.generate()
    return KeyPair(
        private=sk.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption()),
        public=sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw),
    )


def fingerprint(public_key: bytes) -> str:
    """Short hex fingerprint of a public key for out-of-band comparison."""
    h = hashes.Hash(hashes.SHA256())
    h.update(_LABEL + bytes(public_key))
    return h.finalize()[:10].hex()


def _check_key(key: bytes, what: str) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
        raise ValueError(f"{what} must be 32 raw bytes")
    return bytes(key)


def _aead_key(private: bytes, sender_pk: bytes, recipient_pk: bytes, peer_pk: bytes, salt: bytes) -> AESGCM:
    sk = X25519PrivateKey.from_private_bytes(private)
    shared = sk.exchange(X25519PublicKey.from_public_bytes(peer_pk))
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt,
               info=_LABEL + sender_pk + recipient_pk).derive(shared)
    return AESGCM(key)


def seal_for(payload: bytes, *, sender: KeyPair, recipient_public: bytes) -> bytes:
    """Encrypt ``payload`` for one recipient.

    Returns
    -------
    bytes
        ``header ‖ AES-GCM(payload)``; the header (keys, salt, nonce) is authenticated.
    """
    recipient_public = _check_key(recipient_public, "recipient_public")
    sender_pk = _check_key(sender.public, "sender.public")
    salt, nonce = secrets.token_bytes(16), secrets.token_bytes(12)
    header = _HDR.pack(_MAGIC, _VERSION, sender_pk, recipient_public, salt, nonce)
    aead = _aead_key(_check_key(sender.private, "sender.private"), sender_pk, recipient_public,
                     recipient_public, salt)
    return header + aead.encrypt(nonce, bytes(payload), header)


_K = TypeVar("_K")


def seal_for_all(payload: bytes, *, sender: KeyPair, recipients: Mapping[_K, bytes]) -> dict[_K, bytes]:
    """:func:`seal_for` for each ``{node_id: public_key}``; returns ``{node_id: sealed}``."""
    return {node: seal_for(payload, sender=sender, recipient_public=pk) for node, pk in recipients.items()}


def open_from(sealed: bytes, *, recipient: KeyPair, sender_public: bytes) -> bytes:
    """Decrypt a message sealed by ``sender_public`` for ``recipient``.

    Raises
    ------
    KeyShareError
        If the bytes are malformed, addressed to another key, from another
        sender, or were modified in transit.
    """
    sender_public = _check_key(sender_public, "sender_public")
    sealed = bytes(sealed)
    if len(sealed) < _HDR.size + 16:
        raise KeyShareError("sealed key share is truncated")
    magic, version, spk, rpk, salt, nonce = _HDR.unpack_from(sealed)
    if magic != _MAGIC or version != _VERSION:
        raise KeyShareError("not a flwr-fedeval key share")
    if rpk != recipient.public:
        raise KeyShareError("key share is addressed to another recipient")
    if spk != sender_public:
        raise KeyShareError("key share comes from an unexpected sender")
    aead = _aead_key(_check_key(recipient.private, "recipient.private"), spk, rpk, spk, salt)
    try:
        return aead.decrypt(nonce, sealed[_HDR.size:], sealed[:_HDR.size])
    except InvalidTag:
        raise KeyShareError("key share failed authentication (wrong key or tampered)") from None


class SharedSecrets(NamedTuple):
    """What the key holder shares: the CKKS secret context and the common seed."""

    secret_context: bytes
    seed: bytes


def seal_bundle(secret_context: bytes, seed: bytes, *, sender: KeyPair,
                recipients: Mapping[_K, bytes]) -> dict[_K, bytes]:
    """Seal ``(secret_context, seed)`` for every recipient.

    Parameters
    ----------
    secret_context : bytes
        The serialized CKKS context with its secret key (any length).
    seed : bytes
        The common random seed of the malicious protocol, at least 32 bytes.
    sender : KeyPair
        The key holder's X25519 key pair (32 raw bytes each).
    recipients : mapping of node ID to bytes
        Each other client's 32-byte X25519 public key.

    Returns
    -------
    dict
        ``{node_id: sealed bytes}``: :func:`seal_for` of ``len(secret_context)``
        (8 bytes, big-endian) ‖ ``secret_context`` ‖ ``seed``; open with
        :func:`open_bundle`.

    Raises
    ------
    ValueError
        If ``seed`` is shorter than 32 bytes, a key is not 32 raw bytes, or a
        recipient key is a low-order X25519 point (the shared secret would be
        all zeros; raised by ``cryptography``).
    TypeError
        If ``secret_context`` or ``seed`` is not bytes-like.
    """
    if len(seed) < 32:
        raise ValueError("seed must be at least 32 bytes")
    payload = struct.pack(">Q", len(secret_context)) + bytes(secret_context) + bytes(seed)
    return seal_for_all(payload, sender=sender, recipients=recipients)


def open_bundle(sealed: bytes, *, recipient: KeyPair, sender_public: bytes) -> SharedSecrets:
    """Inverse of :func:`seal_bundle` for one recipient."""
    payload = open_from(sealed, recipient=recipient, sender_public=sender_public)
    (n,) = struct.unpack_from(">Q", payload)
    if 8 + n > len(payload):
        raise KeyShareError("malformed key share bundle")
    return SharedSecrets(secret_context=payload[8:8 + n], seed=payload[8 + n:])
