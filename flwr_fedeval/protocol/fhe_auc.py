"""Messages of the FHE AUC evaluation phase (Baykara, Ünal, Akgün 2025, §IV-C semi-honest and
§IV-D malicious aggregator; DESIGN.md §4).

=====  =========================  ==========  =======================  ======================
step   message type               replier     request                  reply
=====  =========================  ==========  =======================  ======================
1      ``query.fhe_pubkey``       client      :class:`PubkeyRequest`   :class:`PubkeyReply`
2      ``query.fhe_keygen``       key-holder  :class:`KeygenRequest`   :class:`KeygenReply`
3–4    ``evaluate.fhe_counts``    client      :class:`CountsRequest`   :class:`CountsReply`
5–6    ``query.fhe_result``       client      :class:`ResultRequest`   :class:`ResultReport`
=====  =========================  ==========  =======================  ======================

Step 5 (aggregation) is the server's alone. Every X25519 key relayed through the server is
signed by its node's roster key over (:data:`SIGNED_PROTOCOL`, session, round 0, role, key)
(:func:`sign`, :func:`verify`, :func:`verify_peers`; :mod:`flwr_fedeval.identity`).

Who takes part is in the same transcript: at step 2 the key holder signs, with role
:data:`PARTICIPANTS_ROLE`, the digest of the ordered list of (roster name, X25519 key) it sealed
the secret context to, itself included (:class:`ParticipantList`). The list travels with the
step-2 reply and every step-3–4 request; every client checks it against the roster and derives
its party index and the party count from it (never from a server field), refuses a list without
itself (with its own step-1 key) or below its floor, and binds the list's digest into the
malicious protocol's common randomness, next to the nonce.

The request of steps 3–4 also carries the global model under the phase's ``arrayrecord_key``
(Flower's model record, not ours: the server adds it next to :meth:`CountsRequest.to_record`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Mapping
from typing import Any, overload

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from flwr_fedeval.fhe.auc import FHEAUCConfig
from flwr_fedeval.fhe.auc_malicious import MaliciousAUCConfig
from flwr_fedeval.fhe.backend import BACKENDS
from flwr_fedeval.identity import (
    IdentityError,
    NodeIdentity,
    Roster,
    SignedKey,
    sign_key,
    verify_key,
    verify_key_set,
)
from flwr_fedeval.protocol._base import (
    MalformedMessage,
    Payload,
    Step,
    array_bytes,
    array_record,
    bytes_array,
    config_bytes,
    config_field,
    config_list,
    config_of,
    config_record,
)
from flwr_fedeval.protocol.auc import EVALUATION_KEY, decision_points_entry, decision_points_from

__all__ = [
    "CLIENT_ROLE",
    "COUNTS",
    "HOLDER_ROLE",
    "KEYGEN",
    "METRICS",
    "PROTOCOLS",
    "PARTICIPANTS_ROLE",
    "PUBKEY",
    "RESULT",
    "SIGNED_PROTOCOL",
    "STEPS",
    "CountsReply",
    "CountsRequest",
    "EncryptionParams",
    "KeygenReply",
    "KeygenRequest",
    "ParticipantList",
    "PubkeyReply",
    "PubkeyRequest",
    "ResultReport",
    "ResultRequest",
    "sign",
    "verify",
    "verify_peers",
]

# --- record keys (the wire format; spelled here only) --------------------------------------
#: ConfigRecord of every request: ``session`` (str) and the step's parameters.
REQUEST_KEY = "fhe"
#: Step 1 reply: ``public-key``, ``test-size-bucket``, ``signer``, ``signature``.
PUBKEY_KEY = "fhe-pubkey"
#: Step 2 request: ``{str(node_id): X25519 public key}`` of the other clients, with their
#: roster names and step-1 signatures under the same node IDs.
PEERS_KEY = "fhe-peers"
PEER_SIGNERS_KEY = "fhe-peer-signers"
PEER_SIGNATURES_KEY = "fhe-peer-signatures"
#: Step 2 reply: ``signer``, ``signature`` of the key holder's X25519 key (role ``"key-holder"``).
HOLDER_KEY = "fhe-holder"
#: Step 2 reply and steps 3–4 request: the signed participant list (ConfigRecord ``names``,
#: ``keys``, ``signer``, ``signature``; :class:`ParticipantList`).
PARTICIPANTS_KEY = "fhe-participants"
#: Step 2 reply: ArrayRecord ``public`` (the public CKKS context, uint8).
CONTEXT_KEY = "fhe-context"
#: Step 2 reply: ArrayRecord ``{str(node_id): sealed bundle}``; step 3 request: ``sealed``.
BUNDLES_KEY = "fhe-bundles"
BUNDLE_KEY = "fhe-bundle"
#: Step 4 reply: ArrayRecord ``auc`` (+ ``metrics``), packed ciphertexts.
COUNTS_KEY = "fhe-counts"
#: Step 5 request: ArrayRecord ``auc`` (+ ``metrics``), the aggregated ciphertexts.
RESULT_KEY = "fhe-result"
#: Step 6 reply: ConfigRecord ``status``, ``shared`` and, if shared, the values.
REPORT_KEY = "fhe-report"
#: The two protocols of the phase (§IV-C, §IV-D).
PROTOCOLS = ("semi-honest", "malicious")
#: ``protocol`` field of the signed key statements (:func:`flwr_fedeval.identity.key_statement`);
#: the phase has no rounds: ``round`` is 0, the session id binds the keys to one run.
SIGNED_PROTOCOL = "fhe-auc"
#: Signing roles: every client's step-1 key, the key holder's key relayed at step 3.
CLIENT_ROLE, HOLDER_ROLE = "client", "key-holder"
#: Signing role of the participant list's digest (the key holder's, at step 2).
PARTICIPANTS_ROLE = "participants"
_PARTICIPANTS_DOMAIN = b"flwr-fedeval/fhe-auc/participants/v1"
#: X25519 public keys are 32 raw bytes (RFC 7748); the step-4 nonce is 16 bytes.
PUBLIC_KEY_BYTES, NONCE_BYTES = 32, 16
#: An upper bound on a DER ECDSA signature (P-521: at most 139 bytes).
MAX_SIGNATURE_BYTES = 256
#: The threshold metrics a client reports (semi-honest only), in the order of
#: :func:`flwr_fedeval.fhe.auc.client_decrypt_threshold_metrics`.
METRICS = ("accuracy", "precision", "recall", "f1")


# --- signed keys ----------------------------------------------------------------------------
def sign(identity: NodeIdentity, *, session: str, role: str, key: bytes) -> SignedKey:
    """``key`` signed by ``identity`` for this phase (``round`` 0) and ``role``."""
    return SignedKey(identity.name, bytes(key), sign_key(identity, protocol=SIGNED_PROTOCOL, session=session,
                                                         round=0, role=role, key=key))


def verify(roster: Roster, signed: SignedKey, *, session: str, role: str) -> None:
    """Check ``signed`` against ``roster`` for this phase, ``session`` and ``role``.

    Raises
    ------
    flwr_fedeval.identity.IdentityError
        Unknown signer or a signature that does not verify (names the signer and the role).
    """
    verify_key(roster, signed.signer, signed.signature, protocol=SIGNED_PROTOCOL, session=session, round=0,
               role=role, key=signed.key)


def verify_peers(roster: Roster, peers: Mapping[int, SignedKey], *, session: str, floor: int,
                 own: str) -> dict[int, str]:
    """The key holder's check of the step-2 key set: ``{node_id: roster name}``.

    Raises
    ------
    flwr_fedeval.identity.IdentityError
        See :func:`flwr_fedeval.identity.verify_key_set` (signatures, distinct members other
        than ``own``, at least ``floor`` members counting ``own``).
    """
    return verify_key_set(roster, dict(peers), protocol=SIGNED_PROTOCOL, session=session, round=0,
                          role=CLIENT_ROLE, floor=floor, own=own)


# --- the signed participant list -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ParticipantList:
    """The ordered list of the parties of one FHE AUC session, signed by the key holder
    (so the server cannot drop or add a party).

    Attributes
    ----------
    names : tuple of str
        Roster names, sorted and distinct (the canonical order: party ``i`` is ``names[i]``).
    keys : tuple of bytes
        The step-1 X25519 key (32 bytes) of each name: the keys the key holder sealed the secret
        context to (its own included).
    signer, signature : str, bytes
        The key holder (one of ``names``) and its signature over :meth:`digest` (role
        :data:`PARTICIPANTS_ROLE`, :func:`flwr_fedeval.identity.key_statement`).
    protocol : str
        The protocol of the session (one of :data:`PROTOCOLS`), which the key holder accepted under
        its node policy (``fedeval-fhe-min-protocol``); every client encrypts under this protocol
        only, so the server cannot run steps 3–6 under another one.

    The digest is SHA-256 of ``DOMAIN ‖ lp(session) ‖ lp(protocol) ‖ M (4 bytes) ‖ lp(name_0) ‖
    key_0 ‖ …``; a client's party index is its position in ``names``, the party count
    ``M = len(names)``.
    """

    names: tuple[str, ...]
    keys: tuple[bytes, ...]
    signer: str
    signature: bytes
    protocol: str

    @staticmethod
    def _digest(session: str, names: tuple[str, ...], keys: tuple[bytes, ...], protocol: str) -> bytes:
        h = hashlib.sha256(_PARTICIPANTS_DOMAIN + _lp(session.encode()) + _lp(protocol.encode())
                           + struct.pack(">I", len(names)))
        for name, key in zip(names, keys):
            h.update(_lp(name.encode()) + _lp(bytes(key)))
        return h.digest()

    def digest(self, session: str) -> bytes:
        """The 32-byte digest the key holder signed (bound into the common randomness)."""
        return self._digest(session, self.names, self.keys, self.protocol)

    @classmethod
    def sign(cls, identity: NodeIdentity, *, session: str, members: Mapping[str, bytes],
             protocol: str) -> ParticipantList:
        """The list of ``members`` (roster name → X25519 key, ``identity`` among them) in name order,
        for ``protocol``, signed by ``identity`` (the key holder)."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        names = tuple(sorted(members))
        keys = tuple(bytes(members[n]) for n in names)
        signature = sign_key(identity, protocol=SIGNED_PROTOCOL, session=session, round=0, role=PARTICIPANTS_ROLE,
                             key=cls._digest(session, names, keys, protocol))
        return cls(names, keys, identity.name, signature, protocol)

    @overload
    def verify(self, roster: Roster, *, session: str, holder: str, own: str,
               own_key: bytes | None = None, floor: int = 2, protocol: str | None = None) -> int: ...

    @overload
    def verify(self, roster: Roster, *, session: str, holder: str, own: None = None,
               own_key: bytes | None = None, floor: int = 2, protocol: str | None = None) -> None: ...

    def verify(self, roster: Roster, *, session: str, holder: str, own: str | None = None,
               own_key: bytes | None = None, floor: int = 2, protocol: str | None = None) -> int | None:
        """Check the list; the party index of ``own`` (``None`` when ``own`` is not given).

        ▲ signed by ``holder`` (the key holder whose key the client checked) for this session and
        its protocol; ▲ the protocol is ``protocol`` (the one the request asks this client to
        encrypt under), when given; ▲ names sorted, distinct, roster members, the holder among
        them, one 32-byte key each; ▲ ``own`` listed with ``own_key`` (its step-1 key); ▲ at least
        ``floor`` parties.

        Raises
        ------
        flwr_fedeval.identity.IdentityError
            Naming the failed check.
        """
        if self.signer != holder:
            raise IdentityError(f"participant list signed by {self.signer!r}, not by the key holder {holder!r}")
        try:
            verify_key(roster, self.signer, self.signature, protocol=SIGNED_PROTOCOL, session=session, round=0,
                       role=PARTICIPANTS_ROLE, key=self.digest(session))
        except IdentityError as exc:  # shortened, reordered, replayed from another session, or forged
            raise IdentityError(f"participant list refused: {exc}") from None
        if protocol is not None and self.protocol != protocol:
            raise IdentityError(f"participant list signed by the key holder for the {self.protocol} protocol, the "
                                f"request asks for {protocol}: refused")
        if list(self.names) != sorted(set(self.names)) or len(self.keys) != len(self.names):
            raise IdentityError("participant list: names not sorted and distinct, or not one key per name")
        unknown = [n for n in self.names if n not in roster]
        if unknown:
            raise IdentityError(f"participant list names {unknown}, not in the roster")
        if holder not in self.names:
            raise IdentityError(f"participant list without its key holder {holder!r}")
        if len(set(self.keys)) != len(self.keys) or any(len(k) != PUBLIC_KEY_BYTES for k in self.keys):
            raise IdentityError("participant list: keys not distinct 32-byte X25519 keys")
        if len(self.names) < floor:
            raise IdentityError(f"participant list of session {session} has {len(self.names)} parties, "
                                f"this node requires at least {floor}")
        if own is None:
            return None
        if own not in self.names:
            raise IdentityError(f"participant list of session {session} does not list this node ({own!r})")
        index = self.names.index(own)
        if own_key is not None and self.keys[index] != bytes(own_key):
            raise IdentityError(f"participant list lists {own!r} with another X25519 key than this node's")
        return index

    def to_config(self) -> ConfigRecord:
        """The ConfigRecord under :data:`PARTICIPANTS_KEY`."""
        return ConfigRecord({"names": list(self.names), "keys": list(self.keys), "signer": self.signer,
                             "signature": self.signature, "protocol": self.protocol})

    @classmethod
    def from_config(cls, rec: ConfigRecord) -> ParticipantList:
        """Parse the record of :meth:`to_config`.

        Raises
        ------
        MalformedMessage
            A field missing, of another type, or keys of another length.
        """
        names = config_list(rec, PARTICIPANTS_KEY, "names", str)
        keys = config_list(rec, PARTICIPANTS_KEY, "keys", bytes, length=len(names), item_length=PUBLIC_KEY_BYTES)
        if not names:
            raise MalformedMessage(f"{PARTICIPANTS_KEY}.names", "empty")
        return cls(tuple(names), tuple(bytes(k) for k in keys),
                   config_field(rec, PARTICIPANTS_KEY, "signer", str),
                   config_bytes(rec, PARTICIPANTS_KEY, "signature", max_length=MAX_SIGNATURE_BYTES),
                   config_field(rec, PARTICIPANTS_KEY, "protocol", str, choices=PROTOCOLS))


def _lp(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


# --- small field helpers of this module -------------------------------------------------------
def _session(content: RecordDict) -> tuple[ConfigRecord, str]:
    rec = config_record(content, REQUEST_KEY)
    session = config_field(rec, REQUEST_KEY, "session", str)
    if not session:
        raise MalformedMessage(f"{REQUEST_KEY}.session", "empty session id")
    return rec, session


def _node_id(key: str, name: str) -> int:
    if not (name.isascii() and name.isdigit()) or int(name) >= 2**64:
        raise MalformedMessage(f"{key}.{name}", "not a node ID (an unsigned 64-bit integer)")
    return int(name)


def _signed(rec: ConfigRecord, key: str, prefix: str, public_key: bytes) -> SignedKey:
    return SignedKey(config_field(rec, key, f"{prefix}signer", str), public_key,
                     config_bytes(rec, key, f"{prefix}signature", max_length=MAX_SIGNATURE_BYTES))


def _bytes_records(records: Mapping[str, bytes | None]) -> ArrayRecord:
    return ArrayRecord({k: bytes_array(v) for k, v in records.items() if v is not None})


def _optional_bytes(rec: ArrayRecord, key: str, name: str) -> bytes | None:
    return array_bytes(rec, key, name) if name in rec else None


def _optional_float(rec: ConfigRecord, name: str, *, nan: bool = False, low: float | None = None,
                    high: float | None = None) -> float | None:
    if name not in rec:
        return None
    if nan and isinstance(rec[name], float) and np.isnan(rec[name]):
        return float("nan")
    return float(config_field(rec, REPORT_KEY, name, float, minimum=low, maximum=high))


# --- step 1 -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PubkeyRequest(Payload):
    """Step 1 request: ``fhe.session`` (str, non-empty; a fresh id per phase run)."""

    LABEL = "FHE public-key request"
    session: str

    def _to_record(self) -> RecordDict:
        return RecordDict({REQUEST_KEY: ConfigRecord({"session": self.session})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> PubkeyRequest:
        return cls(_session(content)[1])


@dataclasses.dataclass(frozen=True)
class PubkeyReply(Payload):
    """Step 1 reply (record ``fhe-pubkey``).

    Attributes
    ----------
    public_key : bytes
        ``public-key``, the client's fresh X25519 public key, 32 bytes.
    test_size_bucket : int
        ``test-size-bucket``, the smallest power of two ≥ the client's test-set size (0: none);
        their sum is the public pooled bound ``max_rows`` (:class:`~flwr_fedeval.fhe.auc.FHEAUCConfig`).
    signer, signature : str, bytes
        ``signer``, ``signature``: the client's roster name and its signature over the key
        (role ``"client"``, :func:`sign`), at most 256 bytes.
    """

    LABEL = "FHE public-key reply"
    public_key: bytes
    test_size_bucket: int
    signer: str
    signature: bytes

    @property
    def signed_key(self) -> SignedKey:
        """The public key with its signer and signature."""
        return SignedKey(self.signer, self.public_key, self.signature)

    def _to_record(self) -> RecordDict:
        return RecordDict({PUBKEY_KEY: ConfigRecord({"public-key": self.public_key,
                                                     "test-size-bucket": self.test_size_bucket,
                                                     "signer": self.signer, "signature": self.signature})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> PubkeyReply:
        rec = config_record(content, PUBKEY_KEY)
        pk = config_bytes(rec, PUBKEY_KEY, "public-key", length=PUBLIC_KEY_BYTES)
        bucket = config_field(rec, PUBKEY_KEY, "test-size-bucket", int, minimum=0)
        if bucket & (bucket - 1):
            raise MalformedMessage(f"{PUBKEY_KEY}.test-size-bucket", f"{bucket} is not 0 or a power of two")
        signed = _signed(rec, PUBKEY_KEY, "", pk)
        return cls(pk, bucket, signed.signer, signed.signature)


# --- step 2 -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class KeygenRequest(Payload):
    """Step 2 request, to the key holder.

    Attributes
    ----------
    session : str
        ``fhe.session``.
    backend : str
        ``fhe.backend``, the CKKS engine (one of :data:`flwr_fedeval.fhe.backend.BACKENDS`).
    slots : int
        ``fhe.slots``, the slots the protocol needs
        (:meth:`flwr_fedeval.strategies.fhe_phase.FHEAUCPhase.slots_needed`).
    max_rows : int
        ``fhe.max-rows``, the public pooled bound; the CKKS parameters follow from it
        (:func:`flwr_fedeval.fhe.auc.ckks_params_for`).
    peers : mapping of int to SignedKey
        The other clients' step-1 keys by node ID: ``fhe-peers`` (32-byte keys),
        ``fhe-peer-signers``, ``fhe-peer-signatures``, keyed by ``str(node_id)``.
    protocol : str
        ``fhe.protocol``, the protocol of the session (one of :data:`PROTOCOLS`); the key holder
        checks it against its node policy and signs it into the participant list.

    Notes
    -----
    :meth:`from_record` refuses a peer key without signer or signature ("not signed").
    """

    LABEL = "FHE key-generation request"
    session: str
    backend: str
    slots: int
    max_rows: int
    peers: Mapping[int, SignedKey]
    protocol: str

    def _to_record(self) -> RecordDict:
        peers = {str(n): p for n, p in self.peers.items()}
        return RecordDict({
            REQUEST_KEY: ConfigRecord({"session": self.session, "backend": self.backend, "slots": self.slots,
                                       "max-rows": self.max_rows, "protocol": self.protocol}),
            PEERS_KEY: ConfigRecord({n: p.key for n, p in peers.items()}),
            PEER_SIGNERS_KEY: ConfigRecord({n: p.signer for n, p in peers.items()}),
            PEER_SIGNATURES_KEY: ConfigRecord({n: p.signature for n, p in peers.items()}),
        })

    @classmethod
    def _from_record(cls, content: RecordDict) -> KeygenRequest:
        rec, session = _session(content)
        keys = config_record(content, PEERS_KEY)
        unsigned = "the peer keys are not signed (unsigned keys are refused)"
        signers = config_record(content, PEER_SIGNERS_KEY) if PEER_SIGNERS_KEY in content else None
        sigs = config_record(content, PEER_SIGNATURES_KEY) if PEER_SIGNATURES_KEY in content else None
        if signers is None or sigs is None:
            raise MalformedMessage(PEER_SIGNERS_KEY if signers is None else PEER_SIGNATURES_KEY, unsigned)
        peers = {}
        for name in keys:
            node = _node_id(PEERS_KEY, name)
            if name not in signers or name not in sigs:
                raise MalformedMessage(f"{PEERS_KEY}.{name}", f"peer key of node {node} is not signed "
                                                              "(unsigned keys are refused)")
            pk = config_bytes(keys, PEERS_KEY, name, length=PUBLIC_KEY_BYTES)
            peers[node] = SignedKey(config_field(signers, PEER_SIGNERS_KEY, name, str), pk,
                                    config_bytes(sigs, PEER_SIGNATURES_KEY, name, max_length=MAX_SIGNATURE_BYTES))
        return cls(session, config_field(rec, REQUEST_KEY, "backend", str, choices=BACKENDS),
                   config_field(rec, REQUEST_KEY, "slots", int, minimum=1),
                   config_field(rec, REQUEST_KEY, "max-rows", int, minimum=1), peers,
                   config_field(rec, REQUEST_KEY, "protocol", str, choices=PROTOCOLS))


@dataclasses.dataclass(frozen=True)
class KeygenReply(Payload):
    """Step 2 reply of the key holder.

    Attributes
    ----------
    public_context : bytes
        ``fhe-context.public``: the public CKKS context (public, relinearisation and rotation
        keys, no secret key), uint8.
    bundles : mapping of int to bytes
        ``fhe-bundles``: ``{str(node_id): keyshare.seal_bundle(...)}``, one sealed (secret
        context, seed) bundle per other client, uint8, opaque to the server.
    signer, signature : str, bytes
        ``fhe-holder.signer``, ``fhe-holder.signature``: the key holder's X25519 key (sent at
        step 1) signed for role ``"key-holder"``.
    participants : ParticipantList
        ``fhe-participants``: the parties the key holder sealed to, itself included, signed.
    """

    LABEL = "FHE key-generation reply"
    public_context: bytes
    bundles: Mapping[int, bytes]
    signer: str
    signature: bytes
    participants: ParticipantList

    def holder_key(self, public_key: bytes) -> SignedKey:
        """The key holder's ``public_key`` (from its step-1 reply) with this reply's signature."""
        return SignedKey(self.signer, bytes(public_key), self.signature)

    def _to_record(self) -> RecordDict:
        return RecordDict({
            CONTEXT_KEY: _bytes_records({"public": self.public_context}),
            BUNDLES_KEY: _bytes_records({str(n): b for n, b in self.bundles.items()}),
            HOLDER_KEY: ConfigRecord({"signer": self.signer, "signature": self.signature}),
            PARTICIPANTS_KEY: self.participants.to_config(),
        })

    @classmethod
    def _from_record(cls, content: RecordDict) -> KeygenReply:
        public = array_bytes(array_record(content, CONTEXT_KEY), CONTEXT_KEY, "public")
        rec = array_record(content, BUNDLES_KEY)
        bundles = {_node_id(BUNDLES_KEY, name): array_bytes(rec, BUNDLES_KEY, name) for name in rec}
        signed = _signed(config_record(content, HOLDER_KEY), HOLDER_KEY, "", b"")
        participants = ParticipantList.from_config(config_record(content, PARTICIPANTS_KEY))
        return cls(public, bundles, signed.signer, signed.signature, participants)


# --- steps 3-4 --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EncryptionParams:
    """The public parameters a client encrypts its counts under (steps 3–4), kept in its state
    for step 6 (decryption never uses the server's second message).

    Attributes
    ----------
    protocol : {"semi-honest", "malicious"}
    n_points : int
        N ≥ 2, the number of public decision points.
    max_rows : int
        R ≥ 1, the public pooled bound (count scale ``K``).
    n_splits : int
        S, additive shares per value (≥ 2 in the malicious protocol, §IV-D).
    nonce : bytes
        16 bytes, fresh per step-4 attempt.
    metrics_threshold : float
        Threshold of the accuracy/precision/recall/F1 (≤ 1; negative: none).
    """

    protocol: str
    n_points: int
    max_rows: int
    n_splits: int
    nonce: bytes
    metrics_threshold: float

    @property
    def auc_config(self) -> FHEAUCConfig:
        """:class:`~flwr_fedeval.fhe.auc.FHEAUCConfig` (malicious: ``MaliciousAUCConfig``)."""
        if self.protocol == "malicious":
            return MaliciousAUCConfig(n_points=self.n_points, max_rows=self.max_rows, n_splits=self.n_splits)
        return FHEAUCConfig(n_points=self.n_points, max_rows=self.max_rows)

    def to_config(self) -> dict[str, Any]:
        """The ``fhe`` fields (without ``session`` and the key holder's)."""
        return {"protocol": self.protocol, "n-points": self.n_points, "max-rows": self.max_rows,
                "n-splits": self.n_splits, "nonce": self.nonce, "metrics-threshold": self.metrics_threshold}

    @classmethod
    def from_config(cls, rec: ConfigRecord, key: str = REQUEST_KEY) -> EncryptionParams:
        """Parse and check the fields of :meth:`to_config` in ``rec`` (record ``key``).

        Raises
        ------
        MalformedMessage
            A field missing, of another type, or out of its range (see the attributes).
        """
        protocol = config_field(rec, key, "protocol", str, choices=PROTOCOLS)
        return cls(protocol, config_field(rec, key, "n-points", int, minimum=2),
                   config_field(rec, key, "max-rows", int, minimum=1),
                   config_field(rec, key, "n-splits", int, minimum=2 if protocol == "malicious" else 0),
                   config_bytes(rec, key, "nonce", length=NONCE_BYTES),
                   config_field(rec, key, "metrics-threshold", float, maximum=1.0))


@dataclasses.dataclass(frozen=True)
class CountsRequest(Payload):
    """Steps 3–4 request (next to the global model).

    Attributes
    ----------
    session : str
        ``fhe.session``.
    params : EncryptionParams
        ``fhe.protocol``, ``fhe.n-points``, ``fhe.max-rows``, ``fhe.n-splits``,
        ``fhe.nonce``, ``fhe.metrics-threshold`` (no party index or count: each client derives
        them from ``participants``).
    holder : SignedKey
        ``fhe.holder-public-key`` (32 bytes), ``fhe.holder-signer``, ``fhe.holder-signature``:
        the key holder's key, signed for role ``"key-holder"``.
    thresholds : ndarray of shape (N,), float64
        ``evaluation.thresholds``, the public decision points (finite; N = ``params.n_points``).
    participants : ParticipantList
        ``fhe-participants``: the key holder's signed participant list of step 2.
    sealed : bytes or None
        ``fhe-bundle.sealed``, this client's sealed bundle (uint8); ``None`` for the key holder.
    """

    LABEL = "FHE encrypted-counts request"
    session: str
    params: EncryptionParams
    holder: SignedKey
    thresholds: np.ndarray
    participants: ParticipantList
    sealed: bytes | None = None

    def _to_record(self) -> RecordDict:
        p = self.params.to_config()
        mt = p.pop("metrics-threshold")
        fhe = {"session": self.session, **p, "holder-public-key": self.holder.key,
               "holder-signer": self.holder.signer, "holder-signature": self.holder.signature,
               "metrics-threshold": mt}
        content = RecordDict({**decision_points_entry(self.thresholds), REQUEST_KEY: ConfigRecord(fhe),
                              PARTICIPANTS_KEY: self.participants.to_config()})
        if self.sealed is not None:
            content[BUNDLE_KEY] = _bytes_records({"sealed": self.sealed})
        return content

    @classmethod
    def _from_record(cls, content: RecordDict) -> CountsRequest:
        rec, session = _session(content)
        params = EncryptionParams.from_config(rec)
        pk = config_bytes(rec, REQUEST_KEY, "holder-public-key", length=PUBLIC_KEY_BYTES)
        thresholds = decision_points_from(content)  # the plaintext phase's record (protocol.auc)
        if thresholds.shape != (params.n_points,):
            raise MalformedMessage(f"{EVALUATION_KEY}.thresholds",
                                   f"shape {thresholds.shape}, expected ({params.n_points},)")
        sealed = array_bytes(array_record(content, BUNDLE_KEY), BUNDLE_KEY, "sealed") if BUNDLE_KEY in content else None
        participants = ParticipantList.from_config(config_record(content, PARTICIPANTS_KEY))
        return cls(session, params, _signed(rec, REQUEST_KEY, "holder-", pk), thresholds, participants, sealed)


@dataclasses.dataclass(frozen=True)
class CountsReply(Payload):
    """Step 4 reply (record ``fhe-counts``).

    Attributes
    ----------
    auc : bytes
        ``auc``: packed ciphertexts of the counts (3 semi-honest, 6 malicious), uint8.
    metrics : bytes or None
        ``metrics``: one ciphertext of ``[TP, FP, TN, FN]`` at the metrics threshold, uint8;
        present iff the request set one.
    """

    LABEL = "FHE encrypted-counts reply"
    auc: bytes
    metrics: bytes | None = None

    def checked(self, *, with_metrics: bool, node: int | None = None) -> CountsReply:
        """This reply, if it has the ``metrics`` the request asked for.

        Raises
        ------
        MalformedMessage
            ``with_metrics`` and no ``metrics`` (naming ``node``).
        """
        if with_metrics and self.metrics is None:
            raise MalformedMessage(f"{COUNTS_KEY}.metrics", "missing (the request set a metrics threshold)",
                                   node=node)
        return self

    def _to_record(self) -> RecordDict:
        return RecordDict({COUNTS_KEY: _bytes_records({"auc": self.auc, "metrics": self.metrics})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> CountsReply:
        rec = array_record(content, COUNTS_KEY)
        return cls(array_bytes(rec, COUNTS_KEY, "auc"), _optional_bytes(rec, COUNTS_KEY, "metrics"))


# --- steps 5-6 --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ResultRequest(Payload):
    """Step 6 request: ``fhe.session`` and ``fhe-result.auc`` (+ ``fhe-result.metrics``), the
    aggregated masked ciphertexts of step 5 (uint8)."""

    LABEL = "FHE result request"
    session: str
    auc: bytes
    metrics: bytes | None = None

    def _to_record(self) -> RecordDict:
        return RecordDict({REQUEST_KEY: ConfigRecord({"session": self.session}),
                           RESULT_KEY: _bytes_records({"auc": self.auc, "metrics": self.metrics})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> ResultRequest:
        session = _session(content)[1]
        rec = array_record(content, RESULT_KEY)
        return cls(session, array_bytes(rec, RESULT_KEY, "auc"), _optional_bytes(rec, RESULT_KEY, "metrics"))


@dataclasses.dataclass(frozen=True)
class ResultReport(Payload):
    """Step 6 reply (record ``fhe-report``): what the client tells the server.

    Attributes
    ----------
    shared : bool
        ``shared``: whether the client's node policy (``fedeval-share-auc``, tightened by run
        config ``fedeval-share-auc``) lets the AUC leave the node; without it nothing else is sent.
    auc : float or None
        ``auc`` in [0, 1] (certified, :func:`flwr_fedeval.fhe.auc.certify`).
    resolution_bound : float or None
        ``resolution-bound`` ≥ 0, the bound of the N-point approximation (``|AUC − auc|``).
    accuracy, precision, recall, f1 : float or None
        At the metrics threshold (semi-honest only); ``nan`` where a ratio is undefined; all
        four or none.
    status : str
        ``status``, always ``"ok"`` (a failure is an error reply).
    """

    LABEL = "FHE result report"
    shared: bool
    auc: float | None = None
    resolution_bound: float | None = None
    accuracy: float | None = None
    precision: float | None = None
    recall: float | None = None
    f1: float | None = None
    status: str = "ok"

    @property
    def threshold_metrics(self) -> dict[str, float] | None:
        """``{"accuracy", "precision", "recall", "f1"}`` if reported, else ``None``."""
        values = (self.accuracy, self.precision, self.recall, self.f1)
        return None if self.accuracy is None else dict(zip(METRICS, values))  # type: ignore[arg-type]

    def _to_record(self) -> RecordDict:
        metrics = dict(zip(METRICS, (self.accuracy, self.precision, self.recall, self.f1)))
        return RecordDict({REPORT_KEY: config_of({"status": self.status, "shared": self.shared, "auc": self.auc,
                                                  "resolution-bound": self.resolution_bound, **metrics})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> ResultReport:
        rec = config_record(content, REPORT_KEY)
        status = config_field(rec, REPORT_KEY, "status", str, choices=("ok",))
        accuracy, precision, recall, f1 = metrics = [_optional_float(rec, k, nan=True) for k in METRICS]
        if len({m is None for m in metrics}) > 1:
            missing = [k for k, m in zip(METRICS, metrics) if m is None]
            raise MalformedMessage(f"{REPORT_KEY}.{missing[0]}", "missing (all four threshold metrics or none)")
        return cls(config_field(rec, REPORT_KEY, "shared", bool),
                   _optional_float(rec, "auc", low=0.0, high=1.0),
                   _optional_float(rec, "resolution-bound", low=0.0), accuracy, precision, recall, f1,
                   status=status)


PUBKEY = Step("step 1 (public keys)", "query.fhe_pubkey", "client", PubkeyRequest, PubkeyReply)
KEYGEN = Step("step 2 (key setup)", "query.fhe_keygen", "key-holder", KeygenRequest, KeygenReply)
COUNTS = Step("steps 3-4 (encrypted counts)", "evaluate.fhe_counts", "client", CountsRequest, CountsReply)
RESULT = Step("step 6 (clients decrypt)", "query.fhe_result", "client", ResultRequest, ResultReport)
#: The step table of the phase.
STEPS = (PUBKEY, KEYGEN, COUNTS, RESULT)
