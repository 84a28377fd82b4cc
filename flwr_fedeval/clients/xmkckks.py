"""Client side of xMK-CKKS secure aggregation for any Flower ClientApp.

Add the query handlers and wrap your ``train`` handler with the mod::

    from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod

    app = ClientApp()
    register_xmkckks_handlers(app)   # query.xmk_keygen, query.xmk_reveal, query.xmk_pdec

    @app.train(mods=[xmkckks_mod])
    def train(msg, context): ...     # unchanged: replies "arrays" + "metrics"

The mod leaves ordinary (plaintext) training untouched; when the train
message carries the key set (:class:`flwr_fedeval.protocol.xmk.TrainRequest`) it turns the reply into one
xMK-CKKS ciphertext of ``[n_i·(w_i − w_global), n_i]`` (Walskaar et al.
2023, Eq. 6; DESIGN.md §3 step 2), masked with pairwise zero-sum masks
(:mod:`flwr_fedeval.rlwe.masking`): neither the update nor ``num-examples``
leaves the client in clear, and only the sum over the whole key set decrypts.

Every node needs its roster identity (:func:`flwr_fedeval.clients.identity.node_identity`:
node config ``fedeval-identity-key`` + ``fedeval-roster``, or run config
``identity-dir`` in simulation); without one it refuses every step.

What a client checks (▲, each refusal an error reply naming the reason;
the protocol is in :mod:`flwr_fedeval.rlwe.keyset`):

* ``query.xmk_keygen`` (commit): ▲ key-set id = H(params, seed-a), a
  128-bit parameter set, a key-set id it has not committed for before.
  Replies only a signed commitment to (b_i, X25519 mask key).
* ``query.xmk_reveal``: ▲ every commitment signed by a distinct roster
  member, its own among them, at least its floor
  (:func:`~flwr_fedeval.clients.identity.key_set_floor`: node config
  ``fedeval-min-clients`` / ``xmk-min-clients``, else run config
  ``min-nodes``); ▲ one reveal per key set. Replies (b_i, X_i) and its
  signature over the key-set transcript T, which includes the mask degree
  k; ▲ k gives at least this client's floor of neighbours
  (:func:`~flwr_fedeval.clients.identity.mask_degree_floor`: node config,
  else run config ``xmk-mask-degree``; 0 = the complete graph).
* ``train`` (the mod): ▲ every opening matches its commitment, every member
  signed the same T, the round is later than its last encryption under
  this key set (masks are never reused), ``num-clients`` = |K|, at least
  its floor. Encrypts m_i + r_i under b = Σ b_j, r_i over its neighbours
  in the mask graph it derives itself from T
  (:func:`~flwr_fedeval.rlwe.masking.mask_neighbours`).
* ``query.xmk_pdec``: ▲ the key set and round of its last encryption, at
  most **one** partial decryption per key set and round (a second request
  is refused whatever C1), the contributor list = the key set's members,
  C1 in the canonical encoding with the expected number of polynomials
  (header fields, length, reduced residues), C1 ≠ its own c1.

The client's secrets live in ``context.state`` (a ConfigRecord under
``"xmk-state"``), never in module globals (the deployment engine starts a
process per message).
"""

from __future__ import annotations

import hashlib

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord

from flwr_fedeval import rlwe
from flwr_fedeval.clients.identity import key_set_floor, mask_degree_floor, node_identity
from flwr_fedeval.clients.keras_adapter import WeightLayout
from flwr_fedeval.identity import IdentityError
from flwr_fedeval.protocol import MalformedMessage, Refused, error_reply, handler, register, xmk
from flwr_fedeval.rlwe import keyset, masking

__all__ = [
    "PartialDecryptionRefused",
    "register_xmkckks_handlers",
    "xmk_keygen",
    "xmk_partial_decrypt",
    "xmk_reveal",
    "xmkckks_mod",
]

_STATE_KEY = "xmk-state"
_MAX_USED_KEY_IDS = 64  # key-set ids this client committed for (refuses to commit twice)
_LABEL = "xMK-CKKS"

#: The old name of the client's refusal (:class:`flwr_fedeval.protocol.Refused`).
PartialDecryptionRefused = Refused

#: What a handler turns into an error reply besides :class:`Refused` and a malformed request.
_ERRORS = (keyset.KeySetError, IdentityError, masking.MaskKeyError, ValueError, KeyError)


def _state(context: Context) -> ConfigRecord:
    if _STATE_KEY not in context.state:
        context.state[_STATE_KEY] = ConfigRecord()
    return context.state[_STATE_KEY]


def _params(name: str) -> rlwe.ParameterSet:
    params = rlwe.get_parameter_set(name)
    rlwe.validate_security(params)
    return params


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _current(state: ConfigRecord, key_id: str, phase: str) -> str:
    """``key_id`` of the request, checked against this client's key set and its phase."""
    if "key-id" not in state or state["key-id"] != key_id:
        raise Refused(f"no key for key set {key_id!r}")
    if phase == "revealed" and not state.get("members"):
        raise Refused(f"key set {key_id} has not been revealed to this client")
    return key_id


def _keygen(request: xmk.KeygenRequest, msg: Message, context: Context) -> xmk.KeygenReply:
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
    state = _state(context)
    used = list(state.get("used-key-ids", []))
    if key_id in used:
        raise keyset.KeySetError(f"this client has already committed for key set {key_id}")
    secret, public = rlwe.keygen(params, rlwe.expand_a(params, request.seed_a))
    mask_private, mask_public = masking.new_mask_keypair()
    share = public.to_bytes()
    h = keyset.commitment(key_id, share, mask_public)
    signature = keyset.sign_commitment(identity, key_id=key_id, round_=request.round, commitment_=h)
    state.clear()  # a new key set replaces the old one (no key survives a re-key)
    state.update({
        "key-id": key_id, "params": params.name, "seed-a": request.seed_a, "round": request.round,
        "name": identity.name, "secret": secret.to_bytes(), "share": share, "mask-private": mask_private,
        "mask-public": mask_public, "commitment": h, "used-key-ids": (used + [key_id])[-_MAX_USED_KEY_IDS:],
        "enc-round": -1, "pdec-round": -1,
    })
    return xmk.KeygenReply(key_id, identity.name, h, signature)


def _reveal(request: xmk.RevealRequest, msg: Message, context: Context) -> xmk.RevealReply:
    """Step 2 (reveal): check every member's signed commitment, then open b_i and X_i.

    Request :class:`~flwr_fedeval.protocol.xmk.RevealRequest` (``key-id``, ``round``, aligned
    ``signers``/``commitments``/``signatures`` as each member replied to step 1, ``mask-degree``
    k, 0 = complete); reply :class:`~flwr_fedeval.protocol.xmk.RevealReply` (``public-share``
    b_i, ``mask-key`` X_i, ``transcript`` T (32 bytes), ``transcript-signature``).

    Refuses (error reply) an unsigned, forged or duplicated entry, a key set
    without this client or with another commitment for it, fewer members
    than its floor, a mask degree below its floor, or a second reveal for
    the same key set.
    """
    identity, roster = node_identity(context)
    state = _state(context)
    key_id = _current(state, request.key_id, "committed")
    if state.get("members"):
        raise keyset.KeySetError(f"this client has already revealed its share for key set {key_id}")
    if request.round != state["round"]:
        raise keyset.KeySetError(f"round {request.round} differs from the round of the commitment ({state['round']})")
    members = keyset.check_commitments(
        roster, list(zip(request.signers, request.commitments, request.signatures)), key_id=key_id,
        round_=request.round, own_name=identity.name, own_commitment=bytes(state["commitment"]),
        floor=key_set_floor(context),
    )
    degree = request.mask_degree
    masking.check_mask_degree(degree, len(members), mask_degree_floor(context))
    params = rlwe.get_parameter_set(str(state["params"]))
    digest = keyset.transcript_digest(params, key_id=key_id, seed_a=bytes(state["seed-a"]), round_=request.round,
                                      members=members, mask_degree=degree)
    state["mask-degree"] = degree
    state["members"] = [name for name, _ in members]
    state["member-commitments"] = [h for _, h in members]
    state["transcript"] = digest
    signature = keyset.sign_transcript(identity, key_id=key_id, round_=request.round, digest=digest)
    return xmk.RevealReply(key_id, identity.name, bytes(state["share"]), bytes(state["mask-public"]), digest,
                           signature)


def _open(request: xmk.TrainRequest, state: ConfigRecord, context: Context, params: rlwe.ParameterSet):
    """Step 3 ▲: the joint key b = Σ b_j and every peer's mask key, from openings checked here.

    The client never takes an aggregate key from the server: every b_j must
    match the commitment its member signed before seeing the others', and
    every member must have signed the same key-set transcript.
    """
    _, roster = node_identity(context)
    key_id = str(state["key-id"])
    names = list(state["members"])
    members = list(zip(names, [bytes(h) for h in state["member-commitments"]]))
    floor = key_set_floor(context)
    if len(names) < floor:
        raise keyset.KeySetError(f"key set {key_id} has {len(names)} members, this client requires at least {floor}")
    if request.num_clients != len(names):
        raise keyset.KeySetError(f"num-clients is {request.num_clients}, the key set has {len(names)} members")
    signers = request.signers
    if len(set(signers)) != len(signers):
        raise keyset.KeySetError("signers, public-shares, mask-keys and transcript-signatures must align, "
                                 "one entry per member")
    openings = dict(zip(signers, zip(request.public_shares, request.mask_keys)))
    joint, peers = keyset.open_key_set(params, key_id=key_id, members=members, openings=openings)
    if not state.get("confirmed"):
        keyset.check_transcript_signatures(
            roster, dict(zip(signers, request.transcript_signatures)), members=names, key_id=key_id,
            round_=int(state["round"]), digest=bytes(state["transcript"]),
        )
        state["confirmed"] = True
    own = str(state["name"])
    if peers[own] != bytes(state["mask-public"]) or openings[own][0] != bytes(state["share"]):
        raise keyset.KeySetError("the relayed opening of this client is not its own")
    # the mask graph: recomputed here from the signed transcript, never taken from the server
    neighbours = masking.mask_neighbours(names, int(state["mask-degree"]), bytes(state["transcript"]))[own]
    return joint, {name: peers[name] for name in neighbours}


def xmkckks_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower mod: encrypt the reply of a ``train`` handler under the joint key, masked.

    Active only when the message carries the key set
    (:class:`~flwr_fedeval.protocol.xmk.TrainRequest`, the ``"xmk"`` ConfigRecord the
    secure-aggregation strategy sets); otherwise the handler's reply passes through
    unchanged. The wrapped handler must reply with ``"arrays"`` (new weights, same
    layout as the received ones) and a ``"metrics"`` MetricRecord with ``"num-examples"``.

    The reply (:class:`~flwr_fedeval.protocol.xmk.TrainReply`) carries the ciphertext of
    ``[n_i·(w_i − w), n_i] + r_i`` (float64, fixed point with Δ = 2^scale-bits, plus the
    pairwise mask r_i mod q) and the metrics without ``num-examples``. A refusal (see the
    module docstring), a malformed request or a value beyond ``max-abs-value``
    (:class:`flwr_fedeval.rlwe.EncodingRangeError`) is an error reply.
    """
    if msg.metadata.message_type != xmk.TRAIN.message_type or not xmk.TrainRequest.carried_by(msg.content):
        return call_next(msg, context)
    state = _state(context)
    try:
        request = xmk.TrainRequest.from_record(msg.content)
        _current(state, request.key_id, "revealed")
        params = _params(request.params)
        if params.name != state["params"]:
            raise keyset.KeySetError("parameter set differs from the key set's")
        if request.round <= int(state["enc-round"]):
            raise keyset.KeySetError(
                f"round {request.round} is not after this client's last encryption under this key set "
                f"(round {state['enc-round']}): masks are never reused"
            )
        joint, peers = _open(request, state, context, params)  # checks before any training
    except (Refused, MalformedMessage, *_ERRORS) as exc:
        return error_reply(msg, exc, _LABEL)
    global_arrays = msg.content["arrays"].to_numpy_ndarrays()

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
        vector = np.append(num_examples * update, float(num_examples))
        if np.max(np.abs(vector)) > request.max_abs_value:
            raise rlwe.EncodingRangeError(
                f"|n_i·Δw| reaches {np.max(np.abs(vector)):.4g}, above the agreed bound "
                f"max-abs-value={request.max_abs_value:.4g}; raise it on the server"
            )
        m = len(state["members"])
        plaintext = rlwe.encode(params, vector, scale_bits=request.scale_bits, num_clients=m)
        context_bytes = masking.mask_context(bytes(state["transcript"]), request.round)
        masked = masking.mask_plaintext(
            params, plaintext, own_name=str(state["name"]), own_private=bytes(state["mask-private"]),
            peers=peers, context=context_bytes,
        )
        a = rlwe.expand_a(params, bytes(state["seed-a"]))
        ct = rlwe.encrypt(params, joint, a, masked)
    except (Refused, *_ERRORS) as exc:
        return error_reply(msg, exc, _LABEL)
    state["enc-round"] = request.round
    state["num-polys"] = ct.num_polys
    state["own-c1"] = _digest(rlwe.polys_to_bytes(params, ct.c1))
    clear_metrics = MetricRecord({k: v for k, v in metrics.items() if k != "num-examples"})
    return Message(content=xmk.TrainReply(ct.to_bytes(), clear_metrics).to_record(), reply_to=msg)


def _partial_decrypt(request: xmk.PdecRequest, msg: Message, context: Context) -> xmk.PdecReply:
    """Step 4: D_i = s_i·C1 + e*_i with smudging noise (Walskaar et al. 2023, Eq. 7), once.

    Request :class:`~flwr_fedeval.protocol.xmk.PdecRequest` (``params``, ``key-id``,
    ``round``, ``contributors`` (roster names), ``num-clients``; C1, the canonical bytes of
    k polynomials); reply :class:`~flwr_fedeval.protocol.xmk.PdecReply` (D_i).

    Refuses (:class:`~flwr_fedeval.protocol.Refused`, an error reply, nothing decrypted) when

    * the key set is not the one this client holds, or the round is not the
      round of its last encryption,
    * it has already decrypted once for this key set and round (whatever C1),
    * the contributors are not exactly the key set's members (none missing,
      none added, no duplicates) or ``num-clients`` disagrees,
    * C1 is not canonical (a header field other than expected, a count other
      than its own ciphertext's, a wrong length, an unreduced residue),
    * C1 equals its own c1.
    """
    state = _state(context)
    key_id = _current(state, request.key_id, "revealed")
    params = _params(request.params)
    if params.name != state["params"]:
        raise Refused("parameter set differs from the key's")
    round_ = request.round
    if int(state["enc-round"]) < 0 or round_ != int(state["enc-round"]):
        raise Refused(f"round {round_}: this client encrypted nothing for key set {key_id} in that round")
    if int(state["pdec-round"]) == round_:
        raise Refused(f"already decrypted once for key set {key_id} in round {round_}: refused whatever C1")
    contributors = list(request.contributors)
    members = list(state["members"])
    if len(set(contributors)) != len(contributors):
        raise Refused("contributor list has duplicates")
    if set(contributors) != set(members):
        missing = sorted(set(members) - set(contributors))
        extra = sorted(set(contributors) - set(members))
        raise Refused(f"contributors are not the key set's members (missing {missing}, not members {extra})")
    if request.num_clients != len(members):
        raise Refused("num-clients disagrees with the key set")
    try:
        c1 = rlwe.polys_from_bytes(request.c1, params, count=int(state["num-polys"]))
    except ValueError as exc:
        raise Refused(f"C1 is not canonical: {exc}") from None
    if _digest(request.c1) == state["own-c1"]:
        raise Refused("C1 equals this client's own c1")
    secret = rlwe.SecretKey.from_bytes(bytes(state["secret"]), params)
    state["pdec-round"] = round_  # before computing: one partial decryption per key set and round
    share = rlwe.partial_decrypt(params, secret, c1, num_clients=len(members))
    return xmk.PdecReply(share.to_bytes())


#: The query handlers (ClientApp handler functions ``(msg, context) -> reply``).
xmk_keygen = handler(xmk.KEYGEN, _keygen, label=_LABEL, errors=_ERRORS)
xmk_reveal = handler(xmk.REVEAL, _reveal, label=_LABEL, errors=_ERRORS)
xmk_partial_decrypt = handler(xmk.PDEC, _partial_decrypt, label=_LABEL, errors=_ERRORS)
for _handler, _serve in ((xmk_keygen, _keygen), (xmk_reveal, _reveal), (xmk_partial_decrypt, _partial_decrypt)):
    _handler.__doc__ = _serve.__doc__


def register_xmkckks_handlers(app) -> None:
    """Register :func:`xmk_keygen`, :func:`xmk_reveal` and :func:`xmk_partial_decrypt` on ``app``
    (the query steps of :data:`flwr_fedeval.protocol.xmk.STEPS`; step 2 is the App's own
    ``train`` handler wrapped by :func:`xmkckks_mod`)."""
    register(app, xmk.QUERY_STEPS, {xmk.KEYGEN.message_type: xmk_keygen, xmk.REVEAL.message_type: xmk_reveal,
                                     xmk.PDEC.message_type: xmk_partial_decrypt})
