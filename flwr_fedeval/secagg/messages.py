"""The fields of every xMK request and reply, as flwr-free frozen dataclasses.

The member party (:class:`flwr_fedeval.secagg.member.Member`) takes these requests and returns these
replies. Their wire form (Flower records, the checks of ``from_record``) is
:mod:`flwr_fedeval.protocol.xmk`, whose payload classes subclass these: a parsed request is passed to
the member as it is, and the client adapter wraps a member's reply in the payload class of the same
name. The meaning of each field is documented there, with its record key.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr_fedeval.secagg.parameters import KeySetParameters

__all__ = [
    "ContributorsReply",
    "ContributorsRequest",
    "KeygenReply",
    "KeygenRequest",
    "PdecReply",
    "PdecRequest",
    "RevealReply",
    "RevealRequest",
    "SharesReply",
    "KeySetOpenings",
    "SharesRequest",
    "TrainRequest",
    "TrainUpload",
]

#: Bytes of a SHA-256 digest (model hash, commitment, transcript T).
DIGEST_BYTES = 32


@dataclass(frozen=True)
class KeygenRequest:
    """Step 1a (commit): parameter set name, 32-byte seed of a, key-set id, round."""

    params: str
    seed_a: bytes
    key_id: str
    round: int


@dataclass(frozen=True)
class KeygenReply:
    """Step 1a: the member's signed commitment h_i to (b_i, X_i)."""

    key_id: str
    signer: str
    commitment: bytes
    signature: bytes


@dataclass(frozen=True)
class RevealRequest:
    """Step 1b: every member's signed commitment and the public parameters the members sign in T."""

    key_id: str
    round: int
    signers: tuple[str, ...]
    commitments: tuple[bytes, ...]
    signatures: tuple[bytes, ...]
    mask_degree: int
    scale_bits: int
    max_abs_value: float
    threshold: int
    limbs: int
    decryption_attempts: int
    bulk: str = "kahe"
    fractional_bits: int = 0

    def parameters(self, parameter_set: str, seed_a: bytes, num_members: int) -> KeySetParameters:
        """The key set's parameters as this request shows them, with the parameter set and seed-a of step 1a
        and N.

        Raises
        ------
        flwr_fedeval.rlwe.keyset.KeySetError
            They do not validate (:class:`~flwr_fedeval.secagg.KeySetParameters`).
        """
        return KeySetParameters(parameter_set, self.key_id, seed_a, self.round, num_members, self.mask_degree,
                                self.scale_bits, self.max_abs_value, self.threshold, self.limbs,
                                self.decryption_attempts, self.bulk, self.fractional_bits)


@dataclass(frozen=True)
class RevealReply:
    """Step 1b: the opening (b_i, X_i) and the member's signature over T."""

    key_id: str
    signer: str
    public_share: bytes
    mask_key: bytes
    transcript: bytes
    transcript_signature: bytes


@dataclass(frozen=True)
class KeySetOpenings:
    """Every member's opening (b_j, X_j) and signature over T (aligned lists, one entry per member), for
    parameter set ``params``, key set ``key_id`` and ``round``: what steps 1c and 2 both carry."""

    params: str
    key_id: str
    round: int
    signers: tuple[str, ...]
    public_shares: tuple[bytes, ...]
    mask_keys: tuple[bytes, ...]
    transcript_signatures: tuple[bytes, ...]


@dataclass(frozen=True)
class SharesRequest(KeySetOpenings):
    """Step 1c: the key set's openings (:class:`KeySetOpenings`); each member answers with its shares."""


@dataclass(frozen=True)
class SharesReply:
    """Step 1c: the member's Shamir shares, one sealed box per other member (aligned)."""

    key_id: str
    signer: str
    round: int
    recipients: tuple[str, ...]
    sealed_shares: tuple[bytes, ...]


@dataclass(frozen=True)
class TrainRequest(KeySetOpenings):
    """Step 2: the key set's openings as in step 1c (:class:`KeySetOpenings`), |K|, and the member's inbox
    of sealed shares."""

    num_clients: int
    senders: tuple[str, ...] = ()
    sealed_shares: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class TrainUpload:
    """Step 2, what the member uploads: the ciphertext (KAHE mode: the KAHE ciphertext; CKKS mode: the
    compact xMK-CKKS ciphertext) and, in KAHE mode, the key capsule and the signature over its c1
    (``None`` and ``b""`` in CKKS mode). The train reply's metrics are the adapter's. The KAHE ciphertext is
    a read-only view of the buffer it was packed into (:func:`flwr_fedeval.rlwe.kahe.encrypt_bytes`)."""

    ciphertext: bytes | memoryview
    capsule: bytes | None = None
    capsule_signature: bytes = b""


@dataclass(frozen=True)
class ContributorsRequest:
    """Step 2b: the contributor set C to sign for (key set, round, model hash)."""

    key_id: str
    round: int
    model_hash: bytes
    contributors: tuple[str, ...]


@dataclass(frozen=True)
class ContributorsReply:
    """Step 2b: the member's signature over (key set, round, model hash, C)."""

    key_id: str
    signer: str
    signature: bytes


@dataclass(frozen=True)
class PdecRequest:
    """Step 3: C, its signatures, the active set A, the attempt k and C1 (CKKS mode) or the contributors'
    signed capsule c1 (KAHE mode)."""

    params: str
    key_id: str
    round: int
    contributors: tuple[str, ...]
    num_clients: int
    c1: bytes
    limbs: int
    model_hash: bytes = bytes(DIGEST_BYTES)
    contributor_signers: tuple[str, ...] = ()
    contributor_signatures: tuple[bytes, ...] = ()
    active: tuple[str, ...] = ()
    attempt: int = 1
    capsule_c1s: tuple[bytes, ...] = ()
    capsule_signatures: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class PdecReply:
    """Step 3: the masked decryption share D_j and the recovery shares (seeds of C, mask keys of K∖C)."""

    share: bytes | memoryview
    seed_shares: tuple[bytes, ...] = ()
    mask_shares: tuple[bytes, ...] = ()
