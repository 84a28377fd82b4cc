"""Client side of xMK-CKKS secure aggregation for any Flower ClientApp.

Add the query handlers and wrap your ``train`` handler with the mod::

    from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod

    app = ClientApp()
    register_xmkckks_handlers(app)   # query.xmk_keygen, query.xmk_reveal, query.xmk_pdec

    @app.train(mods=[xmkckks_mod])
    def train(msg, context): ...     # unchanged: replies "arrays" + "metrics"

The mod leaves ordinary (plaintext) training untouched; when the train
message carries an ``"xmk"`` ConfigRecord it turns the reply into one
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
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from flwr_fedeval import rlwe
from flwr_fedeval.clients.identity import key_set_floor, mask_degree_floor, node_identity
from flwr_fedeval.clients.keras_adapter import WeightLayout
from flwr_fedeval.clients.replies import error_reply, serve
from flwr_fedeval.identity import IdentityError
from flwr_fedeval.messages import (
    QUERY_XMK_KEYGEN,
    QUERY_XMK_PDEC,
    QUERY_XMK_REVEAL,
    XMK_C1_KEY,
    XMK_CIPHERTEXT_KEY,
    XMK_CONFIG_KEY,
    XMK_SHARE_KEY,
    array_to_bytes,
    bytes_to_array,
)
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


class PartialDecryptionRefused(ValueError):
    """The client refuses a step of the protocol (the reply becomes an error)."""


_ERRORS = (PartialDecryptionRefused, keyset.KeySetError, IdentityError, masking.MaskKeyError, ValueError)


def _state(context: Context) -> ConfigRecord:
    if _STATE_KEY not in context.state:
        context.state[_STATE_KEY] = ConfigRecord()
    return context.state[_STATE_KEY]


def _params(config) -> rlwe.ParameterSet:
    params = rlwe.get_parameter_set(str(config["params"]))
    rlwe.validate_security(params)
    return params


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _round(config) -> int:
    value = config["round"]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise PartialDecryptionRefused(f"round must be an integer in [0, 2**63), got {value!r}")
    return value


def _current(state: ConfigRecord, config, phase: str) -> str:
    """The key-set id of the request, checked against this client's key set and its phase."""
    key_id = str(config["key-id"])
    if "key-id" not in state or state["key-id"] != key_id:
        raise PartialDecryptionRefused(f"no key for key set {key_id!r}")
    if phase == "revealed" and not state.get("members"):
        raise PartialDecryptionRefused(f"key set {key_id} has not been revealed to this client")
    return key_id


def xmk_keygen(msg: Message, context: Context) -> Message:
    """Step 1 (commit): s_i, b_i = −s_i·a + e_i (Eq. 1) and a mask key; reply a signed commitment.

    Request ``"xmk"`` ConfigRecord: ``params``, ``seed-a`` (32 bytes),
    ``key-id`` (= :func:`~flwr_fedeval.rlwe.keyset.key_set_id`), ``round``.
    Reply ``"xmk"``: ``key-id``, ``signer`` (roster name), ``commitment``
    (32 bytes, :func:`~flwr_fedeval.rlwe.keyset.commitment` of b_i and X_i),
    ``signature``. Neither b_i nor X_i leaves the client before every member
    has committed. Source: Walskaar et al. 2023, Eq. 1; Bonawitz et al. 2017.
    """

    def step(config: dict) -> RecordDict:
        identity, _ = node_identity(context)
        params = _params(config)
        seed_a = bytes(config["seed-a"])
        key_id = keyset.key_set_id(params, seed_a)
        if str(config["key-id"]) != key_id:
            raise keyset.KeySetError(f"key-id {config['key-id']!r} is not H(params, seed-a) = {key_id}")
        round_ = _round(config)
        state = _state(context)
        used = list(state.get("used-key-ids", []))
        if key_id in used:
            raise keyset.KeySetError(f"this client has already committed for key set {key_id}")
        secret, public = rlwe.keygen(params, rlwe.expand_a(params, seed_a))
        mask_private, mask_public = masking.new_mask_keypair()
        share = public.to_bytes()
        h = keyset.commitment(key_id, share, mask_public)
        signature = keyset.sign_commitment(identity, key_id=key_id, round_=round_, commitment_=h)
        state.clear()  # a new key set replaces the old one (no key survives a re-key)
        state.update({
            "key-id": key_id, "params": params.name, "seed-a": seed_a, "round": round_, "name": identity.name,
            "secret": secret.to_bytes(), "share": share, "mask-private": mask_private, "mask-public": mask_public,
            "commitment": h, "used-key-ids": (used + [key_id])[-_MAX_USED_KEY_IDS:],
            "enc-round": -1, "pdec-round": -1,
        })
        reply = ConfigRecord({"key-id": key_id, "signer": identity.name, "commitment": h, "signature": signature})
        return RecordDict({XMK_CONFIG_KEY: reply})

    return serve(msg, XMK_CONFIG_KEY, step, errors=_ERRORS, label=_LABEL)


def xmk_reveal(msg: Message, context: Context) -> Message:
    """Step 2 (reveal): check every member's signed commitment, then open b_i and X_i.

    Request ``"xmk"``: ``key-id``, ``round``, ``signers`` (roster names),
    ``commitments`` and ``signatures`` (aligned lists, as each member replied
    to step 1), ``mask-degree`` (k of the mask graph, 0 = complete). Reply
    ``"xmk"``: ``public-share`` (b_i), ``mask-key`` (X_i),
    ``transcript`` (T, 32 bytes) and ``transcript-signature``.

    Refuses (error reply) an unsigned, forged or duplicated entry, a key set
    without this client or with another commitment for it, fewer members
    than its floor, a mask degree below its floor, or a second reveal for
    the same key set.
    """

    def step(config: dict) -> RecordDict:
        identity, roster = node_identity(context)
        state = _state(context)
        key_id = _current(state, config, "committed")
        if state.get("members"):
            raise keyset.KeySetError(f"this client has already revealed its share for key set {key_id}")
        round_ = _round(config)
        if round_ != state["round"]:
            raise keyset.KeySetError(f"round {round_} differs from the round of the commitment ({state['round']})")
        signers, hs, sigs = list(config["signers"]), list(config["commitments"]), list(config["signatures"])
        if not len(signers) == len(hs) == len(sigs):
            raise keyset.KeySetError("signers, commitments and signatures must have the same length")
        members = keyset.check_commitments(
            roster, list(zip(signers, hs, sigs)), key_id=key_id, round_=round_, own_name=identity.name,
            own_commitment=bytes(state["commitment"]), floor=key_set_floor(context),
        )
        degree = config["mask-degree"]
        masking.check_mask_degree(degree, len(members), mask_degree_floor(context))
        params = rlwe.get_parameter_set(str(state["params"]))
        digest = keyset.transcript_digest(params, key_id=key_id, seed_a=bytes(state["seed-a"]), round_=round_,
                                          members=members, mask_degree=int(degree))
        state["mask-degree"] = int(degree)
        state["members"] = [name for name, _ in members]
        state["member-commitments"] = [h for _, h in members]
        state["transcript"] = digest
        signature = keyset.sign_transcript(identity, key_id=key_id, round_=round_, digest=digest)
        reply = ConfigRecord({"key-id": key_id, "signer": identity.name, "public-share": bytes(state["share"]),
                              "mask-key": bytes(state["mask-public"]), "transcript": digest,
                              "transcript-signature": signature})
        return RecordDict({XMK_CONFIG_KEY: reply})

    return serve(msg, XMK_CONFIG_KEY, step, errors=_ERRORS, label=_LABEL)


def _open(config: ConfigRecord, state: ConfigRecord, context: Context, params: rlwe.ParameterSet):
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
    if int(config["num-clients"]) != len(names):
        raise keyset.KeySetError(f"num-clients is {config['num-clients']}, the key set has {len(names)} members")
    signers = list(config["signers"])
    shares, mask_keys, sigs = list(config["public-shares"]), list(config["mask-keys"]), list(config["transcript-signatures"])
    if not len(signers) == len(shares) == len(mask_keys) == len(sigs) or len(set(signers)) != len(signers):
        raise keyset.KeySetError("signers, public-shares, mask-keys and transcript-signatures must align, "
                                 "one entry per member")
    openings = {s: (bytes(b), bytes(x)) for s, b, x in zip(signers, shares, mask_keys)}
    joint, peers = keyset.open_key_set(params, key_id=key_id, members=members, openings=openings)
    if not state.get("confirmed"):
        keyset.check_transcript_signatures(
            roster, {s: bytes(sig) for s, sig in zip(signers, sigs)}, members=names, key_id=key_id,
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

    Active only when the message carries the ``"xmk"`` ConfigRecord (the
    secure-aggregation strategy sets it); otherwise the handler's reply
    passes through unchanged. The wrapped handler must reply with
    ``"arrays"`` (new weights, same layout as the received ones) and a
    ``"metrics"`` MetricRecord with ``"num-examples"``.

    Request ``"xmk"``: ``params``, ``key-id``, ``round``, ``signers``,
    ``public-shares``, ``mask-keys``, ``transcript-signatures`` (aligned, one
    per member), ``scale-bits``, ``num-clients``, ``max-abs-value``.

    The reply carries the ciphertext of ``[n_i·(w_i − w), n_i] + r_i``
    (float64, fixed point with Δ = 2^scale-bits, plus the pairwise mask r_i
    mod q) under ``"xmk-ciphertext"`` and the metrics without ``num-examples``.
    A refusal (see the module docstring) or a value beyond ``max-abs-value``
    (:class:`flwr_fedeval.rlwe.EncodingRangeError`) is an error reply.
    """
    if msg.metadata.message_type != "train" or XMK_CONFIG_KEY not in msg.content:
        return call_next(msg, context)
    config = msg.content[XMK_CONFIG_KEY]
    state = _state(context)
    try:
        _current(state, config, "revealed")
        params = _params(config)
        if params.name != state["params"]:
            raise keyset.KeySetError("parameter set differs from the key set's")
        round_ = _round(config)
        if round_ <= int(state["enc-round"]):
            raise keyset.KeySetError(
                f"round {round_} is not after this client's last encryption under this key set "
                f"(round {state['enc-round']}): masks are never reused"
            )
        joint, peers = _open(config, state, context, params)  # checks before any training
    except (KeyError, *_ERRORS) as exc:
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
        max_abs = float(config["max-abs-value"])
        if np.max(np.abs(vector)) > max_abs:
            raise rlwe.EncodingRangeError(
                f"|n_i·Δw| reaches {np.max(np.abs(vector)):.4g}, above the agreed bound "
                f"max-abs-value={max_abs:.4g}; raise it on the server"
            )
        m = len(state["members"])
        plaintext = rlwe.encode(params, vector, scale_bits=int(config["scale-bits"]), num_clients=m)
        context_bytes = masking.mask_context(bytes(state["transcript"]), round_)
        masked = masking.mask_plaintext(
            params, plaintext, own_name=str(state["name"]), own_private=bytes(state["mask-private"]),
            peers=peers, context=context_bytes,
        )
        a = rlwe.expand_a(params, bytes(state["seed-a"]))
        ct = rlwe.encrypt(params, joint, a, masked)
    except (KeyError, *_ERRORS) as exc:
        return error_reply(msg, exc, _LABEL)
    state["enc-round"] = round_
    state["num-polys"] = ct.num_polys
    state["own-c1"] = _digest(rlwe.polys_to_bytes(params, ct.c1))
    clear_metrics = MetricRecord({k: v for k, v in metrics.items() if k != "num-examples"})
    content = RecordDict(
        {
            XMK_CIPHERTEXT_KEY: ArrayRecord({"ciphertext": bytes_to_array(ct.to_bytes())}),
            "metrics": clear_metrics,
        }
    )
    return Message(content=content, reply_to=msg)


def xmk_partial_decrypt(msg: Message, context: Context) -> Message:
    """Step 4: D_i = s_i·C1 + e*_i with smudging noise (Walskaar et al. 2023, Eq. 7), once.

    Request ``"xmk"``: ``params``, ``key-id``, ``round``, ``contributors``
    (roster names), ``num-clients``; ``"xmk-c1"``: ``c1`` (canonical bytes of
    k polynomials). Reply ``"xmk-share"``: ``share``.

    Refuses (error reply, nothing decrypted) when

    * the key set is not the one this client holds, or the round is not the
      round of its last encryption,
    * it has already decrypted once for this key set and round (whatever C1),
    * the contributors are not exactly the key set's members (none missing,
      none added, no duplicates) or ``num-clients`` disagrees,
    * C1 is not canonical (a header field other than expected, a count other
      than its own ciphertext's, a wrong length, an unreduced residue),
    * C1 equals its own c1.
    """

    def step(config: dict) -> RecordDict:
        state = _state(context)
        key_id = _current(state, config, "revealed")
        params = _params(config)
        if params.name != state["params"]:
            raise PartialDecryptionRefused("parameter set differs from the key's")
        round_ = _round(config)
        if int(state["enc-round"]) < 0 or round_ != int(state["enc-round"]):
            raise PartialDecryptionRefused(
                f"round {round_}: this client encrypted nothing for key set {key_id} in that round"
            )
        if int(state["pdec-round"]) == round_:
            raise PartialDecryptionRefused(
                f"already decrypted once for key set {key_id} in round {round_}: refused whatever C1"
            )
        contributors = [str(x) for x in config["contributors"]]
        members = list(state["members"])
        if len(set(contributors)) != len(contributors):
            raise PartialDecryptionRefused("contributor list has duplicates")
        if set(contributors) != set(members):
            missing = sorted(set(members) - set(contributors))
            extra = sorted(set(contributors) - set(members))
            raise PartialDecryptionRefused(
                f"contributors are not the key set's members (missing {missing}, not members {extra})"
            )
        if int(config["num-clients"]) != len(members):
            raise PartialDecryptionRefused("num-clients disagrees with the key set")
        c1_bytes = array_to_bytes(msg.content[XMK_C1_KEY]["c1"])
        try:
            c1 = rlwe.polys_from_bytes(c1_bytes, params, count=int(state["num-polys"]))
        except ValueError as exc:
            raise PartialDecryptionRefused(f"C1 is not canonical: {exc}") from None
        if _digest(c1_bytes) == state["own-c1"]:
            raise PartialDecryptionRefused("C1 equals this client's own c1")
        secret = rlwe.SecretKey.from_bytes(bytes(state["secret"]), params)
        state["pdec-round"] = round_  # before computing: one partial decryption per key set and round
        share = rlwe.partial_decrypt(params, secret, c1, num_clients=len(members))
        return RecordDict({XMK_SHARE_KEY: ArrayRecord({"share": bytes_to_array(share.to_bytes())})})

    return serve(msg, XMK_CONFIG_KEY, step, errors=_ERRORS, label=_LABEL)


def register_xmkckks_handlers(app) -> None:
    """Register :func:`xmk_keygen`, :func:`xmk_reveal` and :func:`xmk_partial_decrypt` on ``app``."""
    app.query(QUERY_XMK_KEYGEN.split(".", 1)[1])(xmk_keygen)
    app.query(QUERY_XMK_REVEAL.split(".", 1)[1])(xmk_reveal)
    app.query(QUERY_XMK_PDEC.split(".", 1)[1])(xmk_partial_decrypt)
