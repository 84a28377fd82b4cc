"""Authenticated xMK-CKKS key sets: signed commit-then-reveal of the shares b_i.

The xMK-CKKS papers (Ma et al. 2022; Walskaar et al. 2023, Eq. 1) let the
server sum the shares b_i = -s_i·a + e_i into the joint key b. Against a
server that deviates (DESIGN.md §7), every member checks instead:

* **who**: each share is bound to a roster member by a signature
  (:mod:`flwr_fedeval.identity`), so the server cannot add or swap a share;
* **when**: each member commits to its share and its X25519 mask key before
  seeing anyone else's, so no member (nor the server for it) can choose a
  share as a function of the others' (the rogue-key attack b_j = b' - Σ b_i);
* **the same set**: every member signs the digest of the key set it saw and
  checks every other member's signature over the same digest, and the mask
  keys are derived from that digest (:mod:`flwr_fedeval.rlwe.masking`).

Protocol for one key set K (cait-sith notation: ★ send, • wait, ▲ check
"or refuse"). Server-chosen values: seed_a, round r; key-set id
``kid = key_set_id(params, seed_a)``.

1. **Commit** (``query.xmk_keygen``). Each member i:
   ▲ the request's kid equals key_set_id(params, seed_a), params is a
   128-bit set, and i has not committed for this kid before;
   draws s_i, b_i = -s_i·a + e_i (Eq. 1) and an X25519 pair (x_i, X_i);
   h_i = :func:`commitment` (kid, b_i, X_i);
   ★ (name_i, h_i, sig_i) with sig_i = Sign_i("xmkckks", kid, r,
   "share-commitment", h_i).
2. **Reveal** (``query.xmk_reveal``). • the list [(name_j, h_j, sig_j)]; i:
   ▲ (:func:`check_commitments`) every name is in the roster, names and
   commitments are distinct, every sig_j verifies for (kid, r), i is listed
   with its own h_i, and |K| >= i's floor;
   ▲ the server's mask degree k gives at least i's floor of neighbours
   (:func:`~flwr_fedeval.rlwe.masking.check_mask_degree`);
   T = :func:`transcript_digest` (params, kid, seed_a, r, k, scale, bound B,
   threshold t, limbs L', sorted (name, h)): every public parameter of the key set;
   ▲ i reveals at most once per key set;
   ★ (b_i, X_i, Sign_i("xmkckks", kid, r, "key-set", T)).
3. **Encrypt** (``train``). • every member's (b_j, X_j, transcript sig_j); i:
   ▲ (:func:`open_key_set`) the members are exactly K, each (b_j, X_j)
   matches h_j, each b_j is a canonical single share;
   ▲ (:func:`check_transcript_signatures`) every member signed the same T;
   b = Σ b_j; masks from X_j of i's neighbours in the mask graph of
   degree k derived from T (:func:`~flwr_fedeval.rlwe.masking.mask_neighbours`).
   Before it (step 1c) each member seals its Shamir shares of s_i,
   x_i and its self-mask seed to every member (:func:`seal_shares`: AES-GCM
   under HKDF(X25519(x_i, X_j)) with its own label, AAD = kid, round, sender,
   recipient) and opens the ones addressed to it (:func:`open_shares`).
4. **Contributors** (``query.xmk_contributors``): each member signs
   (kid, r, model hash, C) once per key set and round (:func:`sign_contributors`);
   a decryptor ▲ t such signatures over the same C (:func:`check_contributor_signatures`).

Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from flwr_fedeval.identity import IdentityError, NodeIdentity, Roster, sign_key, verify_key

from . import masking
from .params import ParameterSet
from .xmkckks import PublicKey, aggregate_public_keys

__all__ = [
    "PROTOCOL",
    "ROLE_COMMITMENT",
    "ROLE_CONTRIBUTORS",
    "ROLE_KEY_SET",
    "ROLE_CAPSULE",
    "capsule_digest",
    "check_capsule_signature",
    "check_contributor_signatures",
    "sign_capsule",
    "contributors_digest",
    "open_shares",
    "seal_shares",
    "sign_contributors",
    "KeySetError",
    "key_set_id",
    "commitment",
    "sign_commitment",
    "check_commitments",
    "transcript_digest",
    "transcript_of",
    "transcript_parameters",
    "sign_transcript",
    "check_transcript_signatures",
    "open_key_set",
]

#: ``protocol`` field of every signed statement (:func:`flwr_fedeval.identity.key_statement`).
PROTOCOL = "xmkckks"
ROLE_COMMITMENT = "share-commitment"
ROLE_KEY_SET = "key-set"
_ID_DOMAIN = b"flwr-fedeval/xmkckks/key-set-id/v1"
_COMMIT_DOMAIN = b"flwr-fedeval/xmkckks/share-commitment/v1"
_TRANSCRIPT_DOMAIN = b"flwr-fedeval/xmkckks/key-set-transcript/v3"  # v3: binds the bulk mode and the KAHE set
_CONTRIBUTORS_DOMAIN = b"flwr-fedeval/xmkckks/contributors/v1"
#: The HKDF info label of the share boxes (its own: a box key never equals a mask key).
_SEAL_LABEL = b"flwr-fedeval/xmkckks/share-seal/v1"
ROLE_CONTRIBUTORS = "contributors"
ROLE_CAPSULE = "key-capsule"
_CAPSULE_DOMAIN = b"flwr-fedeval/xmkckks/key-capsule-c1/v1"
_NONCE_BYTES = 12
DIGEST_BYTES = 32


class KeySetError(ValueError):
    """A member refuses a key set (the message says which member and what failed)."""


def _lp(data: bytes) -> bytes:
    return struct.pack(">Q", len(data)) + bytes(data)


def key_set_id(params: ParameterSet, seed_a: bytes) -> str:
    """Key-set id: the first 32 hex digits of SHA-256(domain, params id, seed_a).

    Binds the id to the parameter set and the public polynomial a, so one
    signature over the id covers both.

    Raises
    ------
    KeySetError
        If ``seed_a`` is not 32 bytes.
    """
    if not isinstance(seed_a, (bytes, bytearray)) or len(seed_a) != 32:
        raise KeySetError("seed-a must be 32 bytes")
    return hashlib.sha256(_ID_DOMAIN + _lp(params.name.encode()) + _lp(seed_a)).hexdigest()[:32]


def commitment(key_id: str, public_share: bytes, mask_key: bytes) -> bytes:
    """h_i = SHA-256(domain, kid, b_i bytes, X_i): the binding commitment to a member's keys (32 bytes)."""
    return hashlib.sha256(
        _COMMIT_DOMAIN + _lp(key_id.encode()) + _lp(public_share) + _lp(mask_key)
    ).digest()


def sign_commitment(identity: NodeIdentity, *, key_id: str, round_: int, commitment_: bytes) -> bytes:
    """Sign_i("xmkckks", kid, r, "share-commitment", h_i)."""
    return sign_key(identity, protocol=PROTOCOL, session=key_id, round=round_, role=ROLE_COMMITMENT,
                    key=commitment_)


def check_commitments(
    roster: Roster,
    entries: Sequence[tuple[str, bytes, bytes]],
    *,
    key_id: str,
    round_: int,
    own_name: str,
    own_commitment: bytes,
    floor: int,
) -> tuple[tuple[str, bytes], ...]:
    """Step 2 ▲: check the relayed commitments; returns the members sorted by name.

    Parameters
    ----------
    roster : Roster
    entries : sequence of (name, commitment, signature)
        As relayed by the server; this member's own entry included.
    key_id : str
    round_ : int
        The round the commitments were signed for.
    own_name : str
    own_commitment : bytes
        This member's h_i (from its state, not from the server).
    floor : int
        This member's minimum key-set size (>= 2).

    Returns
    -------
    tuple of (name, commitment), sorted by name

    Raises
    ------
    flwr_fedeval.identity.IdentityError
        A name not in the roster or a signature that does not verify.
    KeySetError
        Duplicate names or commitments, this member missing or listed with
        another commitment, or fewer members than ``floor``.
    """
    members: dict[str, bytes] = {}
    for entry in entries:
        if len(entry) != 3:
            raise KeySetError("every key-set entry needs a name, a commitment and a signature")
        name, h, sig = entry
        if not isinstance(name, str) or not isinstance(h, (bytes, bytearray)) or len(h) != DIGEST_BYTES:
            raise KeySetError(f"entry of {name!r}: commitment must be {DIGEST_BYTES} bytes")
        if name in members:
            raise KeySetError(f"key set {key_id} lists {name!r} twice")
        verify_key(roster, name, sig, protocol=PROTOCOL, session=key_id, round=round_, role=ROLE_COMMITMENT,
                   key=bytes(h))
        if bytes(h) in members.values():
            raise KeySetError(f"key set {key_id}: {name!r} relays another member's commitment")
        members[name] = bytes(h)
    if own_name not in members:
        raise KeySetError(f"key set {key_id} does not list this member ({own_name!r})")
    if members[own_name] != bytes(own_commitment):
        raise KeySetError(f"key set {key_id} lists another commitment for this member ({own_name!r})")
    if len(members) < floor:
        raise KeySetError(
            f"key set {key_id} has {len(members)} roster members, this member requires at least {floor}"
        )
    return tuple(sorted(members.items()))


def transcript_parameters(
    params: ParameterSet,
    *,
    key_id: str,
    seed_a: bytes,
    round_: int,
    mask_degree: int = 0,
    scale_bits: int = 0,
    max_abs_value: float = 0.0,
    threshold: int = 0,
    limbs: int = 0,
    decryption_attempts: int = 0,
    bulk: str = "ckks",
    kahe_parameters: bytes = b"",
) -> bytes:
    """The canonical bytes of a key set's public parameters, as the transcript T binds them:
    params, kid, seed_a, r, k, Δ bits, B, t, L', a, bulk, KAHE set (each length-prefixed or fixed-width,
    big-endian).

    The parameter set and a (via kid, seed_a), the first round r, the mask degree k
    (:func:`~flwr_fedeval.rlwe.masking.mask_neighbours`; 0 = complete), the scale 2^scale_bits, the
    value bound B (IEEE-754 binary64) every encrypted value is clipped to, the threshold t of the
    t-out-of-N decryption, the limb count L' that c0 and the decryption shares are switched to before
    sending (:func:`~flwr_fedeval.rlwe.compact.compact_limbs`; 0 in tests that do not use it), a, the
    most active sets A a member gives a decryption share for per round (0 in tests that do not use it),
    the bulk mode (``"kahe"``: the update under KAHE and only its key under xMK-CKKS; ``"ckks"``: every
    weight under xMK-CKKS) and the canonical bytes of the KAHE parameter set
    (:meth:`flwr_fedeval.rlwe.kahe.KaheParameters.to_bytes`; empty in ``"ckks"`` mode).

    Raises
    ------
    KeySetError
        ``bulk`` is not ``"kahe"`` or ``"ckks"``, an integer field is not an integer >= 0, or B is not
        a finite number >= 0.
    """
    if bulk not in ("kahe", "ckks"):
        raise KeySetError(f"bulk must be 'kahe' or 'ckks', got {bulk!r}")
    if isinstance(mask_degree, bool) or not isinstance(mask_degree, int) or mask_degree < 0:
        raise KeySetError(f"mask degree must be an integer >= 0, got {mask_degree!r}")
    for name, value in (("scale bits", scale_bits), ("threshold", threshold), ("limbs", limbs),
                        ("decryption attempts", decryption_attempts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise KeySetError(f"{name} must be an integer >= 0, got {value!r}")
    if not np.isfinite(max_abs_value) or max_abs_value < 0:
        raise KeySetError(f"the value bound must be a finite number >= 0, got {max_abs_value!r}")
    return b"".join([_lp(params.name.encode()), _lp(key_id.encode()), _lp(seed_a),
                     struct.pack(">Q", round_), struct.pack(">Q", mask_degree), struct.pack(">Q", scale_bits),
                     struct.pack(">d", float(max_abs_value)), struct.pack(">Q", threshold),
                     struct.pack(">Q", limbs), struct.pack(">Q", decryption_attempts), _lp(bulk.encode()),
                     _lp(bytes(kahe_parameters))])


def transcript_of(parameters: bytes, members: Sequence[tuple[str, bytes]]) -> bytes:
    """T = SHA-256(domain, ``parameters`` (:func:`transcript_parameters`), (name, h) sorted by name):
    the key set every member must agree on, signed by every member, so the server cannot vary any
    public parameter per request."""
    parts = [_TRANSCRIPT_DOMAIN, bytes(parameters), struct.pack(">Q", len(members))]
    for name, h in sorted(members):
        parts += [_lp(name.encode()), _lp(h)]
    return hashlib.sha256(b"".join(parts)).digest()


def transcript_digest(
    params: ParameterSet,
    *,
    key_id: str,
    seed_a: bytes,
    round_: int,
    members: Sequence[tuple[str, bytes]],
    mask_degree: int = 0,
    scale_bits: int = 0,
    max_abs_value: float = 0.0,
    threshold: int = 0,
    limbs: int = 0,
    decryption_attempts: int = 0,
    bulk: str = "ckks",
    kahe_parameters: bytes = b"",
) -> bytes:
    """T of loose parameters: :func:`transcript_of` of :func:`transcript_parameters` (the protocol builds
    T from one :class:`flwr_fedeval.secagg.KeySetParameters`; this form serves tests and benchmarks).

    Raises
    ------
    KeySetError
        As :func:`transcript_parameters`.
    """
    return transcript_of(transcript_parameters(
        params, key_id=key_id, seed_a=seed_a, round_=round_, mask_degree=mask_degree, scale_bits=scale_bits,
        max_abs_value=max_abs_value, threshold=threshold, limbs=limbs, decryption_attempts=decryption_attempts,
        bulk=bulk, kahe_parameters=kahe_parameters), members)


def sign_transcript(identity: NodeIdentity, *, key_id: str, round_: int, digest: bytes) -> bytes:
    """Sign_i("xmkckks", kid, r, "key-set", T)."""
    return sign_key(identity, protocol=PROTOCOL, session=key_id, round=round_, role=ROLE_KEY_SET, key=digest)


def check_transcript_signatures(
    roster: Roster,
    signatures: Mapping[str, bytes],
    *,
    members: Sequence[str],
    key_id: str,
    round_: int,
    digest: bytes,
) -> None:
    """Step 3 ▲: every member signed the transcript digest T this member computed.

    Raises
    ------
    KeySetError
        A member's signature is missing, or signatures of non-members are relayed.
    flwr_fedeval.identity.IdentityError
        A signature does not verify (that member saw another key set, or the
        server forged it); the message names the member.
    """
    extra = sorted(set(signatures) - set(members))
    if extra:
        raise KeySetError(f"key set {key_id}: transcript signatures of non-members {extra}")
    for name in members:
        if name not in signatures:
            raise KeySetError(f"key set {key_id}: member {name!r} has not confirmed the key set")
        try:
            verify_key(roster, name, signatures[name], protocol=PROTOCOL, session=key_id, round=round_,
                       role=ROLE_KEY_SET, key=digest)
        except IdentityError as exc:
            raise IdentityError(f"member {name!r} did not confirm the key set this member saw: {exc}") from None


def open_key_set(
    params: ParameterSet,
    *,
    key_id: str,
    members: Sequence[tuple[str, bytes]],
    openings: Mapping[str, tuple[bytes, bytes]],
) -> tuple[PublicKey, dict[str, bytes]]:
    """Step 3 ▲: check every revealed (b_j, X_j) against h_j; the joint key and the mask keys.

    Parameters
    ----------
    params : ParameterSet
    key_id : str
    members : sequence of (name, commitment)
        As checked in step 2 (this member's stored copy).
    openings : mapping of name to (public share bytes, X25519 mask key)
        As relayed by the server.

    Returns
    -------
    (PublicKey, dict of name to mask key)
        b = Σ b_j (Eq. 1) with ``num_shares = |K|``; every member's X_j.

    Raises
    ------
    KeySetError
        Missing or extra members, an opening that does not match its
        commitment, or a share that is not a canonical single share.
    """
    names = [name for name, _ in members]
    missing = sorted(set(names) - set(openings))
    extra = sorted(set(openings) - set(names))
    if missing or extra:
        raise KeySetError(f"key set {key_id}: openings missing for {missing}, not members: {extra}")
    shares, mask_keys = [], {}
    for name, h in members:
        share, mask_key = openings[name]
        share, mask_key = bytes(share), bytes(mask_key)
        if commitment(key_id, share, mask_key) != h:
            raise KeySetError(
                f"key set {key_id}: the share or mask key of {name!r} does not match its signed commitment"
            )
        try:
            pk = PublicKey.from_bytes(share, params)
        except ValueError as exc:
            raise KeySetError(f"key set {key_id}: share of {name!r} is malformed: {exc}") from None
        if pk.num_shares != 1:
            raise KeySetError(f"key set {key_id}: share of {name!r} claims {pk.num_shares} shares, expected 1")
        if len(mask_key) != masking.MASK_KEY_BYTES:
            raise KeySetError(f"key set {key_id}: mask key of {name!r} is not {masking.MASK_KEY_BYTES} bytes")
        shares.append(pk)
        mask_keys[name] = mask_key
    joint = aggregate_public_keys(shares)
    if not np.any(joint.b):
        raise KeySetError(f"key set {key_id}: the shares sum to zero")
    return joint, mask_keys


# ------------------------------------------------------------------ step 1c: sealed shares
def _seal_aad(key_id: str, round_: int, sender: str, recipient: str) -> bytes:
    return _SEAL_LABEL + _lp(key_id.encode()) + struct.pack(">Q", round_) + _lp(sender.encode()) + \
        _lp(recipient.encode())


def _box_key(own_private: bytes, peer_public: bytes, *, own_name: str, peer_name: str, transcript: bytes,
             round_: int) -> AESGCM:
    """AES-256-GCM under HKDF(X25519(x_i, X_j)) with the share-seal label (:func:`masking.pairwise_mask_key`)."""
    context = _SEAL_LABEL + masking.mask_context(transcript, round_)
    return AESGCM(masking.pairwise_mask_key(own_private, peer_public, own_name=own_name, peer_name=peer_name,
                                            context=context))


def seal_shares(parts: Sequence[bytes], *, key_id: str, round_: int, transcript: bytes, sender: str,
                own_private: bytes, recipient: str, recipient_public: bytes) -> bytes:
    """Seal a member's shares for one recipient: nonce (12 bytes) || AES-256-GCM(length-prefixed parts).

    The key comes from the pairwise X25519 agreement of the mask keys opened in the reveal (both
    signed in T), through HKDF with its own info label; the AAD binds (kid, round, sender,
    recipient), so a box cannot be relayed to another member, round or key set. Source: Bonawitz
    et al. 2017, §4 (the shares are sent encrypted to each peer).

    Raises
    ------
    flwr_fedeval.rlwe.masking.MaskKeyError
        A key is malformed or the agreement fails.
    """
    box = _box_key(own_private, recipient_public, own_name=sender, peer_name=recipient, transcript=transcript,
                   round_=round_)
    nonce = secrets.token_bytes(_NONCE_BYTES)
    payload = b"".join(_lp(bytes(p)) for p in parts)
    return nonce + box.encrypt(nonce, payload, _seal_aad(key_id, round_, sender, recipient))


def open_shares(sealed: bytes, *, key_id: str, round_: int, transcript: bytes, sender: str, sender_public: bytes,
                recipient: str, own_private: bytes, count: int) -> list[bytes]:
    """Open a box of :func:`seal_shares` from ``sender``: its ``count`` parts.

    Raises
    ------
    KeySetError
        The box does not open (forged, altered, or sealed for another member, round or key set),
        or does not hold exactly ``count`` parts.
    """
    if len(sealed) <= _NONCE_BYTES:
        raise KeySetError(f"the shares of {sender!r} are not a sealed box")
    box = _box_key(own_private, sender_public, own_name=recipient, peer_name=sender, transcript=transcript,
                   round_=round_)
    try:
        payload = box.decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:],
                              _seal_aad(key_id, round_, sender, recipient))
    except InvalidTag:
        raise KeySetError(f"the shares of {sender!r} do not open: forged, altered or sealed for another member, "
                          f"round or key set") from None
    parts, pos = [], 0
    while pos < len(payload):
        if pos + 8 > len(payload):
            raise KeySetError(f"the shares of {sender!r} are truncated")
        (length,) = struct.unpack(">Q", payload[pos:pos + 8])
        if pos + 8 + length > len(payload):
            raise KeySetError(f"the shares of {sender!r} are truncated")
        parts.append(payload[pos + 8:pos + 8 + length])
        pos += 8 + length
    if len(parts) != count:
        raise KeySetError(f"the box of {sender!r} holds {len(parts)} shares, expected {count}")
    return parts


# ------------------------------------------------------------------ step 2b: the contributor set
def contributors_digest(*, key_id: str, round_: int, model_hash: bytes, contributors: Sequence[str]) -> bytes:
    """SHA-256(domain, kid, r, model hash, C sorted): what each member signs once per key set and round."""
    parts = [_CONTRIBUTORS_DOMAIN, _lp(key_id.encode()), struct.pack(">Q", round_), _lp(bytes(model_hash)),
             struct.pack(">Q", len(contributors))]
    parts += [_lp(name.encode()) for name in sorted(contributors)]
    return hashlib.sha256(b"".join(parts)).digest()


def sign_contributors(identity: NodeIdentity, *, key_id: str, round_: int, model_hash: bytes,
                      contributors: Sequence[str]) -> bytes:
    """Sign_i("xmkckks", kid, r, "contributors", :func:`contributors_digest`)."""
    digest = contributors_digest(key_id=key_id, round_=round_, model_hash=model_hash, contributors=contributors)
    return sign_key(identity, protocol=PROTOCOL, session=key_id, round=round_, role=ROLE_CONTRIBUTORS, key=digest)


def check_contributor_signatures(roster: Roster, signatures: Mapping[str, bytes], *, members: Sequence[str],
                                 key_id: str, round_: int, model_hash: bytes, contributors: Sequence[str],
                                 threshold: int) -> None:
    """Step 3 ▲: at least ``threshold`` distinct members of K signed this contributor set C.

    With t > N/2 two different contributor sets of one key set and round cannot both gather t
    signatures from honest members (each signs once), so at most one sum is ever decrypted.

    Raises
    ------
    KeySetError
        A signer that is not a member of K, or fewer than ``threshold`` signatures.
    flwr_fedeval.identity.IdentityError
        A signature that does not verify (the member signed another C, or none).
    """
    extra = sorted(set(signatures) - set(members))
    if extra:
        raise KeySetError(f"key set {key_id}: contributor-set signatures of non-members {extra}")
    if len(signatures) < threshold:
        raise KeySetError(f"key set {key_id}: {len(signatures)} members signed the contributor set, "
                          f"the threshold is {threshold}")
    digest = contributors_digest(key_id=key_id, round_=round_, model_hash=model_hash, contributors=contributors)
    for name, signature in signatures.items():
        try:
            verify_key(roster, name, signature, protocol=PROTOCOL, session=key_id, round=round_,
                       role=ROLE_CONTRIBUTORS, key=digest)
        except IdentityError as exc:
            raise IdentityError(f"member {name!r} did not sign this contributor set: {exc}") from None


# ------------------------------------------------------------------ step 2: the key capsule's c1
def capsule_digest(*, transcript: bytes, round_: int, model_hash: bytes, c1: bytes) -> bytes:
    """SHA-256(domain, T, r, model hash, c1): what a contributor signs for its key capsule (KAHE mode).

    ``c1`` is the canonical encoding of the capsule's c1 at the full L limbs
    (:func:`flwr_fedeval.rlwe.polys_to_bytes`); binding T, the round and the model hash makes a capsule
    of another key set, round or model fail the decryptors' check.
    """
    parts = [_CAPSULE_DOMAIN, _lp(bytes(transcript)), struct.pack(">Q", round_), _lp(bytes(model_hash)),
             _lp(bytes(c1))]
    return hashlib.sha256(b"".join(parts)).digest()


def sign_capsule(identity: NodeIdentity, *, key_id: str, transcript: bytes, round_: int, model_hash: bytes,
                 c1: bytes) -> bytes:
    """Sign_i("xmkckks", kid, r, "key-capsule", :func:`capsule_digest`)."""
    digest = capsule_digest(transcript=transcript, round_=round_, model_hash=model_hash, c1=c1)
    return sign_key(identity, protocol=PROTOCOL, session=key_id, round=round_, role=ROLE_CAPSULE, key=digest)


def check_capsule_signature(roster: Roster, name: str, signature: bytes, *, key_id: str, transcript: bytes,
                            round_: int, model_hash: bytes, c1: bytes) -> None:
    """Step 3 ▲ (KAHE mode): member ``name`` signed this capsule c1 for (T, round, model hash).

    Raises
    ------
    flwr_fedeval.identity.IdentityError
        The signature does not verify (another c1, round, key set or model, or not the member's key).
    """
    digest = capsule_digest(transcript=transcript, round_=round_, model_hash=model_hash, c1=c1)
    try:
        verify_key(roster, name, signature, protocol=PROTOCOL, session=key_id, round=round_, role=ROLE_CAPSULE,
                   key=digest)
    except IdentityError as exc:
        raise IdentityError(f"member {name!r} did not sign this key capsule c1: {exc}") from None
