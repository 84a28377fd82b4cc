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
decryption, :mod:`flwr_fedeval.rlwe.threshold`).

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
  training and recorded there before the reply leaves; ▲ the openings and T again (openings byte for
  byte those of step 1c reuse the joint key checked then); ▲ a valid share from every member
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

The checks and the cryptography are the member party's (:class:`flwr_fedeval.secagg.member.Member`,
no Flower import); this module is its Flower adapter: each handler parses the request, loads the
member's typed state from ``context.state`` (``"xmk-state"`` and ``"xmk-ledger"``, never module
globals: the deployment engine starts a process per message), calls the member's step, saves the state
once and wraps the reply. A member's :class:`~flwr_fedeval.secagg.member.Refusal` becomes a
:class:`~flwr_fedeval.protocol.Refused` error reply (``ALREADY_CONTRIBUTED`` for the no-retry rules).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar, cast

from flwr.app import ConfigRecord, Context, Message, MetricRecord

from flwr_fedeval.clients.identity import key_set_floor, mask_degree_floor, node_identity
from flwr_fedeval.clients.keras_adapter import WeightLayout
from flwr_fedeval.clients.ledger import node_ledger, record_training
from flwr_fedeval.identity import IdentityError, NodeIdentity, Roster
from flwr_fedeval.protocol import MalformedMessage, Payload, Refused, ReplyCode, error_reply, handler, register, xmk
from flwr_fedeval.rlwe import kahe, keyset, masking, threshold
from flwr_fedeval.secagg.member import Member, MemberLedger, MemberState, Refusal

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
_LABEL = "xMK-CKKS"

#: The old name of the client's refusal (:class:`flwr_fedeval.protocol.Refused`).
PartialDecryptionRefused = Refused

#: What a handler turns into an error reply besides :class:`Refused` and a malformed request.
_ERRORS = (keyset.KeySetError, IdentityError, masking.MaskKeyError, threshold.ThresholdError, kahe.KaheError,
           ValueError)

_Request = TypeVar("_Request")
_Reply = TypeVar("_Reply", bound=Payload)


class _FlowerNode:
    """The member's node (:class:`~flwr_fedeval.secagg.member.MemberNode`) over Flower's ``Context``: the
    roster identity and policy floors of :mod:`flwr_fedeval.clients.identity`, the privacy ledger of
    :mod:`flwr_fedeval.clients.ledger` (across runs, never evicted)."""

    def __init__(self, context: Context) -> None:
        self._context = context

    def identity(self) -> tuple[NodeIdentity, Roster]:
        return node_identity(self._context)

    def key_set_floor(self) -> int:
        return key_set_floor(self._context)

    def mask_degree_floor(self) -> int:
        return mask_degree_floor(self._context)

    def trained(self, model: bytes) -> bool:
        return node_ledger(self._context).trained(model)

    def record_training(self, model: bytes) -> None:
        record_training(self._context, model)


def _refused(exc: Exception) -> Exception:
    """A member's :class:`Refusal` as the protocol's :class:`Refused` (same reason); any other error as is."""
    if isinstance(exc, Refusal):
        code = ReplyCode.ALREADY_CONTRIBUTED if exc.already_contributed else ReplyCode.REFUSED
        return Refused(str(exc), code=code)
    return exc


@contextlib.contextmanager
def _member(context: Context) -> Iterator[Member]:
    """The member party on its typed state and ledger, loaded once from ``context.state`` and saved once
    when the message is done (also when it is refused: what a step wrote before refusing stays written)."""
    state = MemberState.from_config(context.state[_STATE_KEY]) if _STATE_KEY in context.state else MemberState()
    ledger = (MemberLedger.from_config(context.state[_LEDGER_KEY]) if _LEDGER_KEY in context.state
              else MemberLedger())
    member = Member(_FlowerNode(context), state, ledger)
    try:
        yield member
    except Refusal as exc:
        raise _refused(exc) from None
    finally:
        context.state[_STATE_KEY] = ConfigRecord(member.state.to_config())
        context.state[_LEDGER_KEY] = ConfigRecord(member.ledger.to_config())


def _wire(payload: type[_Reply], reply: object) -> _Reply:
    """The member's reply (a :mod:`flwr_fedeval.secagg.messages` dataclass) as the payload class of the same
    fields (:mod:`flwr_fedeval.protocol.xmk`), which knows its record."""
    return payload(*(getattr(reply, f.name) for f in dataclasses.fields(reply)))  # type: ignore[arg-type]


class _Serve(Protocol):
    def __call__(self, request: Any, msg: Message, context: Context) -> Payload: ...


def _serve(step: Callable[[Member, _Request], object], payload: type[_Reply]) -> _Serve:
    """A handler's ``serve(request, msg, context)``: ``step`` of the member party on its state, its reply
    wrapped in ``payload``."""

    def serve(request: Any, msg: Message, context: Context) -> Payload:
        with _member(context) as member:
            return _wire(payload, step(member, request))

    serve.__doc__ = step.__doc__
    return serve


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

    The member checks the request before the handler trains
    (:meth:`~flwr_fedeval.secagg.member.Member.open_round`) and encrypts ``n_i·(w_i − w)`` after it
    (:meth:`~flwr_fedeval.secagg.member.Member.encrypt`). The reply
    (:class:`~flwr_fedeval.protocol.xmk.TrainReply`) carries the upload and the metrics without
    ``num-examples``. A refusal (see the module docstring) or a malformed request is an error reply; a
    second train request for a global model this client already trained on, or for a round not after
    its last, is refused with ``ReplyCode.ALREADY_CONTRIBUTED`` (no retries).
    """
    if msg.metadata.message_type != xmk.TRAIN.message_type or not xmk.TrainRequest.carried_by(msg.content):
        return call_next(msg, context)
    with _member(context) as member:
        return _train(msg, context, call_next, member)


def _train(msg: Message, context: Context, call_next: Callable[[Message, Context], Message],
           member: Member) -> Message:
    """:func:`xmkckks_mod` with the member party (its state loaded and saved once by the caller)."""
    try:
        request = xmk.TrainRequest.from_record(msg.content)
        arrays = msg.content.array_records["arrays"]
        keys = member.open_round(request, xmk.model_hash(arrays))  # every check before any training
    except (Refused, MalformedMessage, *_ERRORS) as exc:
        return error_reply(msg, _refused(exc), _LABEL)
    global_arrays = arrays.to_numpy_ndarrays()

    # the inner mods and the handler get Flower's train message: one ArrayRecord, one ConfigRecord
    msg.content = xmk.TrainRequest.without(msg.content)
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    try:
        new_arrays = reply.content.array_records["arrays"].to_numpy_ndarrays()
        metrics = reply.content.metric_records["metrics"]
        num_examples = int(cast("int | float", metrics["num-examples"]))
    except KeyError as exc:
        raise ValueError(f"train reply lacks {exc} (needs 'arrays' and metrics 'num-examples')") from exc
    try:
        layout = WeightLayout.of(global_arrays)
        update = layout.difference(new_arrays, global_arrays)
        upload = member.encrypt(keys, update, num_examples)
    except (Refused, *_ERRORS) as exc:
        return error_reply(msg, _refused(exc), _LABEL)
    clear_metrics = MetricRecord({k: v for k, v in metrics.items() if k != "num-examples"})
    payload = xmk.TrainReply(upload.ciphertext, clear_metrics, upload.capsule, upload.capsule_signature)
    return Message(content=payload.to_record(), reply_to=msg)


#: The query handlers (ClientApp handler functions ``(msg, context) -> reply``).
xmk_keygen = handler(xmk.KEYGEN, _serve(Member.keygen, xmk.KeygenReply), label=_LABEL, errors=_ERRORS)
xmk_reveal = handler(xmk.REVEAL, _serve(Member.reveal, xmk.RevealReply), label=_LABEL, errors=_ERRORS)
xmk_shares = handler(xmk.SHARES, _serve(Member.shares, xmk.SharesReply), label=_LABEL, errors=_ERRORS)
xmk_contributors = handler(xmk.CONTRIBUTORS, _serve(Member.contributors, xmk.ContributorsReply), label=_LABEL,
                           errors=_ERRORS)
xmk_partial_decrypt = handler(xmk.PDEC, _serve(Member.partial_decrypt, xmk.PdecReply), label=_LABEL,
                              errors=_ERRORS)
for _handler, _step in ((xmk_keygen, Member.keygen), (xmk_reveal, Member.reveal), (xmk_shares, Member.shares),
                        (xmk_contributors, Member.contributors), (xmk_partial_decrypt, Member.partial_decrypt)):
    _handler.__doc__ = _step.__doc__


def register_xmkckks_handlers(app: Any) -> None:
    """Register :func:`xmk_keygen`, :func:`xmk_reveal`, :func:`xmk_shares`, :func:`xmk_contributors` and
    :func:`xmk_partial_decrypt` on ``app`` (the query steps of :data:`flwr_fedeval.protocol.xmk.STEPS`;
    step 2 is the App's own ``train`` handler wrapped by :func:`xmkckks_mod`)."""
    register(app, xmk.QUERY_STEPS, {xmk.KEYGEN.message_type: xmk_keygen, xmk.REVEAL.message_type: xmk_reveal,
                                     xmk.SHARES.message_type: xmk_shares,
                                     xmk.CONTRIBUTORS.message_type: xmk_contributors,
                                     xmk.PDEC.message_type: xmk_partial_decrypt})
