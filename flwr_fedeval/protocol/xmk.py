"""xMK-CKKS secure aggregation: the step table and one payload class per request and reply.

The protocol (Walskaar, Tran, Catak 2023; Ma et al. 2022; hardened with signed
commit-then-reveal key sets and pairwise masks, DESIGN.md §3 and §7):

==========  ======================  =========  ==========================================
step        message type            request    reply
==========  ======================  =========  ==========================================
1a          ``query.xmk_keygen``        KeygenRequest   KeygenReply (signed commitment h_i)
1b          ``query.xmk_reveal``        RevealRequest   RevealReply (b_i, X_i, signature over T;
                                                    T binds every public parameter)
1c          ``query.xmk_shares``        SharesRequest   SharesReply (Shamir shares of s_i, x_i and
                                                    the self-mask seed, sealed to each member)
2           ``train``                   TrainRequest    TrainReply (Enc(n_i·Δw_i, n_i) + r_i + u_i,
                                                    c0 switched to L' limbs, c1 exact)
2b          ``query.xmk_contributors``  ContributorsRequest  ContributorsReply (signature over C)
3           ``query.xmk_pdec``          PdecRequest     PdecReply (D_j = λ_j·sk_j·C1 + e*_j plus
            (attempt k ∈ 1..a)                      pairwise masks over A: at L' for k = 1, at the
                                                    full L for k ≥ 2; and the seed / mask-key
                                                    shares for C / K∖C)
==========  ======================  =========  ==========================================

No retries (a second update of one model gives the server a difference): a client trains at most once
per global model (:func:`model_hash`) and round,
signs one contributor set per key set and round, and gives one masked decryption share per active set A
and per attempt index k ∈ 1..a, for at most a (signed in T) active sets and one C1 per key set and round.
Only attempt k = 1 is modulus-switched before the masks are added; a retry (k ≥ 2) is sent at the full L
limbs so that its masked shares sum to exactly s·C1 + Σ e*_j (:mod:`flwr_fedeval.rlwe.threshold`).

Every record key and field name of the protocol is spelled in this module only; the
server (:mod:`flwr_fedeval.strategies.xmk_fedavg`) and the client
(:mod:`flwr_fedeval.clients.xmkckks`) build and parse their messages through these
classes. ``from_record`` checks the wire format (types, lengths, aligned lists, 1-D
uint8 byte arrays); what needs the client's state or the parameter set (signatures,
commitments, the canonical encoding of C1, the key set's members) is checked by the
client and server themselves.

Step 2 is Flower's own ``train`` message: :class:`TrainRequest` is the ``"xmk"``
ConfigRecord added to the model and train config, :class:`TrainReply` the ciphertext
record beside the train reply's metrics; the client's ``@app.train()`` handler answers
it, wrapped by ``xmkckks_mod`` (a :class:`ModStep`, which :func:`register` skips).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from flwr_fedeval.protocol._base import (
    MalformedMessage,
    Payload,
    Step,
    array_bytes,
    array_bytes_view,
    array_record,
    bytes_array,
    config_bytes,
    config_field,
    config_list,
    config_record,
)
from flwr_fedeval.secagg import BULK_MODES, KeySetParameters, messages

__all__ = [
    "BULK_MODES",
    "CONTRIBUTORS",
    "KEYGEN",
    "PDEC",
    "SHARES",
    "ContributorsReply",
    "ContributorsRequest",
    "SharesReply",
    "SharesRequest",
    "model_hash",
    "QUERY_STEPS",
    "REVEAL",
    "STEPS",
    "TRAIN",
    "KeygenReply",
    "KeygenRequest",
    "ModStep",
    "PdecReply",
    "PdecRequest",
    "RevealReply",
    "RevealRequest",
    "TrainReply",
    "TrainRequest",
]

#: Message types of the query steps (1a, 1b, 3).
QUERY_XMK_KEYGEN = "query.xmk_keygen"
QUERY_XMK_REVEAL = "query.xmk_reveal"
QUERY_XMK_PDEC = "query.xmk_pdec"
QUERY_XMK_SHARES = "query.xmk_shares"
QUERY_XMK_CONTRIBUTORS = "query.xmk_contributors"
#: Record keys: the ConfigRecord of every request and of the replies of step 1,
#: the ciphertext (reply of step 2), C1 (request of step 3), D_i (reply of step 3).
XMK_CONFIG_KEY = "xmk"
XMK_CIPHERTEXT_KEY = "xmk-ciphertext"
XMK_C1_KEY = "xmk-c1"
XMK_SHARE_KEY = "xmk-share"
#: Record key of the key capsule (KAHE mode: the xMK-CKKS ciphertext of the KAHE key k_i, reply of step 2).
XMK_CAPSULE_KEY = "xmk-capsule"
#: The bulk modes: the update under KAHE and its key under xMK-CKKS, or every weight under xMK-CKKS.
#: Flower's key of a train reply's MetricRecord (``FedAvg``'s default, ``messages.METRICS_KEY``).
_METRICS_KEY = "metrics"

#: Bytes of a seed of the public polynomial a, of a commitment h_i and of a transcript digest T (SHA-256),
#: of an X25519 mask key (RFC 7748).
SEED_BYTES = DIGEST_BYTES = MASK_KEY_BYTES = 32
_MAX_ROUND = 2**63 - 1

_K = XMK_CONFIG_KEY
_MODEL_DOMAIN = b"flwr-fedeval/xmkckks/global-model/v1"


def model_hash(arrays: ArrayRecord) -> bytes:
    """SHA-256 of a global model: every array's name, dtype, shape and bytes, in the record's order.

    The no-retry rule's key: a client gives at most one update per model hash, whatever
    the key set. 32 bytes.
    """
    h = hashlib.sha256(_MODEL_DOMAIN)
    for name, array in arrays.items():
        a = array.numpy()
        for part in (name.encode(), str(a.dtype.str).encode(), repr(tuple(a.shape)).encode()):
            h.update(struct.pack(">Q", len(part)) + part)
        data = np.ascontiguousarray(a)  # the bytes of tobytes() (C order), hashed without a copy
        h.update(struct.pack(">Q", data.nbytes))
        h.update(data.data)
    return h.digest()


# ------------------------------------------------------------------ generic helpers (this protocol's)
def _bulk(rec: ConfigRecord) -> str:
    """``bulk``: one of :data:`BULK_MODES`."""
    bulk = config_field(rec, _K, "bulk", str)
    if bulk not in BULK_MODES:
        raise MalformedMessage(f"{_K}.bulk", f"must be one of {BULK_MODES}, got {bulk!r}")
    return bulk


def _round(rec: ConfigRecord) -> int:
    """``round``: the training round, an int in [0, 2**63)."""
    return config_field(rec, _K, "round", int, minimum=0, maximum=_MAX_ROUND)


def _aligned(**lists: list[Any]) -> None:
    """The lists of one key set are aligned (one entry per member).

    Raises
    ------
    MalformedMessage
        Naming the first list whose length differs from the first one's.
    """
    names = list(lists)
    first = len(lists[names[0]])
    for name in names[1:]:
        if len(lists[name]) != first:
            raise MalformedMessage(f"{_K}.{name}", f"{len(lists[name])} items, but {names[0]} has {first}: "
                                                  f"{', '.join(names)} must align, one entry per member")


def _config(**fields: Any) -> RecordDict:
    """The ``"xmk"`` ConfigRecord of ``fields`` (``key_id`` → ``"key-id"``; tuples sent as lists)."""
    return RecordDict({_K: ConfigRecord({k.replace("_", "-"): list(v) if isinstance(v, tuple) else v
                                         for k, v in fields.items()})})


def _blob(name: str, data: bytes | memoryview) -> ArrayRecord:
    """An ArrayRecord of one byte string (a 1-D uint8 array)."""
    return ArrayRecord({name: bytes_array(data)})


# ------------------------------------------------------------------ step 1a
@dataclasses.dataclass(frozen=True)
class KeygenRequest(Payload, messages.KeygenRequest):
    """Step 1a request (``query.xmk_keygen``), record ``"xmk"``.

    Attributes
    ----------
    params : str
        Name of the RLWE parameter set (:data:`flwr_fedeval.rlwe.PARAMETER_SETS`).
    seed_a : bytes
        32-byte seed of the public polynomial a (Walskaar et al. 2023, Eq. 1).
    key_id : str
        Key-set id, H(params, seed-a) (:func:`flwr_fedeval.rlwe.keyset.key_set_id`).
    round : int
        Training round, in [0, 2**63).
    """

    LABEL = "xMK key generation request"

    def _to_record(self) -> RecordDict:
        return _config(params=self.params, seed_a=self.seed_a, key_id=self.key_id, round=self.round)

    @classmethod
    def _from_record(cls, content: RecordDict) -> KeygenRequest:
        rec = config_record(content, _K)
        return cls(config_field(rec, _K, "params", str), config_bytes(rec, _K, "seed-a", length=SEED_BYTES),
                   config_field(rec, _K, "key-id", str), _round(rec))


@dataclasses.dataclass(frozen=True)
class KeygenReply(Payload, messages.KeygenReply):
    """Step 1a reply, record ``"xmk"``: a signed commitment, neither b_i nor X_i.

    Attributes
    ----------
    key_id : str
        The key-set id of the request.
    signer : str
        The member's roster name.
    commitment : bytes
        h_i = SHA-256(domain, kid, b_i, X_i), 32 bytes (:func:`flwr_fedeval.rlwe.keyset.commitment`).
    signature : bytes
        Ed25519 signature of the key statement over h_i (:func:`flwr_fedeval.rlwe.keyset.sign_commitment`).
    """

    LABEL = "xMK key generation reply"

    def _to_record(self) -> RecordDict:
        return _config(key_id=self.key_id, signer=self.signer, commitment=self.commitment, signature=self.signature)

    @classmethod
    def _from_record(cls, content: RecordDict) -> KeygenReply:
        rec = config_record(content, _K)
        return cls(config_field(rec, _K, "key-id", str), config_field(rec, _K, "signer", str),
                   config_bytes(rec, _K, "commitment", length=DIGEST_BYTES), config_bytes(rec, _K, "signature"))


# ------------------------------------------------------------------ step 1b
@dataclasses.dataclass(frozen=True)
class RevealRequest(Payload, messages.RevealRequest):
    """Step 1b request (``query.xmk_reveal``), record ``"xmk"``: every member's signed commitment.

    Attributes
    ----------
    key_id : str
    round : int
        The round the commitments were signed for.
    signers, commitments, signatures : tuple
        Aligned, one entry per member, as each replied to step 1a: roster names (str),
        32-byte commitments, signatures (bytes; an empty one is refused by the client's check).
    mask_degree : int
        Degree k >= 0 of the mask graph (0 = complete; Bell et al. 2020).
    scale_bits : int
        log2 of the fixed-point scale Δ (>= 1).
    max_abs_value : float
        The value bound B (finite, >= 1): every encrypted value n_i·Δw and n_i is clipped to [-B, B].
    threshold : int
        t of the t-out-of-N threshold decryption (>= 1; each member requires t > N/2).
    limbs : int
        L', the RNS limbs c0 and every decryption share are modulus-switched to before they are sent
        (:func:`flwr_fedeval.rlwe.compact.compact_limbs`; >= 1, each member requires at least the
        fewest its noise budget allows and at most the parameter set's L; c1 stays at L).
    decryption_attempts : int
        a, the most active sets A a member gives a decryption share for per round (>= 1; each member
        requires a <= :data:`flwr_fedeval.rlwe.params.MAX_DECRYPTION_ATTEMPTS`, which the smudging is
        sized for): a decryptor lost during step 3 is replaced within the round, at most a - 1 times.
    bulk : {"kahe", "ckks"}
        How the update travels: ``"kahe"``, under key-additive RLWE with only its key k_i under
        xMK-CKKS (the key capsule; ``max_abs_value`` is then the KAHE clip bound B and the scale and L'
        are the capsule's, for values bounded by the tail of k), or ``"ckks"``, every weight under
        xMK-CKKS (Walskaar et al. 2023).
    fractional_bits : int
        F, the fixed-point fraction bits of the KAHE encoding (>= 1 in ``"kahe"`` mode, 0 in ``"ckks"``).
        Each member derives the KAHE parameter set from (N, B, F) itself
        (:func:`flwr_fedeval.rlwe.kahe.kahe_parameters`) and binds its bytes in T.

    The members sign all of these in the key-set transcript T: the server cannot vary them per
    request. ``from_record`` raises :class:`~flwr_fedeval.protocol.MalformedMessage` for misaligned
    lists, a mask degree that is not an integer >= 0, or a missing or ill-typed public parameter.
    """

    LABEL = "xMK key reveal request"

    @classmethod
    def of(cls, parameters: KeySetParameters, signers: tuple[str, ...], commitments: tuple[bytes, ...],
           signatures: tuple[bytes, ...]) -> RevealRequest:
        """The request relaying the commitments, with the public parameters of ``parameters`` (the members
        sign them in T; seed-a and the parameter set went with step 1a)."""
        return cls(parameters.key_id, parameters.round, signers, commitments, signatures, parameters.mask_degree,
                   parameters.scale_bits, parameters.max_abs_value, parameters.threshold, parameters.limbs,
                   parameters.decryption_attempts, parameters.bulk, parameters.fractional_bits)

    def _to_record(self) -> RecordDict:
        return _config(key_id=self.key_id, round=self.round, signers=self.signers, commitments=self.commitments,
                       signatures=self.signatures, mask_degree=self.mask_degree, scale_bits=self.scale_bits,
                       max_abs_value=self.max_abs_value, threshold=self.threshold, limbs=self.limbs,
                       decryption_attempts=self.decryption_attempts, bulk=self.bulk,
                       fractional_bits=self.fractional_bits)

    @classmethod
    def _from_record(cls, content: RecordDict) -> RevealRequest:
        rec = config_record(content, _K)
        signers = config_list(rec, _K, "signers", str)
        commitments = config_list(rec, _K, "commitments", bytes, item_length=DIGEST_BYTES)
        signatures = config_list(rec, _K, "signatures", bytes)
        _aligned(signers=signers, commitments=commitments, signatures=signatures)
        if "mask-degree" not in rec:
            raise MalformedMessage(f"{_K}.mask-degree", "missing")
        degree = rec["mask-degree"]
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 0:
            raise MalformedMessage(f"{_K}.mask-degree", f"must be an integer >= 0, got {degree!r}")
        bound = config_field(rec, _K, "max-abs-value", float, minimum=1.0)
        if not math.isfinite(bound):
            raise MalformedMessage(f"{_K}.max-abs-value", f"must be finite, got {bound!r}")
        return cls(config_field(rec, _K, "key-id", str), _round(rec), tuple(signers), tuple(commitments),
                   tuple(signatures), degree, config_field(rec, _K, "scale-bits", int, minimum=1), bound,
                   config_field(rec, _K, "threshold", int, minimum=1), config_field(rec, _K, "limbs", int, minimum=1),
                   config_field(rec, _K, "decryption-attempts", int, minimum=1), _bulk(rec),
                   config_field(rec, _K, "fractional-bits", int, minimum=0))


@dataclasses.dataclass(frozen=True)
class RevealReply(Payload, messages.RevealReply):
    """Step 1b reply, record ``"xmk"``: the opening of the commitment and the signed transcript.

    Attributes
    ----------
    key_id, signer : str
    public_share : bytes
        b_i = −s_i·a + e_i (Eq. 1), :meth:`flwr_fedeval.rlwe.PublicKey.to_bytes`.
    mask_key : bytes
        X_i, the member's 32-byte X25519 public mask key.
    transcript : bytes
        T, the 32-byte key-set transcript digest (:func:`flwr_fedeval.rlwe.keyset.transcript_digest`).
    transcript_signature : bytes
        The member's signature over T (:func:`flwr_fedeval.rlwe.keyset.sign_transcript`).
    """

    LABEL = "xMK key reveal reply"

    def _to_record(self) -> RecordDict:
        return _config(key_id=self.key_id, signer=self.signer, public_share=self.public_share,
                       mask_key=self.mask_key, transcript=self.transcript,
                       transcript_signature=self.transcript_signature)

    @classmethod
    def _from_record(cls, content: RecordDict) -> RevealReply:
        rec = config_record(content, _K)
        return cls(config_field(rec, _K, "key-id", str), config_field(rec, _K, "signer", str),
                   config_bytes(rec, _K, "public-share"), config_bytes(rec, _K, "mask-key", length=MASK_KEY_BYTES),
                   config_bytes(rec, _K, "transcript", length=DIGEST_BYTES),
                   config_bytes(rec, _K, "transcript-signature"))


def _openings(request: messages.KeySetOpenings) -> dict[str, Any]:
    """The fields of :class:`~flwr_fedeval.secagg.messages.KeySetOpenings` (steps 1c and 2), for :func:`_config`."""
    return {f.name: getattr(request, f.name) for f in dataclasses.fields(messages.KeySetOpenings)}


def _key_set_lists(rec: ConfigRecord) -> dict[str, list[Any]]:
    """The aligned openings of a key set: signers, public shares, mask keys, transcript signatures."""
    lists = {"signers": config_list(rec, _K, "signers", str),
             "public-shares": config_list(rec, _K, "public-shares", bytes),
             "mask-keys": config_list(rec, _K, "mask-keys", bytes, item_length=MASK_KEY_BYTES),
             "transcript-signatures": config_list(rec, _K, "transcript-signatures", bytes)}
    _aligned(**lists)
    return lists


# ------------------------------------------------------------------ step 1c
@dataclasses.dataclass(frozen=True)
class SharesRequest(Payload, messages.SharesRequest):
    """Step 1c request (``query.xmk_shares``), record ``"xmk"``: every member's opening and signature over T.

    Attributes
    ----------
    params, key_id : str
    round : int
        The round the shares are for (the round of the train request that follows).
    signers, public_shares, mask_keys, transcript_signatures : tuple
        Aligned, one entry per member: roster names, b_j (bytes), X_j (32 bytes), signatures over T.
    """

    LABEL = "xMK key shares request"

    def _to_record(self) -> RecordDict:
        return _config(**_openings(self))

    @classmethod
    def _from_record(cls, content: RecordDict) -> SharesRequest:
        rec = config_record(content, _K)
        signers, shares, mask_keys, signatures = (tuple(v) for v in _key_set_lists(rec).values())
        return cls(config_field(rec, _K, "params", str), config_field(rec, _K, "key-id", str), _round(rec),
                   signers, shares, mask_keys, signatures)


@dataclasses.dataclass(frozen=True)
class SharesReply(Payload, messages.SharesReply):
    """Step 1c reply, record ``"xmk"``: this member's shares, sealed to each other member.

    Attributes
    ----------
    key_id, signer : str
    round : int
    recipients, sealed_shares : tuple
        Aligned: every other member's name and the AES-GCM box of its shares of s_i, x_i and the
        self-mask seed (:func:`flwr_fedeval.rlwe.keyset.seal_shares`).
    """

    LABEL = "xMK key shares reply"

    def _to_record(self) -> RecordDict:
        return _config(key_id=self.key_id, signer=self.signer, round=self.round, recipients=self.recipients,
                       sealed_shares=self.sealed_shares)

    @classmethod
    def _from_record(cls, content: RecordDict) -> SharesReply:
        rec = config_record(content, _K)
        recipients = config_list(rec, _K, "recipients", str)
        sealed = config_list(rec, _K, "sealed-shares", bytes)
        _aligned(**{"recipients": recipients, "sealed-shares": sealed})
        return cls(config_field(rec, _K, "key-id", str), config_field(rec, _K, "signer", str), _round(rec),
                   tuple(recipients), tuple(sealed))


# ------------------------------------------------------------------ step 2
@dataclasses.dataclass(frozen=True)
class TrainRequest(Payload, messages.TrainRequest):
    """Step 2 request: the ``"xmk"`` ConfigRecord of the key set, added to Flower's ``train`` message
    (beside the model's ArrayRecord and the train config, which are Flower's).

    Attributes
    ----------
    params, key_id : str
    round : int
        The training round; a client encrypts at most once per key set and round.
    signers, public_shares, mask_keys, transcript_signatures : tuple
        Aligned, one entry per member: roster names, b_j (bytes), X_j (32 bytes), signatures over T.
    num_clients : int
        |K|, the number of members (>= 1).
    senders, sealed_shares : tuple
        The member's inbox of step 1c, aligned: each member's name and its sealed shares for this member
        (:class:`SharesReply`). The scale and the value bound are not here: they are in T only.
    """

    LABEL = "xMK train request"

    @staticmethod
    def carried_by(content: RecordDict) -> bool:
        """Whether a ``train`` message carries the key set (else it is ordinary, plaintext training)."""
        return _K in content

    @staticmethod
    def without(content: RecordDict) -> RecordDict:
        """``content`` without the key set's ``"xmk"`` ConfigRecord: Flower's own ``train`` message (the
        model's ArrayRecord, the train config and any other record), as inner mods such as Flower's
        ``fixedclipping_mod`` expect it (exactly one ArrayRecord and one ConfigRecord)."""
        return RecordDict({key: record for key, record in content.items() if key != _K})

    def _to_record(self) -> RecordDict:
        return _config(**_openings(self), num_clients=self.num_clients, senders=self.senders,
                       sealed_shares=self.sealed_shares)

    @classmethod
    def _from_record(cls, content: RecordDict) -> TrainRequest:
        rec = config_record(content, _K)
        signers, shares, mask_keys, signatures = (tuple(v) for v in _key_set_lists(rec).values())
        senders = config_list(rec, _K, "senders", str)
        sealed = config_list(rec, _K, "sealed-shares", bytes)
        _aligned(**{"senders": senders, "sealed-shares": sealed})
        return cls(config_field(rec, _K, "params", str), config_field(rec, _K, "key-id", str), _round(rec),
                   signers, shares, mask_keys, signatures, config_field(rec, _K, "num-clients", int, minimum=1),
                   tuple(senders), tuple(sealed))


@dataclasses.dataclass(frozen=True)
class TrainReply(Payload):
    """Step 2 reply: record ``"xmk-ciphertext"`` (ArrayRecord ``ciphertext``, uint8), in KAHE mode also
    record ``"xmk-capsule"`` (ArrayRecord ``capsule``, uint8) and record ``"xmk"`` (``capsule-signature``),
    and Flower's ``"metrics"``.

    Attributes
    ----------
    ciphertext : bytes or memoryview
        (Parsed: a read-only view into the message's buffer, :func:`~flwr_fedeval.protocol._base.array_bytes_view`.)
        KAHE mode: the KAHE ciphertext of [clip(n_i·(w_i − w), ±B)] with the integer slots [n_i, clipped
        count], under a fresh key k_i and the a_j of (T, round)
        (:meth:`flwr_fedeval.rlwe.kahe.KaheCiphertext.to_bytes`). CKKS mode: Enc(n_i·(w_i − w), n_i) + r_i + u_i
        under b = Σ b_j (Eq. 6) with c0 modulus-switched to the L' limbs of T and c1 exact:
        :meth:`flwr_fedeval.rlwe.compact.CompactCiphertext.to_bytes` (c0 then c1, each with its own header;
        the receiver parses it strictly at T's L').
    metrics : MetricRecord or None
        The train handler's metrics without ``num-examples`` (n_i stays encrypted).
    capsule : bytes, memoryview or None
        KAHE mode: the key capsule, Enc(k_i) + r_i + u_i under b (one polynomial, compact as the CKKS-mode
        ciphertext); ``None`` in CKKS mode.
    capsule_signature : bytes
        KAHE mode: the member's signature over the capsule's c1 (:func:`flwr_fedeval.rlwe.keyset.sign_capsule`).
    """

    LABEL = "xMK train reply"
    ciphertext: bytes | memoryview
    metrics: MetricRecord | None = None
    capsule: bytes | memoryview | None = None
    capsule_signature: bytes = b""

    def _to_record(self) -> RecordDict:
        content = RecordDict({XMK_CIPHERTEXT_KEY: _blob("ciphertext", self.ciphertext)})
        if self.capsule is not None:
            content[XMK_CAPSULE_KEY] = _blob("capsule", self.capsule)
            content.update(_config(capsule_signature=self.capsule_signature))
        if self.metrics is not None:
            content[_METRICS_KEY] = self.metrics
        return content

    @classmethod
    def _from_record(cls, content: RecordDict) -> TrainReply:
        # a view into the message's own buffer, not a copy (one reply in flight)
        data = array_bytes_view(array_record(content, XMK_CIPHERTEXT_KEY), XMK_CIPHERTEXT_KEY, "ciphertext")
        metrics = content.get(_METRICS_KEY)  # RecordDict is a Mapping
        if metrics is not None and not isinstance(metrics, MetricRecord):
            raise MalformedMessage(_METRICS_KEY, f"expected a MetricRecord, got {type(metrics).__name__}")
        capsule, signature = None, b""
        if XMK_CAPSULE_KEY in content:
            capsule = array_bytes(array_record(content, XMK_CAPSULE_KEY), XMK_CAPSULE_KEY, "capsule")
            signature = config_bytes(config_record(content, _K), _K, "capsule-signature")
        return cls(data, metrics, capsule, signature)


# ------------------------------------------------------------------ step 2b
@dataclasses.dataclass(frozen=True)
class ContributorsRequest(Payload, messages.ContributorsRequest):
    """Step 2b request (``query.xmk_contributors``), record ``"xmk"``: the contributor set C to sign.

    Attributes
    ----------
    key_id : str
    round : int
    model_hash : bytes
        :func:`model_hash` of the global model of the round (32 bytes).
    contributors : tuple of str
        C: the members whose ciphertexts the server summed.
    """

    LABEL = "xMK contributors request"

    def _to_record(self) -> RecordDict:
        return _config(key_id=self.key_id, round=self.round, model_hash=self.model_hash,
                       contributors=self.contributors)

    @classmethod
    def _from_record(cls, content: RecordDict) -> ContributorsRequest:
        rec = config_record(content, _K)
        return cls(config_field(rec, _K, "key-id", str), _round(rec),
                   config_bytes(rec, _K, "model-hash", length=DIGEST_BYTES),
                   tuple(config_list(rec, _K, "contributors", str)))


@dataclasses.dataclass(frozen=True)
class ContributorsReply(Payload, messages.ContributorsReply):
    """Step 2b reply, record ``"xmk"``: the member's signature over (key set, round, model hash, C).

    Attributes
    ----------
    key_id, signer : str
    signature : bytes
        :func:`flwr_fedeval.rlwe.keyset.sign_contributors`.
    """

    LABEL = "xMK contributors reply"

    def _to_record(self) -> RecordDict:
        return _config(key_id=self.key_id, signer=self.signer, signature=self.signature)

    @classmethod
    def _from_record(cls, content: RecordDict) -> ContributorsReply:
        rec = config_record(content, _K)
        return cls(config_field(rec, _K, "key-id", str), config_field(rec, _K, "signer", str),
                   config_bytes(rec, _K, "signature"))


# ------------------------------------------------------------------ step 3
@dataclasses.dataclass(frozen=True)
class PdecRequest(Payload, messages.PdecRequest):
    """Step 3 request (``query.xmk_pdec``): record ``"xmk"`` and record ``"xmk-c1"`` (ArrayRecord ``c1``, uint8).

    Attributes
    ----------
    params, key_id : str
    round : int
        The round of the summed ciphertexts.
    contributors : tuple of str
        C: roster names of the members whose ciphertexts were summed.
    num_clients : int
        |K| (>= 1).
    c1 : bytes
        CKKS mode: C1 = Σ_{j∈C} c1_j (Eq. 3), :func:`flwr_fedeval.rlwe.polys_to_bytes` at the full L limbs
        (its canonical form is the client's check). KAHE mode: empty (each decryptor sums the capsules'
        c1 itself, ``capsule_c1s``).
    limbs : int
        L' (>= 1), the limbs of the decryption share the server will combine: a member refuses any
        other value than the L' signed in T.
    model_hash : bytes
        The 32-byte :func:`model_hash` the contributor set was signed for.
    contributor_signers, contributor_signatures : tuple
        Aligned: members' names and their signatures over (key set, round, model hash, C) (step 2b).
    active : tuple of str
        A: the decryptor set whose shares the server will combine (|A| >= t, A within the signers of
        C). One round may take up to a (signed in T) active sets, one request per member each: the
        server replaces a decryptor lost during this step by asking a new A.
    attempt : int
        k, the index of the attempt (>= 1): a member answers each k at most once per key set and round,
        only k <= a, and sends attempt 1 modulus-switched to L' limbs, every later attempt at the full
        L limbs (unswitched, its pairwise masks mod q; :func:`flwr_fedeval.rlwe.threshold.share_limbs`).
    capsule_c1s, capsule_signatures : tuple of bytes
        KAHE mode, aligned with ``contributors``: each contributor's capsule c1 (one polynomial,
        :func:`flwr_fedeval.rlwe.polys_to_bytes` at L) and its signature over it
        (:func:`flwr_fedeval.rlwe.keyset.sign_capsule`): every decryptor checks each and computes
        C1 = Σ_{i∈C} c1_i itself. Empty in CKKS mode.
    """

    LABEL = "xMK partial decryption request"

    def _to_record(self) -> RecordDict:
        content = _config(params=self.params, key_id=self.key_id, round=self.round, contributors=self.contributors,
                          num_clients=self.num_clients, limbs=self.limbs, model_hash=self.model_hash,
                          contributor_signers=self.contributor_signers,
                          contributor_signatures=self.contributor_signatures, active=self.active,
                          attempt=self.attempt, capsule_c1s=self.capsule_c1s,
                          capsule_signatures=self.capsule_signatures)
        if self.c1:
            content[XMK_C1_KEY] = _blob("c1", self.c1)
        return content

    @classmethod
    def _from_record(cls, content: RecordDict) -> PdecRequest:
        rec = config_record(content, _K)
        signers = config_list(rec, _K, "contributor-signers", str)
        signatures = config_list(rec, _K, "contributor-signatures", bytes)
        _aligned(**{"contributor-signers": signers, "contributor-signatures": signatures})
        contributors = config_list(rec, _K, "contributors", str)
        c1s = config_list(rec, _K, "capsule-c1s", bytes) if "capsule-c1s" in rec else []
        c1_signatures = config_list(rec, _K, "capsule-signatures", bytes) if "capsule-signatures" in rec else []
        _aligned(**{"capsule-c1s": c1s, "capsule-signatures": c1_signatures})
        if c1s and len(c1s) != len(contributors):
            raise MalformedMessage(f"{_K}.capsule-c1s", f"{len(c1s)} items, but contributors has "
                                                        f"{len(contributors)}: one capsule c1 per contributor")
        if c1s and XMK_C1_KEY in content:
            raise MalformedMessage(XMK_C1_KEY, "a request carries either C1 or the contributors' capsule c1, "
                                               "not both")
        c1 = array_bytes(array_record(content, XMK_C1_KEY), XMK_C1_KEY, "c1") if not c1s else b""
        return cls(config_field(rec, _K, "params", str), config_field(rec, _K, "key-id", str), _round(rec),
                   tuple(contributors), config_field(rec, _K, "num-clients", int, minimum=1), c1,
                   config_field(rec, _K, "limbs", int, minimum=1),
                   config_bytes(rec, _K, "model-hash", length=DIGEST_BYTES), tuple(signers), tuple(signatures),
                   tuple(config_list(rec, _K, "active", str)), config_field(rec, _K, "attempt", int, minimum=1),
                   tuple(c1s), tuple(c1_signatures))


@dataclasses.dataclass(frozen=True)
class PdecReply(Payload, messages.PdecReply):
    """Step 3 reply: record ``"xmk-share"`` (ArrayRecord ``share``, uint8).

    Attributes
    ----------
    share : bytes or memoryview
        (Parsed: a read-only view into the message's buffer.)
        D_j = λ_j·sk_j·C1 + e*_j with smudging noise (Eq. 7, threshold form), in attempt k = 1
        modulus-switched to the L' limbs of T (:func:`flwr_fedeval.rlwe.compact.compress_decryption_share`),
        in attempt k >= 2 at the full L limbs; plus the pairwise masks over A at that level:
        :meth:`flwr_fedeval.rlwe.DecryptionShare.to_bytes` under
        :func:`~flwr_fedeval.rlwe.compact.level_parameter_set` (params, L' or L), parsed strictly at the
        level of the attempt the server asked for.
    seed_shares : tuple of bytes
        This member's Shamir shares of the self-mask seed of every i ∈ C, in the order of C.
    mask_shares : tuple of bytes
        Its shares of the X25519 mask private key of every i ∈ K∖C, in name order.
    """

    LABEL = "xMK partial decryption reply"

    def _to_record(self) -> RecordDict:
        content = RecordDict({XMK_SHARE_KEY: _blob("share", self.share)})
        content.update(_config(seed_shares=self.seed_shares, mask_shares=self.mask_shares))
        return content

    @classmethod
    def _from_record(cls, content: RecordDict) -> PdecReply:
        rec = config_record(content, _K)
        # a view into the message's own buffer, not a copy (one reply in flight)
        return cls(array_bytes_view(array_record(content, XMK_SHARE_KEY), XMK_SHARE_KEY, "share"),
                   tuple(config_list(rec, _K, "seed-shares", bytes)), tuple(config_list(rec, _K, "mask-shares", bytes)))


# ------------------------------------------------------------------ the step table
@dataclasses.dataclass(frozen=True)
class ModStep(Step):
    """A step answered by the ClientApp's own handler of an action (``@app.train()``), wrapped by a mod:
    its message type is the bare action (``"train"``), and :func:`flwr_fedeval.protocol.register`
    is not given it (the App registers its own handler)."""

    def __post_init__(self) -> None:
        if self.message_type not in ("train", "evaluate", "query"):
            raise ValueError(f"a mod step's message type is train, evaluate or query, got {self.message_type!r}")

    @property
    def handler_name(self) -> str:
        """``""``: Flower's default handler of the action."""
        return ""


KEYGEN = Step("step 1a (key commitment)", QUERY_XMK_KEYGEN, "client", KeygenRequest, KeygenReply)
REVEAL = Step("step 1b (key reveal)", QUERY_XMK_REVEAL, "client", RevealRequest, RevealReply)
SHARES = Step("step 1c (key shares)", QUERY_XMK_SHARES, "client", SharesRequest, SharesReply)
TRAIN = ModStep("step 2 (encrypted training)", "train", "client", TrainRequest, TrainReply)
CONTRIBUTORS = Step("step 2b (contributor set)", QUERY_XMK_CONTRIBUTORS, "client", ContributorsRequest,
                    ContributorsReply)
PDEC = Step("step 3 (partial decryption)", QUERY_XMK_PDEC, "client", PdecRequest, PdecReply)
#: Every step of a round, in order.
STEPS = (KEYGEN, REVEAL, SHARES, TRAIN, CONTRIBUTORS, PDEC)
#: The steps with a query handler of ours (:func:`flwr_fedeval.clients.xmkckks.register_xmkckks_handlers`).
QUERY_STEPS = (KEYGEN, REVEAL, SHARES, CONTRIBUTORS, PDEC)
