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
``query.shapley_helper``       helper clients          decrypt, predict, deal the zero test (P's part; A's
                                                       part sealed for A)
``query.shapley_aux_diff``     A                       its share of ``r·(Ŷ − Y)`` per batch (zero test)
=============================  ======================  ====================================================

Every request and reply is a payload dataclass of :mod:`flwr_fedeval.protocol.secsv`
(parsed and checked before any work); every request carries ``shapley.session``;
state lives in ``context.state`` under ``shapley.*`` (the deployment engine starts
a process per message). Requests that do not fit (wrong role, unknown session,
malformed fields, bounds exceeded, malformed bytes) get an error reply
(:class:`flwr_fedeval.protocol.Refused`, :class:`~flwr_fedeval.protocol.MalformedMessage`)
and change nothing.

No secret leaves a node: the clients' CKKS secret context travels sealed
(X25519 + HKDF + AES-GCM, :mod:`flwr_fedeval.keyshare`) between clients, A's
shares travel sealed for A; P sees its own shares (uniform on ``Z_{2^k}``),
ciphertexts, and which samples each coalition model predicts correctly: it opens
``r·(Ŷ − Y)`` for a multiplier ``r`` it does not know (:mod:`flwr_fedeval.shapley.zerotest`),
never ``Ŷ − Y`` (whose sign is the label of a misclassified binary sample).
Trust model: P and A do not collude; each may deviate. Every
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

Against a deviating P: each client signs its encrypted model of a round
(``"secsv-model"``) and A computes only on models so signed by the roster member it
checked for that node; A signs its half of every job (``"secsv-products"``: session,
round, coalition, sample ids, ciphertexts) and a helper decrypts only jobs A signed, adding
P's half itself, and each (round, coalition, sample) once. A answers each sealed deal of the zero
test once and each (round, coalition, sample) once whichever helper dealt it, and never a deal
from a helper that owns a sample of the batch (A's node privacy ledger, across runs:
:func:`aux_diff`). P's own half is not checked
(no MACs), so a deviating P can still learn labels: every node refuses the phase at
hello unless its node config ``fedeval-secsv-trust-principal`` is true
(:func:`trusts_principal`).
"""

from __future__ import annotations

import io
import secrets
import zipfile
from collections.abc import Callable, Sequence
from logging import INFO
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message
from flwr.common.logger import log

from flwr_fedeval import keyshare
from flwr_fedeval.clients.identity import key_set_floor, node_identity
from flwr_fedeval.clients.policy import SECSV_TRUST_PRINCIPAL, node_policy
from flwr_fedeval.clients.session_keys import load_session_keypair, new_session_keypair
from flwr_fedeval.fhe.backend import (
    CKKSContext,
    FHEError,
    create_context,
    load_context,
    pack_blobs,
    unpack_blobs,
)
from flwr_fedeval.identity import IdentityError, sign_key, verify_key, verify_key_set
from flwr_fedeval.protocol import (
    ARRAYS_KEY,
    CONFIG_KEY,
    METRICS_KEY,
    MalformedMessage,
    Refused,
    Step,
    array_bytes,
    array_field,
    array_record,
    bytes_array,
    config_field,
    config_list,
    config_record,
    error_reply,
    handler,
    register,
)
from flwr_fedeval.protocol import secsv as proto
from flwr_fedeval.shapley.parties import (
    add_products,
    aggregate_model,
    encrypt_model,
    helper_predict,
    model_matrix,
    server_plaintexts,
    server_products,
    share_test_set,
)
from flwr_fedeval.shapley.secsv import shapley_ckks_params
from flwr_fedeval.shapley.sharing import LABEL_PRIME
from flwr_fedeval.shapley.zerotest import AuxDeal, aux_share, deal

if TYPE_CHECKING:
    from flwr.clientapp import ClientApp

__all__ = [
    "Refused",
    "aux_diff",
    "aux_eval",
    "aux_setup",
    "encrypt_models",
    "hello",
    "helper",
    "keygen",
    "linear_model_matrix",
    "node_role",
    "read_raw_npz",
    "recorded_model",
    "recorded_models",
    "register_shapley_handlers",
    "role_reply",
    "shapley_record_mod",
    "share_data",
    "trusts_principal",
]

#: The request record (``"shapley"``), for code that edits requests (deviating-server tests).
REQUEST_KEY = proto.REQUEST_KEY
STATE_MODELS = "shapley.models"          # ArrayRecord per round: "shapley.models.<t>"
STATE_ROUNDS = "shapley.rounds"          # ConfigRecord: rounds (list), num-examples
STATE_KEYPAIR = "shapley.keypair"
STATE_SECRET = "shapley.secret"
STATE_AUX = "shapley.aux"                # A: shares (ArrayRecord)
STATE_AUX_MODELS = "shapley.aux-models"  # A: the current round's ciphertexts
STATE_PEERS = "shapley.peers"            # verified relayed keys: client {"aux"}, A {<node>: client key}
STATE_AUX_NAMES = "shapley.aux-names"    # A: {<node>: roster name that signed the node's client key}
STATE_DECRYPTED = "shapley.decrypted"    # helper: {"<round>:<members>": sample ids decrypted}
_LABEL = "Shapley"
#: Node config: this node accepts an honest-but-curious principal server P (the paper's model).
TRUST_PRINCIPAL_CONFIG = SECSV_TRUST_PRINCIPAL
#: Exceptions a handler turns into an error reply (besides Refused and MalformedMessage).
_ERRORS = (FHEError, ValueError, TypeError, KeyError)


def _state_config(context: Context, key: str) -> ConfigRecord:
    """``context.state[key]``, a ``ConfigRecord`` this module wrote (MalformedMessage if missing)."""
    return config_record(context.state, key)


def _state_arrays(context: Context, key: str) -> ArrayRecord:
    """``context.state[key]``, an ``ArrayRecord`` this module wrote (MalformedMessage if missing)."""
    return array_record(context.state, key)


def _keypair(context: Context, session: str) -> keyshare.KeyPair:
    """This phase's X25519 key pair; refuses another session."""
    return load_session_keypair(context, STATE_KEYPAIR, session,
                                missing="no key pair for this phase (query.shapley_hello missing)")


def _layout(public: proto.PublicParams) -> tuple[int, int, int]:
    m, d_out, n_classes = public.m, public.d_out, public.n_classes
    if m is None or d_out is None or n_classes is None:
        raise Refused("the request carries no layout (m, d-out, n-classes)")
    if d_out not in (1, n_classes) or m * d_out > shapley_ckks_params().slot_count:
        raise Refused(f"invalid layout m={m}, d_out={d_out}, n_classes={n_classes}")
    return m, d_out, n_classes


def _pack_arrays(**arrays: np.ndarray) -> bytes:
    """An uncompressed ``.npz`` of ``arrays`` (``np.savez``'s layout, no pickled objects)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, a in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(a), allow_pickle=False)
    return buf.getvalue()


def _shape_is(shape: tuple[int, ...]) -> Callable[[tuple[Any, ...]], bool]:
    """A shape check for :func:`read_raw_npz`: exactly ``shape``."""
    return lambda s: tuple(s) == shape


def read_raw_npz(data: bytes, expected: dict[str, tuple[Any, Callable[[tuple[Any, ...]], bool]]]) -> list[np.ndarray]:
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




def _peers(context: Context, session: str, missing: str) -> ConfigRecord:
    """The peer keys this node checked in this phase (``session``); ``Refused(missing)`` if none."""
    if STATE_PEERS not in context.state:
        raise Refused(missing)
    peers = _state_config(context, STATE_PEERS)
    if config_field(peers, STATE_PEERS, "session", str) != session:
        raise Refused(missing)
    return peers


def _verified_aux_key(context: Context, request: proto.HelperRequest) -> tuple[bytes, str]:
    """A's key and roster name as this client checked them at the share step; the request must name
    the same key."""
    peers = _peers(context, request.public.session, "no checked auxiliary-server key for this phase (share step "
                   "missing)")
    key, signer = config_field(peers, STATE_PEERS, "aux", bytes), config_field(peers, STATE_PEERS, "aux-signer", str)
    if request.aux_public_key != key:
        raise IdentityError(f"the auxiliary server's key differs from the one {signer!r} signed "
                            "(checked at the share step): refused")
    return key, signer


def _verified_client_keys(context: Context, public: proto.PublicParams) -> dict[bytes, str]:
    """A: the clients' keys it checked at setup, with the node (decimal ID) of each."""
    peers = _peers(context, public.session, "no checked client keys for this phase (aux setup missing)")
    return {config_field(peers, STATE_PEERS, k, bytes): k for k in peers if k != "session"}


def trusts_principal(context: Context) -> bool:
    """Whether this node's operator accepts an honest-but-curious principal server P.

    Node config ``fedeval-secsv-trust-principal`` (deployment: ``flower-supernode
    --node-config 'fedeval-secsv-trust-principal=true'``); in simulation, where the node config
    holds only the partition, the same key in ``<identity-dir>/node-<partition-id>.policy.toml``.
    Default ``False``. Run config cannot set it (whoever submits the run would vouch for itself).

    SecSV protects the test sets against an honest-but-curious P only (Zheng et al. 2023, §3);
    a P that deviates can still learn labels through its own half of the scores (no MACs on its
    share computation, README "Threat model"), so every node must accept that explicitly.

    Raises
    ------
    Refused
        The value is not a boolean (``true``/``false``), or the policy file is malformed.
    """
    return node_policy(context).secsv_trust_principal


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


def shapley_record_mod(msg: Message, context: Context,
                       call_next: Callable[[Message, Context], Message]) -> Message:
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
    config = msg.content.config_records.get(CONFIG_KEY, ConfigRecord())
    if "server-round" not in config or ARRAYS_KEY not in reply.content:
        return reply
    rnd = config_field(config, CONFIG_KEY, "server-round", int)
    context.state[f"{STATE_MODELS}.{rnd}"] = ArrayRecord(array_record(reply.content, ARRAYS_KEY).to_numpy_ndarrays())
    rounds = sorted(set(recorded_rounds(context)) | {rnd})
    metrics = reply.content.metric_records.get(METRICS_KEY)
    value = metrics.get("num-examples", 0) if metrics is not None else 0
    num = int(value) if isinstance(value, (int, float)) else 0
    context.state[STATE_ROUNDS] = ConfigRecord({"rounds": rounds, "num-examples": num})
    return reply


def recorded_rounds(context: Context) -> list[int]:
    if STATE_ROUNDS not in context.state:
        return []
    return config_list(_state_config(context, STATE_ROUNDS), STATE_ROUNDS, "rounds", int)


def recorded_model(context: Context, rnd: int) -> np.ndarray:
    """``θ (n_classes, d+1)`` of round ``rnd`` as :func:`shapley_record_mod` kept it."""
    if rnd not in recorded_rounds(context):
        raise Refused(f"no model recorded for round {rnd}")
    return linear_model_matrix(_state_arrays(context, f"{STATE_MODELS}.{rnd}").to_numpy_ndarrays())


def recorded_models(context: Context) -> dict[int, np.ndarray]:
    """``{round: θ (n_classes, d+1)}`` of the models :func:`shapley_record_mod` kept."""
    return {t: recorded_model(context, t) for t in recorded_rounds(context)}


# --- every node --------------------------------------------------------------
def role_payload(request: proto.RoleRequest, role: str, context: Context | None = None,
                 partition: tuple[int, int] | None = None) -> proto.RoleReply:
    """``query.fedeval_role``: this node's role and, if it has an identity, a signed statement of it.

    With a ``request.nonce`` (P's fresh nonce) and a node identity in ``context``, the reply
    carries ``signer``/``signature`` over ``("fedeval-role", nonce, 0, role, this node's public
    signing key)`` — lets a server that holds the roster leave out nodes outside it before
    training (:func:`~flwr_fedeval.strategies.shapley_phase.discover_roles`). A node without an
    identity still answers, unsigned. ``partition = (partition id, number of partitions)`` of a
    data client is reported unsigned (the server's harness uses it only for its reference
    numbers, never in a protocol).

    Raises
    ------
    Refused
        ``role`` is not one of :data:`~flwr_fedeval.protocol.secsv.ROLES`.
    """
    if role not in proto.ROLES:
        raise Refused(f"unknown role {role!r}, expected one of {proto.ROLES}")
    part = (int(partition[0]), int(partition[1])) if partition is not None else None
    if context is None or not request.nonce:
        return proto.RoleReply(role, part)
    try:
        ident, _ = node_identity(context)
    except IdentityError as exc:
        return proto.RoleReply(role, part, identity_error=str(exc))
    sig = sign_key(ident, protocol=proto.ROLE_PROTOCOL, session=request.nonce, round=0, role=role,
                   key=ident.public_key_bytes())
    return proto.RoleReply(role, part, ident.name, sig)


def role_reply(msg: Message, role: str, context: Context | None = None,
               partition: tuple[int, int] | None = None) -> Message:
    """The reply message of :func:`role_payload` to ``msg`` (an error reply if it is refused)."""
    try:
        reply = role_payload(proto.RoleRequest.from_record(msg.content), role, context, partition)
    except (Refused, MalformedMessage) as exc:
        return error_reply(msg, exc, _LABEL)
    return Message(content=reply.to_record(), reply_to=msg)


def hello(request: proto.HelloRequest, context: Context, role: str, *, num_test: int = 0,
          n_features: int = 0) -> proto.HelloReply:
    """``query.shapley_hello``: a fresh X25519 key pair; a client adds what the server plans with.

    Starts a new phase (drops this node's state of any earlier one, keeps the recorded models).
    Reply: :class:`~flwr_fedeval.protocol.secsv.HelloReply`, the key signed with this node's
    roster key over ``("secsv", session, 0, "client" | "aux", key)``.

    Raises
    ------
    Refused
        Unknown role, no recorded model, models of different shapes, or a feature count other
        than the models'.
    IdentityError
        This node has no identity (the message names the config keys to set).
    """
    session = request.session
    if not trusts_principal(context):
        raise Refused(f"node config '{TRUST_PRINCIPAL_CONFIG}' is not true: SecSV protects this node's test set "
                      "only against an honest-but-curious principal server (README, Threat model)")
    for key in [k for k in context.state if k.startswith("shapley.") and k not in
                (STATE_ROUNDS,) and not k.startswith(STATE_MODELS)]:
        del context.state[key]                       # a new phase starts from scratch
    if role not in proto.SIGNED_ROLE:
        raise Refused(f"unknown role {role!r}")
    ident, _ = node_identity(context)
    kp = new_session_keypair(context, STATE_KEYPAIR, session)
    sig = sign_key(ident, protocol=proto.SIGNED_PROTOCOL, session=session, round=0, role=proto.SIGNED_ROLE[role],
                   key=kp.public)
    reply = proto.HelloReply(role, kp.public, ident.name, sig)
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
        num_examples = config_field(_state_config(context, STATE_ROUNDS), STATE_ROUNDS, "num-examples", int)
        reply = reply.replace(num_examples=num_examples, num_test=int(num_test),
                              n_features=int(n_features), n_classes=int(n_classes), rounds=tuple(sorted(models)))
    log(INFO, "Shapley phase: %s, X25519 fingerprint %s", role, keyshare.fingerprint(kp.public))
    return reply


# --- data clients ---------------------------------------------------------------
def keygen(request: proto.KeygenRequest, context: Context) -> proto.KeygenReply:
    """``query.shapley_keygen`` (leader, Algorithm 3 step 1): CKKS keys for the clients.

    The other clients' keys are checked first (distinct roster members, role ``"client"``, at
    least the node's floor). Reply: the public context (public and relinearisation keys, no
    rotation keys, no secret key), one sealed secret context per peer, and the leader's key
    signed for role ``"key-holder"``.
    """
    kp = _keypair(context, request.public.session)
    ident, roster = node_identity(context)
    entries = request.peers.entries()
    if kp.public in request.peers.keys.values():
        raise IdentityError("the peer list relays this leader's own key")
    verify_key_set(roster, entries, protocol=proto.SIGNED_PROTOCOL, session=request.public.session, round=0,
                   role="client", floor=key_set_floor(context), own=ident.name)
    ctx = create_context(params=shapley_ckks_params())
    secret = ctx.secret_bytes()
    # SecSV needs no common seed; the bundle format carries one, so it is fresh random bytes.
    bundles = keyshare.seal_bundle(secret, secrets.token_bytes(32), sender=kp, recipients=request.peers.keys)
    context.state[STATE_SECRET] = ArrayRecord({"context": bytes_array(secret)})
    log(INFO, "Shapley phase: leader, CKKS keys for %d other clients", len(request.peers.keys))
    sig = sign_key(ident, protocol=proto.SIGNED_PROTOCOL, session=request.public.session, round=0, role="key-holder",
                   key=kp.public)
    return proto.KeygenReply(ctx.public_bytes(rotation_keys=False), dict(bundles), ident.name, sig)


def _checked_params(ctx: CKKSContext) -> CKKSContext:
    """Refuse a context whose CKKS parameters are not the (HE-Standard, 128-bit) Shapley set."""
    if ctx.params != shapley_ckks_params():
        raise Refused(f"CKKS parameters {ctx.params} are not the Shapley set {shapley_ckks_params()}")
    return ctx


def _secret_context(context: Context) -> CKKSContext:
    if STATE_SECRET not in context.state:
        raise Refused("no CKKS secret context for this phase")
    ctx = load_context(array_bytes(_state_arrays(context, STATE_SECRET), STATE_SECRET, "context"))
    if not ctx.is_private:
        raise Refused("the stored context holds no secret key")
    return _checked_params(ctx)


def share_data(request: proto.ShareRequest, context: Context, X_test: np.ndarray,
               y_test: np.ndarray) -> proto.ShareReply:
    """``query.shapley_share`` (Algorithm 3 steps 2–3): open the key bundle, share the test set.

    The leader's key (role ``"key-holder"``) and A's key (role ``"aux"``) are checked against
    the roster first; A's verified key is kept for the helper step. Reply: P's share ``x``
    ``(M, d_in)``, ``y`` ``(M,)`` (uint64) and A's share sealed for A.

    Raises
    ------
    IdentityError
        A relayed key does not verify, or names this node or the leader as A.
    Refused
        (before any work) A recorded model or a test feature exceeds the public bounds.
    """
    public = request.public
    kp = _keypair(context, public.session)
    params = public.params
    ident, roster = node_identity(context)
    leader, aux = request.leader, request.aux
    verify_key(roster, leader.signer, leader.signature, protocol=proto.SIGNED_PROTOCOL, session=public.session, round=0,
               role="key-holder", key=leader.key)
    if (leader.signer == ident.name) != (leader.key == kp.public):
        raise IdentityError(f"leader {leader.signer!r} with this node's key, or this node's name with another "
                            "key: refused")
    verify_key(roster, aux.signer, aux.signature, protocol=proto.SIGNED_PROTOCOL, session=public.session, round=0,
               role="aux", key=aux.key)
    if aux.signer in (ident.name, leader.signer):
        raise IdentityError(f"auxiliary server {aux.signer!r} is this node or the leader: refused")
    if request.bundle is not None:
        if leader.key == kp.public:
            raise Refused("a key bundle addressed to the leader itself")
        secrets_ = keyshare.open_bundle(request.bundle, recipient=kp, sender_public=leader.key)
        context.state[STATE_SECRET] = ArrayRecord({"context": bytes_array(secrets_.secret_context)})
    _secret_context(context)                          # refuse early without a key
    _, d_out, n_classes = _layout(public)
    for rnd, theta in recorded_models(context).items():   # refuse now, not rounds later
        try:
            model_matrix(theta, 1, params, n_classes=n_classes, d_out=d_out)
        except ValueError as exc:
            raise Refused(f"local model of round {rnd}: {exc}") from None
    (x_p, y_p), (x_a, y_a) = share_test_set(X_test, np.asarray(y_test, dtype=np.int64), params)
    sealed = keyshare.seal_for(_pack_arrays(x=x_a, y=y_a), sender=kp, recipient_public=aux.key)
    context.state[STATE_PEERS] = ConfigRecord({"session": public.session, "aux": aux.key, "aux-signer": aux.signer})
    return proto.ShareReply(x_p, y_p, sealed)


def _arr(a: np.ndarray) -> Array:
    return Array(np.ascontiguousarray(a))


def encrypt_models(request: proto.ModelsRequest, context: Context) -> proto.ModelsReply:
    """``query.shapley_models`` (Algorithm 5 steps 1–3): encrypt this client's model of round ``t``.

    Reply: ``d_in`` packed ciphertexts of ``w_i · round(θ_i^t 2^f)``, signed with this node's roster
    key over ``("secsv-model", session, t, "client", SHA-256 of the ciphertexts)``: A computes only
    on models so signed (a model P made itself under the public key is refused). Refuses a model
    above the public ``model-bound`` (``ValueError``) or a round without a recorded model.
    """
    _keypair(context, request.public.session)
    m, d_out, n_classes = _layout(request.public)
    theta = recorded_model(context, request.round)
    A = model_matrix(theta, request.weight, request.public.params, n_classes=n_classes, d_out=d_out)
    ctx = _secret_context(context)
    packed = pack_blobs([ctx.serialize_ciphertext(c) for c in encrypt_model(ctx, A, m)])
    ident, _ = node_identity(context)
    sig = sign_key(ident, protocol=proto.MODEL_PROTOCOL, session=request.public.session, round=request.round,
                   role="client", key=proto.model_digest(packed))
    return proto.ModelsReply(packed, ident.name, sig)


def _decrypted(context: Context, session: str) -> ArrayRecord:
    """The helper's record of what it decrypted in this phase: ``{"<round>:<members>": sample ids}``."""
    if STATE_DECRYPTED not in context.state:
        context.state[STATE_DECRYPTED] = ArrayRecord()
        context.state[STATE_DECRYPTED + ".session"] = ConfigRecord({"session": session})
    key = STATE_DECRYPTED + ".session"
    if config_field(_state_config(context, key), key, "session", str) != session:
        raise Refused("decryption record of another phase")
    return _state_arrays(context, STATE_DECRYPTED)


def helper(request: proto.HelperRequest, context: Context) -> proto.HelperReply:
    """``query.shapley_helper`` (Algorithm 4 steps 6–11): add both halves, decrypt, predict, deal the zero test.

    Only jobs bound to this phase's transcript are decrypted: A's half must carry A's signature
    (checked against the roster name of the A key this client checked at the share step) over
    (``"secsv-products"``, session, round, ``"aux"``, digest of the coalition, the sample ids and
    A's ciphertexts), and each (round, coalition, sample) is decrypted at most once by this client
    (no retries: P cannot bisect a score through repeated decryptions). The helper adds P's half
    itself (Algorithm 4 step 6). ``request.aux_public_key`` must be the key this client checked.

    Reply per job: P's part of the zero test's deal (:func:`~flwr_fedeval.shapley.zerotest.deal`:
    its share of ``r·Ŷ`` and its triple part, uint64 in ``F_p``) and A's part (``q'', r, v, c''``
    and the job's sample ids, round and coalition, so that A answers each (round, coalition,
    sample) once whichever helper decrypted it: :func:`aux_diff`), sealed for A. The predictions
    themselves never leave the helper.

    Raises
    ------
    IdentityError
        A's signature of a job does not verify (a ciphertext A did not compute for this job).
    Refused
        A (round, coalition, sample) decrypted before, repeated or out-of-range sample ids.
    """
    public = request.public
    kp = _keypair(context, public.session)
    params = public.params
    m, d_out, _ = _layout(public)
    ctx = _secret_context(context)
    aux_pk, aux_signer = _verified_aux_key(context, request)
    _, roster = node_identity(context)
    done = _decrypted(context, public.session)
    seen: dict[str, np.ndarray] = {}
    for j, (_own, aux, ids, members, sig) in request.batches.items():   # check everything first
        if ids.size > m or ids.min() < 0 or len(np.unique(ids)) != ids.size:
            raise Refused(f"job {j}: {ids.size} sample ids, repeated, negative or more than m = {m}")
        verify_key(roster, aux_signer, sig, protocol=proto.PRODUCTS_PROTOCOL, session=public.session,
                   round=request.round, role="aux", key=proto.products_digest(members, ids, aux))
        key = f"{request.round}:{','.join(sorted(members))}"
        before = seen.get(key, array_field(done, STATE_DECRYPTED, key, dtype=np.int64) if key in done
                          else np.zeros(0, dtype=np.int64))
        if np.intersect1d(before, ids).size:
            raise Refused(f"job {j}: samples of round {request.round}, coalition {sorted(members)} were decrypted "
                          "before (each is decrypted once)")
        seen[key] = np.union1d(before, ids)
    out = {}
    for j, (own, aux, ids, members, _sig) in request.batches.items():
        halves = [[ctx.deserialize_ciphertext(b) for b in unpack_blobs(h, expected=params.n_limbs)]
                  for h in (own, aux)]
        pred = helper_predict(ctx, add_products(ctx, *halves), ids.size, params, m=m, d_out=d_out,
                              out_of_range="zero")  # the reply must not depend on the decrypted value
        deal_p, deal_a = deal(pred)
        sealed = keyshare.seal_for(_pack_arrays(**deal_a._asdict(), ids=ids.astype(np.int64),
                                                round=np.array([request.round], dtype=np.int64),
                                                members=np.array([int(n) for n in members], dtype=np.uint64)),
                                   sender=kp, recipient_public=aux_pk)
        out[j] = (deal_p, sealed)
    for key, ids_done in seen.items():
        done[key] = _arr(ids_done.astype(np.int64))
    context.state[STATE_DECRYPTED] = done
    return proto.HelperReply(out)


# --- auxiliary server A -------------------------------------------------------
def aux_setup(request: proto.AuxSetupRequest, context: Context) -> proto.AuxSetupReply:
    """``query.shapley_aux_setup``: open A's shares of every test set, keep them.

    The clients' keys are checked against the roster (distinct members, role ``"client"``, at
    least the node's floor); each share must be a raw ``.npz`` with ``x`` uint64 ``(M_c, d+1)``
    and ``y`` uint64 ``(M_c,)`` (:func:`read_raw_npz`). Reply: the number of samples M.
    """
    public = request.public
    keypair = _keypair(context, public.session)
    params = public.params
    ident, roster = node_identity(context)
    ctx = _checked_params(load_context(request.public_context))
    if ctx.is_private:
        raise Refused("the auxiliary server must not receive a secret key")
    keys, order = request.clients.keys, list(request.order)
    if sorted(order) != sorted(keys) or len(set(order)) != len(order):
        raise Refused("client order and client keys list different nodes")
    if keypair.public in keys.values():
        raise IdentityError("the client keys relay this auxiliary server's own key")
    names = verify_key_set(roster, request.clients.entries(), protocol=proto.SIGNED_PROTOCOL, session=public.session,
                           round=0, role="client", floor=key_set_floor(context))
    if ident.name in names.values():
        raise IdentityError(f"the client keys list this auxiliary server ({ident.name!r}) as a client")
    xs, ys = [], []
    d_in = params.n_features + 1
    for node in order:
        raw = keyshare.open_from(request.shares[node], recipient=keypair, sender_public=keys[node])
        rows: list[int] = []

        def x_shape(s: tuple[Any, ...], rows: list[int] = rows) -> bool:
            rows.append(s[0] if len(s) == 2 else -1)
            return len(s) == 2 and s[1] == d_in

        def y_shape(s: tuple[Any, ...], rows: list[int] = rows) -> bool:
            return s == (rows[0],)

        x, y = read_raw_npz(raw, {"x": (np.uint64, x_shape), "y": (np.uint64, y_shape)})
        if y.size and int(y.max()) >= LABEL_PRIME:
            raise Refused(f"label shares of node {node} are not elements of F_p (p = {LABEL_PRIME})")
        xs.append(x)
        ys.append(y)
    X, Y = np.vstack(xs), np.concatenate(ys)
    context.state[STATE_AUX] = ArrayRecord({"x": _arr(X), "y": _arr(Y),
                                            "context": bytes_array(request.public_context)})
    context.state[STATE_AUX + ".order"] = ConfigRecord({"order": order, "sizes": [len(y) for y in ys]})
    context.state[STATE_PEERS] = ConfigRecord({"session": public.session, **keys})
    context.state[STATE_AUX_NAMES] = ConfigRecord({str(n): str(name) for n, name in names.items()})
    log(INFO, "Shapley phase: auxiliary server (%s) checked the keys of clients %s", ident.name,
        sorted(names.values()))
    log(INFO, "Shapley phase: auxiliary server holds shares of %d test samples", len(Y))
    return proto.AuxSetupReply(len(Y))


def _aux_state(context: Context) -> tuple[np.ndarray, np.ndarray, CKKSContext]:
    """A's shares ``x`` uint64 ``(M, d+1)``, ``y`` uint64 ``(M,)`` and the public CKKS context."""
    if STATE_AUX not in context.state:
        raise Refused("no test-set shares (query.shapley_aux_setup missing)")
    st = _state_arrays(context, STATE_AUX)
    return (array_field(st, STATE_AUX, "x", dtype=np.uint64, shape=(None, None)),
            array_field(st, STATE_AUX, "y", dtype=np.uint64, shape=(None,)),
            load_context(array_bytes(st, STATE_AUX, "context")))


def _aux_names(context: Context) -> dict[str, str]:
    """A: ``{node (decimal ID): roster name}`` of the clients it checked at setup."""
    if STATE_AUX_NAMES not in context.state:
        raise Refused("no checked client names for this phase (aux setup missing)")
    rec = _state_config(context, STATE_AUX_NAMES)
    return {node: config_field(rec, STATE_AUX_NAMES, node, str) for node in rec}


def _aux_order(context: Context) -> tuple[list[str], list[int]]:
    """A: the clients (decimal IDs) in the order of its stacked shares, and each one's sample count."""
    key = STATE_AUX + ".order"
    rec = _state_config(context, key)
    return config_list(rec, key, "order", str), config_list(rec, key, "sizes", int)


def _check_model_signatures(context: Context, request: proto.AuxEvalRequest) -> None:
    """A: every forwarded model of the round signed by the roster member A checked for its node."""
    names = _aux_names(context)
    _, roster = node_identity(context)
    sigs = request.model_signatures or {}
    for node, packed in (request.round_models or {}).items():
        if node not in names:
            raise IdentityError(f"model of node {node}, which is not one of the clients checked at setup")
        if node not in sigs:
            raise IdentityError(f"model of node {node} ({names[node]!r}) is not signed (unsigned models are refused)")
        verify_key(roster, names[node], sigs[node], protocol=proto.MODEL_PROTOCOL,
                   session=request.public.session, round=request.round, role="client",
                   key=proto.model_digest(packed))


def aux_eval(request: proto.AuxEvalRequest, context: Context) -> proto.AuxEvalReply:
    """``query.shapley_aux_eval`` (Algorithm 4 step 4): A's products for every (coalition, batch).

    The round's model ciphertexts come with the first request of a round and are kept for the
    following ones; each must carry its client's signature over (``"secsv-model"``, session,
    round, ``"client"``, SHA-256 of the ciphertexts), checked against the roster name A verified
    for that node at setup — P cannot have A compute on a model it made. Reply per job: one
    packed ciphertext per limb, signed by A over (``"secsv-products"``, session, round, ``"aux"``,
    digest of coalition, sample ids and ciphertexts) — the helper decrypts only jobs so signed.

    Raises
    ------
    IdentityError
        A forwarded model without a valid signature of its node's roster member.
    """
    _keypair(context, request.public.session)
    params = request.public.params
    m, d_out, _ = _layout(request.public)
    X, _, ctx = _aux_state(context)
    order, _ = _aux_order(context)
    if request.round_models is not None:
        _check_model_signatures(context, request)
        context.state[STATE_AUX_MODELS] = ArrayRecord({n: bytes_array(b)
                                                       for n, b in request.round_models.items()})
        context.state[STATE_AUX_MODELS + ".round"] = ConfigRecord({"round": request.round})
    round_key = STATE_AUX_MODELS + ".round"
    if (STATE_AUX_MODELS not in context.state
            or config_field(_state_config(context, round_key), round_key, "round", int) != request.round):
        raise Refused(f"no model ciphertexts for round {request.round}")
    stored = _state_arrays(context, STATE_AUX_MODELS)
    models = {node: [ctx.deserialize_ciphertext(b)
                     for b in unpack_blobs(array_bytes(stored, STATE_AUX_MODELS, node))]
              for node in stored}
    ident, _ = node_identity(context)
    plain_cache: dict[bytes, list[Any]] = {}
    agg_cache: dict[tuple[Any, ...], list[Any]] = {}
    out = {}
    for j, (index, ids) in request.jobs.items():
        if index.size == 0 or index.min() < 0 or index.max() >= len(order):
            raise Refused(f"job {j}: member indices {index.tolist()} outside 0..{len(order) - 1}")
        if len(set(index.tolist())) != index.size:
            raise Refused(f"job {j}: member indices {index.tolist()} repeat a client")
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
        packed = pack_blobs([ctx.serialize_ciphertext(c) for c in prods])
        sig = sign_key(ident, protocol=proto.PRODUCTS_PROTOCOL, session=request.public.session, round=request.round,
                       role="aux", key=proto.products_digest(members, ids, packed))
        out[j] = (packed, sig)
    return proto.AuxEvalReply(out)


def _sample_owners(context: Context, ids: np.ndarray) -> tuple[list[str], list[str]]:
    """A: the node (decimal ID) owning each sample id and the sample's stable name
    ``"<owner's roster name>/<index in the owner's test set>"`` (from the order and sizes of the setup)."""
    order, sizes = _aux_order(context)
    ends = np.cumsum(sizes)
    which = np.searchsorted(ends, ids, side="right")
    names = _aux_names(context)
    owners = [order[k] for k in which.tolist()]
    local = (ids - (ends[which] - np.asarray(sizes)[which])).tolist()
    return owners, [f"{names[o]}/{i}" for o, i in zip(owners, local)]


def aux_diff(request: proto.AuxDiffRequest, context: Context) -> proto.AuxDiffReply:
    """``query.shapley_aux_diff`` (the zero test replacing Algorithm 4 steps 12–14): A's share of
    ``r·(Ŷ − Y)`` per batch (:func:`~flwr_fedeval.shapley.zerotest.aux_share`).

    Each helper key must be one of the client keys checked at setup; each deal must be a raw
    ``.npz`` with ``q``, ``r``, ``v``, ``c`` uint64 of the batch's length, in ``F_p``, ``r`` non-zero,
    the sample ``ids`` (int64) the helper dealt it for, equal to the job's (P cannot move a
    deal to other samples), and the ``round`` (int64 ``(1,)``) and coalition ``members`` (node IDs,
    uint64) of the job the helper decrypted.

    Single use, in A's node privacy ledger (:mod:`flwr_fedeval.clients.ledger`, across runs):
    ▲ the helper owns none of the batch's samples; ▲ each sealed deal is answered once
    (:meth:`~flwr_fedeval.ledger.NodeLedger.record_deal`: two answers to one deal with two label
    shares give P ``z1 − z2 = r``, Beaver 1991); ▲ each (round, coalition, sample) is zero-tested
    once, whichever helper decrypted it (:meth:`~flwr_fedeval.ledger.NodeLedger.record_batch`, by
    roster names and the sample's place in its owner's test set; scope: the run). All jobs are
    checked before any is recorded; each record is committed before the reply.
    Reply per job: ``f = r − v`` and ``z''``, uint64 ``(n_j,)``.

    Raises
    ------
    Refused
        Code ``ALREADY_CONTRIBUTED``: a deal answered before or a (round, coalition, sample)
        zero-tested before; ``REFUSED``: a helper that owns a sample of its batch, a malformed deal.
    """
    from flwr_fedeval.clients.ledger import digest, ledger_refusals, node_ledger

    keypair = _keypair(context, request.public.session)
    _, Y, _ = _aux_state(context)
    node_of_key = _verified_client_keys(context, request.public)
    names = _aux_names(context)
    ledger = node_ledger(context)
    checked = []
    for j, (sealed, ids, helper_pk, e) in request.jobs.items():
        if ids.size == 0 or ids.min() < 0 or ids.max() >= len(Y):
            raise Refused(f"job {j}: sample ids out of range")
        if helper_pk not in node_of_key:
            raise IdentityError(f"job {j}: the helper's key is not one of the clients' keys checked at setup")
        raw = keyshare.open_from(sealed, recipient=keypair, sender_public=helper_pk)
        expected: dict[str, tuple[Any, Callable[[tuple[Any, ...]], bool]]] = {
            name: (np.uint64, _shape_is((ids.size,))) for name in AuxDeal._fields}
        expected |= {"ids": (np.int64, _shape_is((ids.size,))), "round": (np.int64, _shape_is((1,))),
                     "members": (np.uint64, lambda s: len(s) == 1 and 1 <= s[0] <= len(names))}
        *parts, dealt_ids, round_, members = read_raw_npz(raw, expected)
        if not np.array_equal(dealt_ids, ids):
            raise Refused(f"job {j}: the helper dealt this zero test for other samples")
        coalition = [str(int(n)) for n in members]
        if any(n not in names for n in coalition) or len(set(coalition)) != len(coalition):
            raise Refused(f"job {j}: the deal names a coalition {coalition} of nodes not checked at setup")
        owners, samples = _sample_owners(context, ids)
        helper_node = node_of_key[bytes(helper_pk)]
        if helper_node in owners:
            raise Refused(f"job {j}: the helper ({names[helper_node]!r}) owns samples of the batch it decrypted; "
                          "a helper decrypts only batches of other clients' samples")
        checked.append((j, raw, int(round_[0]), [names[n] for n in coalition], samples, AuxDeal(*parts), ids, e))
    out = {}
    for j, raw, rnd, names_of, samples, deal_a, ids, e in checked:
        with ledger_refusals(f"SecSV zero test, job {j}"):
            ledger.record_deal(digest("secsv-deal", raw))
            ledger.record_batch(rnd, names_of, samples, scope=f"run {context.run_id}")
        try:
            out[j] = aux_share(deal_a, Y[ids], e)
        except ValueError as exc:
            raise Refused(f"job {j}: {exc}") from None
    return proto.AuxDiffReply(out)


# --- registration -------------------------------------------------------------
def node_role(context: Context) -> str:
    """The node config's ``fedeval-role`` (``"client"`` when absent)."""
    return str(context.node_config.get("fedeval-role", "client"))


def register_shapley_handlers(
    app: ClientApp,
    *,
    test_set: Callable[[Context], tuple[np.ndarray, np.ndarray]],
    role: Callable[[Context], str] = node_role,
    partition: Callable[[Context], tuple[int, int] | None] | None = None,
) -> None:
    """Register the role query and the SecSV handlers (:data:`flwr_fedeval.protocol.secsv.STEPS`) on a ``ClientApp``.

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

    Notes
    -----
    A step of the other role is refused before its request is read, and so is a request of
    another session (the one of this node's last hello). Also wrap the train handler with
    :func:`shapley_record_mod`.
    """

    def only(wanted: str, serve: Callable[[Any, Message, Context], Any],
             step: Step) -> Callable[[Message, Context], Message]:
        serve_step = handler(step, serve, label=_LABEL, errors=_ERRORS)

        def run(msg: Message, context: Context) -> Message:
            try:
                if role(context) != wanted:
                    raise Refused(f"this node is the auxiliary server ({role(context)!r}), not a data client"
                                  if wanted == "client" else "this node is not the auxiliary server")
                _keypair(context, proto.session_of(msg.content))
            except (Refused, ValueError) as exc:
                return error_reply(msg, exc, _LABEL)
            return serve_step(msg, context)

        run.__name__ = serve_step.__name__
        return run

    def serve_hello(request: proto.HelloRequest, msg: Message, context: Context) -> proto.HelloReply:
        r = role(context)
        if r != "client":
            return hello(request, context, r)
        X, _ = test_set(context)
        return hello(request, context, r, num_test=len(X), n_features=int(np.shape(X)[1]))

    def serve_role(request: proto.RoleRequest, msg: Message, context: Context) -> proto.RoleReply:
        return role_payload(request, role(context), context, partition(context) if partition else None)

    register(app, proto.STEPS, {
        proto.ROLE_QUERY.message_type: handler(proto.ROLE_QUERY, serve_role, label=_LABEL),
        proto.HELLO.message_type: handler(proto.HELLO, serve_hello, label=_LABEL, errors=_ERRORS),
        proto.KEYGEN.message_type: only("client", lambda r, m, c: keygen(r, c), proto.KEYGEN),
        proto.SHARE.message_type: only("client", lambda r, m, c: share_data(r, c, *test_set(c)), proto.SHARE),
        proto.MODELS.message_type: only("client", lambda r, m, c: encrypt_models(r, c), proto.MODELS),
        proto.HELPER.message_type: only("client", lambda r, m, c: helper(r, c), proto.HELPER),
        proto.AUX_SETUP.message_type: only("shapley-aux", lambda r, m, c: aux_setup(r, c), proto.AUX_SETUP),
        proto.AUX_EVAL.message_type: only("shapley-aux", lambda r, m, c: aux_eval(r, c), proto.AUX_EVAL),
        proto.AUX_DIFF.message_type: only("shapley-aux", lambda r, m, c: aux_diff(r, c), proto.AUX_DIFF),
    })
