"""Client side of the FHE AUC evaluation phase (Baykara, Ünal, Akgün 2025; DESIGN.md §4).

Four handlers, registered by :func:`register_fhe_handlers`; the messages are
the payloads of :mod:`flwr_fedeval.protocol.fhe_auc`, the protocol steps are in
:mod:`flwr_fedeval.fhe.auc` / :mod:`flwr_fedeval.fhe.auc_malicious`, the key
relay in :mod:`flwr_fedeval.keyshare`. These functions only serve the parsed
request, keep the client's secrets in ``context.state`` and return the reply
payload; a request they will not serve raises :class:`~flwr_fedeval.protocol.Refused`.

===========================  ====================================================
message type                 handler
===========================  ====================================================
``query.fhe_pubkey``         :func:`serve_pubkey`: fresh X25519 key pair; reply the public key
``query.fhe_keygen``         :func:`serve_keygen` (key holder only): CKKS keys + common
                             seed; reply the *public* context and one sealed
                             (secret context, seed) bundle per other client
``evaluate.fhe_counts``      :func:`serve_counts`: open the bundle (others),
                             encrypt the threshold counts of the local test split
``query.fhe_result``         :func:`serve_result`: decrypt, divide, verify
                             (malicious), log; report only if the node's policy
                             (``fedeval-share-auc``) allows it
===========================  ====================================================

State (``context.state``, per phase; the deployment engine starts a process
per message, so nothing lives in module globals):

* ``fhe-auc.keypair`` (ConfigRecord): ``session``, X25519 ``private``/``public``.
* ``fhe-auc.secret`` (ArrayRecord): ``context``, the CKKS *secret* context bytes.
* ``fhe-auc.session`` (ConfigRecord): ``session``, ``seed`` (common seed of the
  malicious protocol).
* ``fhe-auc.params`` (ConfigRecord): the public parameters this client encrypted
  under at step 4 (:class:`~flwr_fedeval.protocol.fhe_auc.EncryptionParams`: protocol,
  N, R, S, nonce, metrics threshold) and what it derived from the signed participant
  list (``party-index``, ``n-parties``, ``participants-digest``). Decryption uses
  these stored values, never the server's second message.

All four are deleted when :func:`serve_result` returns (success or not).

Identity (DESIGN.md §7): every X25519 key relayed through the
server is signed with the node's roster key over (``"fhe-auc"``, session, 0,
role, key) and checked against the roster before use: the key holder checks
every peer (role ``"client"``; distinct roster members, at least
:func:`~flwr_fedeval.clients.identity.key_set_floor` of them, itself
included) before sealing the secret context, and every client checks the key
holder's key (role ``"key-holder"``) before opening its bundle. A node without
a key and roster refuses every step (the error names the config keys).

Participants: the key holder signs the ordered list of (roster name,
X25519 key) it sealed to, itself included
(:class:`~flwr_fedeval.protocol.fhe_auc.ParticipantList`); at step 4 every client
checks it (▲ signed by the key holder it checked, ▲ roster members, ▲ itself listed
with its own step-1 key, ▲ at least its floor,
:func:`~flwr_fedeval.clients.policy.min_clients`), takes its party index and the
party count from it and binds its digest into the malicious protocol's common
randomness. Before encrypting, the client records the evaluation of the global
model (:func:`~flwr_fedeval.clients.policy.record_evaluation`): a second
evaluation of the same model is refused unless node config
``fedeval-evaluations-per-model`` allows it.

What a client reveals: its X25519 public key and a power-of-two upper bound
on its test-set size (for the public count scale ``K``; the main job's FedAvg
evaluation already reports the exact size). What it reports, when its node
policy ``fedeval-share-auc`` is true (default false) and the run config does not
set ``fedeval-share-auc = false``: the AUC and, in the semi-honest protocol,
accuracy/precision/recall/F1 at ``fhe-metrics-threshold``. In the malicious
protocol the threshold metrics are computed with the semi-honest aggregation
(no double execution protects them), so the client logs them marked
*unverified* and does not report them: a deviating server could otherwise
use the clients as a decryption oracle.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.common.logger import log

from flwr_fedeval import config_keys, keyshare
from flwr_fedeval.clients import policy
from flwr_fedeval.clients.identity import node_identity
from flwr_fedeval.clients.local_scores import cached_test_labels, cached_test_scores
from flwr_fedeval.clients.session_keys import load_session_keypair, new_session_keypair
from flwr_fedeval.fhe.auc import (
    AUCResult,
    ckks_params_for,
    client_decrypt_auc,
    client_decrypt_threshold_metrics,
    client_encrypt_confusion,
    client_encrypt_counts,
)
from flwr_fedeval.fhe.auc_malicious import (
    MaliciousAUCConfig,
    MaliciousAUCResult,
    TamperingDetectedError,
    client_decrypt_auc_malicious,
    client_encrypt_counts_malicious,
    new_seed,
)
from flwr_fedeval.fhe.backend import CKKSContext, FHEError, create_context, load_context
from flwr_fedeval.identity import IdentityError
from flwr_fedeval.metrics.counts import threshold_counts
from flwr_fedeval.protocol import (
    Refused,
    ReplyCode,
    Step,
    array_bytes,
    array_record,
    bytes_array,
    config_field,
    config_record,
    fhe_auc,
    handler,
    register,
)

if TYPE_CHECKING:
    from flwr.clientapp import ClientApp

__all__ = [
    "CLIENT_FHE_DEFAULTS",
    "STATE_KEYPAIR",
    "STATE_PARAMS",
    "STATE_SECRET",
    "STATE_SESSION",
    "decrypt_result",
    "encrypt_counts",
    "keygen",
    "pubkey",
    "register_fhe_handlers",
    "serve_counts",
    "serve_keygen",
    "serve_pubkey",
    "serve_result",
]

STATE_KEYPAIR = "fhe-auc.keypair"
STATE_SECRET = "fhe-auc.secret"
STATE_SESSION = "fhe-auc.session"
STATE_PARAMS = "fhe-auc.params"

#: The run-config key a client reads (tightening only: ``false`` withholds the AUC whatever the
#: node policy) and its default, equal to the demo App's ``share-auc-with-server`` (checked by a
#: test). Whether the AUC leaves the node is the node policy's ``fedeval-share-auc``
#: (:mod:`flwr_fedeval.clients.policy`).
CLIENT_FHE_DEFAULTS = {config_keys.SHARE_AUC: True}

_LABEL = "FHE AUC"
#: Refused as error replies besides :class:`Refused` and a malformed request (UndefinedAUCError,
#: IdentityError, KeyShareError and SerializationError are ValueErrors).
_ERRORS = (TamperingDetectedError, FHEError, ValueError, TypeError)


def _keypair(context: Context, session: str) -> keyshare.KeyPair:
    return load_session_keypair(context, STATE_KEYPAIR, session,
                                missing="no X25519 key pair for this phase (step 1 missing)")


def _store_secrets(context: Context, session: str, secret_context: bytes, seed: bytes) -> None:
    context.state[STATE_SECRET] = ArrayRecord({"context": bytes_array(secret_context)})
    context.state[STATE_SESSION] = ConfigRecord({"session": session, "seed": bytes(seed)})
    if STATE_PARAMS in context.state:  # parameters of an earlier step-4 attempt are void
        del context.state[STATE_PARAMS]


#: Deserialised secret contexts of this process, by SHA-256 of their bytes (a few, most recent last).
#: Loading one costs ~60 ms (TenSEAL, n = 8192); in simulation every client of a process holds the
#: same relayed secret context, and each client needs it at two steps. The digest of the stored
#: bytes is the key, so a node only ever gets the context its own state holds.
_CONTEXT_CACHE: OrderedDict[bytes, CKKSContext] = OrderedDict()
_CONTEXT_CACHE_SIZE = 4


def _session_seed(context: Context, session: str) -> bytes:
    """The common seed stored for ``session`` (Refused if another session's is stored)."""
    rec = config_record(context.state, STATE_SESSION)
    if config_field(rec, STATE_SESSION, "session", str) != session:
        raise Refused("session id does not match the stored secret context")
    return config_field(rec, STATE_SESSION, "seed", bytes)


def _secret_context(context: Context, session: str) -> CKKSContext:
    if STATE_SECRET not in context.state or STATE_SESSION not in context.state:
        raise Refused("no CKKS secret context for this phase")
    _session_seed(context, session)
    data = array_bytes(array_record(context.state, STATE_SECRET), STATE_SECRET, "context")
    digest = hashlib.sha256(data).digest()
    ctx = _CONTEXT_CACHE.pop(digest, None)
    if ctx is None:
        ctx = load_context(data)
    _CONTEXT_CACHE[digest] = ctx
    while len(_CONTEXT_CACHE) > _CONTEXT_CACHE_SIZE:
        _CONTEXT_CACHE.popitem(last=False)
    if not ctx.is_private:
        raise Refused("the stored context holds no secret key")
    return ctx


def _forget(context: Context) -> None:
    for key in (STATE_KEYPAIR, STATE_SECRET, STATE_SESSION, STATE_PARAMS):
        if key in context.state:
            del context.state[key]


# --- step 1 ----------------------------------------------------------------------
def serve_pubkey(request: fhe_auc.PubkeyRequest, context: Context, num_test_samples: int) -> fhe_auc.PubkeyReply:
    """Step 1: a fresh X25519 key pair for this phase; reply the public key.

    Reply (:class:`~flwr_fedeval.protocol.fhe_auc.PubkeyReply`): the 32-byte public key, this
    node's roster name and signature (role ``"client"``) and the test-size bucket (the smallest
    power of two ≥ ``num_test_samples``; 0 for none); the buckets' sum is the public pooled
    bound ``max_rows`` the count encoding is derived from.

    Raises
    ------
    flwr_fedeval.identity.IdentityError
        This node has no identity key and roster (the message names the config keys).
    """
    _forget(context)  # a new phase starts from scratch
    ident, _ = node_identity(context)
    kp = new_session_keypair(context, STATE_KEYPAIR, request.session)
    bucket = 0 if num_test_samples <= 0 else 1 << (int(num_test_samples) - 1).bit_length()
    signed = fhe_auc.sign(ident, session=request.session, role=fhe_auc.CLIENT_ROLE, key=kp.public)
    return fhe_auc.PubkeyReply(kp.public, bucket, signed.signer, signed.signature)


# --- step 2 ----------------------------------------------------------------------
def serve_keygen(request: fhe_auc.KeygenRequest, context: Context) -> fhe_auc.KeygenReply:
    """Step 2 (key holder): CKKS keys and common seed; public context + sealed bundles.

    Every peer key of the request is checked against the roster first
    (:func:`~flwr_fedeval.protocol.fhe_auc.verify_peers`: distinct members other than this
    node, at least the node's floor, :func:`~flwr_fedeval.clients.policy.min_clients`); the
    peers and this node, in roster-name order, are the participant list it signs
    (:class:`~flwr_fedeval.protocol.fhe_auc.ParticipantList`); the CKKS parameter set follows from ``max_rows``
    (:func:`flwr_fedeval.fhe.auc.ckks_params_for`). Reply: the public context (public key,
    relinearisation and rotation keys, no secret key), one ``keyshare.seal_bundle`` per peer
    (opaque to the server) and this node's key signed for role ``"key-holder"``. The secret
    context and the seed stay in this client's state.

    Raises
    ------
    flwr_fedeval.identity.IdentityError
        A peer key fails the roster check, or a peer relays this node's own key.
    Refused
        No step-1 key pair of this session.
    """
    kp = _keypair(context, request.session)
    ident, roster = node_identity(context)
    policy.check_fhe_protocol(context, request.protocol, "FHE AUC key setup")
    for node, peer in request.peers.items():
        if peer.key == kp.public:
            raise IdentityError(f"peer node {node} relays this key holder's own key")
    names = fhe_auc.verify_peers(roster, request.peers, session=request.session, floor=policy.min_clients(context),
                                 own=ident.name)
    members = {names[n]: p.key for n, p in request.peers.items()}
    members[ident.name] = kp.public
    participants = fhe_auc.ParticipantList.sign(ident, session=request.session, members=members,
                                                protocol=request.protocol)
    ctx = create_context(params=ckks_params_for(request.backend, request.slots, request.max_rows))
    seed = new_seed()
    secret = ctx.secret_bytes()
    recipients = {n: p.key for n, p in request.peers.items()}
    bundles = keyshare.seal_bundle(secret, seed, sender=kp, recipients=recipients)
    _store_secrets(context, request.session, secret, seed)
    log(INFO, "FHE AUC: key holder (%s) for %d other roster members %s (X25519 fingerprint %s)",
        ident.name, len(request.peers), sorted(names.values()), keyshare.fingerprint(kp.public))
    holder = fhe_auc.sign(ident, session=request.session, role=fhe_auc.HOLDER_ROLE, key=kp.public)
    return fhe_auc.KeygenReply(ctx.public_bytes(), bundles, holder.signer, holder.signature, participants)


# --- steps 3-4 -------------------------------------------------------------------
def serve_counts(request: fhe_auc.CountsRequest, context: Context, y_true: np.ndarray,
                 y_score: np.ndarray, *, model: bytes | None = None) -> fhe_auc.CountsReply:
    """Steps 3–4: check the participant list, open the key bundle (if any), encrypt the local
    threshold counts.

    ``y_true`` (0/1) and ``y_score`` (shape (n_test,)) are the local test split scored by the
    global model of the request; ``model`` is that model's digest
    (:func:`~flwr_fedeval.clients.policy.model_digest`; ``None``: not counted). The key holder's
    key is checked against the roster (role ``"key-holder"``) before the bundle is opened, then
    the participant list (:meth:`~flwr_fedeval.protocol.fhe_auc.ParticipantList.verify`): the
    party index is this node's position in it, the party count its length. Reply: 3 ciphertexts
    (semi-honest) or 6 (malicious) of the counts at the request's N decision points and, with a
    metrics threshold, 1 ciphertext of ``[TP, FP, TN, FN]`` at it.

    Raises
    ------
    flwr_fedeval.identity.IdentityError
        The key holder's key or the participant list does not verify, the list does not hold this
        node with its step-1 key, or has fewer parties than the node's floor.
    Refused
        No step-1 key pair of this session, no bundle while this node is not the key holder, or a
        second evaluation of ``model`` beyond ``fedeval-evaluations-per-model``.
    """
    session, params, holder = request.session, request.params, request.holder
    kp = _keypair(context, session)
    ident, roster = node_identity(context)
    policy.check_fhe_protocol(context, params.protocol, "FHE AUC encrypted counts")
    fhe_auc.verify(roster, holder, session=session, role=fhe_auc.HOLDER_ROLE)
    if (holder.signer == ident.name) != (holder.key == kp.public):
        raise IdentityError(f"key holder {holder.signer!r} with this node's key, or this node's name with "
                            "another key: refused")
    listed = request.participants
    party_index = listed.verify(roster, session=session, holder=holder.signer, own=ident.name, own_key=kp.public,
                                floor=policy.min_clients(context), protocol=params.protocol)
    if listed.keys[listed.names.index(holder.signer)] != holder.key:
        raise IdentityError("the participant list holds another key for the key holder than the one relayed")
    transcript = listed.digest(session)
    if request.sealed is not None:
        bundle = keyshare.open_bundle(request.sealed, recipient=kp, sender_public=holder.key)
        _store_secrets(context, session, bundle.secret_context, bundle.seed)
        log(INFO, "FHE AUC: key bundle opened (key holder fingerprint %s)", keyshare.fingerprint(holder.key))
    elif holder.key != kp.public:
        raise Refused("no key bundle in the request and this client is not the key holder")
    ctx = _secret_context(context, session)
    if model is not None:  # nothing computed from the test data has left the node yet
        policy.record_evaluation(context, model, "FHE AUC")
    config = params.auc_config
    thresholds = request.thresholds
    # Decision points inside [0, 1]: probabilities (guarded); otherwise real-valued scores (logits).
    probability = bool(thresholds.size) and thresholds.min() >= 0.0 and thresholds.max() <= 1.0
    counts = threshold_counts(y_true, y_score, thresholds, score_range=(0.0, 1.0) if probability else None)
    seed = _session_seed(context, session)
    if isinstance(config, MaliciousAUCConfig):
        auc_msg = client_encrypt_counts_malicious(ctx, counts, config=config, seed=seed,
                                                  party_index=party_index, n_parties=len(listed.names),
                                                  nonce=params.nonce, transcript=transcript)
    else:
        auc_msg = client_encrypt_counts(ctx, counts, config=config)
    metrics_msg = None
    if params.metrics_threshold >= 0:
        c = threshold_counts(y_true, y_score, [params.metrics_threshold])
        metrics_msg = client_encrypt_confusion(ctx, int(c.tp[0]), int(c.fp[0]), int(c.tn[0]), int(c.fn[0]),
                                               config=config)
    context.state[STATE_PARAMS] = ConfigRecord({**params.to_config(), "party-index": party_index,
                                                "n-parties": len(listed.names), "participants-digest": transcript})
    log(INFO, "FHE AUC: party %d of %d (%s), participant list signed by key holder %s", party_index,
        len(listed.names), ", ".join(listed.names), holder.signer)
    return fhe_auc.CountsReply(auc_msg, metrics_msg)


# --- step 6 ----------------------------------------------------------------------
#: The step-6 error reply of a node that shares its AUC and could not accept the decrypted result:
#: one code and this fixed reason, whatever failed (no value, no direction).
RESULT_REJECTED_REASON = ("the decrypted result failed this client's checks (undefined, imprecise, out of range or "
                          "the two runs disagree); which one stays in the node's log")


def serve_result(request: fhe_auc.ResultRequest, context: Context) -> fhe_auc.ResultReport:
    """Step 6: decrypt the masked values, divide, verify (malicious); log; report if allowed.

    The protocol parameters, seed, party count, nonce and participant-list digest are this
    client's own from step 4 (its state), never the server's. Whether the AUC leaves the node is
    decided *before* decrypting (:func:`~flwr_fedeval.clients.policy.share_auc`: node
    ``fedeval-share-auc``, default false; run config ``fedeval-share-auc`` can only turn it off),
    and the reply depends on the decryption only where the policy lets the AUC leave:

    * not shared: the reply is ``ResultReport(shared=False)`` whatever the decryption gives — an
      AUC, an out-of-range value, a failed verification — which is logged on the node only (a
      server that sends E(AUC_v − θ) learns nothing from the reply);
    * shared: the AUC and its resolution bound (and, semi-honest only, accuracy, precision,
      recall, F1); a result the client cannot accept is one error reply
      (``ReplyCode.RESULT_REJECTED``, :data:`RESULT_REJECTED_REASON`) without the value or which
      check failed.

    The phase's state is deleted whatever happens.

    Raises
    ------
    Refused
        No secret context or no step-4 parameters of this session (before any decryption); or,
        shared only, a decrypted result that failed a check (``RESULT_REJECTED``).
    """
    failure: BaseException | None = None
    out: AUCResult | MaliciousAUCResult | None = None
    metrics = None
    try:
        ctx = _secret_context(context, request.session)
        if STATE_PARAMS not in context.state:
            raise Refused("no encrypted counts for this phase (step 4 missing)")
        stored = config_record(context.state, STATE_PARAMS)
        params = fhe_auc.EncryptionParams.from_config(stored, STATE_PARAMS)
        seed = _session_seed(context, request.session)
        config = params.auc_config
        shared = policy.share_auc(context)  # decided before anything is decrypted
        try:
            if isinstance(config, MaliciousAUCConfig):
                out = client_decrypt_auc_malicious(
                    ctx, request.auc, config=config, seed=seed,
                    n_parties=config_field(stored, STATE_PARAMS, "n-parties", int), nonce=params.nonce,
                    transcript=config_field(stored, STATE_PARAMS, "participants-digest", bytes))
            else:
                out = client_decrypt_auc(ctx, request.auc, config=config)
            if params.metrics_threshold >= 0 and request.metrics is not None:
                metrics = client_decrypt_threshold_metrics(ctx, request.metrics, config=config)
        except _ERRORS as exc:  # what the decrypted values gave: logged here, never in the reply
            failure = exc
    finally:
        _forget(context)
    malicious = isinstance(config, MaliciousAUCConfig)
    if failure is not None:
        log(WARNING, "FHE AUC (%s): the decrypted result is not accepted: %s: %s", params.protocol,
            type(failure).__name__, failure)
    elif out is not None:
        log(INFO, "FHE AUC (%s, N=%d): global AUC %.6f (resolution bound %.2g)%s", params.protocol,
            config.n_points, out.auc, out.resolution_bound, " (verified: both runs agree)" if malicious else "")
        if metrics is not None:
            log(INFO, "FHE metrics at threshold %g%s: accuracy %.6f precision %.6f recall %.6f F1 %.6f",
                params.metrics_threshold, " (unverified, not reported)" if malicious else "", *metrics)
    if not shared:
        log(INFO, "FHE AUC: the result stays on this node (node policy 'fedeval-share-auc' is false, or run config "
            "'fedeval-share-auc' is false); the reply is the same whatever was decrypted")
        return fhe_auc.ResultReport(shared=False)
    if failure is not None or out is None:
        raise Refused(RESULT_REJECTED_REASON, code=ReplyCode.RESULT_REJECTED)
    reported = [float(v) for v in metrics] if metrics is not None and not malicious else [None] * 4
    return fhe_auc.ResultReport(True, float(out.auc), float(out.resolution_bound), *reported)


# --- handlers --------------------------------------------------------------------
def _handler(step: Step, serve: Callable[..., Any]) -> Callable[[Message, Context], Message]:
    return handler(step, serve, label=_LABEL, errors=_ERRORS)


def pubkey(msg: Message, context: Context, num_test_samples: int) -> Message:
    """The ``query.fhe_pubkey`` handler of a client with ``num_test_samples`` test rows (:func:`serve_pubkey`)."""
    return _handler(fhe_auc.PUBKEY, lambda req, m, c: serve_pubkey(req, c, num_test_samples))(msg, context)


def keygen(msg: Message, context: Context) -> Message:
    """The ``query.fhe_keygen`` handler (:func:`serve_keygen`)."""
    return _handler(fhe_auc.KEYGEN, lambda req, m, c: serve_keygen(req, c))(msg, context)


def encrypt_counts(msg: Message, context: Context, y_true: np.ndarray, y_score: np.ndarray) -> Message:
    """The ``evaluate.fhe_counts`` handler for the scored test split (:func:`serve_counts`)."""
    return _handler(fhe_auc.COUNTS, lambda req, m, c: serve_counts(
        req, c, y_true, y_score, model=policy.message_model_digest(m)))(msg, context)


def decrypt_result(msg: Message, context: Context) -> Message:
    """The ``query.fhe_result`` handler (:func:`serve_result`)."""
    return _handler(fhe_auc.RESULT, lambda req, m, c: serve_result(req, c))(msg, context)


def register_fhe_handlers(app: ClientApp, *, test_scores: Callable[[Message, Context], tuple[np.ndarray, np.ndarray]],
                          test_labels: Callable[[Context], np.ndarray]) -> None:
    """Register the four FHE AUC handlers (``query.fhe_pubkey``, ``query.fhe_keygen``,
    ``evaluate.fhe_counts``, ``query.fhe_result``) on ``app``.

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
    test_scores : callable
        ``(msg, context) -> (y_true, y_score)``: labels (0/1, shape (n_test,))
        and positive-class scores (float, shape (n_test,)) of the local test
        split under the global model in ``msg.content["arrays"]``; called after
        the request passed its checks.
    test_labels : callable
        ``context -> y_true`` (step 1 carries no model; the client reports a
        power-of-two bound of its test-set size).

    Notes
    -----
    Each client reports the AUC to the server only if its node policy says
    ``fedeval-share-auc = true`` (default false; :mod:`flwr_fedeval.clients.policy`) and the run
    config does not turn it off; it answers one evaluation per global model unless node config
    ``fedeval-evaluations-per-model`` allows more. ``test_scores`` is called once per global model
    and run on a node, ``test_labels`` once per run (kept in ``context.state``:
    :mod:`flwr_fedeval.clients.local_scores`).
    """
    test_scores = cached_test_scores(test_scores)
    test_labels = cached_test_labels(test_labels)
    register(app, fhe_auc.STEPS, {
        fhe_auc.PUBKEY.message_type: _handler(
            fhe_auc.PUBKEY, lambda req, msg, ctx: serve_pubkey(req, ctx, int(np.asarray(test_labels(ctx)).size))),
        fhe_auc.KEYGEN.message_type: _handler(fhe_auc.KEYGEN, lambda req, msg, ctx: serve_keygen(req, ctx)),
        fhe_auc.COUNTS.message_type: _handler(
            fhe_auc.COUNTS, lambda req, msg, ctx: serve_counts(req, ctx, *test_scores(msg, ctx),
                                                               model=policy.message_model_digest(msg))),
        fhe_auc.RESULT.message_type: _handler(fhe_auc.RESULT, lambda req, msg, ctx: serve_result(req, ctx)),
    })
