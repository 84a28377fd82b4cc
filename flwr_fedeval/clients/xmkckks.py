"""Client side of xMK-CKKS secure aggregation for any Flower ClientApp.

Add the query handlers and wrap your ``train`` handler with the mod::

    from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod

    app = ClientApp()
    register_xmkckks_handlers(app)   # query.xmk_keygen, _reveal, _shares, _contributors, _pdec

    @app.train(mods=[xmkckks_mod])
    def train(msg, context): ...     # unchanged: replies "arrays" + "metrics"

The mod leaves ordinary (plaintext) training untouched; when the train
message carries the key set (:class:`flwr_fedeval.protocol.xmk.TrainRequest`) it turns the reply into one
xMK-CKKS ciphertext of ``[n_i·(w_i − w_global), n_i]`` (Walskaar et al.
2023, Eq. 6; DESIGN.md §3 step 2), masked with pairwise zero-sum masks
(:mod:`flwr_fedeval.rlwe.masking`) and a self-mask (:mod:`flwr_fedeval.rlwe.selfmask`):
neither the update nor ``num-examples`` leaves the client in clear, and only the
sum over a contributor set the members signed decrypts (t-out-of-N threshold
decryption, :mod:`flwr_fedeval.rlwe.threshold`; issue 21).

Every node needs its roster identity (:func:`flwr_fedeval.clients.identity.node_identity`:
node config ``fedeval-identity-key`` + ``fedeval-roster``, or run config
``fedeval-identity-dir`` in simulation); without one it refuses every step with a configuration
refusal (``NOT_CONFIGURED``), which stops the run naming the keys to set.

What a client checks (▲, each refusal an error reply naming the reason;
the protocol is in :mod:`flwr_fedeval.rlwe.keyset`):

* ``query.xmk_keygen`` (commit): ▲ key-set id = H(params, seed-a), a
  128-bit parameter set, a key-set id it has not committed for before.
  Replies only a signed commitment to (b_i, X25519 mask key).
* ``query.xmk_reveal``: ▲ every commitment signed by a distinct roster
  member, its own among them, at least its floor
  (:func:`~flwr_fedeval.clients.identity.key_set_floor`: node config
  ``fedeval-min-clients``, raised by run config ``fedeval-min-clients``);
  ▲ one reveal per key set; ▲ k gives at least this client's
  floor of neighbours (:func:`~flwr_fedeval.clients.identity.mask_degree_floor`);
  ▲ N/2 < t <= N; ▲ the scale fits the noise budget for N and the bound B;
  ▲ the limb count L' is at least the fewest that budget allows
  (:func:`~flwr_fedeval.rlwe.compact.compact_limbs`) and at most L;
  ▲ 1 <= a (decryption attempts) <= :data:`~flwr_fedeval.rlwe.params.MAX_DECRYPTION_ATTEMPTS`.
  Replies (b_i, X_i) and its signature over the key-set transcript T, which
  binds every public parameter (parameter set, a, round, k, scale, B, t, L',
  decryption attempts).
* ``query.xmk_shares``: ▲ every opening matches its commitment and every member
  signed the same T; ▲ once per key set and round, the round after its last
  training round. Shamir-splits (t of N) s_i, its mask key and a fresh
  self-mask seed and seals each share to its member
  (:func:`~flwr_fedeval.rlwe.keyset.seal_shares`).
* ``train`` (the mod): ▲ **no retries**: at most one update per global model
  (:func:`~flwr_fedeval.protocol.xmk.model_hash`, whatever the key set) and
  the round strictly after its last (refused with
  ``ReplyCode.ALREADY_CONTRIBUTED``): the model is checked in the node's privacy
  ledger (:mod:`flwr_fedeval.clients.ledger`, across runs, never evicted) before
  training and recorded there before the reply leaves; ▲ the openings and T again; ▲ a valid share from every member
  (it keeps sk_j = Σ_i share_{i→j}). Clips n_i·Δw_i and n_i to the signed B
  (the count is logged and kept in the ledger, never sent), encrypts
  m_i + r_i + u_i under b = Σ b_j, r_i over its neighbours in the mask graph it
  derives itself from T (:func:`~flwr_fedeval.rlwe.masking.mask_neighbours`),
  u_i its self-mask, and sends c0 modulus-switched to the L' limbs of T
  with c1 exact (:func:`~flwr_fedeval.rlwe.compact.compress_ciphertext`).
* ``query.xmk_contributors``: ▲ C ⊆ K, |C| >= its floor and >= t, itself ∈ C
  iff it uploaded in the round, the model hash is the one it trained on;
  signs (key set, round, model hash, C) once per key set and round.
* ``query.xmk_pdec``: ▲ the key set and a round it holds a share for, C as
  above signed by >= t distinct members of K, the active set A (>= t members of
  K, itself among them, A ⊆ C ∩ the signers), C1 in the canonical encoding with
  the expected number of polynomials, C1 ≠ its own c1, and never the seed share
  and the mask-key share of one member (across the key set's rounds); ▲ the
  request's limb count is the L' of T; ▲ its decryption ledger of the key set
  and round (``ALREADY_CONTRIBUTED`` otherwise): one C1 and model hash, **one
  share per active set A** and **one per attempt index k**, k in 1..a, at most
  **a** active sets (signed in T, ``decryption-attempts`` <=
  :data:`~flwr_fedeval.rlwe.params.MAX_DECRYPTION_ATTEMPTS`), and the members
  of C that an A passes over as lost only grow from one A to the next.
  Replies D_j = λ_j·sk_j·C1 + e*_j, for k = 1 switched to L' limbs
  (:func:`~flwr_fedeval.rlwe.compact.compress_decryption_share`), for k >= 2 at
  the full L limbs (:func:`~flwr_fedeval.rlwe.threshold.share_limbs`), plus its
  pairwise masks over (A, k) (:func:`~flwr_fedeval.rlwe.threshold.mask_decryption_share`),
  and its shares of the seeds of C and of the mask keys of K∖C.

The client's secrets live in ``context.state`` (a ConfigRecord under
``"xmk-state"``), never in module globals (the deployment engine starts a
process per message).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord
from flwr.common.logger import log

from flwr_fedeval import rlwe
from flwr_fedeval.clients.identity import key_set_floor, mask_degree_floor, node_identity
from flwr_fedeval.clients.keras_adapter import WeightLayout
from flwr_fedeval.clients.ledger import node_ledger, record_training
from flwr_fedeval.identity import IdentityError
from flwr_fedeval.protocol import MalformedMessage, Refused, ReplyCode, error_reply, handler, register, xmk
from flwr_fedeval.rlwe import capsule, compact, kahe, keyset, masking, selfmask, threshold
from flwr_fedeval.secagg.member import MemberLedger, MemberState

__all__ = [
    "PartialDecryptionRefused",
    "register_xmkckks_handlers",
    "xmk_contributors",
    "xmk_keygen",
    "xmk_partial_decrypt",
    "xmk_shares",
    "xmk_reveal",
    "xmkckks_mod",
]

_STATE_KEY = "xmk-state"
_LEDGER_KEY = "xmk-ledger"
_MAX_USED_KEY_IDS = 64  # key-set ids this client committed for (refuses to commit twice)
_LABEL = "xMK-CKKS"

#: The old name of the client's refusal (:class:`flwr_fedeval.protocol.Refused`).
PartialDecryptionRefused = Refused

#: What a handler turns into an error reply besides :class:`Refused` and a malformed request.
_ERRORS = (keyset.KeySetError, IdentityError, masking.MaskKeyError, threshold.ThresholdError, kahe.KaheError,
           ValueError)


@contextlib.contextmanager
def _member(context: Context) -> Iterator[tuple[MemberState, MemberLedger]]:
    """The member's typed state and ledger, loaded once from ``context.state`` and saved once when the
    message is done (also when it is refused: what a step wrote before refusing stays written)."""
    state = MemberState.from_config(context.state[_STATE_KEY]) if _STATE_KEY in context.state else MemberState()
    ledger = (MemberLedger.from_config(context.state[_LEDGER_KEY]) if _LEDGER_KEY in context.state
              else MemberLedger())
    try:
        yield state, ledger
    finally:
        context.state[_STATE_KEY] = ConfigRecord(state.to_config())
        context.state[_LEDGER_KEY] = ConfigRecord(ledger.to_config())


def _serve(step: Callable[..., Any]) -> Callable[[Any, Message, Context], Any]:
    """A handler's ``serve(request, msg, context)`` running ``step(request, state, ledger, context)`` on the
    member's state (:func:`_member`)."""

    def serve(request: Any, msg: Message, context: Context) -> Any:
        with _member(context) as (state, ledger):
            return step(request, state, ledger, context)

    serve.__doc__ = step.__doc__
    return serve


def _params(name: str) -> rlwe.ParameterSet:
    params = rlwe.get_parameter_set(name)
    rlwe.validate_security(params)
    return params


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _current(state: MemberState, key_id: str, phase: str) -> str:
    """``key_id`` of the request, checked against this client's key set and its phase."""
    if not state.key_id or state.key_id != key_id:
        raise Refused(f"no key for key set {key_id!r}")
    if phase == "revealed" and not state.revealed:
        raise Refused(f"key set {key_id} has not been revealed to this client")
    return key_id


def _keygen(request: xmk.KeygenRequest, state: MemberState, ledger: MemberLedger,
            context: Context) -> xmk.KeygenReply:
    """Step 1 (commit): s_i, b_i = −s_i·a + e_i (Eq. 1) and a mask key; reply a signed commitment.

    Request :class:`~flwr_fedeval.protocol.xmk.KeygenRequest` (``params``, 32-byte ``seed-a``,
    ``key-id`` = :func:`~flwr_fedeval.rlwe.keyset.key_set_id`, ``round``); reply
    :class:`~flwr_fedeval.protocol.xmk.KeygenReply` (``key-id``, ``signer``, the 32-byte
    ``commitment`` to b_i and X_i, its ``signature``). Neither b_i nor X_i leaves the
    client before every member has committed. Source: Walskaar et al. 2023, Eq. 1;
    Bonawitz et al. 2017.
    """
    identity, _ = node_identity(context)
    params = _params(request.params)
    key_id = keyset.key_set_id(params, request.seed_a)
    if request.key_id != key_id:
        raise keyset.KeySetError(f"key-id {request.key_id!r} is not H(params, seed-a) = {key_id}")
    used = list(state.used_key_ids)
    if key_id in used:
        raise keyset.KeySetError(f"this client has already committed for key set {key_id}")
    secret, public = rlwe.keygen(params, rlwe.expand_a(params, request.seed_a))
    mask_private, mask_public = masking.new_mask_keypair()
    share = public.to_bytes()
    h = keyset.commitment(key_id, share, mask_public)
    signature = keyset.sign_commitment(identity, key_id=key_id, round_=request.round, commitment_=h)
    # a new key set replaces the old one (no key survives a re-key)
    fresh = MemberState(key_id=key_id, params=params.name, seed_a=request.seed_a, round=request.round,
                        name=identity.name, secret=secret.to_bytes(), share=share, mask_private=mask_private,
                        mask_public=mask_public, commitment=h, used_key_ids=(used + [key_id])[-_MAX_USED_KEY_IDS:])
    state.__dict__.update(fresh.__dict__)
    return xmk.KeygenReply(key_id, identity.name, h, signature)


def _check_not_trained(context: Context, model: bytes) -> None:
    """Refuse, before any training, a global model this node already gave an update for, in any run
    (the node's privacy ledger, :mod:`flwr_fedeval.clients.ledger`: a new run is a fresh
    ``context.state``, so the record cannot live there).

    Raises
    ------
    Refused
        Code ``ALREADY_CONTRIBUTED``: trained on ``model`` before; ``NOT_CONFIGURED``: no ledger.
    """
    if node_ledger(context).trained(model):
        raise Refused(f"no retries: this node already trained on global model {model.hex()[:16]}… "
                      f"(one update per global model, whatever the key set or run)",
                      code=ReplyCode.ALREADY_CONTRIBUTED)


def _reveal(request: xmk.RevealRequest, state: MemberState, ledger: MemberLedger,
            context: Context) -> xmk.RevealReply:
    """Step 1b (reveal): check every member's signed commitment and the public parameters, then open b_i and X_i.

    Request :class:`~flwr_fedeval.protocol.xmk.RevealRequest` (``key-id``, ``round``, aligned
    ``signers``/``commitments``/``signatures`` as each member replied to step 1, ``mask-degree``
    k, 0 = complete, ``scale-bits``, ``max-abs-value`` B, ``threshold`` t, ``limbs`` L',
    ``decryption-attempts`` a); reply
    :class:`~flwr_fedeval.protocol.xmk.RevealReply` (``public-share`` b_i, ``mask-key`` X_i,
    ``transcript`` T (32 bytes, binding every public parameter), ``transcript-signature``).

    Refuses (error reply) an unsigned, forged or duplicated entry, a key set
    without this client or with another commitment for it, fewer members
    than its floor, a mask degree below its floor, a threshold t <= N/2 or > N, a scale
    that does not fit the noise budget for N clients and B, a limb count L' below the fewest that
    budget allows after modulus switching (:func:`~flwr_fedeval.rlwe.compact.compact_limbs`: the sum
    would wrap around or lose its precision) or above L, a number of decryption attempts a outside
    [1, :data:`~flwr_fedeval.rlwe.params.MAX_DECRYPTION_ATTEMPTS`] (the smudging is sized for that
    maximum), or a second reveal for the same key set.
    """
    identity, roster = node_identity(context)
    key_id = _current(state, request.key_id, "committed")
    if state.revealed:
        raise keyset.KeySetError(f"this client has already revealed its share for key set {key_id}")
    if request.round != state.round:
        raise keyset.KeySetError(f"round {request.round} differs from the round of the commitment ({state.round})")
    members = keyset.check_commitments(
        roster, list(zip(request.signers, request.commitments, request.signatures)), key_id=key_id,
        round_=request.round, own_name=identity.name, own_commitment=state.commitment,
        floor=key_set_floor(context),
    )
    degree = request.mask_degree
    masking.check_mask_degree(degree, len(members), mask_degree_floor(context))
    # the one check of the public parameters (t, scale, L', a, bulk, the KAHE set derived from N, B, F)
    signed = request.parameters(state.params, state.seed_a, len(members))
    digest = signed.transcript(members)
    state.reveal(signed, members, digest)
    signature = keyset.sign_transcript(identity, key_id=key_id, round_=request.round, digest=digest)
    return xmk.RevealReply(key_id, identity.name, state.share, state.mask_public, digest,
                           signature)


def _open(request: xmk.SharesRequest | xmk.TrainRequest, state: MemberState, context: Context,
          params: rlwe.ParameterSet) -> tuple[rlwe.PublicKey, dict[str, bytes], dict[str, bytes]]:
    """▲ the joint key b = Σ b_j and every member's mask key, from openings checked here.

    The client never takes an aggregate key from the server: every b_j must
    match the commitment its member signed before seeing the others', and
    every member must have signed the same key-set transcript. Returns
    ``(b, {member: X_j} of every member, {neighbour: X_j} of its mask graph)``.
    """
    _, roster = node_identity(context)
    key_id = state.key_id
    names = list(state.members)
    members = list(zip(names, [bytes(h) for h in state.member_commitments]))
    floor = key_set_floor(context)
    if len(names) < floor:
        raise keyset.KeySetError(f"key set {key_id} has {len(names)} members, this client requires at least {floor}")
    num_clients = getattr(request, "num_clients", len(names))
    if num_clients != len(names):
        raise keyset.KeySetError(f"num-clients is {num_clients}, the key set has {len(names)} members")
    signers = request.signers
    if len(set(signers)) != len(signers):
        raise keyset.KeySetError("signers, public-shares, mask-keys and transcript-signatures must align, "
                                 "one entry per member")
    openings = dict(zip(signers, zip(request.public_shares, request.mask_keys)))
    joint, peers = keyset.open_key_set(params, key_id=key_id, members=members, openings=openings)
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


def _check_round(state: MemberState, ledger: MemberLedger, round_: int) -> None:
    """▲ no retries: ``round_`` is after the last round this client trained in (any key set) and not
    before the key set's first round."""
    last = ledger.last_round
    if round_ <= last:
        raise Refused(f"no retries: round {round_} is not after round {last}, the last this client trained in "
                      f"(rounds strictly increase)", code=ReplyCode.ALREADY_CONTRIBUTED)
    if round_ < state.round:
        raise Refused(f"round {round_} is before the round of key set {state.key_id} ({state.round})")


def _shares(request: xmk.SharesRequest, state: MemberState, ledger: MemberLedger,
            context: Context) -> xmk.SharesReply:
    """Step 1c: Shamir-split s_i, the mask key x_i and a fresh self-mask seed u_i; seal each share to its member.

    Request :class:`~flwr_fedeval.protocol.xmk.SharesRequest` (every member's opening and signature over
    T); reply :class:`~flwr_fedeval.protocol.xmk.SharesReply` (one AES-GCM box per other member,
    :func:`~flwr_fedeval.rlwe.keyset.seal_shares`). t-out-of-N with N = |K| and t from T
    (Mouchet et al. 2021, §4; Bonawitz et al. 2017, §4: double masking).

    Refuses (nothing shared) a key set it has not revealed, openings that do not match the
    commitments or a T not signed by every member (as the train step), a round not after its last
    training round, or a second request for the same key set and round.
    """
    key_id = _current(state, request.key_id, "revealed")
    params = _params(request.params)
    if params.name != state.params:
        raise Refused("parameter set differs from the key set's")
    _check_round(state, ledger, request.round)
    if state.shares_round >= request.round:
        raise Refused(f"already shared its keys for key set {key_id} in round {state.shares_round}: "
                      f"one sharing per key set and round", code=ReplyCode.ALREADY_CONTRIBUTED)
    _, peers, _ = _open(request, state, context, params)
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
    return xmk.SharesReply(key_id, own, request.round, tuple(recipients), tuple(sealed))


def _open_inbox(request: xmk.TrainRequest, state: MemberState, params: rlwe.ParameterSet,
                peers: dict[str, bytes]) -> None:
    """▲ a valid share from every member of K; keep sk_j = Σ_i share_{i→j} and the byte shares (step 2)."""
    names = list(state.members)
    own = state.name
    others = sorted(set(names) - {own})
    if sorted(request.senders) != others or len(set(request.senders)) != len(request.senders):
        raise Refused(f"the inbox must hold one box from every other member of the key set: from "
                      f"{sorted(request.senders)}, expected {others}")
    points = dict(zip(names, threshold.member_points(len(names), params=params)))
    t = state.threshold
    own_parts = [bytes(p) for p in state.own_shares]
    by_sender = {own: own_parts}
    for sender, box in zip(request.senders, request.sealed_shares):
        by_sender[sender] = keyset.open_shares(box, key_id=state.key_id, round_=request.round,
                                               transcript=state.transcript, sender=sender,
                                               sender_public=peers[sender], recipient=own,
                                               own_private=state.mask_private, count=3)
    ring_shares = []
    for name in names:
        share = threshold.SecretShare.from_bytes(by_sender[name][0], params)
        if share.point != points[own] or share.threshold != t:
            raise Refused(f"the share from {name!r} is for point {share.point} with t={share.threshold}, "
                          f"expected point {points[own]} with t={t}")
        for part in by_sender[name][1:]:
            if len(part) != threshold.BYTES_SHARE_SIZE:
                raise Refused(f"a byte share from {name!r} is not {threshold.BYTES_SHARE_SIZE} bytes")
        ring_shares.append(share)
    state.sk_share = threshold.aggregate_shares(params, ring_shares).to_bytes()
    state.member_mask_keys = [peers[name] for name in names]  # checked openings: masks of step 3
    state.key_shares = [by_sender[name][1] for name in names]
    state.seed_shares = [by_sender[name][2] for name in names]
    state.sk_round = request.round
    state.own_shares = []


def _clip(vector: np.ndarray, bound: float, ledger: MemberLedger) -> np.ndarray:
    """Clip every value to the signed bound [-B, B] (Flower SecAgg+'s ``clipping_range``); the count is
    logged on the node and kept in the ledger, never sent."""
    if not np.all(np.isfinite(vector)):
        raise ValueError(f"the update has {int(np.sum(~np.isfinite(vector)))} NaN/inf values")
    clipped = int(np.count_nonzero(np.abs(vector) > bound))
    ledger.clipped_last = clipped
    ledger.clipped_values += clipped
    if clipped:
        log(WARNING, "xMK-CKKS: %d of %d values clipped to the signed bound %.4g (kept on this node)",
            clipped, vector.size, bound)
    return np.clip(vector, -bound, bound)


def xmkckks_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Flower mod: encrypt the reply of a ``train`` handler under the joint key, masked.

    Active only when the message carries the key set
    (:class:`~flwr_fedeval.protocol.xmk.TrainRequest`, the ``"xmk"`` ConfigRecord the
    secure-aggregation strategy sets); otherwise the handler's reply passes through
    unchanged. The wrapped handler must reply with ``"arrays"`` (new weights, same
    layout as the received ones) and a ``"metrics"`` MetricRecord with ``"num-examples"``.

    The mods inside it and the handler get Flower's own ``train`` message: the key set's record is
    taken off (:meth:`~flwr_fedeval.protocol.xmk.TrainRequest.without`), so Flower's
    ``fixedclipping_mod`` / ``adaptiveclipping_mod`` (which want exactly one ArrayRecord and one
    ConfigRecord) clip the update that is then encrypted. List this mod **first** (outermost)::

        @app.train(mods=[xmkckks_mod, fixedclipping_mod])

    (the other order would clip a ciphertext; Flower refuses it with ``MOD_FAILED_PRECONDITION``).

    The reply (:class:`~flwr_fedeval.protocol.xmk.TrainReply`) carries the ciphertext of
    ``[n_i·(w_i − w), n_i] + r_i + u_i`` (float64, fixed point with Δ = 2^scale-bits of T, clipped
    to the bound B of T, plus the pairwise mask r_i and the self-mask u_i mod q) and the metrics
    without ``num-examples``. A refusal (see the module docstring) or a malformed request is an
    error reply; a second train request for a global model this client already trained on, or for
    a round not after its last, is refused with ``ReplyCode.ALREADY_CONTRIBUTED`` (no retries).
    """
    if msg.metadata.message_type != xmk.TRAIN.message_type or not xmk.TrainRequest.carried_by(msg.content):
        return call_next(msg, context)
    with _member(context) as (state, ledger):
        return _train(msg, context, call_next, state, ledger)


def _train(msg: Message, context: Context, call_next: Callable[[Message, Context], Message], state: MemberState,
           ledger: MemberLedger) -> Message:
    """:func:`xmkckks_mod` on the member's state (loaded and saved once by the caller)."""
    try:
        request = xmk.TrainRequest.from_record(msg.content)
        _current(state, request.key_id, "revealed")
        params = _params(request.params)
        if params.name != state.params:
            raise keyset.KeySetError("parameter set differs from the key set's")
        model = xmk.model_hash(msg.content["arrays"])
        _check_not_trained(context, model)
        _check_round(state, ledger, request.round)
        if state.shares_round != request.round:
            raise Refused(f"round {request.round}: this client shared no keys for key set {request.key_id} "
                          f"in that round")
        if request.round <= state.enc_round:
            raise keyset.KeySetError(
                f"round {request.round} is not after this client's last encryption under this key set "
                f"(round {state.enc_round}): masks are never reused"
            )
        joint, all_peers, peers = _open(request, state, context, params)  # checks before any training
        _open_inbox(request, state, params, all_peers)
    except (Refused, MalformedMessage, *_ERRORS) as exc:
        return error_reply(msg, exc, _LABEL)
    global_arrays = msg.content["arrays"].to_numpy_ndarrays()

    # the inner mods and the handler get Flower's train message: one ArrayRecord, one ConfigRecord
    msg.content = xmk.TrainRequest.without(msg.content)
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    try:
        new_arrays = reply.content["arrays"].to_numpy_ndarrays()
        metrics = reply.content["metrics"]
        num_examples = int(metrics["num-examples"])
    except KeyError as exc:
        raise ValueError(f"train reply lacks {exc} (needs 'arrays' and metrics 'num-examples')") from exc
    try:
        if num_examples < 1:
            raise ValueError(f"num-examples must be >= 1, got {num_examples}")
        layout = WeightLayout.of(global_arrays)
        update = layout.flatten(new_arrays) - layout.flatten(global_arrays)
        m = len(state.members)
        bound, scale_bits = state.max_abs_value, state.scale_bits
        kahe_reply = b""
        if state.bulk == "kahe":
            # the update under KAHE with a fresh key k_i (never reused: two rounds would give k_i = K_C - K_C'),
            # n_i and the clipped count in the integer slots (the server learns only their totals)
            vector = _clip(num_examples * update, bound, ledger)
            kahe_params = state.parameters().kahe  # derived from the signed (N, B, F)
            assert kahe_params is not None
            key = kahe.sample_key(kahe_params)
            seed = kahe.public_seed(state.transcript, request.round)
            integers = np.array([num_examples, ledger.clipped_last], dtype=np.int64)
            kahe_reply = kahe.encrypt(kahe_params, seed, key, vector, integers).to_bytes()
            del vector
            # the key capsule: k_i as one xMK-CKKS polynomial, masked below like a CKKS-mode update
            plaintext = _capsule_plaintext(params, key, scale_bits=scale_bits, num_clients=m,
                                           kahe_params=kahe_params)
            del key
        else:
            vector = _clip(np.append(num_examples * update, float(num_examples)), bound, ledger)
            plaintext = rlwe.encode(params, vector, scale_bits=scale_bits, num_clients=m)
        context_bytes = masking.mask_context(state.transcript, request.round)
        masked = masking.mask_plaintext(
            params, plaintext, own_name=state.name, own_private=state.mask_private,
            peers=peers, context=context_bytes,
        )
        masked = masking.apply_mask(params, masked, selfmask.self_mask(params, state.self_seed,
                                                                       plaintext.shape[0]))
        a = rlwe.expand_a(params, state.seed_a)
        ct = rlwe.encrypt(params, joint, a, masked)
        upload = compact.compress_ciphertext(ct, state.limbs)  # c0 at L' limbs, c1 exact
        c1_bytes = rlwe.polys_to_bytes(params, ct.c1)
        if state.bulk == "kahe":
            identity, _ = node_identity(context)
            signature = keyset.sign_capsule(identity, key_id=state.key_id,
                                            transcript=state.transcript, round_=request.round,
                                            model_hash=model, c1=c1_bytes)
            payload = xmk.TrainReply(kahe_reply, None, upload.to_bytes(), signature)
        else:
            payload = xmk.TrainReply(upload.to_bytes())
        # written before the reply leaves (a kill -9 after this line never allows a second update);
        # a concurrent run that recorded the model first makes this raise, and nothing is sent
        record_training(context, model)
    except (Refused, *_ERRORS) as exc:
        return error_reply(msg, exc, _LABEL)
    ledger.last_round = request.round  # rounds strictly increase
    state.enc_round = request.round
    state.enc_model = model
    state.num_polys = ct.num_polys
    state.own_c1 = _digest(c1_bytes)
    state.self_seed = b""  # used once
    clear_metrics = MetricRecord({k: v for k, v in metrics.items() if k != "num-examples"})
    return Message(content=replace(payload, metrics=clear_metrics).to_record(), reply_to=msg)


def _capsule_plaintext(params: rlwe.ParameterSet, key: np.ndarray, *, scale_bits: int, num_clients: int,
                       kahe_params: kahe.KaheParameters) -> np.ndarray:
    """The key capsule's plaintext: k_i (n integers) at the signed scale, one polynomial
    (:func:`flwr_fedeval.rlwe.capsule.encode_key`)."""
    return capsule.encode_key(params, key, scale_bits=scale_bits, num_clients=num_clients, kahe_params=kahe_params)


def _check_contributors(state: MemberState, context: Context, contributors: tuple[str, ...], round_: int,
                        model: bytes) -> None:
    """▲ C ⊆ K without duplicates, |C| >= this client's floor and >= t; itself ∈ C iff it uploaded in
    ``round_``; the model hash is the one it trained on (when it did)."""
    members = list(state.members)
    own = state.name
    if len(set(contributors)) != len(contributors):
        raise Refused("contributor list has duplicates")
    extra = sorted(set(contributors) - set(members))
    if extra:
        raise Refused(f"contributors {extra} are not members of key set {state.key_id}")
    floor, t = key_set_floor(context), state.threshold
    if len(contributors) < max(floor, t):
        raise Refused(f"{len(contributors)} contributors, this client requires at least {max(floor, t)} "
                      f"(its floor {floor}, the threshold {t})")
    uploaded = state.enc_round == round_
    if uploaded != (own in contributors):
        raise Refused(f"the contributor list {'leaves out' if uploaded else 'lists'} this client, which "
                      f"{'uploaded' if uploaded else 'did not upload'} in round {round_}")
    if uploaded and state.enc_model != model:
        raise Refused("the model hash is not the one of the global model this client trained on")


def _contributors(request: xmk.ContributorsRequest, state: MemberState, ledger: MemberLedger,
                  context: Context) -> xmk.ContributorsReply:
    """Step 2b: sign the contributor set C once per key set and round (SecAgg's consistency check,
    Bonawitz et al. 2017, §4).

    Request :class:`~flwr_fedeval.protocol.xmk.ContributorsRequest` (``key-id``, ``round``,
    ``model-hash``, ``contributors``); reply :class:`~flwr_fedeval.protocol.xmk.ContributorsReply`
    (:func:`~flwr_fedeval.rlwe.keyset.sign_contributors`). Refuses (nothing signed) a key set or
    round it holds no shares for, a second request for the same key set and round (whatever C:
    ``ALREADY_CONTRIBUTED``), and any C that fails :func:`_check_contributors`.
    """
    identity, _ = node_identity(context)
    key_id = _current(state, request.key_id, "revealed")
    if state.sk_round != request.round:
        raise Refused(f"round {request.round}: this client holds no decryption share of key set {key_id}")
    if state.signed_round == request.round:
        raise Refused(f"already signed a contributor set for key set {key_id} in round {request.round}: "
                      f"one per key set and round", code=ReplyCode.ALREADY_CONTRIBUTED)
    _check_contributors(state, context, request.contributors, request.round, request.model_hash)
    state.signed_round = request.round
    signature = keyset.sign_contributors(identity, key_id=key_id, round_=request.round,
                                         model_hash=request.model_hash, contributors=request.contributors)
    return xmk.ContributorsReply(key_id, identity.name, signature)


def _active_key(active) -> str:
    """How an active set is kept in the ledger: its sorted names, JSON-encoded (one spelling per set)."""
    return json.dumps(sorted(str(a) for a in active))


def _passed_over(contributors, active) -> set[str]:
    """L(A): the members of C that sort before A's last member and are not in A (those a server that picks
    "the first t signers not lost" has passed over: lost, or no signature)."""
    last = max(active)
    return {name for name in contributors if name < last and name not in active}


def _check_attempt(state: MemberState, key_id: str, round_: int, c1_digest: str, model: bytes, active,
                   contributors, attempt: int) -> tuple[list[str], list[int]]:
    """▲ the decryption ledger of (key set, round): one C1 and model hash, one share per active set A, one per
    attempt index k, at most a (signed in T) active sets, and a passed-over set L(A) (:func:`_passed_over`)
    that strictly grows from each A to the next (a member passed over as lost stays lost). Returns the
    active sets and attempt indices already answered in ``round_`` (the ledger ``pdec-active`` and
    ``pdec-attempts`` of the state, :func:`_active_key` strings and ints, aligned).

    One share per k is what keeps the retries simulatable: a member gives at most one share switched to
    L' limbs (k = 1) per round, so at most one complete switched attempt exists whatever the server
    asks -- two would need a member of both active sets (each has > N/2 members) to answer k = 1 twice --
    and every other complete attempt is at the full L limbs, revealing s·C1 plus fresh smudging only
    (:mod:`flwr_fedeval.rlwe.threshold`, "Why the retry is sent at the full level").

    Raises
    ------
    Refused
        ``ALREADY_CONTRIBUTED``: another C1 or model than the round's first request, an A already answered,
        a + 1 distinct A, a k already answered, or an A whose passed-over set does not strictly contain
        an earlier one's.
    """
    if state.pdec_round != round_:
        return [], []
    if state.pdec_c1 != c1_digest or state.pdec_model != model:
        raise Refused(f"already decrypted once for key set {key_id} in round {round_} for another C1 or model: "
                      f"one C1 per key set and round", code=ReplyCode.ALREADY_CONTRIBUTED)
    used = [str(a) for a in state.pdec_active]
    if _active_key(active) in used:
        raise Refused(f"already decrypted once for key set {key_id} in round {round_} for the active set "
                      f"{sorted(active)}: one share per active set", code=ReplyCode.ALREADY_CONTRIBUTED)
    attempts = state.decryption_attempts
    if len(used) >= attempts:
        raise Refused(f"already decrypted for {len(used)} active sets of key set {key_id} in round {round_}: at "
                      f"most a = {attempts} (signed in the key-set transcript)", code=ReplyCode.ALREADY_CONTRIBUTED)
    ks = [int(k) for k in state.pdec_attempts]
    if attempt in ks:
        raise Refused(f"already decrypted once for key set {key_id} in round {round_} as attempt k={attempt}: one "
                      f"share per attempt index (at most one switched to L' limbs)",
                      code=ReplyCode.ALREADY_CONTRIBUTED)
    passed = _passed_over(contributors, active)
    for earlier in used:
        before = _passed_over(contributors, json.loads(earlier))
        if not before < passed:
            raise Refused(f"already decrypted for the active set {json.loads(earlier)}: a later active set must pass "
                          f"over every member it passed over ({sorted(before)}) and more, got {sorted(passed)} "
                          f"(members lost stay lost)", code=ReplyCode.ALREADY_CONTRIBUTED)
    return used, ks


def _capsule_sum(request: xmk.PdecRequest, state: MemberState, roster, params: rlwe.ParameterSet) -> np.ndarray:
    """▲ KAHE mode: one capsule c1 per contributor of C, each canonical (one polynomial at L limbs) and signed
    by that contributor for (T, round, model hash), this client's own the one it sent; returns
    C1 = Σ_{i∈C} c1_i (shape (1, L, n), uint64), computed here: the server cannot ask for any other
    combination of the capsules (such as 2·c1_v).

    Raises
    ------
    Refused
        C1 sent instead of the capsules, a count other than |C|, a non-canonical c1, this client's own c1
        not the one it sent.
    flwr_fedeval.identity.IdentityError
        A signature that does not verify for its contributor.
    """
    contributors = request.contributors
    if request.c1:
        raise Refused("KAHE mode: a decryptor sums the contributors' signed capsule c1 itself; the request "
                      "carries a C1 instead")
    if len(request.capsule_c1s) != len(contributors) or len(request.capsule_signatures) != len(contributors):
        raise Refused(f"KAHE mode: {len(request.capsule_c1s)} capsule c1s and {len(request.capsule_signatures)} "
                      f"signatures for {len(contributors)} contributors: one of each per contributor")
    own = state.name
    total = None
    for name, raw, signature in zip(contributors, request.capsule_c1s, request.capsule_signatures):
        keyset.check_capsule_signature(roster, name, signature, key_id=state.key_id,
                                       transcript=state.transcript, round_=request.round,
                                       model_hash=request.model_hash, c1=raw)
        if name == own and _digest(raw) != state.own_c1:
            raise Refused("the capsule c1 listed for this client is not the one it sent")
        try:
            c1 = rlwe.polys_from_bytes(raw, params, count=capsule.CAPSULE_POLYS)
        except ValueError as exc:
            raise Refused(f"the capsule c1 of {name!r} is not canonical: {exc}") from None
        total = c1 if total is None else params.ring.add(total, c1)
    assert total is not None  # |C| >= t >= 1
    return total


def _partial_decrypt(request: xmk.PdecRequest, state: MemberState, ledger: MemberLedger,
                     context: Context) -> xmk.PdecReply:
    """Step 3: D_j = λ_j·sk_j·C1 + e*_j (threshold form of Walskaar et al. 2023, Eq. 7) plus
    Σ_{k∈A∖{j}} ±PRG(K_jk) (:func:`~flwr_fedeval.rlwe.threshold.mask_decryption_share`), once per
    active set A and attempt index k: attempt 1 switched to L' limbs before the masks are added (mod q'),
    every retry at the full L limbs (mod q; :func:`~flwr_fedeval.rlwe.threshold.share_limbs`); and the
    recovery shares: of the self-mask seed of every i ∈ C, of the mask key of every i ∈ K∖C.

    Request :class:`~flwr_fedeval.protocol.xmk.PdecRequest` (``params``, ``key-id``, ``round``,
    ``contributors`` C, ``num-clients``, ``model-hash``, the members' signatures over C, the active
    decryptors A, the attempt index k; C1, the canonical bytes of the polynomials); reply
    :class:`~flwr_fedeval.protocol.xmk.PdecReply`.

    Refuses (:class:`~flwr_fedeval.protocol.Refused`, an error reply, nothing decrypted) when

    * the key set is not the one this client holds, or it holds no share for the round,
    * (``ALREADY_CONTRIBUTED``) it has already decrypted for this key set and round another C1 or model
      hash, or this A, or this k, or a (signed in T) active sets, or an A that passed over a member this
      A does not pass over (:func:`_check_attempt`),
    * the attempt index k is not in 1..a (a signed in T),
    * C fails :func:`_check_contributors`, or fewer than t distinct members of K signed this C for
      this model hash (:func:`~flwr_fedeval.rlwe.keyset.check_contributor_signatures`),
    * A is not a set of >= t members of K that includes this client and lies within C and the signers
      of C, ``num-clients`` disagrees, or
      ``limbs`` is not the L' signed in T,
    * C1 is not canonical (a header field other than expected, a count other
      than its own ciphertext's, a wrong length, an unreduced residue), or equals its own c1,
    * it would reveal, for one member, shares of both its seed and its mask key (across the rounds
      of the key set: SecAgg's rule).
    """
    _, roster = node_identity(context)
    key_id = _current(state, request.key_id, "revealed")
    params = _params(request.params)
    if params.name != state.params:
        raise Refused("parameter set differs from the key's")
    round_ = request.round
    if state.sk_round != round_:
        raise Refused(f"round {round_}: this client holds no decryption share of key set {key_id} for that round")
    members = list(state.members)
    own = state.name
    t = state.threshold
    if request.num_clients != len(members):
        raise Refused("num-clients disagrees with the key set")
    if request.limbs != state.limbs:
        raise Refused(f"limbs={request.limbs} is not the limb count L'={state.limbs} signed in the key-set "
                      f"transcript")
    attempts = state.decryption_attempts
    if not 1 <= request.attempt <= attempts:
        raise Refused(f"attempt k={request.attempt} must be in [1, {attempts}]: a = {attempts} attempts are signed "
                      f"in the key-set transcript")
    contributors = request.contributors
    _check_contributors(state, context, contributors, round_, request.model_hash)
    if len(set(request.contributor_signers)) != len(request.contributor_signers):
        raise Refused("a member signs the contributor set at most once: duplicate signers")
    keyset.check_contributor_signatures(
        roster, dict(zip(request.contributor_signers, request.contributor_signatures)), members=members,
        key_id=key_id, round_=round_, model_hash=request.model_hash, contributors=contributors, threshold=t)
    active = request.active
    if len(set(active)) != len(active) or not set(active) <= set(members) or own not in active or len(active) < t:
        raise Refused(f"the active decryptors {list(active)} must be >= {t} distinct members including this one")
    outside = sorted(set(active) - (set(contributors) & set(request.contributor_signers)))
    if outside:
        raise Refused(f"the active decryptors {outside} are not contributors that signed C: A must be within "
                      f"the signers of the contributor set")
    if state.bulk == "kahe":
        c1 = _capsule_sum(request, state, roster, params)
        c1_digest = _digest(rlwe.polys_to_bytes(params, c1))
    else:
        if request.capsule_c1s:
            raise Refused("CKKS mode: the request carries capsule c1s, not C1")
        try:
            count = state.num_polys or None
            c1 = rlwe.polys_from_bytes(request.c1, params, count=count)
        except ValueError as exc:
            raise Refused(f"C1 is not canonical: {exc}") from None
        c1_digest = _digest(request.c1)
        if state.own_c1 and c1_digest == state.own_c1:
            raise Refused("C1 equals this client's own c1")
    # only multiples of the sum over C are masked once the masks of K∖C are rebuilt: C must be connected
    masking.check_contributors_connected(members, state.mask_degree, state.transcript,
                                         contributors)
    used, ks = _check_attempt(state, key_id, round_, c1_digest, request.model_hash, active, contributors,
                              request.attempt)
    dropped = [name for name in members if name not in contributors]
    seeds, keys = list(state.revealed_seeds), list(state.revealed_keys)
    both = sorted(set(contributors) & set(keys) | set(dropped) & set(seeds))
    if both:
        raise Refused(f"would reveal both the self-mask seed and the mask key of {both} (SecAgg's rule)")
    # before computing: one share per active set and per k, at most a active sets and one C1 per key set and round
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
    share = threshold.mask_decryption_share(  # + Σ_{k ∈ A∖{j}} ±PRG(K_jk) at that level: cancels only over all of A
        share, own_name=own, own_private=state.mask_private,
        peers={name: mask_keys[name] for name in active if name != own},
        context=threshold.pdec_mask_context(state.transcript, round_, request.model_hash, active,
                                            attempt=request.attempt))
    index = {name: i for i, name in enumerate(members)}
    return xmk.PdecReply(share.to_bytes(), tuple(bytes(state.seed_shares[index[n]]) for n in contributors),
                         tuple(bytes(state.key_shares[index[n]]) for n in dropped))


#: The query handlers (ClientApp handler functions ``(msg, context) -> reply``).
xmk_keygen = handler(xmk.KEYGEN, _serve(_keygen), label=_LABEL, errors=_ERRORS)
xmk_reveal = handler(xmk.REVEAL, _serve(_reveal), label=_LABEL, errors=_ERRORS)
xmk_shares = handler(xmk.SHARES, _serve(_shares), label=_LABEL, errors=_ERRORS)
xmk_contributors = handler(xmk.CONTRIBUTORS, _serve(_contributors), label=_LABEL, errors=_ERRORS)
xmk_partial_decrypt = handler(xmk.PDEC, _serve(_partial_decrypt), label=_LABEL, errors=_ERRORS)
for _handler, _serve in ((xmk_keygen, _keygen), (xmk_reveal, _reveal), (xmk_shares, _shares),
                         (xmk_contributors, _contributors), (xmk_partial_decrypt, _partial_decrypt)):
    _handler.__doc__ = _serve.__doc__


def register_xmkckks_handlers(app) -> None:
    """Register :func:`xmk_keygen`, :func:`xmk_reveal`, :func:`xmk_shares`, :func:`xmk_contributors` and
    :func:`xmk_partial_decrypt` on ``app`` (the query steps of :data:`flwr_fedeval.protocol.xmk.STEPS`;
    step 2 is the App's own ``train`` handler wrapped by :func:`xmkckks_mod`)."""
    register(app, xmk.QUERY_STEPS, {xmk.KEYGEN.message_type: xmk_keygen, xmk.REVEAL.message_type: xmk_reveal,
                                     xmk.SHARES.message_type: xmk_shares,
                                     xmk.CONTRIBUTORS.message_type: xmk_contributors,
                                     xmk.PDEC.message_type: xmk_partial_decrypt})
