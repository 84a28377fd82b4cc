"""The member party: its typed state, loaded once per message, and one method per protocol step.

A member's state lives on its node between messages (Flower's ``context.state``; the deployment
engine starts a process per message, so never in module globals). :class:`MemberState` is that state
as one typed record, in the manner of Flower's ``SecAggPlusState``: the client adapter
(:mod:`flwr_fedeval.clients.xmkckks`) loads it once when a message arrives
(:meth:`MemberState.from_config`) and saves it once before the reply (:meth:`MemberState.to_config`);
every step reads and writes attributes, so a misspelt field is an ``AttributeError`` (a bug), never a
refusal. :class:`MemberLedger` is the part that survives a re-key (the last training round, the
count of clipped values).

:class:`Member` is the member party: one method per protocol step (keygen, reveal, shares, train in two
halves around the App's training, contributors, partial decryption), each taking the typed request of
:mod:`flwr_fedeval.secagg.messages` and returning its typed reply, with every check a member makes
(DESIGN.md §3, the ▲ of :mod:`flwr_fedeval.clients.xmkckks`). What the node provides (its roster
identity, its policy floors, its privacy ledger) comes through :class:`MemberNode`.

No Flower import; the values of :meth:`MemberState.to_config` are the scalar and list types that a
Flower ``ConfigRecord`` holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from flwr_fedeval import rlwe
from flwr_fedeval.identity import NodeIdentity, Roster
from flwr_fedeval.rlwe import capsule, compact, kahe, keyset, masking, selfmask, threshold
from flwr_fedeval.secagg.messages import (
    ContributorsReply,
    ContributorsRequest,
    KeygenReply,
    KeygenRequest,
    PdecReply,
    PdecRequest,
    RevealReply,
    RevealRequest,
    SharesReply,
    SharesRequest,
    TrainRequest,
    TrainUpload,
)
from flwr_fedeval.secagg.parameters import KeySetParameters

__all__ = ["Member", "MemberLedger", "MemberNode", "MemberState", "Refusal", "TrainKeys"]

#: Flower's logger: a member's warnings show in the node's log.
_log = logging.getLogger("flwr")
_MAX_USED_KEY_IDS = 64  # key-set ids this member committed for (it refuses to commit twice)
_OPENINGS_DOMAIN = b"flwr-fedeval/xmkckks/member-openings/v1"

ConfigValue = int | float | str | bytes | bool | list[int] | list[float] | list[str] | list[bytes] | list[bool]
_T = TypeVar("_T", bound="_Record")


class Refusal(ValueError):
    """A member will not serve a request (the client adapter replies with an error carrying the reason).

    ``already_contributed`` marks the refusals of the no-retry rules (a second update, signature or
    decryption share where one is allowed): the adapter replies ``ALREADY_CONTRIBUTED`` for them.
    """

    def __init__(self, reason: str, *, already_contributed: bool = False) -> None:
        self.already_contributed = already_contributed
        super().__init__(reason)


class _Record:
    """A dataclass saved as two ConfigRecord values (:meth:`to_config`): ``"fields"``, a JSON object with one
    key per field (``_`` spelt ``-``), and ``"blobs"``, the bytes of its ``bytes`` and ``list[bytes]`` fields
    in field order (the JSON gives their counts). A missing field loads as its default.

    Two values rather than one per field: a node's state is serialized twice per message (the engine hands
    the ``Context`` to the ClientApp and takes it back), and Flower converts a ConfigRecord value by value.
    """

    @classmethod
    def from_config(cls: type[_T], values: Mapping[str, Any]) -> _T:
        """The record saved by :meth:`to_config`.

        Raises
        ------
        TypeError
            ``values`` is not such a record, or names a field this class lacks, or its blobs do not match
            its counts (a record of another version: a bug, not a refusal).
        """
        hints, names = _layout(cls)
        if set(values) - {_FIELDS, _BLOBS}:
            raise TypeError(f"{cls.__name__}: not a saved record (keys {sorted(values)})")
        fields = json.loads(str(values[_FIELDS])) if _FIELDS in values else {}
        blobs = list(values[_BLOBS]) if _BLOBS in values else []
        if not isinstance(fields, dict):
            raise TypeError(f"{cls.__name__}: the saved fields are not a JSON object")
        unknown = sorted(set(fields) - set(names))
        if unknown:
            raise TypeError(f"{cls.__name__}: no field for {unknown}")
        kwargs: dict[str, Any] = {}
        pos = 0
        for key, value in fields.items():  # in the order saved: the blobs follow it
            name = names[key]
            hint = hints[name]
            if hint is bytes or hint == list[bytes]:
                count = int(value)
                if pos + count > len(blobs):
                    raise TypeError(f"{cls.__name__}: {key} needs {count} blobs past the {len(blobs)} saved")
                items = [bytes(b) for b in blobs[pos : pos + count]]
                pos += count
                kwargs[name] = items[0] if hint is bytes else items
            else:
                kwargs[name] = _convert(hint, value)
        if pos != len(blobs):
            raise TypeError(f"{cls.__name__}: {len(blobs) - pos} saved blobs belong to no field")
        return cls(**kwargs)

    def to_config(self) -> dict[str, ConfigValue]:
        """``{"fields": JSON str, "blobs": list of bytes}`` (class docstring)."""
        hints, names = _layout(type(self))
        fields: dict[str, Any] = {}
        blobs: list[bytes] = []
        for key, name in names.items():
            value = getattr(self, name)
            hint = hints[name]
            if hint is bytes:
                fields[key] = 1
                blobs.append(bytes(value))
            elif hint == list[bytes]:
                fields[key] = len(value)
                blobs.extend(bytes(v) for v in value)
            else:
                fields[key] = list(value) if isinstance(value, (list, tuple)) else value
        return {_FIELDS: json.dumps(fields, separators=(",", ":")), _BLOBS: blobs}


_FIELDS, _BLOBS = "fields", "blobs"
_LAYOUTS: dict[type, tuple[dict[str, Any], dict[str, str]]] = {}


def _layout(cls: type) -> tuple[dict[str, Any], dict[str, str]]:
    """A record class's field types and its ``{config key: field name}``, worked out once per class
    (``typing.get_type_hints`` parses every annotation: a cost paid on every message otherwise)."""
    if cls not in _LAYOUTS:
        hints = typing.get_type_hints(cls)
        names = {f.name.replace("_", "-"): f.name for f in dataclasses.fields(cls)}
        _LAYOUTS[cls] = (hints, names)
    return _LAYOUTS[cls]


def _convert(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [item(v) for v in value]
    if hint is bytes:
        return bytes(value)
    return hint(value)


@dataclass
class MemberLedger(_Record):
    """What a member keeps across key sets (never cleared by a re-key).

    ``last_round``: the latest round it trained in (the global models it trained on are in the node's
    privacy ledger, across runs); ``clipped_values`` / ``clipped_last``: the node operator's count of
    values clipped to the signed bound (never sent in clear).
    """

    last_round: int = -1
    clipped_values: int = 0
    clipped_last: int = 0


@dataclass
class MemberState(_Record):
    """One member's state of its current key set (cleared by a new commitment).

    Step 1a (commit): ``key_id``, ``params``, ``seed_a``, ``round`` (of the commitment), ``name`` (its
    roster name), ``secret`` s_i, ``share`` b_i, ``mask_private`` / ``mask_public`` (X25519),
    ``commitment``; ``used_key_ids`` (kept across key sets: it never commits twice for one).
    Step 1b (reveal): the signed parameters (``mask_degree``, ``scale_bits``, ``max_abs_value``,
    ``threshold``, ``limbs``, ``decryption_attempts``, ``bulk``, ``fractional_bits``), ``members`` and
    ``member_commitments`` (aligned), ``transcript`` T; ``confirmed`` once every member's signature over
    T checked; ``opened`` / ``joint``: the digest of the openings it checked against the commitments
    and their joint key b (a later step relaying the same openings reuses b). Step 1c (shares):
    ``shares_round``, ``own_shares`` (its own Shamir shares until step 2), ``self_seed`` (until its one
    use). Step 2 (train): ``sk_share``, ``member_mask_keys``,
    ``key_shares``, ``seed_shares`` (aligned with ``members``), ``sk_round``; ``enc_round``,
    ``enc_model``, ``num_polys``, ``own_c1`` (the digest of its c1). Step 2b: ``signed_round``. Step 3:
    the decryption ledger of the round (``pdec_round``, ``pdec_c1``, ``pdec_model``, ``pdec_active``,
    ``pdec_attempts``) and the members whose seed / mask key it revealed shares of
    (``revealed_seeds`` / ``revealed_keys``, across the key set's rounds).
    """

    key_id: str = ""
    params: str = ""
    seed_a: bytes = b""
    round: int = -1
    name: str = ""
    secret: bytes = b""
    share: bytes = b""
    mask_private: bytes = b""
    mask_public: bytes = b""
    commitment: bytes = b""
    used_key_ids: list[str] = field(default_factory=list)
    mask_degree: int = 0
    scale_bits: int = 0
    max_abs_value: float = 0.0
    threshold: int = 0
    limbs: int = 0
    decryption_attempts: int = 0
    bulk: str = ""
    fractional_bits: int = 0
    members: list[str] = field(default_factory=list)
    member_commitments: list[bytes] = field(default_factory=list)
    transcript: bytes = b""
    confirmed: bool = False
    opened: bytes = b""
    joint: bytes = b""
    shares_round: int = -1
    own_shares: list[bytes] = field(default_factory=list)
    self_seed: bytes = b""
    sk_share: bytes = b""
    member_mask_keys: list[bytes] = field(default_factory=list)
    key_shares: list[bytes] = field(default_factory=list)
    seed_shares: list[bytes] = field(default_factory=list)
    sk_round: int = -1
    enc_round: int = -1
    enc_model: bytes = b""
    num_polys: int = 0
    own_c1: str = ""
    signed_round: int = -1
    pdec_round: int = -1
    pdec_c1: str = ""
    pdec_model: bytes = b""
    pdec_active: list[str] = field(default_factory=list)
    pdec_attempts: list[int] = field(default_factory=list)
    revealed_seeds: list[str] = field(default_factory=list)
    revealed_keys: list[str] = field(default_factory=list)

    @property
    def revealed(self) -> bool:
        """Whether step 1b ran for this key set (the members are known)."""
        return bool(self.members)

    def reveal(self, parameters: KeySetParameters, members: Sequence[tuple[str, bytes]], transcript: bytes) -> None:
        """Keep the signed parameters, the members' (name, commitment) pairs and T of step 1b."""
        self.mask_degree, self.scale_bits = parameters.mask_degree, parameters.scale_bits
        self.max_abs_value, self.threshold = parameters.max_abs_value, parameters.threshold
        self.limbs, self.decryption_attempts = parameters.limbs, parameters.decryption_attempts
        self.bulk, self.fractional_bits = parameters.bulk, parameters.fractional_bits
        self.members = [name for name, _ in members]
        self.member_commitments = [h for _, h in members]
        self.transcript = transcript

    def parameters(self) -> KeySetParameters:
        """The signed parameters of step 1b (checked again: what this member signed validated then).

        Raises
        ------
        flwr_fedeval.rlwe.keyset.KeySetError
            The key set has not been revealed to this member.
        """
        return KeySetParameters(self.params, self.key_id, self.seed_a, self.round, len(self.members),
                                self.mask_degree, self.scale_bits, self.max_abs_value, self.threshold, self.limbs,
                                self.decryption_attempts, self.bulk, self.fractional_bits)


class MemberNode(Protocol):
    """What a member needs from its node (the client adapter implements it over Flower's ``Context``).

    Every method is called only when a step needs it, so a node without an identity or a ledger refuses
    exactly the steps that need one (their errors propagate: a configuration refusal).
    """

    def identity(self) -> tuple[NodeIdentity, Roster]:
        """The node's roster identity (it signs with it) and the roster (it checks the others against it)."""
        ...

    def key_set_floor(self) -> int:
        """The fewest members of a key set this node accepts."""
        ...

    def mask_degree_floor(self) -> int:
        """The fewest mask-graph neighbours this node accepts."""
        ...

    def trained(self, model: bytes) -> bool:
        """Whether the node gave an update for the global model of this hash, in any run."""
        ...

    def record_training(self, model: bytes) -> None:
        """Record, durably, that the node gives an update for this model (before the reply leaves)."""
        ...


@dataclass(frozen=True)
class TrainKeys:
    """What step 2 checked before training (:meth:`Member.open_round`): the round, the global model's hash,
    the joint key b = Σ b_j from checked openings, the mask keys of the member's neighbours."""

    round: int
    model: bytes
    joint: rlwe.PublicKey
    peers: dict[str, bytes]


def _params(name: str) -> rlwe.ParameterSet:
    params = rlwe.get_parameter_set(name)
    rlwe.validate_security(params)
    return params


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _capsule_plaintext(params: rlwe.ParameterSet, key: np.ndarray[Any, np.dtype[np.int64]], *, scale_bits: int,
                       num_clients: int, kahe_params: kahe.KaheParameters) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """The key capsule's plaintext: k_i (n integers) at the signed scale, one polynomial
    (:func:`flwr_fedeval.rlwe.capsule.encode_key`)."""
    return capsule.encode_key(params, key, scale_bits=scale_bits, num_clients=num_clients, kahe_params=kahe_params)


def _openings_digest(signers: Sequence[str], public_shares: Sequence[bytes], mask_keys: Sequence[bytes]) -> bytes:
    """SHA-256 of the relayed openings (signer, b_j, X_j) in the request's order, each part length-prefixed:
    what :meth:`Member._open` keeps to recognise openings it has checked already."""
    h = hashlib.sha256(_OPENINGS_DOMAIN)
    for name, share, key in zip(signers, public_shares, mask_keys):
        for part in (str(name).encode(), bytes(share), bytes(key)):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return h.digest()


def _active_key(active: Sequence[str]) -> str:
    """How an active set is kept in the ledger: its sorted names, JSON-encoded (one spelling per set)."""
    return json.dumps(sorted(str(a) for a in active))


def _passed_over(contributors: Sequence[str], active: Sequence[str]) -> set[str]:
    """L(A): the members of C that sort before A's last member and are not in A (those a server that picks
    "the first t signers not lost" has passed over: lost, or no signature)."""
    last = max(active)
    return {name for name in contributors if name < last and name not in active}


class Member:
    """One member of an xMK key set: the checks and the cryptography of every step, on its typed state.

    Parameters
    ----------
    node : MemberNode
        The node's identity, policy floors and privacy ledger.
    state : MemberState
        The key set's state, as loaded for this message; the step writes it (``self.state``, replaced
        by a new commitment) and the caller saves it once, also after a refusal (what a step wrote
        before refusing stays written).
    ledger : MemberLedger
        What survives a re-key (last training round, clipped counts).

    Every step raises :class:`Refusal` (``already_contributed`` for the no-retry rules) or an error of
    the layer it calls (:class:`~flwr_fedeval.rlwe.keyset.KeySetError`,
    :class:`~flwr_fedeval.identity.IdentityError`, :class:`~flwr_fedeval.rlwe.masking.MaskKeyError`,
    :class:`~flwr_fedeval.rlwe.threshold.ThresholdError`, :class:`~flwr_fedeval.rlwe.kahe.KaheError`,
    ``ValueError``) for a request it will not serve; nothing is sent then.
    """

    def __init__(self, node: MemberNode, state: MemberState, ledger: MemberLedger) -> None:
        self.node = node
        self.state = state
        self.ledger = ledger

    # ------------------------------------------------------------ shared checks
    def _current(self, key_id: str, *, revealed: bool) -> str:
        """``key_id`` of the request, checked against this member's key set (and that it was revealed)."""
        if not self.state.key_id or self.state.key_id != key_id:
            raise Refusal(f"no key for key set {key_id!r}")
        if revealed and not self.state.revealed:
            raise Refusal(f"key set {key_id} has not been revealed to this client")
        return key_id

    def _key_params(self, name: str, what: str = "key set's") -> rlwe.ParameterSet:
        params = _params(name)
        if params.name != self.state.params:
            raise Refusal(f"parameter set differs from the {what}")
        return params

    def _check_round(self, round_: int) -> None:
        """▲ no retries: ``round_`` is after the last round this member trained in (any key set) and not
        before the key set's first round."""
        last = self.ledger.last_round
        if round_ <= last:
            raise Refusal(f"no retries: round {round_} is not after round {last}, the last this client trained in "
                          f"(rounds strictly increase)", already_contributed=True)
        if round_ < self.state.round:
            raise Refusal(f"round {round_} is before the round of key set {self.state.key_id} ({self.state.round})")

    def _open(self, request: SharesRequest | TrainRequest,
              params: rlwe.ParameterSet) -> tuple[rlwe.PublicKey, dict[str, bytes], dict[str, bytes]]:
        """▲ the joint key b = Σ b_j and every member's mask key, from openings checked here.

        The member never takes an aggregate key from the server: every b_j must match the commitment its
        member signed before seeing the others', and every member must have signed the same T. Returns
        ``(b, {member: X_j} of every member, {neighbour: X_j} of its mask graph)``.
        """
        state = self.state
        _, roster = self.node.identity()
        key_id = state.key_id
        names = list(state.members)
        members = list(zip(names, [bytes(h) for h in state.member_commitments]))
        floor = self.node.key_set_floor()
        if len(names) < floor:
            raise keyset.KeySetError(f"key set {key_id} has {len(names)} members, this client requires at least "
                                     f"{floor}")
        num_clients = request.num_clients if isinstance(request, TrainRequest) else len(names)
        if num_clients != len(names):
            raise keyset.KeySetError(f"num-clients is {num_clients}, the key set has {len(names)} members")
        signers = request.signers
        if len(set(signers)) != len(signers):
            raise keyset.KeySetError("signers, public-shares, mask-keys and transcript-signatures must align, "
                                     "one entry per member")
        openings = dict(zip(signers, zip(request.public_shares, request.mask_keys)))
        digest = _openings_digest(signers, request.public_shares, request.mask_keys)
        if state.opened and digest == state.opened:
            # byte for byte the openings this member checked at an earlier step of the key set (step 1c
            # before step 2): their joint key is the one it kept then
            joint = rlwe.PublicKey.from_bytes(state.joint, params)
            peers = {name: bytes(key) for name, (_, key) in openings.items()}
        else:
            joint, peers = keyset.open_key_set(params, key_id=key_id, members=members, openings=openings)
            state.opened, state.joint = digest, joint.to_bytes()
        if not state.confirmed:
            keyset.check_transcript_signatures(
                roster, dict(zip(signers, request.transcript_signatures)), members=names, key_id=key_id,
                round_=state.round, digest=state.transcript,
            )
            state.confirmed = True
        own = state.name
        if peers[own] != state.mask_public or openings[own][0] != state.share:
            raise keyset.KeySetError("the relayed opening of this client is not its own")
        # the mask graph: recomputed here from the signed transcript, never taken from the server
        neighbours = masking.mask_neighbours(names, state.mask_degree, state.transcript)[own]
        return joint, peers, {name: peers[name] for name in neighbours}

    def _check_contributors(self, contributors: tuple[str, ...], round_: int, model: bytes) -> None:
        """▲ C ⊆ K without duplicates, |C| >= this member's floor and >= t; itself ∈ C iff it uploaded in
        ``round_``; the model hash is the one it trained on (when it did)."""
        state = self.state
        if len(set(contributors)) != len(contributors):
            raise Refusal("contributor list has duplicates")
        extra = sorted(set(contributors) - set(state.members))
        if extra:
            raise Refusal(f"contributors {extra} are not members of key set {state.key_id}")
        floor, t = self.node.key_set_floor(), state.threshold
        if len(contributors) < max(floor, t):
            raise Refusal(f"{len(contributors)} contributors, this client requires at least {max(floor, t)} "
                          f"(its floor {floor}, the threshold {t})")
        uploaded = state.enc_round == round_
        if uploaded != (state.name in contributors):
            raise Refusal(f"the contributor list {'leaves out' if uploaded else 'lists'} this client, which "
                          f"{'uploaded' if uploaded else 'did not upload'} in round {round_}")
        if uploaded and state.enc_model != model:
            raise Refusal("the model hash is not the one of the global model this client trained on")

    # ------------------------------------------------------------ step 1a
    def keygen(self, request: KeygenRequest) -> KeygenReply:
        """Step 1a (commit): s_i, b_i = −s_i·a + e_i (Eq. 1) and an X25519 mask key; a signed commitment to
        (b_i, X_i), neither of which leaves the member before every member has committed (Walskaar et al.
        2023, Eq. 1; Bonawitz et al. 2017). A new key set replaces the old one (no key survives a re-key).

        Raises
        ------
        flwr_fedeval.rlwe.keyset.KeySetError
            ``key_id`` is not H(params, seed-a), or this member already committed for it.
        """
        identity, _ = self.node.identity()
        params = _params(request.params)
        key_id = keyset.key_set_id(params, request.seed_a)
        if request.key_id != key_id:
            raise keyset.KeySetError(f"key-id {request.key_id!r} is not H(params, seed-a) = {key_id}")
        used = list(self.state.used_key_ids)
        if key_id in used:
            raise keyset.KeySetError(f"this client has already committed for key set {key_id}")
        secret, public = rlwe.keygen(params, rlwe.expand_a(params, request.seed_a))
        mask_private, mask_public = masking.new_mask_keypair()
        share = public.to_bytes()
        h = keyset.commitment(key_id, share, mask_public)
        signature = keyset.sign_commitment(identity, key_id=key_id, round_=request.round, commitment_=h)
        self.state = MemberState(key_id=key_id, params=params.name, seed_a=request.seed_a, round=request.round,
                                 name=identity.name, secret=secret.to_bytes(), share=share,
                                 mask_private=mask_private, mask_public=mask_public, commitment=h,
                                 used_key_ids=(used + [key_id])[-_MAX_USED_KEY_IDS:])
        return KeygenReply(key_id, identity.name, h, signature)

    # ------------------------------------------------------------ step 1b
    def reveal(self, request: RevealRequest) -> RevealReply:
        """Step 1b (reveal): check every member's signed commitment and the public parameters, then open b_i
        and X_i with a signature over the key-set transcript T (which binds every public parameter).

        Refuses an unsigned, forged or duplicated entry, a key set without this member or with another
        commitment for it, fewer members than its floor, a mask degree below its floor, parameters that
        do not validate (:class:`~flwr_fedeval.secagg.KeySetParameters`: t, the scale, L', a, the KAHE
        set), or a second reveal for the same key set.
        """
        state = self.state
        identity, roster = self.node.identity()
        key_id = self._current(request.key_id, revealed=False)
        if state.revealed:
            raise keyset.KeySetError(f"this client has already revealed its share for key set {key_id}")
        if request.round != state.round:
            raise keyset.KeySetError(f"round {request.round} differs from the round of the commitment ({state.round})")
        members = keyset.check_commitments(
            roster, list(zip(request.signers, request.commitments, request.signatures)), key_id=key_id,
            round_=request.round, own_name=identity.name, own_commitment=state.commitment,
            floor=self.node.key_set_floor(),
        )
        masking.check_mask_degree(request.mask_degree, len(members), self.node.mask_degree_floor())
        # the one check of the public parameters (t, scale, L', a, bulk, the KAHE set derived from N, B, F)
        signed = request.parameters(state.params, state.seed_a, len(members))
        digest = signed.transcript(members)
        state.reveal(signed, members, digest)
        signature = keyset.sign_transcript(identity, key_id=key_id, round_=request.round, digest=digest)
        return RevealReply(key_id, identity.name, state.share, state.mask_public, digest, signature)

    # ------------------------------------------------------------ step 1c
    def shares(self, request: SharesRequest) -> SharesReply:
        """Step 1c: Shamir-split (t of N, t from T) s_i, the mask key x_i and a fresh self-mask seed u_i and
        seal each member's shares to it (Mouchet et al. 2021, §4; Bonawitz et al. 2017, §4).

        Refuses a key set it has not revealed, openings that do not match the commitments or a T not
        signed by every member, a round not after its last training round, or a second request for
        the same key set and round (``already_contributed``).
        """
        state = self.state
        key_id = self._current(request.key_id, revealed=True)
        params = self._key_params(request.params, "key set's")
        self._check_round(request.round)
        if state.shares_round >= request.round:
            raise Refusal(f"already shared its keys for key set {key_id} in round {state.shares_round}: "
                          f"one sharing per key set and round", already_contributed=True)
        _, peers, _ = self._open(request, params)
        names = list(state.members)
        own = state.name
        t = state.threshold
        points = threshold.member_points(len(names), params=params)
        secret = rlwe.SecretKey.from_bytes(state.secret, params)
        ring_shares = threshold.split_secret(params, secret, threshold=t, points=points)
        seed = selfmask.new_self_mask_seed()
        key_shares = threshold.split_bytes(state.mask_private, threshold=t, points=points)
        seed_shares = threshold.split_bytes(seed, threshold=t, points=points)
        recipients, sealed = [], []
        for name, x in zip(names, points):
            parts = [ring_shares[x].to_bytes(), key_shares[x], seed_shares[x]]
            if name == own:
                state.own_shares = parts
                continue
            recipients.append(name)
            sealed.append(keyset.seal_shares(parts, key_id=key_id, round_=request.round,
                                             transcript=state.transcript, sender=own,
                                             own_private=state.mask_private, recipient=name,
                                             recipient_public=peers[name]))
        state.shares_round, state.self_seed = request.round, seed
        return SharesReply(key_id, own, request.round, tuple(recipients), tuple(sealed))

    # ------------------------------------------------------------ step 2
    def open_round(self, request: TrainRequest, model: bytes) -> TrainKeys:
        """Step 2, before any training: ▲ no retries (``model`` not in the node's privacy ledger, the round
        after its last, keys shared for this round, no encryption yet in it), the openings and T again
        (openings byte for byte those checked at step 1c reuse the joint key kept then; any others are
        checked in full), a valid share from every member (it keeps sk_j = Σ_i share_{i→j}).

        Raises
        ------
        Refusal
            ``already_contributed``: trained on ``model`` before (any key set or run) or in a later round.
        """
        state = self.state
        self._current(request.key_id, revealed=True)
        params = _params(request.params)
        if params.name != state.params:
            raise keyset.KeySetError("parameter set differs from the key set's")
        if self.node.trained(model):
            raise Refusal(f"no retries: this node already trained on global model {model.hex()[:16]}… "
                          f"(one update per global model, whatever the key set or run)", already_contributed=True)
        self._check_round(request.round)
        if state.shares_round != request.round:
            raise Refusal(f"round {request.round}: this client shared no keys for key set {request.key_id} "
                          f"in that round")
        if request.round <= state.enc_round:
            raise keyset.KeySetError(
                f"round {request.round} is not after this client's last encryption under this key set "
                f"(round {state.enc_round}): masks are never reused"
            )
        joint, all_peers, peers = self._open(request, params)
        self._open_inbox(request, params, all_peers)
        return TrainKeys(request.round, model, joint, peers)

    def _open_inbox(self, request: TrainRequest, params: rlwe.ParameterSet, peers: dict[str, bytes]) -> None:
        """▲ a valid share from every member of K; keep sk_j = Σ_i share_{i→j} and the byte shares."""
        state = self.state
        names = list(state.members)
        own = state.name
        others = sorted(set(names) - {own})
        if sorted(request.senders) != others or len(set(request.senders)) != len(request.senders):
            raise Refusal(f"the inbox must hold one box from every other member of the key set: from "
                          f"{sorted(request.senders)}, expected {others}")
        points = dict(zip(names, threshold.member_points(len(names), params=params)))
        t = state.threshold
        by_sender = {own: [bytes(p) for p in state.own_shares]}
        for sender, box in zip(request.senders, request.sealed_shares):
            by_sender[sender] = keyset.open_shares(box, key_id=state.key_id, round_=request.round,
                                                   transcript=state.transcript, sender=sender,
                                                   sender_public=peers[sender], recipient=own,
                                                   own_private=state.mask_private, count=3)
        ring_shares = []
        for name in names:
            share = threshold.SecretShare.from_bytes(by_sender[name][0], params)
            if share.point != points[own] or share.threshold != t:
                raise Refusal(f"the share from {name!r} is for point {share.point} with t={share.threshold}, "
                              f"expected point {points[own]} with t={t}")
            for part in by_sender[name][1:]:
                if len(part) != threshold.BYTES_SHARE_SIZE:
                    raise Refusal(f"a byte share from {name!r} is not {threshold.BYTES_SHARE_SIZE} bytes")
            ring_shares.append(share)
        state.sk_share = threshold.aggregate_shares(params, ring_shares).to_bytes()
        state.member_mask_keys = [peers[name] for name in names]  # checked openings: masks of step 3
        state.key_shares = [by_sender[name][1] for name in names]
        state.seed_shares = [by_sender[name][2] for name in names]
        state.sk_round = request.round
        state.own_shares = []

    def _count_clipped(self, values: np.ndarray[Any, np.dtype[np.float64]], scale: float = 1.0) -> int:
        """How many of ``scale * values`` lie beyond the signed bound [-B, B] (Flower SecAgg+'s
        ``clipping_range``); the count is logged on the node and kept in the ledger, never sent.

        Raises
        ------
        ValueError
            A NaN or infinite value.
        """
        low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        if not (np.isfinite(low) and np.isfinite(high)):  # min and max are NaN if any value is
            raise ValueError(f"the update has {int(np.sum(~np.isfinite(values)))} NaN/inf values")
        bound = self.state.max_abs_value
        # rounding is monotone: every scale·v is within ±B iff scale·min and scale·max are (no copy then)
        inside = -bound <= scale * low and scale * high <= bound
        clipped = 0 if inside else int(np.count_nonzero(np.abs(values * scale) > bound))
        self.ledger.clipped_last = clipped
        self.ledger.clipped_values += clipped
        if clipped:
            _log.warning(
                "xMK-CKKS: %d of %d values clipped to the signed bound %.4g (kept on this node)",
                clipped,
                values.size,
                bound,
            )
        return clipped

    def _clip(self, vector: np.ndarray[Any, np.dtype[np.float64]]) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Every value clipped to the signed bound [-B, B] (:meth:`_count_clipped`); ``vector`` itself when
        none is beyond it.

        Raises
        ------
        ValueError
            A NaN or infinite value.
        """
        if not self._count_clipped(vector):
            return vector
        bound = self.state.max_abs_value
        clipped_vector: np.ndarray[Any, np.dtype[np.float64]] = np.clip(vector, -bound, bound)
        return clipped_vector

    def encrypt(self, keys: TrainKeys, update: np.ndarray[Any, np.dtype[np.float64]], num_examples: int) -> TrainUpload:
        """Step 2, after training: the upload of ``n_i·update`` (DESIGN.md §3 step 2).

        KAHE mode: ``clip(n_i·update, ±B)`` and the integer slots [n_i, clipped count] under KAHE with a fresh
        key k_i (never reused: two rounds would give k_i = K_C − K_C') and the a_j of (T, round); k_i in the
        key capsule, masked with the pairwise masks r_i over its neighbours and the self-mask u_i, encrypted
        under b, c0 switched to L' limbs; the capsule's c1 signed for (T, round, model hash). CKKS mode:
        ``[clip(n_i·update), n_i]`` itself encrypted so (Walskaar et al. 2023, Eq. 6). The model is recorded
        in the node's privacy ledger before anything is returned (a crash after it never allows a second
        update), then the state: last round, the digest of its c1, the self-mask seed cleared (used once).

        Parameters
        ----------
        keys : TrainKeys
            From :meth:`open_round` of this message.
        update : ndarray of shape (d,), float64
            w_i − w (the model's weights flattened).
        num_examples : int
            n_i (>= 1).

        Raises
        ------
        ValueError
            ``num_examples`` < 1 or a NaN/infinite value in the update.
        """
        state = self.state
        if num_examples < 1:
            raise ValueError(f"num-examples must be >= 1, got {num_examples}")
        params = _params(state.params)
        m = len(state.members)
        scale_bits = state.scale_bits
        kahe_bytes: bytes | memoryview = b""
        if state.bulk == "kahe":
            clipped = self._count_clipped(update, float(num_examples))
            kahe_params = state.parameters().kahe  # derived from the signed (N, B, F)
            assert kahe_params is not None
            key = kahe.sample_key(kahe_params)
            seed = kahe.public_seed(state.transcript, keys.round)
            integers = np.array([num_examples, clipped], dtype=np.int64)
            # clip(n_i·update, ±B) quantised range by range: no scaled copy of the update
            kahe_bytes = kahe.encrypt_bytes(kahe_params, seed, key, update, integers, scale=float(num_examples))
            # the key capsule: k_i as one xMK-CKKS polynomial, masked below like a CKKS-mode update
            plaintext = _capsule_plaintext(params, key, scale_bits=scale_bits, num_clients=m,
                                           kahe_params=kahe_params)
            del key
        else:
            vector = self._clip(np.append(num_examples * update, float(num_examples)))
            plaintext = rlwe.encode(params, vector, scale_bits=scale_bits, num_clients=m)
        masked = masking.mask_plaintext(params, plaintext, own_name=state.name, own_private=state.mask_private,
                                        peers=keys.peers, context=masking.mask_context(state.transcript, keys.round))
        masked = masking.apply_mask(params, masked, selfmask.self_mask(params, state.self_seed, plaintext.shape[0]))
        ct = rlwe.encrypt(params, keys.joint, rlwe.expand_a(params, state.seed_a), masked)
        compressed = compact.compress_ciphertext(ct, state.limbs).to_bytes()  # c0 at L' limbs, c1 exact
        c1_bytes = rlwe.polys_to_bytes(params, ct.c1)
        if state.bulk == "kahe":
            identity, _ = self.node.identity()
            signature = keyset.sign_capsule(identity, key_id=state.key_id, transcript=state.transcript,
                                            round_=keys.round, model_hash=keys.model, c1=c1_bytes)
            upload = TrainUpload(kahe_bytes, compressed, signature)
        else:
            upload = TrainUpload(compressed)
        # written before the reply leaves (a kill -9 after this line never allows a second update); a
        # concurrent run that recorded the model first makes this raise, and nothing is sent
        self.node.record_training(keys.model)
        self.ledger.last_round = keys.round  # rounds strictly increase
        state.enc_round, state.enc_model = keys.round, keys.model
        state.num_polys = ct.num_polys
        state.own_c1 = _digest(c1_bytes)
        state.self_seed = b""  # used once
        return upload

    # ------------------------------------------------------------ step 2b
    def contributors(self, request: ContributorsRequest) -> ContributorsReply:
        """Step 2b: sign the contributor set C once per key set and round (SecAgg's consistency check,
        Bonawitz et al. 2017, §4; :func:`~flwr_fedeval.rlwe.keyset.sign_contributors`).

        Refuses a key set or round it holds no shares for, a second request for the same key set and round
        (whatever C: ``already_contributed``), and a C that fails the contributor checks (C ⊆ K, |C| >=
        its floor and t, itself in C iff it uploaded, the model it trained on).
        """
        state = self.state
        identity, _ = self.node.identity()
        key_id = self._current(request.key_id, revealed=True)
        if state.sk_round != request.round:
            raise Refusal(f"round {request.round}: this client holds no decryption share of key set {key_id}")
        if state.signed_round == request.round:
            raise Refusal(f"already signed a contributor set for key set {key_id} in round {request.round}: "
                          f"one per key set and round", already_contributed=True)
        self._check_contributors(request.contributors, request.round, request.model_hash)
        state.signed_round = request.round
        signature = keyset.sign_contributors(identity, key_id=key_id, round_=request.round,
                                             model_hash=request.model_hash, contributors=request.contributors)
        return ContributorsReply(key_id, identity.name, signature)

    # ------------------------------------------------------------ step 3
    def _check_attempt(self, key_id: str, round_: int, c1_digest: str, model: bytes, active: Sequence[str],
                       contributors: Sequence[str], attempt: int) -> tuple[list[str], list[int]]:
        """▲ the decryption ledger of (key set, round): one C1 and model hash, one share per active set A, one
        per attempt index k, at most a (signed in T) active sets, and a passed-over set L(A)
        (:func:`_passed_over`) that strictly grows from each A to the next (a member passed over as lost
        stays lost). Returns the active sets and attempt indices already answered in ``round_``.

        One share per k is what keeps the retries simulatable: a member gives at most one share switched to
        L' limbs (k = 1) per round, so at most one complete switched attempt exists whatever the server
        asks -- two would need a member of both active sets (each has > N/2 members) to answer k = 1 twice
        -- and every other complete attempt is at the full L limbs, revealing s·C1 plus fresh smudging only
        (:mod:`flwr_fedeval.rlwe.threshold`, "Why the retry is sent at the full level").

        Raises
        ------
        Refusal
            ``already_contributed``: another C1 or model than the round's first request, an A already
            answered, a + 1 distinct A, a k already answered, or an A whose passed-over set does not
            strictly contain an earlier one's.
        """
        state = self.state
        if state.pdec_round != round_:
            return [], []
        if state.pdec_c1 != c1_digest or state.pdec_model != model:
            raise Refusal(f"already decrypted once for key set {key_id} in round {round_} for another C1 or model: "
                          f"one C1 per key set and round", already_contributed=True)
        used = [str(a) for a in state.pdec_active]
        if _active_key(active) in used:
            raise Refusal(f"already decrypted once for key set {key_id} in round {round_} for the active set "
                          f"{sorted(active)}: one share per active set", already_contributed=True)
        attempts = state.decryption_attempts
        if len(used) >= attempts:
            raise Refusal(f"already decrypted for {len(used)} active sets of key set {key_id} in round {round_}: at "
                          f"most a = {attempts} (signed in the key-set transcript)", already_contributed=True)
        ks = [int(k) for k in state.pdec_attempts]
        if attempt in ks:
            raise Refusal(f"already decrypted once for key set {key_id} in round {round_} as attempt k={attempt}: "
                          f"one share per attempt index (at most one switched to L' limbs)", already_contributed=True)
        passed = _passed_over(contributors, active)
        for earlier in used:
            before = _passed_over(contributors, json.loads(earlier))
            if not before < passed:
                raise Refusal(f"already decrypted for the active set {json.loads(earlier)}: a later active set must "
                              f"pass over every member it passed over ({sorted(before)}) and more, got "
                              f"{sorted(passed)} (members lost stay lost)", already_contributed=True)
        return used, ks

    def _capsule_sum(self, request: PdecRequest, roster: Roster,
                     params: rlwe.ParameterSet) -> np.ndarray[Any, np.dtype[np.uint64]]:
        """▲ KAHE mode: one capsule c1 per contributor of C, each canonical (one polynomial at L limbs) and
        signed by that contributor for (T, round, model hash), this member's own the one it sent; returns
        C1 = Σ_{i∈C} c1_i (shape (1, L, n), uint64), computed here: the server cannot ask for any other
        combination of the capsules (such as 2·c1_v).

        Raises
        ------
        Refusal
            C1 sent instead of the capsules, a count other than |C|, a non-canonical c1, this member's own
            c1 not the one it sent.
        flwr_fedeval.identity.IdentityError
            A signature that does not verify for its contributor.
        """
        state = self.state
        contributors = request.contributors
        if request.c1:
            raise Refusal("KAHE mode: a decryptor sums the contributors' signed capsule c1 itself; the request "
                          "carries a C1 instead")
        if len(request.capsule_c1s) != len(contributors) or len(request.capsule_signatures) != len(contributors):
            raise Refusal(f"KAHE mode: {len(request.capsule_c1s)} capsule c1s and {len(request.capsule_signatures)} "
                          f"signatures for {len(contributors)} contributors: one of each per contributor")
        total: np.ndarray[Any, np.dtype[np.uint64]] | None = None
        for name, raw, signature in zip(contributors, request.capsule_c1s, request.capsule_signatures):
            keyset.check_capsule_signature(roster, name, signature, key_id=state.key_id, transcript=state.transcript,
                                           round_=request.round, model_hash=request.model_hash, c1=raw)
            if name == state.name and _digest(raw) != state.own_c1:
                raise Refusal("the capsule c1 listed for this client is not the one it sent")
            try:
                c1 = rlwe.polys_from_bytes(raw, params, count=capsule.CAPSULE_POLYS)
            except ValueError as exc:
                raise Refusal(f"the capsule c1 of {name!r} is not canonical: {exc}") from None
            total = c1 if total is None else params.ring.add(total, c1)
        assert total is not None  # |C| >= t >= 1
        return total

    def partial_decrypt(self, request: PdecRequest) -> PdecReply:
        """Step 3: D_j = λ_j·sk_j·C1 + e*_j (threshold form of Walskaar et al. 2023, Eq. 7) plus
        Σ_{k∈A∖{j}} ±PRG(K_jk) (:func:`~flwr_fedeval.rlwe.threshold.mask_decryption_share`), once per active
        set A and attempt index k: attempt 1 switched to L' limbs before the masks are added (mod q'), every
        retry at the full L limbs (mod q; :func:`~flwr_fedeval.rlwe.threshold.share_limbs`); and the
        recovery shares: of the self-mask seed of every i ∈ C, of the mask key of every i ∈ K∖C.

        Refuses (nothing decrypted) when the key set is not this member's or it holds no share for the
        round; (``already_contributed``) the decryption ledger forbids it (:meth:`_check_attempt`); k is
        not in 1..a; C fails the contributor checks or fewer than t distinct members of K signed it; A is
        not >= t members of K including this one, within C and its signers; ``num_clients`` or ``limbs``
        disagree with T; C1 is not canonical or equals its own c1 (CKKS mode), or a capsule c1 is not
        signed by its contributor (KAHE mode: C1 is summed here); the mask graph induced on C is not
        connected (only multiples of the sum over C are masked once the masks of K∖C are rebuilt); or it
        would reveal, for one member, shares of both its seed and its mask key (SecAgg's rule).
        """
        state = self.state
        _, roster = self.node.identity()
        key_id = self._current(request.key_id, revealed=True)
        params = self._key_params(request.params, "key's")
        round_ = request.round
        if state.sk_round != round_:
            raise Refusal(f"round {round_}: this client holds no decryption share of key set {key_id} for that round")
        members = list(state.members)
        own = state.name
        t = state.threshold
        if request.num_clients != len(members):
            raise Refusal("num-clients disagrees with the key set")
        if request.limbs != state.limbs:
            raise Refusal(f"limbs={request.limbs} is not the limb count L'={state.limbs} signed in the key-set "
                          f"transcript")
        attempts = state.decryption_attempts
        if not 1 <= request.attempt <= attempts:
            raise Refusal(f"attempt k={request.attempt} must be in [1, {attempts}]: a = {attempts} attempts are "
                          f"signed in the key-set transcript")
        contributors = request.contributors
        self._check_contributors(contributors, round_, request.model_hash)
        if len(set(request.contributor_signers)) != len(request.contributor_signers):
            raise Refusal("a member signs the contributor set at most once: duplicate signers")
        keyset.check_contributor_signatures(
            roster, dict(zip(request.contributor_signers, request.contributor_signatures)), members=members,
            key_id=key_id, round_=round_, model_hash=request.model_hash, contributors=contributors, threshold=t)
        active = request.active
        if len(set(active)) != len(active) or not set(active) <= set(members) or own not in active or len(active) < t:
            raise Refusal(f"the active decryptors {list(active)} must be >= {t} distinct members including this one")
        outside = sorted(set(active) - (set(contributors) & set(request.contributor_signers)))
        if outside:
            raise Refusal(f"the active decryptors {outside} are not contributors that signed C: A must be within "
                          f"the signers of the contributor set")
        if state.bulk == "kahe":
            c1 = self._capsule_sum(request, roster, params)
            c1_digest = _digest(rlwe.polys_to_bytes(params, c1))
        else:
            if request.capsule_c1s:
                raise Refusal("CKKS mode: the request carries capsule c1s, not C1")
            try:
                c1 = rlwe.polys_from_bytes(request.c1, params, count=state.num_polys or None)
            except ValueError as exc:
                raise Refusal(f"C1 is not canonical: {exc}") from None
            c1_digest = _digest(request.c1)
            if state.own_c1 and c1_digest == state.own_c1:
                raise Refusal("C1 equals this client's own c1")
        # only multiples of the sum over C are masked once the masks of K∖C are rebuilt: C must be connected
        masking.check_contributors_connected(members, state.mask_degree, state.transcript, contributors)
        used, ks = self._check_attempt(key_id, round_, c1_digest, request.model_hash, active, contributors,
                                       request.attempt)
        dropped = [name for name in members if name not in contributors]
        seeds, keys = list(state.revealed_seeds), list(state.revealed_keys)
        both = sorted(set(contributors) & set(keys) | set(dropped) & set(seeds))
        if both:
            raise Refusal(f"would reveal both the self-mask seed and the mask key of {both} (SecAgg's rule)")
        # before computing: one share per active set and per k, at most a active sets, one C1 per key set and round
        state.pdec_round, state.pdec_c1, state.pdec_model = round_, c1_digest, request.model_hash
        state.pdec_active, state.pdec_attempts = used + [_active_key(active)], ks + [request.attempt]
        state.revealed_seeds = sorted(set(seeds) | set(contributors))
        state.revealed_keys = sorted(set(keys) | set(dropped))
        points = dict(zip(members, threshold.member_points(len(members), params=params)))
        sk = threshold.SecretShare.from_bytes(state.sk_share, params)
        share = threshold.threshold_partial_decrypt(params, sk, [points[name] for name in active], c1,
                                                    num_clients=len(members))
        # attempt 1: D_j at L' limbs; a retry at the full L limbs (its masked shares sum to exactly s·C1 + Σ e*_j)
        share = compact.compress_decryption_share(params, share,
                                                  threshold.share_limbs(params, state.limbs, request.attempt))
        mask_keys = dict(zip(members, [bytes(k) for k in state.member_mask_keys]))
        share = threshold.mask_decryption_share(  # + Σ_{k ∈ A∖{j}} ±PRG(K_jk) at that level: cancels only over A
            share, own_name=own, own_private=state.mask_private,
            peers={name: mask_keys[name] for name in active if name != own},
            context=threshold.pdec_mask_context(state.transcript, round_, request.model_hash, active,
                                                attempt=request.attempt))
        index = {name: i for i, name in enumerate(members)}
        return PdecReply(share.to_bytes(), tuple(bytes(state.seed_shares[index[n]]) for n in contributors),
                         tuple(bytes(state.key_shares[index[n]]) for n in dropped))
