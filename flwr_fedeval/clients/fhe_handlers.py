"""Client side of the FHE AUC evaluation phase (Baykara, Ünal, Akgün 2025; DESIGN.md §4).

Four handlers, registered in :mod:`flwr_fedeval.app.client_app`; the
protocol steps are in :mod:`flwr_fedeval.fhe.auc` /
:mod:`flwr_fedeval.fhe.auc_malicious`, the key relay in
:mod:`flwr_fedeval.keyshare`. These functions only decode the request,
keep the client's secrets in ``context.state`` and encode the reply.

===========================  ====================================================
message type                 handler
===========================  ====================================================
``query.fhe_pubkey``         :func:`pubkey`: fresh X25519 key pair; reply the public key
``query.fhe_keygen``         :func:`keygen` (key holder only): CKKS keys + common
                             seed; reply the *public* context and one sealed
                             (secret context, seed) bundle per other client
``evaluate.fhe_counts``      :func:`encrypt_counts`: open the bundle (others),
                             encrypt the threshold counts of the local test split
``query.fhe_result``         :func:`decrypt_result`: decrypt, divide, verify
                             (malicious), log; report only if this client's own
                             ``share-auc-with-server`` says so
===========================  ====================================================

State (``context.state``, per phase; the deployment engine starts a process
per message, so nothing lives in module globals):

* ``fhe-auc.keypair`` (ConfigRecord): ``session``, X25519 ``private``/``public``.
* ``fhe-auc.secret`` (ArrayRecord): ``context``, the CKKS *secret* context bytes.
* ``fhe-auc.session`` (ConfigRecord): ``session``, ``seed`` (common seed of the
  malicious protocol) and the public parameters this client encrypted under
  (protocol, N, K, S, party index, number of parties, nonce). Decryption uses
  these stored values, never the server's second message.

All three are deleted when :func:`decrypt_result` returns (success or not).

Identity (issue 12, DESIGN.md §7): every X25519 key relayed through the
server is signed with the node's roster key over (``"fhe-auc"``, session, 0,
role, key) and checked against the roster before use: the key holder checks
every peer (role ``"client"``; distinct roster members, at least
:func:`~flwr_fedeval.clients.identity.key_set_floor` of them, itself
included) before sealing the secret context, and every client checks the key
holder's key (role ``"key-holder"``) before opening its bundle. A node without
a key and roster refuses every step (the error names the config keys).

What a client reveals: its X25519 public key and a power-of-two upper bound
on its test-set size (for the public count scale ``K``; the main job's FedAvg
evaluation already reports the exact size). What it reports, when
``share-auc-with-server = true``: the AUC and, in the semi-honest protocol,
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
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.logger import log

from flwr_fedeval import keyshare
from flwr_fedeval.clients.identity import key_set_floor, node_identity, signed_key_from_record, signed_key_record
from flwr_fedeval.clients.replies import error_reply, serve
from flwr_fedeval.fhe.auc import (
    FHEAUCConfig,
    client_decrypt_auc,
    client_decrypt_threshold_metrics,
    client_encrypt_confusion,
    client_encrypt_counts,
    ckks_params_for,
)
from flwr_fedeval.fhe.auc_malicious import (
    MaliciousAUCConfig,
    TamperingDetectedError,
    client_decrypt_auc_malicious,
    client_encrypt_counts_malicious,
    new_seed,
)
from flwr_fedeval.fhe.backend import FHEError, create_context, load_context
from flwr_fedeval.fhe.counts import threshold_counts
from flwr_fedeval.identity import IdentityError, SignedKey, verify_key, verify_key_set
from flwr_fedeval.messages import (
    EVALUATE_FHE_COUNTS,
    EVALUATION_KEY,
    FHE_BUNDLE_KEY,
    FHE_BUNDLES_KEY,
    FHE_CONTEXT_KEY,
    FHE_COUNTS_KEY,
    FHE_HOLDER_KEY,
    FHE_PEER_SIGNATURES_KEY,
    FHE_PEER_SIGNERS_KEY,
    FHE_PEERS_KEY,
    FHE_PROTOCOLS,
    FHE_PUBKEY_KEY,
    FHE_REPORT_KEY,
    FHE_REQUEST_KEY,
    FHE_RESULT_KEY,
    FHE_SIGNED_PROTOCOL,
    QUERY_FHE_KEYGEN,
    QUERY_FHE_PUBKEY,
    QUERY_FHE_RESULT,
    array_to_bytes,
    bytes_to_array,
)

__all__ = [
    "CLIENT_FHE_DEFAULTS",
    "PROTOCOLS",
    "REQUEST_KEY",
    "STATE_KEYPAIR",
    "STATE_SECRET",
    "STATE_SESSION",
    "decrypt_result",
    "encrypt_counts",
    "keygen",
    "pubkey",
    "register_fhe_handlers",
]

# Record keys: defined in flwr_fedeval.messages (shared with the server); the
# short names stay importable from here.
PROTOCOLS = FHE_PROTOCOLS
REQUEST_KEY = FHE_REQUEST_KEY
PUBKEY_KEY = FHE_PUBKEY_KEY
PEERS_KEY = FHE_PEERS_KEY
PEER_SIGNERS_KEY = FHE_PEER_SIGNERS_KEY
PEER_SIGNATURES_KEY = FHE_PEER_SIGNATURES_KEY
HOLDER_KEY = FHE_HOLDER_KEY
SIGNED_PROTOCOL = FHE_SIGNED_PROTOCOL
CONTEXT_KEY = FHE_CONTEXT_KEY
BUNDLES_KEY = FHE_BUNDLES_KEY
BUNDLE_KEY = FHE_BUNDLE_KEY
COUNTS_KEY = FHE_COUNTS_KEY
RESULT_KEY = FHE_RESULT_KEY
REPORT_KEY = FHE_REPORT_KEY

STATE_KEYPAIR = "fhe-auc.keypair"
STATE_SECRET = "fhe-auc.secret"
STATE_SESSION = "fhe-auc.session"

#: The client's own FHE settings (run-config keys) and their defaults; the
#: defaults equal ``JobConfig``'s (checked by a test).
CLIENT_FHE_DEFAULTS = {"share-auc-with-server": True}

_METRICS = ("accuracy", "precision", "recall", "f1")


class _Refused(ValueError):
    """A request this client will not serve (wrong session, missing state, bad parameters)."""


def _error_reply(msg: Message, exc: BaseException) -> Message:
    return error_reply(msg, exc, "FHE AUC")


def _serve(msg: Message, step: Callable[[dict], RecordDict]) -> Message:
    """Run ``step(request)``; protocol and validation errors become error replies.

    (UndefinedAUCError, KeyShareError and SerializationError are ValueErrors.)"""
    return serve(msg, REQUEST_KEY, step, errors=(TamperingDetectedError, FHEError, ValueError, TypeError),
                 label="FHE AUC")


def _session(request: dict) -> str:
    session = request.get("session")
    if not isinstance(session, str) or not session:
        raise _Refused("request has no session id")
    return session


def _keypair(context: Context, session: str) -> keyshare.KeyPair:
    if STATE_KEYPAIR not in context.state:
        raise _Refused("no X25519 key pair for this phase (step 1 missing)")
    rec = context.state[STATE_KEYPAIR]
    if rec["session"] != session:
        raise _Refused("session id does not match this client's key pair")
    return keyshare.KeyPair(private=bytes(rec["private"]), public=bytes(rec["public"]))


def _store_secrets(context: Context, session: str, secret_context: bytes, seed: bytes) -> None:
    context.state[STATE_SECRET] = ArrayRecord({"context": bytes_to_array(secret_context)})
    context.state[STATE_SESSION] = ConfigRecord({"session": session, "seed": bytes(seed)})


#: Deserialised secret contexts of this process, by SHA-256 of their bytes (a few, most recent last).
#: Loading one costs ~60 ms (TenSEAL, n = 8192); in simulation every client of a process holds the
#: same relayed secret context, and each client needs it at two steps. The digest of the stored
#: bytes is the key, so a node only ever gets the context its own state holds.
_CONTEXT_CACHE: "OrderedDict[bytes, object]" = OrderedDict()
_CONTEXT_CACHE_SIZE = 4


def _secret_context(context: Context, session: str):
    if STATE_SECRET not in context.state or STATE_SESSION not in context.state:
        raise _Refused("no CKKS secret context for this phase")
    if context.state[STATE_SESSION]["session"] != session:
        raise _Refused("session id does not match the stored secret context")
    data = array_to_bytes(context.state[STATE_SECRET]["context"])
    digest = hashlib.sha256(data).digest()
    ctx = _CONTEXT_CACHE.pop(digest, None)
    if ctx is None:
        ctx = load_context(data)
    _CONTEXT_CACHE[digest] = ctx
    while len(_CONTEXT_CACHE) > _CONTEXT_CACHE_SIZE:
        _CONTEXT_CACHE.popitem(last=False)
    if not ctx.is_private:
        raise _Refused("the stored context holds no secret key")
    return ctx


def _forget(context: Context) -> None:
    for key in (STATE_KEYPAIR, STATE_SECRET, STATE_SESSION):
        if key in context.state:
            del context.state[key]


def _int(request: dict, key: str, low: int) -> int:
    v = request[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise _Refused(f"request '{key}' must be an integer >= {low}, got {v!r}")
    return int(v)


def _protocol_config(params: dict) -> FHEAUCConfig:
    protocol = params["protocol"]
    if protocol not in PROTOCOLS:
        raise _Refused(f"request 'protocol' must be one of {PROTOCOLS}, got {protocol!r}")
    n, rows = _int(params, "n-points", 2), _int(params, "max-rows", 1)
    if protocol == "malicious":
        return MaliciousAUCConfig(n_points=n, max_rows=rows, n_splits=_int(params, "n-splits", 2))
    return FHEAUCConfig(n_points=n, max_rows=rows)


# --- step 1 ----------------------------------------------------------------------
def pubkey(msg: Message, context: Context, num_test_samples: int) -> Message:
    """Step 1: a fresh X25519 key pair for this phase; reply the public key.

    Request: ``fhe.session``. Reply: ``fhe-pubkey.public-key`` (32 bytes),
    ``fhe-pubkey.signer`` (this node's roster name), ``fhe-pubkey.signature``
    (over ``("fhe-auc", session, 0, "client", public key)``) and
    ``fhe-pubkey.test-size-bucket`` (the smallest power of two ≥ the number of
    local test samples; 0 for none); their sum is the public pooled bound
    ``max_rows`` the count encoding is derived from.

    Raises (as an error reply) :class:`~flwr_fedeval.identity.IdentityError`
    if this node has no identity key and roster.
    """

    def step(request: dict) -> RecordDict:
        session = _session(request)
        _forget(context)  # a new phase starts from scratch
        ident, _ = node_identity(context)
        kp = keyshare.generate_keypair()
        context.state[STATE_KEYPAIR] = ConfigRecord({"session": session, "private": kp.private, "public": kp.public})
        bucket = 0 if num_test_samples <= 0 else 1 << (int(num_test_samples) - 1).bit_length()
        signed = signed_key_record(ident, protocol=SIGNED_PROTOCOL, session=session, round=0, role="client",
                                   key=kp.public)
        return RecordDict({PUBKEY_KEY: ConfigRecord({"public-key": kp.public, "test-size-bucket": bucket,
                                                     **signed})})

    return _serve(msg, step)


# --- step 2 ----------------------------------------------------------------------
def keygen(msg: Message, context: Context) -> Message:
    """Step 2 (key holder): CKKS keys and common seed; public context + sealed bundles.

    Request: ``fhe.session``, ``fhe.backend``, ``fhe.slots`` (slots the
    protocol needs), ``fhe.max-rows`` (the public pooled bound; the CKKS
    parameter set follows from it, :func:`flwr_fedeval.fhe.auc.ckks_params_for`), ``fhe-peers`` (``{str(node_id): X25519 public key}``
    of the other clients), ``fhe-peer-signers`` and ``fhe-peer-signatures``
    (each peer's roster name and step-1 signature). Every peer key is checked
    against the roster first (:func:`flwr_fedeval.identity.verify_key_set`:
    distinct members other than this node, at least the node's floor).
    Reply: ``fhe-context.public`` (public key, relinearisation and rotation
    keys — no secret key), ``fhe-bundles`` (``{str(node_id):
    keyshare.seal_bundle(...)}``), opaque to the server, and ``fhe-holder``
    (``signer``, ``signature`` of this node's key for role ``"key-holder"``).
    The secret context and the seed stay in this client's state.
    """

    def step(request: dict) -> RecordDict:
        session = _session(request)
        kp = _keypair(context, session)
        ident, roster = node_identity(context)
        peers = {str(k): bytes(v) for k, v in dict(msg.content[PEERS_KEY]).items()}
        signers = dict(msg.content[PEER_SIGNERS_KEY]) if PEER_SIGNERS_KEY in msg.content else {}
        signatures = dict(msg.content[PEER_SIGNATURES_KEY]) if PEER_SIGNATURES_KEY in msg.content else {}
        entries = {}
        for node, pk in peers.items():
            if node not in signers or node not in signatures:
                raise IdentityError(f"peer key of node {node} is not signed (unsigned keys are refused)")
            entries[node] = SignedKey(str(signers[node]), pk, bytes(signatures[node]))
            if pk == kp.public:
                raise IdentityError(f"peer node {node} relays this key holder's own key")
        names = verify_key_set(roster, entries, protocol=SIGNED_PROTOCOL, session=session, round=0, role="client",
                               floor=key_set_floor(context), own=ident.name)
        params = ckks_params_for(str(request["backend"]), _int(request, "slots", 1), _int(request, "max-rows", 1))
        ctx = create_context(params=params)
        seed = new_seed()
        secret = ctx.secret_bytes()
        bundles = keyshare.seal_bundle(secret, seed, sender=kp, recipients=peers)
        _store_secrets(context, session, secret, seed)
        log(INFO, "FHE AUC: key holder (%s) for %d other roster members %s (X25519 fingerprint %s)",
            ident.name, len(peers), sorted(names.values()), keyshare.fingerprint(kp.public))
        holder = signed_key_record(ident, protocol=SIGNED_PROTOCOL, session=session, round=0, role="key-holder",
                                   key=kp.public)
        return RecordDict(
            {
                CONTEXT_KEY: ArrayRecord({"public": bytes_to_array(ctx.public_bytes())}),
                BUNDLES_KEY: ArrayRecord({node: bytes_to_array(b) for node, b in bundles.items()}),
                HOLDER_KEY: ConfigRecord(holder),
            }
        )

    return _serve(msg, step)


# --- steps 3-4 -------------------------------------------------------------------
def encrypt_counts(msg: Message, context: Context, y_true: np.ndarray, y_score: np.ndarray) -> Message:
    """Steps 3–4: open the key bundle (if any), encrypt the local threshold counts.

    Request: the global model (scored by the caller into ``y_true``,
    ``y_score``), ``evaluation.thresholds`` (N,), ``fhe.session``,
    ``fhe.protocol``, ``fhe.n-points``, ``fhe.max-rows``, ``fhe.n-splits``,
    ``fhe.party-index``, ``fhe.n-parties``, ``fhe.nonce``,
    ``fhe.holder-public-key``, ``fhe.holder-signer``, ``fhe.holder-signature``
    (the key holder's key, checked against the roster for role
    ``"key-holder"`` before the bundle is opened), ``fhe.metrics-threshold``
    (< 0: none) and, for every client but the key holder, ``fhe-bundle.sealed``. Reply:
    ``fhe-counts.auc`` (3 ciphertexts semi-honest, 6 malicious) and, with a
    threshold, ``fhe-counts.metrics`` (1 ciphertext of ``[TP, FP, TN, FN]``).
    """

    def step(request: dict) -> RecordDict:
        session = _session(request)
        kp = _keypair(context, session)
        ident, roster = node_identity(context)
        holder_pk = bytes(request["holder-public-key"])
        holder = signed_key_from_record(request, holder_pk, prefix="holder-")
        verify_key(roster, holder.signer, holder.signature, protocol=SIGNED_PROTOCOL, session=session, round=0,
                   role="key-holder", key=holder_pk)
        if (holder.signer == ident.name) != (holder_pk == kp.public):
            raise IdentityError(f"key holder {holder.signer!r} with this node's key, or this node's name with "
                                "another key: refused")
        if BUNDLE_KEY in msg.content:
            bundle = keyshare.open_bundle(array_to_bytes(msg.content[BUNDLE_KEY]["sealed"]),
                                          recipient=kp, sender_public=holder_pk)
            _store_secrets(context, session, bundle.secret_context, bundle.seed)
            log(INFO, "FHE AUC: key bundle opened (key holder fingerprint %s)", keyshare.fingerprint(holder_pk))
        elif holder_pk != kp.public:
            raise _Refused("no key bundle in the request and this client is not the key holder")
        ctx = _secret_context(context, session)
        config = _protocol_config(request)
        thresholds = msg.content[EVALUATION_KEY]["thresholds"].numpy().astype(np.float64)
        if thresholds.shape != (config.n_points,):
            raise _Refused(f"{thresholds.size} thresholds, request says n-points = {config.n_points}")
        # Decision points inside [0, 1]: probabilities (guarded); otherwise real-valued scores (logits).
        probability = bool(thresholds.size) and 0.0 <= thresholds.min() and thresholds.max() <= 1.0
        counts = threshold_counts(y_true, y_score, thresholds, score_range=(0.0, 1.0) if probability else None)
        n_parties = _int(request, "n-parties", 1)
        party = _int(request, "party-index", 0)
        nonce = bytes(request["nonce"])
        seed = bytes(context.state[STATE_SESSION]["seed"])
        if isinstance(config, MaliciousAUCConfig):
            auc_msg = client_encrypt_counts_malicious(ctx, counts, config=config, seed=seed, party_index=party,
                                                      n_parties=n_parties, nonce=nonce)
        else:
            auc_msg = client_encrypt_counts(ctx, counts, config=config)
        out = {"auc": bytes_to_array(auc_msg)}
        metrics_threshold = float(request["metrics-threshold"])
        if metrics_threshold >= 0:
            if metrics_threshold > 1:
                raise _Refused(f"request 'metrics-threshold' must be < 0 (none) or in [0, 1], got {metrics_threshold}")
            c = threshold_counts(y_true, y_score, [metrics_threshold])
            out["metrics"] = bytes_to_array(
                client_encrypt_confusion(ctx, int(c.tp[0]), int(c.fp[0]), int(c.tn[0]), int(c.fn[0]), config=config)
            )
        context.state[STATE_SESSION] = ConfigRecord(
            {
                "session": session,
                "seed": seed,
                "protocol": str(request["protocol"]),
                "n-points": config.n_points,
                "max-rows": int(config.max_rows),
                "n-splits": int(getattr(config, "n_splits", 0)),
                "party-index": party,
                "n-parties": n_parties,
                "nonce": nonce,
                "metrics-threshold": metrics_threshold,
            }
        )
        return RecordDict({COUNTS_KEY: ArrayRecord(out)})

    return _serve(msg, step)


# --- step 6 ----------------------------------------------------------------------
def _share(context: Context) -> bool:
    value = dict(context.run_config).get("share-auc-with-server", CLIENT_FHE_DEFAULTS["share-auc-with-server"])
    if not isinstance(value, bool):
        raise _Refused(f"config 'share-auc-with-server' must be true or false, got {value!r}")
    return value


def decrypt_result(msg: Message, context: Context) -> Message:
    """Step 6: decrypt the masked values, divide, verify (malicious); log; report if allowed.

    Request: ``fhe.session``, ``fhe-result.auc`` (+ ``fhe-result.metrics``).
    The protocol parameters, seed, party count and nonce are this client's
    own from step 4. Reply: ``fhe-report.status = "ok"``, ``fhe-report.shared``
    and, when this client's ``share-auc-with-server`` is true, ``auc`` (and,
    semi-honest only, ``accuracy``, ``precision``, ``recall``, ``f1``). A
    failed verification replies ``TamperingDetectedError: ...``; a
    single-class pooled test set ``UndefinedAUCError: ...``.
    """

    def step(request: dict) -> RecordDict:
        try:
            session = _session(request)
            ctx = _secret_context(context, session)
            st = dict(context.state[STATE_SESSION])
            if "protocol" not in st:
                raise _Refused("no encrypted counts for this phase (step 4 missing)")
            config = _protocol_config(st)
            result = msg.content[RESULT_KEY]
            data = array_to_bytes(result["auc"])
            if isinstance(config, MaliciousAUCConfig):
                out = client_decrypt_auc_malicious(ctx, data, config=config, seed=bytes(st["seed"]),
                                                   n_parties=int(st["n-parties"]), nonce=bytes(st["nonce"]))
            else:
                out = client_decrypt_auc(ctx, data, config=config)
            auc, bound = out.auc, out.resolution_bound
            metrics = None
            if float(st["metrics-threshold"]) >= 0 and "metrics" in result:
                metrics = client_decrypt_threshold_metrics(ctx, array_to_bytes(result["metrics"]), config=config)
            shared = _share(context)
        finally:
            _forget(context)
        log(INFO, "FHE AUC (%s, N=%d): global AUC %.6f (resolution bound %.2g)%s", st["protocol"],
            config.n_points, auc, bound,
            " (verified: both runs agree)" if isinstance(config, MaliciousAUCConfig) else "")
        verified_metrics = not isinstance(config, MaliciousAUCConfig)
        if metrics is not None:
            log(INFO, "FHE metrics at threshold %g%s: accuracy %.6f precision %.6f recall %.6f F1 %.6f",
                float(st["metrics-threshold"]), "" if verified_metrics else " (unverified, not reported)",
                *metrics)
        report: dict = {"status": "ok", "shared": shared}
        if shared:
            report["auc"] = float(auc)
            report["resolution-bound"] = float(bound)
            if metrics is not None and verified_metrics:
                report.update({k: float(v) for k, v in zip(_METRICS, metrics)})
        return RecordDict({REPORT_KEY: ConfigRecord(report)})

    return _serve(msg, step)


def register_fhe_handlers(app, *, test_scores: Callable[[Message, Context], tuple[np.ndarray, np.ndarray]],
                          test_labels: Callable[[Context], np.ndarray]) -> None:
    """Register the four FHE AUC handlers (``query.fhe_pubkey``, ``query.fhe_keygen``,
    ``evaluate.fhe_counts``, ``query.fhe_result``) on ``app``.

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
    test_scores : callable
        ``(msg, context) -> (y_true, y_score)``: labels (0/1, shape (n_test,))
        and positive-class scores (float, shape (n_test,)) of the local test
        split under the global model in ``msg.content["arrays"]``.
    test_labels : callable
        ``context -> y_true`` (step 1 carries no model; the client reports a
        power-of-two bound of its test-set size).

    Each client reports the AUC to the server only if its own run config says
    ``share-auc-with-server = true`` (default: :data:`CLIENT_FHE_DEFAULTS`).
    """

    def query_fhe_pubkey(msg: Message, context: Context) -> Message:
        return pubkey(msg, context, int(np.asarray(test_labels(context)).size))

    def evaluate_fhe_counts(msg: Message, context: Context) -> Message:
        return encrypt_counts(msg, context, *test_scores(msg, context))

    app.query(QUERY_FHE_PUBKEY.split(".", 1)[1])(query_fhe_pubkey)
    app.query(QUERY_FHE_KEYGEN.split(".", 1)[1])(keygen)
    app.evaluate(EVALUATE_FHE_COUNTS.split(".", 1)[1])(evaluate_fhe_counts)
    app.query(QUERY_FHE_RESULT.split(".", 1)[1])(decrypt_result)
