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

from collections.abc import Callable
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.logger import log

from flwr_fedeval import keyshare
from flwr_fedeval.clients.replies import error_reply, serve
from flwr_fedeval.fhe.auc import (
    FHEAUCConfig,
    client_decrypt_auc,
    client_decrypt_threshold_metrics,
    client_encrypt_confusion,
    client_encrypt_counts,
)
from flwr_fedeval.fhe.auc_malicious import (
    MaliciousAUCConfig,
    TamperingDetectedError,
    client_decrypt_auc_malicious,
    client_encrypt_counts_malicious,
    new_seed,
)
from flwr_fedeval.fhe.backend import CKKSParams, FHEError, create_context, load_context
from flwr_fedeval.fhe.counts import threshold_counts
from flwr_fedeval.messages import (
    EVALUATE_FHE_COUNTS,
    EVALUATION_KEY,
    FHE_BUNDLE_KEY,
    FHE_BUNDLES_KEY,
    FHE_CONTEXT_KEY,
    FHE_COUNTS_KEY,
    FHE_PEERS_KEY,
    FHE_PROTOCOLS,
    FHE_PUBKEY_KEY,
    FHE_REPORT_KEY,
    FHE_REQUEST_KEY,
    FHE_RESULT_KEY,
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


def _secret_context(context: Context, session: str):
    if STATE_SECRET not in context.state or STATE_SESSION not in context.state:
        raise _Refused("no CKKS secret context for this phase")
    if context.state[STATE_SESSION]["session"] != session:
        raise _Refused("session id does not match the stored secret context")
    ctx = load_context(array_to_bytes(context.state[STATE_SECRET]["context"]))
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
    n, k = _int(params, "n-points", 2), float(params["count-scale"])
    if protocol == "malicious":
        return MaliciousAUCConfig(n_points=n, count_scale=k, n_splits=_int(params, "n-splits", 2))
    return FHEAUCConfig(n_points=n, count_scale=k)


# --- step 1 ----------------------------------------------------------------------
def pubkey(msg: Message, context: Context, num_test_samples: int) -> Message:
    """Step 1: a fresh X25519 key pair for this phase; reply the public key.

    Request: ``fhe.session``. Reply: ``fhe-pubkey.public-key`` (32 bytes) and
    ``fhe-pubkey.test-size-bucket`` (the smallest power of two ≥ the number of
    local test samples; 0 for none), from which the server picks the public
    count scale ``K``.
    """

    def step(request: dict) -> RecordDict:
        session = _session(request)
        _forget(context)  # a new phase starts from scratch
        kp = keyshare.generate_keypair()
        context.state[STATE_KEYPAIR] = ConfigRecord({"session": session, "private": kp.private, "public": kp.public})
        bucket = 0 if num_test_samples <= 0 else 1 << (int(num_test_samples) - 1).bit_length()
        return RecordDict({PUBKEY_KEY: ConfigRecord({"public-key": kp.public, "test-size-bucket": bucket})})

    return _serve(msg, step)


# --- step 2 ----------------------------------------------------------------------
def keygen(msg: Message, context: Context) -> Message:
    """Step 2 (key holder): CKKS keys and common seed; public context + sealed bundles.

    Request: ``fhe.session``, ``fhe.backend``, ``fhe.slots`` (slots the
    protocol needs) and ``fhe-peers`` (``{str(node_id): X25519 public key}``
    of the other clients). Reply: ``fhe-context.public`` (public key,
    relinearisation and rotation keys — no secret key) and
    ``fhe-bundles`` (``{str(node_id): keyshare.seal_bundle(...)}``), opaque to
    the server. The secret context and the seed stay in this client's state.
    """

    def step(request: dict) -> RecordDict:
        session = _session(request)
        kp = _keypair(context, session)
        peers = {str(k): bytes(v) for k, v in dict(msg.content[PEERS_KEY]).items()}
        params = CKKSParams.for_slots(_int(request, "slots", 1), str(request["backend"]))
        ctx = create_context(params=params)
        seed = new_seed()
        secret = ctx.secret_bytes()
        bundles = keyshare.seal_bundle(secret, seed, sender=kp, recipients=peers)
        _store_secrets(context, session, secret, seed)
        log(INFO, "FHE AUC: key holder for %d other clients (X25519 fingerprint %s)",
            len(peers), keyshare.fingerprint(kp.public))
        return RecordDict(
            {
                CONTEXT_KEY: ArrayRecord({"public": bytes_to_array(ctx.public_bytes())}),
                BUNDLES_KEY: ArrayRecord({node: bytes_to_array(b) for node, b in bundles.items()}),
            }
        )

    return _serve(msg, step)


# --- steps 3-4 -------------------------------------------------------------------
def encrypt_counts(msg: Message, context: Context, y_true: np.ndarray, y_score: np.ndarray) -> Message:
    """Steps 3–4: open the key bundle (if any), encrypt the local threshold counts.

    Request: the global model (scored by the caller into ``y_true``,
    ``y_score``), ``evaluation.thresholds`` (N,), ``fhe.session``,
    ``fhe.protocol``, ``fhe.n-points``, ``fhe.count-scale``, ``fhe.n-splits``,
    ``fhe.party-index``, ``fhe.n-parties``, ``fhe.nonce``,
    ``fhe.holder-public-key``, ``fhe.metrics-threshold`` (< 0: none) and, for
    every client but the key holder, ``fhe-bundle.sealed``. Reply:
    ``fhe-counts.auc`` (2 ciphertexts semi-honest, 4 malicious) and, with a
    threshold, ``fhe-counts.metrics`` (1 ciphertext of ``[TP, FP, TN, FN]``).
    """

    def step(request: dict) -> RecordDict:
        session = _session(request)
        kp = _keypair(context, session)
        holder_pk = bytes(request["holder-public-key"])
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
        counts = threshold_counts(y_true, y_score, thresholds)
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
                "count-scale": float(config.count_scale),
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
                auc = out.auc
            else:
                auc = client_decrypt_auc(ctx, data, config=config).auc
            metrics = None
            if float(st["metrics-threshold"]) >= 0 and "metrics" in result:
                metrics = client_decrypt_threshold_metrics(ctx, array_to_bytes(result["metrics"]), config=config)
            shared = _share(context)
        finally:
            _forget(context)
        log(INFO, "FHE AUC (%s, N=%d): global AUC %.6f%s", st["protocol"], config.n_points, auc,
            " (verified: both runs agree)" if isinstance(config, MaliciousAUCConfig) else "")
        verified_metrics = not isinstance(config, MaliciousAUCConfig)
        if metrics is not None:
            log(INFO, "FHE metrics at threshold %g%s: accuracy %.6f precision %.6f recall %.6f F1 %.6f",
                float(st["metrics-threshold"]), "" if verified_metrics else " (unverified, not reported)",
                *metrics)
        report: dict = {"status": "ok", "shared": shared}
        if shared:
            report["auc"] = float(auc)
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
