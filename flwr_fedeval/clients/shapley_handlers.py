"""Node side of the SecSV contribution phase (Zheng et al., PVLDB 16(7) 2023, Algorithms 3–7).

Two roles run these handlers (the server side is
:mod:`flwr_fedeval.strategies.shapley_phase`; the protocol steps are in
:mod:`flwr_fedeval.shapley.parties`):

* a **data client** (``role = "client"``): records its local model of every
  round during training (:func:`shapley_record_mod`), generates the CKKS keys
  if it is the leader, shares its test set, encrypts its models, and acts as
  the *helper client* that decrypts other clients' scores;
* the **auxiliary server A** (``role = "shapley-aux"``, a SuperNode run by a
  party that does not collude with the ServerApp's operator, the principal
  server P): holds the second share of every test set and evaluates its half
  of each coalition model. It holds no CKKS secret key.

=============================  ======================  ====================================================
message type                   who                     what
=============================  ======================  ====================================================
``query.fedeval_role``         every node              reply the node's role
``query.shapley_hello``        clients, A              fresh X25519 key pair; clients add their train/test
                                                       sizes, feature and class counts, recorded rounds
``query.shapley_keygen``       leader client           CKKS keys (no rotation keys); public context and one
                                                       sealed secret context per other client
``query.shapley_share``        clients                 open the key bundle; share the test set: P's share in
                                                       the clear (uniform), A's share sealed for A
``query.shapley_models``       clients in ``I^t``      ``⟦w_i·round(θ_i^t 2^f)⟧`` in the Matrix Reducing layout
``query.shapley_aux_setup``    A                       open and keep its shares of every test set
``query.shapley_aux_eval``     A                       its half ``⟦A_S B''_l⟧`` of every (coalition, batch)
``query.shapley_helper``       helper clients          decrypt, predict, reply shares of the predictions
``query.shapley_aux_diff``     A                       its share of ``Ŷ − Y`` per batch
=============================  ======================  ====================================================

Every request carries ``shapley.session``; state lives in ``context.state``
under ``shapley.*`` (the deployment engine starts a process per message).
Requests that do not fit (unknown session, wrong role, bounds exceeded,
malformed bytes) get an error reply and change nothing.

No secret leaves a node: the clients' CKKS secret context travels sealed
(X25519 + HKDF + AES-GCM, :mod:`flwr_fedeval.keyshare`) between clients, A's
shares travel sealed for A; P sees its own shares (uniform on ``Z_{2^k}``),
ciphertexts, and which samples each coalition model predicts correctly.
Trust model: P and A do not collude; each may deviate (issue 12). Every
X25519 key P relays is signed with the node's roster key over (``"secsv"``,
session, 0, role, key) and checked against the roster before use
(:mod:`flwr_fedeval.identity`): the leader checks the other clients' keys
(role ``"client"``; distinct roster members, at least the node's floor)
before sealing the CKKS secret; every client checks the leader's key (role
``"key-holder"``) and A's key (role ``"aux"``) before opening its bundle or
sealing A's share, and keeps A's key for the helper step; A checks every
client's key at setup and accepts prediction shares only from those keys.
A accepts only raw (uncompressed) ``.npz`` arrays whose dtype and shape, read
from the ``.npy`` header, are the expected ones (:func:`read_raw_npz`).
"""

from __future__ import annotations

import io
import secrets
import zipfile
from collections.abc import Callable, Sequence
from typing import Any
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.logger import log

from flwr_fedeval import keyshare
from flwr_fedeval.clients.identity import key_set_floor, node_identity, signed_key_from_record, signed_key_record
from flwr_fedeval.clients.replies import error_reply, serve
from flwr_fedeval.fhe.backend import FHEError, create_context, load_context, pack_blobs, unpack_blobs
from flwr_fedeval.identity import IdentityError, SignedKey, verify_key, verify_key_set
from flwr_fedeval.messages import (
    ARRAYS_KEY,
    CONFIG_KEY,
    METRICS_KEY,
    ROLES,
    ROLE_KEY,
    ROLE_PROTOCOL,
    SHAPLEY_AUX_KEY,
    SHAPLEY_AUX_KEYS_KEY,
    SHAPLEY_AUX_SHARES_KEY,
    SHAPLEY_BATCHES_KEY,
    SHAPLEY_BUNDLES_KEY,
    SHAPLEY_BUNDLE_KEY,
    SHAPLEY_CONTEXT_KEY,
    SHAPLEY_DIFFS_KEY,
    SHAPLEY_HELLO_KEY,
    SHAPLEY_HELPER_KEYS_KEY,
    SHAPLEY_JOBS_KEY,
    SHAPLEY_LEADER_KEY,
    SHAPLEY_MODEL_KEY,
    SHAPLEY_PEERS_KEY,
    SHAPLEY_PREDS_KEY,
    SHAPLEY_PRED_KEY,
    SHAPLEY_PRODUCTS_KEY,
    SHAPLEY_REQUEST_KEY,
    SHAPLEY_ROUND_MODELS_KEY,
    SHAPLEY_SHARE_KEY,
    SHAPLEY_SIGNED_PROTOCOL,
    SHAPLEY_SIGNED_ROLE,
    SIGNATURES_SUFFIX,
    SIGNERS_SUFFIX,
    array_to_bytes,
    bytes_to_array,
)
from flwr_fedeval.shapley.parties import (
    aggregate_model,
    encrypt_model,
    helper_predict,
    masked_difference,
    model_matrix,
    server_plaintexts,
    server_products,
    share_test_set,
)
from flwr_fedeval.shapley.secsv import SecSVParams, shapley_ckks_params
from flwr_fedeval.shapley.sharing import share

__all__ = [
    "ROLES",
    "aux_diff",
    "aux_eval",
    "aux_setup",
    "hello",
    "helper",
    "keygen",
    "linear_model_matrix",
    "node_role",
    "read_raw_npz",
    "register_shapley_handlers",
    "recorded_model",
    "recorded_models",
    "role_reply",
    "share_data",
    "shapley_record_mod",
    "encrypt_models",
]

REQUEST_KEY = SHAPLEY_REQUEST_KEY
STATE_MODELS = "shapley.models"          # ArrayRecord per round: "shapley.models.<t>"
STATE_ROUNDS = "shapley.rounds"          # ConfigRecord: rounds (list), num-examples
STATE_KEYPAIR = "shapley.keypair"
STATE_SECRET = "shapley.secret"
STATE_AUX = "shapley.aux"                # A: shares (ArrayRecord)
STATE_AUX_MODELS = "shapley.aux-models"  # A: the current round's ciphertexts
STATE_PEERS = "shapley.peers"            # verified relayed keys: client {"aux"}, A {<node>: client key}
SIGNED_PROTOCOL = SHAPLEY_SIGNED_PROTOCOL  # defined in flwr_fedeval.messages; importable from here
SIGNED_ROLE = SHAPLEY_SIGNED_ROLE


class Refused(ValueError):
    """A request this node will not serve."""


def _error_reply(msg: Message, exc: BaseException) -> Message:
    return error_reply(msg, exc, "Shapley")


def _serve(msg: Message, step: Callable[[dict], RecordDict]) -> Message:
    return serve(msg, REQUEST_KEY, step, errors=(FHEError, ValueError, TypeError), label="Shapley")


def _session(context: Context, request: dict) -> keyshare.KeyPair:
    """This phase's X25519 key pair; refuses another session."""
    if STATE_KEYPAIR not in context.state:
        raise Refused("no key pair for this phase (query.shapley_hello missing)")
    rec = context.state[STATE_KEYPAIR]
    if rec["session"] != request.get("session"):
        raise Refused("session id does not match this node's phase")
    return keyshare.KeyPair(private=bytes(rec["private"]), public=bytes(rec["public"]))


def _params(request: dict) -> SecSVParams:
    return SecSVParams.from_config({k.replace("-", "_"): v for k, v in request.items()}, ckks=shapley_ckks_params())


def _layout(request: dict) -> tuple[int, int, int]:
    m, d_out, n_classes = int(request["m"]), int(request["d-out"]), int(request["n-classes"])
    if m < 1 or d_out not in (1, n_classes) or n_classes < 2 or m * d_out > shapley_ckks_params().slot_count:
        raise Refused(f"invalid layout m={m}, d_out={d_out}, n_classes={n_classes}")
    return m, d_out, n_classes


def _pack_arrays(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def read_raw_npz(data: bytes, expected: dict[str, tuple[Any, Callable[[tuple], bool]]]) -> list[np.ndarray]:
    """Arrays of an uncompressed ``.npz``, checked from their ``.npy`` headers before any data is read.

    Parameters
    ----------
    data : bytes
        The ``.npz`` (as written by ``np.savez``, never ``savez_compressed``).
    expected : dict
        ``name -> (dtype, shape_ok)``: exactly these members, each of this
        dtype (C order) and a shape for which ``shape_ok(shape)`` is true.

    Returns
    -------
    list of ndarray
        In the order of ``expected``.

    Raises
    ------
    Refused
        Not a ZIP, other or extra members, a compressed (e.g. ZIP_DEFLATED)
        or encrypted member, an unknown ``.npy`` version, another dtype,
        Fortran order, a shape ``shape_ok`` rejects, or a member whose size
        is not exactly header + ``prod(shape) · itemsize`` bytes.
    """
    try:
        zf = zipfile.ZipFile(io.BytesIO(bytes(data)))
    except zipfile.BadZipFile as exc:
        raise Refused(f"malformed array bundle: {exc}") from None
    infos = zf.infolist()
    members = [i.filename for i in infos]
    want = [f"{n}.npy" for n in expected]
    if sorted(members) != sorted(want):
        raise Refused(f"array bundle has members {members}, expected {want}")
    out = []
    for name, (dtype, shape_ok) in expected.items():
        info = zf.getinfo(f"{name}.npy")
        if info.compress_type != zipfile.ZIP_STORED:
            raise Refused(f"array '{name}' is compressed (ZIP method {info.compress_type}); only raw (stored) "
                          "arrays are accepted")
        if info.flag_bits & 0x1:
            raise Refused(f"array '{name}' is encrypted")
        try:
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dt = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran, dt = np.lib.format.read_array_header_2_0(f)
                else:
                    raise Refused(f"array '{name}': .npy version {version} not accepted")
                if dt != np.dtype(dtype) or fortran or not shape_ok(tuple(shape)):
                    raise Refused(f"array '{name}' is {dt} {tuple(shape)}{' (Fortran order)' if fortran else ''}, "
                                  f"expected {np.dtype(dtype)} of an accepted shape")
                nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                if info.file_size != f.tell() + nbytes:
                    raise Refused(f"array '{name}': {info.file_size} bytes, the header announces "
                                  f"{f.tell() + nbytes}")
                out.append(np.frombuffer(f.read(nbytes), dtype=dt).reshape(shape).copy())
        except Refused:
            raise
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise Refused(f"malformed array '{name}': {exc}") from None
    return out


def _signed_entries(msg: Message, record: str, keys: dict[str, bytes]) -> dict[str, SignedKey]:
    """``{node: SignedKey}`` from ``<record>`` and its ``<record>-signers`` / ``<record>-signatures``."""
    signers_key, signatures_key = record + SIGNERS_SUFFIX, record + SIGNATURES_SUFFIX
    signers = dict(msg.content[signers_key]) if signers_key in msg.content else {}
    signatures = dict(msg.content[signatures_key]) if signatures_key in msg.content else {}
    out = {}
    for node, pk in keys.items():
        if node not in signers or node not in signatures:
            raise IdentityError(f"key of node {node} in '{record}' is not signed (unsigned keys are refused)")
        out[node] = SignedKey(str(signers[node]), pk, bytes(signatures[node]))
    return out


def _verified_aux_key(context: Context, request: dict) -> bytes:
    """A's key as this client checked it at the share step; the request must name the same key."""
    if STATE_PEERS not in context.state or context.state[STATE_PEERS]["session"] != request.get("session"):
        raise Refused("no checked auxiliary-server key for this phase (share step missing)")
    peers = context.state[STATE_PEERS]
    if bytes(request.get("aux-public-key", b"")) != bytes(peers["aux"]):
        raise IdentityError(f"the auxiliary server's key differs from the one {peers['aux-signer']!r} signed "
                            "(checked at the share step): refused")
    return bytes(peers["aux"])


def _verified_client_keys(context: Context, request: dict) -> set[bytes]:
    """A: the clients' keys it checked at setup."""
    if STATE_PEERS not in context.state or context.state[STATE_PEERS]["session"] != request.get("session"):
        raise Refused("no checked client keys for this phase (aux setup missing)")
    return {bytes(v) for k, v in context.state[STATE_PEERS].items() if k != "session"}


# --- recording the local models (training) ------------------------------------
def linear_model_matrix(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``θ = [W | b]`` of shape ``(n_classes, d + 1)`` from the weights of one Keras ``Dense`` layer.

    ``arrays`` = ``[kernel (d, c), bias (c,)]``; ``c = 1`` (sigmoid) becomes the
    two rows ``[0; w]`` (predict 1 iff the logit > 0), ``c ≥ 2`` (softmax) the
    rows ``kernel.T | bias``.

    Raises
    ------
    ValueError
        If the model is not a single dense layer (SecSV evaluates linear
        classifiers only, as in the paper), or has NaN/inf weights.
    """
    shapes = [np.shape(a) for a in arrays]
    if len(arrays) != 2 or len(shapes[0]) != 2 or shapes[1] != (shapes[0][1],):
        raise ValueError(
            "Shapley evaluation (SecSV) needs a linear classifier: one Dense layer with kernel (d, c) "
            f"and bias (c,), got weight shapes {shapes}")
    kernel, bias = (np.asarray(a, dtype=np.float64) for a in arrays)
    theta = np.hstack([kernel.T, bias[:, None]])
    if not np.all(np.isfinite(theta)):
        raise ValueError("model has NaN or infinite weights")
    if theta.shape[0] == 1:
        theta = np.vstack([np.zeros_like(theta), theta])
    return theta


def shapley_record_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower mod: keep this client's local model of every round in ``context.state``.

    Wrap the user's ``train`` handler (inside any encrypting mod, e.g.
    ``mods=[xmkckks_mod, shapley_record_mod]``). After the handler replies,
    its ``"arrays"`` (the local model ``θ_i^t``) are stored under
    ``shapley.models.<server-round>`` and ``num-examples`` is remembered;
    nothing else changes, and nothing leaves the node.
    """
    reply = call_next(msg, context)
    if msg.metadata.message_type != "train" or reply.has_error():
        return reply
    config = msg.content[CONFIG_KEY] if CONFIG_KEY in msg.content else {}
    if "server-round" not in config or ARRAYS_KEY not in reply.content:
        return reply
    rnd = int(config["server-round"])
    context.state[f"{STATE_MODELS}.{rnd}"] = ArrayRecord(reply.content[ARRAYS_KEY].to_numpy_ndarrays())
    rounds = sorted(set(recorded_rounds(context)) | {rnd})
    num = int(reply.content[METRICS_KEY]["num-examples"]) if METRICS_KEY in reply.content else 0
    context.state[STATE_ROUNDS] = ConfigRecord({"rounds": rounds, "num-examples": num})
    return reply


def recorded_rounds(context: Context) -> list[int]:
    return [int(r) for r in context.state[STATE_ROUNDS]["rounds"]] if STATE_ROUNDS in context.state else []


def recorded_model(context: Context, rnd: int) -> np.ndarray:
    """``θ (n_classes, d+1)`` of round ``rnd`` as :func:`shapley_record_mod` kept it."""
    if rnd not in recorded_rounds(context):
        raise Refused(f"no model recorded for round {rnd}")
    return linear_model_matrix(context.state[f"{STATE_MODELS}.{rnd}"].to_numpy_ndarrays())


def recorded_models(context: Context) -> dict[int, np.ndarray]:
    """``{round: θ (n_classes, d+1)}`` of the models :func:`shapley_record_mod` kept."""
    return {t: recorded_model(context, t) for t in recorded_rounds(context)}


# --- every node --------------------------------------------------------------


def role_reply(msg: Message, role: str, context: Context | None = None,
               partition: tuple[int, int] | None = None) -> Message:
    """``query.fedeval_role``: this node's role and, if it has an identity, a signed statement of it.

    Request (optional) ``role.nonce`` (str, the server's fresh nonce). Reply
    ``role``: ``role`` and, when ``context`` has a node identity and a
    nonce came, ``signer``/``signature`` over ``("fedeval-role", nonce, 0,
    role, this node's public signing key)`` — lets a server that holds the
    roster leave out nodes outside it before training (:func:`~flwr_fedeval.
    strategies.shapley_phase.discover_roles`). A node without an identity
    still answers, unsigned. With ``partition = (partition id, number of
    partitions)`` of a data client, the reply also carries ``partition-id``
    and ``num-partitions`` (unsigned; the server's harness uses them only
    for its reference numbers, never in a protocol).
    """
    if role not in ROLES:
        return _error_reply(msg, Refused(f"unknown role {role!r}, expected one of {ROLES}"))
    out: dict = {"role": role}
    if partition is not None:
        out["partition-id"], out["num-partitions"] = int(partition[0]), int(partition[1])
    nonce = msg.content[ROLE_KEY].get("nonce") if ROLE_KEY in msg.content else None
    if context is not None and isinstance(nonce, str) and nonce:
        try:
            ident, _ = node_identity(context)
        except IdentityError as exc:
            out["identity-error"] = str(exc)
        else:
            out.update(signed_key_record(ident, protocol=ROLE_PROTOCOL, session=nonce, round=0, role=role,
                                         key=ident.public_key_bytes()))
    return Message(content=RecordDict({ROLE_KEY: ConfigRecord(out)}), reply_to=msg)


def hello(msg: Message, context: Context, role: str, *, num_test: int = 0, n_features: int = 0) -> Message:
    """``query.shapley_hello``: a fresh X25519 key pair; a client adds what the server plans with.

    Reply ``shapley-hello``: ``role``, ``public-key``, ``signer`` and
    ``signature`` (this node's roster name and its signature over
    ``("secsv", session, 0, "client" | "aux", public key)``) and, for a client,
    ``num-examples`` (its FedAvg weight basis), ``num-test``, ``n-features``,
    ``n-classes`` and ``rounds`` (those with a recorded model).
    """

    def step(request: dict) -> RecordDict:
        session = request.get("session")
        if not isinstance(session, str) or not session:
            raise Refused("request has no session id")
        for key in [k for k in context.state.keys() if k.startswith("shapley.") and k not in
                    (STATE_ROUNDS,) and not k.startswith(STATE_MODELS)]:
            del context.state[key]                       # a new phase starts from scratch
        if role not in SIGNED_ROLE:
            raise Refused(f"unknown role {role!r}")
        ident, _ = node_identity(context)
        kp = keyshare.generate_keypair()
        context.state[STATE_KEYPAIR] = ConfigRecord({"session": session, "private": kp.private,
                                                     "public": kp.public})
        out = {"role": role, "public-key": kp.public,
               **signed_key_record(ident, protocol=SIGNED_PROTOCOL, session=session, round=0,
                                   role=SIGNED_ROLE[role], key=kp.public)}
        if role == "client":
            models = recorded_models(context)
            if not models:
                raise Refused("no local model was recorded during training (is shapley_record_mod "
                              "wrapping the train handler?)")
            shapes = {m.shape for m in models.values()}
            if len(shapes) != 1:
                raise Refused(f"recorded models have different shapes {sorted(shapes)}")
            (n_classes, d_in), = shapes
            if d_in - 1 != n_features:
                raise Refused(f"models take {d_in - 1} features, the test set has {n_features}")
            out.update({"num-examples": int(context.state[STATE_ROUNDS]["num-examples"]),
                        "num-test": int(num_test), "n-features": int(n_features),
                        "n-classes": int(n_classes), "rounds": sorted(models)})
        log(INFO, "Shapley phase: %s, X25519 fingerprint %s", role, keyshare.fingerprint(kp.public))
        return RecordDict({SHAPLEY_HELLO_KEY: ConfigRecord(out)})

    return _serve(msg, step)


# --- data clients ---------------------------------------------------------------
def keygen(msg: Message, context: Context) -> Message:
    """``query.shapley_keygen`` (leader, Algorithm 3 step 1): CKKS keys for the clients.

    Request ``shapley-peers``: ``{str(node_id): X25519 public key}`` of the
    other clients, ``shapley-peers-signers`` / ``shapley-peers-signatures``
    (their roster names and hello signatures; checked first: distinct roster
    members, at least the node's floor). Reply ``shapley-context.public``
    (public key and relinearisation key, no rotation keys, no secret key),
    ``shapley-bundles`` (sealed secret context per peer) and
    ``shapley-leader`` (``signer``, ``signature`` of the leader's key for role
    ``"key-holder"``).
    """

    def step(request: dict) -> RecordDict:
        kp = _session(context, request)
        ident, roster = node_identity(context)
        peers = {str(k): bytes(v) for k, v in dict(msg.content[SHAPLEY_PEERS_KEY]).items()}
        entries = _signed_entries(msg, SHAPLEY_PEERS_KEY, peers)
        if kp.public in peers.values():
            raise IdentityError("the peer list relays this leader's own key")
        verify_key_set(roster, entries, protocol=SIGNED_PROTOCOL, session=request["session"], round=0,
                       role="client", floor=key_set_floor(context), own=ident.name)
        ctx = create_context(params=shapley_ckks_params())
        secret = ctx.secret_bytes()
        # SecSV needs no common seed; the bundle format carries one, so it is fresh random bytes.
        bundles = keyshare.seal_bundle(secret, secrets.token_bytes(32), sender=kp, recipients=peers)
        context.state[STATE_SECRET] = ArrayRecord({"context": bytes_to_array(secret)})
        log(INFO, "Shapley phase: leader, CKKS keys for %d other clients", len(peers))
        return RecordDict({
            SHAPLEY_CONTEXT_KEY: ArrayRecord({"public": bytes_to_array(ctx.public_bytes(rotation_keys=False))}),
            SHAPLEY_BUNDLES_KEY: ArrayRecord({n: bytes_to_array(b) for n, b in bundles.items()}),
            SHAPLEY_LEADER_KEY: ConfigRecord(signed_key_record(ident, protocol=SIGNED_PROTOCOL,
                                                             session=request["session"], round=0,
                                                             role="key-holder", key=kp.public)),
        })

    return _serve(msg, step)


def _checked_params(ctx):
    """Refuse a context whose CKKS parameters are not the (HE-Standard, 128-bit) Shapley set."""
    if ctx.params != shapley_ckks_params():
        raise Refused(f"CKKS parameters {ctx.params} are not the Shapley set {shapley_ckks_params()}")
    return ctx


def _secret_context(context: Context):
    if STATE_SECRET not in context.state:
        raise Refused("no CKKS secret context for this phase")
    ctx = load_context(array_to_bytes(context.state[STATE_SECRET]["context"]))
    if not ctx.is_private:
        raise Refused("the stored context holds no secret key")
    return _checked_params(ctx)


def share_data(msg: Message, context: Context, X_test: np.ndarray, y_test: np.ndarray) -> Message:
    """``query.shapley_share`` (Algorithm 3 steps 2–3): open the key bundle, share the test set.

    Request: ``shapley`` (session, public SecSV parameters, ``leader-public-key``,
    ``leader-signer``, ``leader-signature`` (role ``"key-holder"``),
    ``aux-public-key``, ``aux-signer``, ``aux-signature`` (role ``"aux"``),
    both checked against the roster first) and, except for the leader,
    ``shapley-bundle.sealed``. A's verified key is kept for the helper step.
    Reply ``shapley-share``: ``x`` (M, d_in) and ``y`` (M,) uint64 — P's share —
    and ``sealed-aux`` (A's share, sealed for A). Refuses (before any work) if a
    recorded model or a test feature exceeds the public bounds.
    """

    def step(request: dict) -> RecordDict:
        kp = _session(context, request)
        params = _params(request)
        ident, roster = node_identity(context)
        session = request["session"]
        leader_pk, aux_pk = bytes(request["leader-public-key"]), bytes(request["aux-public-key"])
        leader = signed_key_from_record(request, leader_pk, prefix="leader-")
        verify_key(roster, leader.signer, leader.signature, protocol=SIGNED_PROTOCOL, session=session, round=0,
                   role="key-holder", key=leader_pk)
        if (leader.signer == ident.name) != (leader_pk == kp.public):
            raise IdentityError(f"leader {leader.signer!r} with this node's key, or this node's name with another "
                                "key: refused")
        aux = signed_key_from_record(request, aux_pk, prefix="aux-")
        verify_key(roster, aux.signer, aux.signature, protocol=SIGNED_PROTOCOL, session=session, round=0,
                   role="aux", key=aux_pk)
        if aux.signer in (ident.name, leader.signer):
            raise IdentityError(f"auxiliary server {aux.signer!r} is this node or the leader: refused")
        if SHAPLEY_BUNDLE_KEY in msg.content:
            if leader_pk == kp.public:
                raise Refused("a key bundle addressed to the leader itself")
            secrets_ = keyshare.open_bundle(array_to_bytes(msg.content[SHAPLEY_BUNDLE_KEY]["sealed"]),
                                            recipient=kp, sender_public=leader_pk)
            context.state[STATE_SECRET] = ArrayRecord({"context": bytes_to_array(secrets_.secret_context)})
        _secret_context(context)                          # refuse early without a key
        _, d_out, n_classes = _layout(request)
        for rnd, theta in recorded_models(context).items():   # refuse now, not rounds later
            try:
                model_matrix(theta, 1, params, n_classes=n_classes, d_out=d_out)
            except ValueError as exc:
                raise Refused(f"local model of round {rnd}: {exc}") from None
        (x_p, y_p), (x_a, y_a) = share_test_set(X_test, np.asarray(y_test, dtype=np.int64), params)
        sealed = keyshare.seal_for(_pack_arrays(x=x_a, y=y_a), sender=kp, recipient_public=aux_pk)
        context.state[STATE_PEERS] = ConfigRecord({"session": session, "aux": aux_pk, "aux-signer": aux.signer})
        return RecordDict({SHAPLEY_SHARE_KEY: ArrayRecord(
            {"x": _arr(x_p), "y": _arr(y_p),
             "sealed-aux": bytes_to_array(sealed)})})

    return _serve(msg, step)


def _arr(a: np.ndarray):
    from flwr.app import Array

    return Array(np.ascontiguousarray(a))


def encrypt_models(msg: Message, context: Context) -> Message:
    """``query.shapley_models`` (Algorithm 5 steps 1–3): encrypt this client's model of round ``t``.

    Request: ``shapley`` (session, parameters, layout ``m``/``d-out``/``n-classes``,
    ``round``, integer ``weight``). Reply ``shapley-model.cts``: ``d_in`` packed
    ciphertexts of ``w_i · round(θ_i^t 2^f)``. Refuses a model above the public
    ``model-bound``.
    """

    def step(request: dict) -> RecordDict:
        _session(context, request)
        params = _params(request)
        m, d_out, n_classes = _layout(request)
        theta = recorded_model(context, int(request["round"]))
        A = model_matrix(theta, int(request["weight"]), params, n_classes=n_classes, d_out=d_out)
        ctx = _secret_context(context)
        blobs = [ctx.serialize_ciphertext(c) for c in encrypt_model(ctx, A, m)]
        return RecordDict({SHAPLEY_MODEL_KEY: ArrayRecord({"cts": bytes_to_array(pack_blobs(blobs))})})

    return _serve(msg, step)


def helper(msg: Message, context: Context) -> Message:
    """``query.shapley_helper`` (Algorithm 4 steps 7–11): decrypt scores, predict, share.

    Request ``shapley-batches``: per job ``j``, ``cts-j`` (packed limb
    ciphertexts) and ``n-j`` (samples); ``shapley`` carries the parameters,
    layout and ``aux-public-key``, which must be the key this client checked
    against the roster at the share step. Reply ``shapley-pred``: ``p-j`` (P's
    share of the predicted labels, uint64) and ``a-j`` (A's share, sealed for A).
    """

    def step(request: dict) -> RecordDict:
        kp = _session(context, request)
        params = _params(request)
        m, d_out, _ = _layout(request)
        ctx = _secret_context(context)
        aux_pk = _verified_aux_key(context, request)
        batches = msg.content[SHAPLEY_BATCHES_KEY]
        jobs = sorted({k.split("-", 1)[1] for k in batches.keys() if k.startswith("cts-")})
        out = {}
        for j in jobs:
            cts = [ctx.deserialize_ciphertext(b)
                   for b in unpack_blobs(array_to_bytes(batches[f"cts-{j}"]), expected=params.n_limbs)]
            n = int(batches[f"n-{j}"].numpy()[0])
            pred = helper_predict(ctx, cts, n, params, m=m, d_out=d_out)
            pred_p, pred_a = share(pred, params.ring_bits)
            out[f"p-{j}"] = _arr(pred_p)
            out[f"a-{j}"] = bytes_to_array(keyshare.seal_for(
                _pack_arrays(pred=pred_a), sender=kp, recipient_public=aux_pk))
        return RecordDict({SHAPLEY_PRED_KEY: ArrayRecord(out)})

    return _serve(msg, step)


# --- auxiliary server A -------------------------------------------------------
def aux_setup(msg: Message, context: Context) -> Message:
    """``query.shapley_aux_setup``: open A's shares of every test set, keep them.

    Request ``shapley-aux-shares``: ``sealed-<c>`` per client in sample-id
    order (``shapley.order``, node IDs as strings: they are 64-bit unsigned), ``shapley-aux-keys``
    (``{str(node_id): X25519 public key}``) with ``shapley-aux-keys-signers`` /
    ``shapley-aux-keys-signatures`` (checked against the roster: distinct
    members, role ``"client"``, at least the node's floor);
    ``shapley-context.public``. Each share must be a raw ``.npz`` with
    ``x`` uint64 ``(M_c, d+1)`` and ``y`` uint64 ``(M_c,)`` (:func:`read_raw_npz`).
    Reply ``shapley-aux``: ``samples`` (M).
    """

    def step(request: dict) -> RecordDict:
        keypair = _session(context, request)
        params = _params(request)
        ident, roster = node_identity(context)
        ctx = _checked_params(load_context(array_to_bytes(msg.content[SHAPLEY_CONTEXT_KEY]["public"])))
        if ctx.is_private:
            raise Refused("the auxiliary server must not receive a secret key")
        keys = {str(k): bytes(v) for k, v in dict(msg.content[SHAPLEY_AUX_KEYS_KEY]).items()}
        order = [str(n) for n in request["order"]]
        if sorted(order) != sorted(keys) or len(set(order)) != len(order):
            raise Refused("client order and client keys list different nodes")
        if keypair.public in keys.values():
            raise IdentityError("the client keys relay this auxiliary server's own key")
        names = verify_key_set(roster, _signed_entries(msg, SHAPLEY_AUX_KEYS_KEY, keys), protocol=SIGNED_PROTOCOL,
                               session=request["session"], round=0, role="client", floor=key_set_floor(context))
        if ident.name in names.values():
            raise IdentityError(f"the client keys list this auxiliary server ({ident.name!r}) as a client")
        shares = msg.content[SHAPLEY_AUX_SHARES_KEY]
        xs, ys = [], []
        d_in = params.n_features + 1
        for node in order:
            raw = keyshare.open_from(array_to_bytes(shares[f"sealed-{node}"]), recipient=keypair,
                                     sender_public=keys[node])
            rows: list[int] = []

            def x_shape(s, rows=rows):
                rows.append(s[0] if len(s) == 2 else -1)
                return len(s) == 2 and s[1] == d_in

            x, y = read_raw_npz(raw, {"x": (np.uint64, x_shape),
                                      "y": (np.uint64, lambda s, rows=rows: s == (rows[0],))})
            xs.append(x)
            ys.append(y)
        X, Y = np.vstack(xs), np.concatenate(ys)
        context.state[STATE_AUX] = ArrayRecord({"x": _arr(X), "y": _arr(Y),
                                                "context": msg.content[SHAPLEY_CONTEXT_KEY]["public"]})
        context.state[STATE_AUX + ".order"] = ConfigRecord({"order": order})
        context.state[STATE_PEERS] = ConfigRecord({"session": request["session"], **keys})
        log(INFO, "Shapley phase: auxiliary server (%s) checked the keys of clients %s", ident.name,
            sorted(names.values()))
        log(INFO, "Shapley phase: auxiliary server holds shares of %d test samples", len(Y))
        return RecordDict({SHAPLEY_AUX_KEY: ConfigRecord({"samples": int(len(Y))})})

    return _serve(msg, step)


def _aux_state(context: Context):
    if STATE_AUX not in context.state:
        raise Refused("no test-set shares (query.shapley_aux_setup missing)")
    st = context.state[STATE_AUX]
    return st["x"].numpy(), st["y"].numpy(), load_context(array_to_bytes(st["context"]))


def aux_eval(msg: Message, context: Context) -> Message:
    """``query.shapley_aux_eval`` (Algorithm 4 step 4): A's products for every (coalition, batch).

    Request ``shapley-jobs``: ``members-j`` (indices into the client order of
    ``query.shapley_aux_setup``), ``ids-j`` (sample
    IDs, ≤ m); optionally ``shapley-round-models`` (``<node>``: packed
    ciphertexts), kept for the following requests of the same round.
    Reply ``shapley-products``: ``cts-j`` (packed, one ciphertext per limb).
    """

    def step(request: dict) -> RecordDict:
        _session(context, request)
        params = _params(request)
        m, d_out, _ = _layout(request)
        X, _, ctx = _aux_state(context)
        order = list(context.state[STATE_AUX + ".order"]["order"])
        if SHAPLEY_ROUND_MODELS_KEY in msg.content:
            context.state[STATE_AUX_MODELS] = msg.content[SHAPLEY_ROUND_MODELS_KEY]
            context.state[STATE_AUX_MODELS + ".round"] = ConfigRecord({"round": int(request["round"])})
        if (STATE_AUX_MODELS not in context.state
                or int(context.state[STATE_AUX_MODELS + ".round"]["round"]) != int(request["round"])):
            raise Refused(f"no model ciphertexts for round {request['round']}")
        stored = context.state[STATE_AUX_MODELS]
        models = {node: [ctx.deserialize_ciphertext(b) for b in unpack_blobs(array_to_bytes(stored[node]))]
                  for node in stored.keys()}
        jobs = msg.content[SHAPLEY_JOBS_KEY]
        plain_cache: dict[bytes, list] = {}
        agg_cache: dict[tuple, list] = {}
        out = {}
        for j in sorted({k.split("-", 1)[1] for k in jobs.keys() if k.startswith("ids-")}):
            ids = jobs[f"ids-{j}"].numpy().astype(np.int64)
            index = jobs[f"members-{j}"].numpy().astype(np.int64)
            if index.size == 0 or index.min() < 0 or index.max() >= len(order):
                raise Refused(f"job {j}: member indices {index.tolist()} outside 0..{len(order) - 1}")
            members = tuple(order[i] for i in index)
            if any(n not in models for n in members):
                raise Refused(f"job {j}: coalition {members} has members without a model")
            if ids.size == 0 or ids.size > m or ids.min() < 0 or ids.max() >= len(X):
                raise Refused(f"job {j}: {ids.size} sample ids outside 1..{m} or out of range")
            if members not in agg_cache:
                agg_cache[members] = aggregate_model(ctx, [models[n] for n in members])
            key = ids.tobytes()
            if key not in plain_cache:
                plain_cache[key] = server_plaintexts(ctx, X[ids], params, m=m, d_out=d_out)
            prods = server_products(ctx, agg_cache[members], plain_cache[key])
            out[f"cts-{j}"] = bytes_to_array(pack_blobs([ctx.serialize_ciphertext(c) for c in prods]))
        return RecordDict({SHAPLEY_PRODUCTS_KEY: ArrayRecord(out)})

    return _serve(msg, step)


def aux_diff(msg: Message, context: Context) -> Message:
    """``query.shapley_aux_diff`` (Algorithm 4 step 12): A's share of ``Ŷ − Y`` per batch.

    Request ``shapley-preds``: ``sealed-j`` (A's prediction share from the
    helper), ``ids-j``; ``shapley-helper-keys``: ``helper-j`` public key, which
    must be one of the client keys checked at setup; the share must be a raw
    ``.npz`` with ``pred`` uint64 of the batch's length.
    Reply ``shapley-diffs``: ``d-j`` (uint64).
    """

    def step(request: dict) -> RecordDict:
        keypair = _session(context, request)
        params = _params(request)
        _, Y, _ = _aux_state(context)
        clients = _verified_client_keys(context, request)
        preds = msg.content[SHAPLEY_PREDS_KEY]
        keys = msg.content[SHAPLEY_HELPER_KEYS_KEY]
        out = {}
        for j in sorted({k.split("-", 1)[1] for k in preds.keys() if k.startswith("ids-")}):
            ids = preds[f"ids-{j}"].numpy().astype(np.int64)
            if ids.size == 0 or ids.min() < 0 or ids.max() >= len(Y):
                raise Refused(f"job {j}: sample ids out of range")
            helper_pk = bytes(keys[f"helper-{j}"])
            if helper_pk not in clients:
                raise IdentityError(f"job {j}: the helper's key is not one of the clients' keys checked at setup")
            raw = keyshare.open_from(array_to_bytes(preds[f"sealed-{j}"]), recipient=keypair,
                                     sender_public=helper_pk)
            (pred_a,) = read_raw_npz(raw, {"pred": (np.uint64, lambda s, n=ids.size: s == (n,))})
            out[f"d-{j}"] = _arr(masked_difference(pred_a, Y[ids], params.ring_bits))
        return RecordDict({SHAPLEY_DIFFS_KEY: ArrayRecord(out)})

    return _serve(msg, step)


# --- registration -------------------------------------------------------------
def node_role(context: Context) -> str:
    """The node config's ``fedeval-role`` (``"client"`` when absent)."""
    return str(context.node_config.get("fedeval-role", "client"))


def register_shapley_handlers(
    app,
    *,
    test_set: Callable[[Context], tuple[np.ndarray, np.ndarray]],
    role: Callable[[Context], str] = node_role,
    partition: Callable[[Context], tuple[int, int] | None] | None = None,
) -> None:
    """Register the SecSV handlers on a ``ClientApp``.

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
    test_set : callable
        ``context -> (X_test (M, d) float, y_test (M,) int)`` — this client's
        test features (within the public ``feature-bound``) and labels.
    role : callable, default=:func:`node_role`
        ``context -> "client" | "shapley-aux"``.
    partition : callable, optional
        ``context -> (partition id, number of partitions)`` of a data client
        (``None`` for a node without data), reported in ``query.fedeval_role``.

    Also wrap the train handler with :func:`shapley_record_mod`.
    """

    def _client_only(context: Context) -> None:
        if role(context) != "client":
            raise Refused(f"this node is the auxiliary server ({role(context)!r}), not a data client")

    def _aux_only(context: Context) -> None:
        if role(context) != "shapley-aux":
            raise Refused("this node is not the auxiliary server")

    def guarded(check, handler):
        def run(msg: Message, context: Context) -> Message:
            try:
                check(context)
            except Refused as exc:
                return _error_reply(msg, exc)
            return handler(msg, context)
        return run

    @app.query("fedeval_role")
    def _role(msg: Message, context: Context) -> Message:
        return role_reply(msg, role(context), context, partition(context) if partition else None)

    @app.query("shapley_hello")
    def _hello(msg: Message, context: Context) -> Message:
        r = role(context)
        if r != "client":
            return hello(msg, context, r)
        X, _ = test_set(context)
        return hello(msg, context, r, num_test=len(X), n_features=int(np.shape(X)[1]))

    app.query("shapley_keygen")(guarded(_client_only, keygen))
    app.query("shapley_share")(guarded(_client_only, lambda m, c: share_data(m, c, *test_set(c))))
    app.query("shapley_models")(guarded(_client_only, encrypt_models))
    app.query("shapley_helper")(guarded(_client_only, helper))
    app.query("shapley_aux_setup")(guarded(_aux_only, aux_setup))
    app.query("shapley_aux_eval")(guarded(_aux_only, aux_eval))
    app.query("shapley_aux_diff")(guarded(_aux_only, aux_diff))
