"""Messages of the SecSV contribution phase and of the role query (Zheng, Cao, Yoshikawa,
"Secure Shapley Value for Cross-Silo Federated Learning", PVLDB 16(7) 2023, Algorithms 3-5).

The principal server P (the ServerApp) sends every request; the data clients, the auxiliary
server A (``fedeval-role = "shapley-aux"``) or the leader (the client that generates the
CKKS keys, the *key holder*) answer. Server side:
:mod:`flwr_fedeval.strategies.shapley_phase`; client side:
:mod:`flwr_fedeval.clients.shapley_handlers`.

=======================  ======================  ==========================================
step                     request                 reply
=======================  ======================  ==========================================
0 ``fedeval_role``       :class:`RoleRequest`    :class:`RoleReply`
1 ``shapley_hello``      :class:`HelloRequest`   :class:`HelloReply`
2 ``shapley_keygen``     :class:`KeygenRequest`  :class:`KeygenReply`
3 ``shapley_share``      :class:`ShareRequest`   :class:`ShareReply`
4 ``shapley_aux_setup``  :class:`AuxSetupRequest`  :class:`AuxSetupReply`
5 ``shapley_models``     :class:`ModelsRequest`  :class:`ModelsReply`
6 ``shapley_aux_eval``   :class:`AuxEvalRequest`   :class:`AuxEvalReply`
7 ``shapley_helper``     :class:`HelperRequest`  :class:`HelperReply`
8 ``shapley_aux_diff``   :class:`AuxDiffRequest`   :class:`AuxDiffReply`
=======================  ======================  ==========================================

Steps 7-8 run the zero test of :mod:`flwr_fedeval.shapley.zerotest` (the helper deals, A
answers, P opens ``r·(Ŷ − Y)``): P never sees ``Ŷ − Y``. Labels are shared over ``F_p``
(``p = 2^31 − 1``), features over ``Z_{2^k}``.

Every request after hello carries :class:`PublicParams` (session id, fixed point, ring, limbs,
Matrix Reducing layout) in the ConfigRecord ``shapley``. Per-job fields are named
``<field>-<j>`` (``j`` the job index of one exchange, a (coalition, batch) pair); per-node
fields are named by the node ID in decimal. Relayed X25519 keys (32 bytes) travel as a
:class:`KeySet`: ``<key>`` with ``<key>-signers`` and ``<key>-signatures``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from flwr_fedeval.identity import IdentityError, SignedKey
from flwr_fedeval.protocol._base import (
    MalformedMessage,
    Payload,
    Step,
    array_bytes,
    array_field,
    array_record,
    bytes_array,
    config_bytes,
    config_field,
    config_list,
    config_of,
    config_record,
)
from flwr_fedeval.shapley.secsv import SecSVParams, shapley_ckks_params
from flwr_fedeval.shapley.sharing import LABEL_PRIME
from flwr_fedeval.shapley.zerotest import PDeal

__all__ = [
    "AUX_DIFF", "AUX_EVAL", "AUX_SETUP", "HELLO", "HELPER", "KEYGEN", "MODELS", "ROLE_QUERY", "SHARE", "STEPS",
    "AuxDiffReply", "AuxDiffRequest", "AuxEvalReply", "AuxEvalRequest", "AuxSetupReply", "AuxSetupRequest",
    "HelloReply", "HelloRequest", "HelperReply", "HelperRequest", "KeySet", "KeygenReply", "KeygenRequest",
    "ModelsReply", "ModelsRequest", "PublicParams", "RoleReply", "RoleRequest", "ShareReply", "ShareRequest",
    "model_digest", "products_digest", "session_of",
]

#: The roles a node answers to the role query.
ROLES = ("client", "shapley-aux")
#: Signing role (:func:`flwr_fedeval.identity.sign_key`) of each node role's X25519 key.
SIGNED_ROLE = {"client": "client", "shapley-aux": "aux"}
#: ``protocol`` of the SecSV key statements (``round`` 0: the session binds a key to one phase).
SIGNED_PROTOCOL = "secsv"
#: ``protocol`` of the signed role statement of the role query.
ROLE_PROTOCOL = "fedeval-role"
#: X25519 public keys are 32 raw bytes.
KEY_BYTES = 32
#: ``protocol`` of a client's signature over its encrypted model of a round (``round`` = t, role
#: ``"client"``, ``key`` = :func:`model_digest` of the packed ciphertexts); checked by A.
MODEL_PROTOCOL = "secsv-model"
#: ``protocol`` of A's signature over its half of a job's products (``round`` = t, role ``"aux"``,
#: ``key`` = :func:`products_digest`); the helper decrypts only jobs A so signed.
PRODUCTS_PROTOCOL = "secsv-products"

# record keys
ROLE_KEY = "role"
REQUEST_KEY = "shapley"
HELLO_KEY = "shapley-hello"
PEERS_KEY = "shapley-peers"
CONTEXT_KEY = "shapley-context"
LEADER_KEY = "shapley-leader"
BUNDLES_KEY = "shapley-bundles"
BUNDLE_KEY = "shapley-bundle"
SHARE_KEY = "shapley-share"
AUX_SHARES_KEY = "shapley-aux-shares"
AUX_KEYS_KEY = "shapley-aux-keys"
AUX_KEY = "shapley-aux"
MODEL_KEY = "shapley-model"
MODEL_SIGNATURE_KEY = "shapley-model-signature"
ROUND_MODEL_SIGNATURES_KEY = "shapley-round-models-signatures"
JOBS_KEY = "shapley-jobs"
ROUND_MODELS_KEY = "shapley-round-models"
PRODUCTS_KEY = "shapley-products"
BATCHES_KEY = "shapley-batches"
PROOFS_KEY = "shapley-batch-proofs"
PRODUCT_SIGNATURES_KEY = "shapley-products-signatures"
PRED_KEY = "shapley-pred"
PREDS_KEY = "shapley-preds"
HELPER_KEYS_KEY = "shapley-helper-keys"
DIFFS_KEY = "shapley-diffs"
SIGNERS_SUFFIX = "-signers"
SIGNATURES_SUFFIX = "-signatures"

_INT_PARAMS = ("ring-bits", "data-frac-bits", "model-frac-bits", "limb-bits", "weight-bits", "max-clients",
               "n-features")
_FLOAT_PARAMS = ("model-bound", "feature-bound")


# ------------------------------------------------------------------ generic helpers (this protocol's)
def _node_keys(record: Mapping[str, Any], key: str, prefix: str = "") -> list[str]:
    """The node IDs (decimal strings) of a per-node record whose fields are ``<prefix><node>``."""
    nodes = []
    for k in record:
        if not (k.startswith(prefix) and k[len(prefix):].isdecimal()):
            raise MalformedMessage(f"{key}.{k}", f"expected {prefix}<node ID>")
        nodes.append(k[len(prefix):])
    return nodes


def _jobs(record: Mapping[str, Any], key: str, names: tuple[str, ...]) -> list[int]:
    """The job indices of a per-job record: every job has the fields ``<name>-<j>`` of ``names``, no other."""
    seen: dict[int, set[str]] = {}
    for k in record:
        name, _, job = k.rpartition("-")
        if name not in names or not job.isdecimal():
            raise MalformedMessage(f"{key}.{k}", f"unexpected field (expected {'|'.join(names)}-<job>)")
        seen.setdefault(int(job), set()).add(name)
    for j, got in seen.items():
        for name in names:
            if name not in got:
                raise MalformedMessage(f"{key}.{name}-{j}", "missing")
    return sorted(seen)


def _optional(content: RecordDict, key: str, kind: type) -> Any:
    """``content[key]`` checked as a ``kind`` record, or an empty one if absent."""
    if key not in content:
        return kind()
    return config_record(content, key) if kind is ConfigRecord else array_record(content, key)


def _array(a: np.ndarray, dtype: Any) -> Array:
    return Array(np.ascontiguousarray(a, dtype=dtype))


def model_digest(cts: bytes) -> bytes:
    """SHA-256 of a client's packed model ciphertexts: what it signs (:data:`MODEL_PROTOCOL`)."""
    return hashlib.sha256(bytes(cts)).digest()


def _lp(b: bytes) -> bytes:
    return len(b).to_bytes(8, "big") + b


def products_digest(members: tuple[str, ...] | list[str], ids: np.ndarray, cts: bytes) -> bytes:
    """SHA-256 over a job's coalition (node IDs, decimal, sorted), its sample ids (int64, little
    endian) and A's packed product ciphertexts: what A signs (:data:`PRODUCTS_PROTOCOL`)."""
    body = _lp(",".join(sorted(members)).encode()) + _lp(np.asarray(ids, dtype="<i8").tobytes()) + _lp(bytes(cts))
    return hashlib.sha256(body).digest()


def session_of(content: RecordDict) -> str:
    """The non-empty ``session`` of a SecSV request (read before anything else of it).

    Raises
    ------
    MalformedMessage
        The request record or its session is missing, not a string, or empty.
    """
    session = config_field(config_record(content, REQUEST_KEY), REQUEST_KEY, "session", str)
    if not session:
        raise MalformedMessage(f"{REQUEST_KEY}.session", "empty")
    return session


# ------------------------------------------------------------------ shared parts
@dataclasses.dataclass(frozen=True)
class PublicParams:
    """The public fields of every SecSV request after hello (ConfigRecord ``shapley``).

    Attributes
    ----------
    session : str
        The phase's session id (hex); binds every key and state to one run of the phase.
    params : SecSVParams
        Ring ``Z_{2^k}``, fixed-point fractional bits, limbs, weight bits, public bounds
        ``|θ| ≤ model_bound``, ``|x| ≤ feature_bound`` (Section 5 of the paper).
    m : int
        Samples per ciphertext (Matrix Reducing, Algorithm 5).
    d_out : int
        Output rows evaluated per sample: 1 (binary margin ``θ_1 − θ_0``) or ``n_classes``.
    n_classes : int
        Classes of the linear classifier (>= 2).

    The layout (``m``, ``d-out``, ``n-classes``) is required by the steps that evaluate models
    (share, models, aux eval, helper); the others read it if present (``None`` if absent).
    """

    session: str
    params: SecSVParams
    m: int | None = None
    d_out: int | None = None
    n_classes: int | None = None

    def fields(self) -> dict[str, Any]:
        """The ConfigRecord fields, in wire order."""
        layout = {"m": self.m, "d-out": self.d_out, "n-classes": self.n_classes}
        return {"session": self.session, **{k.replace("_", "-"): v for k, v in self.params.to_config().items()},
                **{k: v for k, v in layout.items() if v is not None}}

    @classmethod
    def parse(cls, rec: ConfigRecord, *, layout: bool = True) -> PublicParams:
        """Check and read the public fields of ``rec`` (the ``shapley`` record); the layout only if
        present unless ``layout``."""
        k = REQUEST_KEY
        values: dict[str, Any] = {n.replace("-", "_"): config_field(rec, k, n, int, minimum=1) for n in _INT_PARAMS}
        values.update({n.replace("-", "_"): config_field(rec, k, n, float, minimum=0.0) for n in _FLOAT_PARAMS})
        try:
            params = SecSVParams(**values, ckks=shapley_ckks_params())
        except ValueError as exc:
            raise MalformedMessage(k, f"SecSV parameters: {exc}") from None
        shape = [config_field(rec, k, n, int, minimum=low) if layout or n in rec else None
                 for n, low in (("m", 1), ("d-out", 1), ("n-classes", 2))]
        return cls(config_field(rec, k, "session", str), params, *shape)


@dataclasses.dataclass(frozen=True)
class KeySet:
    """X25519 public keys relayed by P, per node, with the roster name and signature each node gave at hello.

    Records ``<key>`` (``{node: 32 bytes}``), ``<key>-signers`` (``{node: roster name}``) and
    ``<key>-signatures`` (``{node: signature bytes}``). An absent record is an empty mapping:
    a key without signer or signature is refused by :meth:`entries` (an unsigned key).
    """

    keys: dict[str, bytes]
    signers: dict[str, str]
    signatures: dict[str, bytes]

    @classmethod
    def of(cls, signed: Mapping[Any, SignedKey]) -> KeySet:
        """The key set of ``{node: SignedKey}``."""
        return cls({str(n): bytes(s.key) for n, s in signed.items()}, {str(n): s.signer for n, s in signed.items()},
                   {str(n): bytes(s.signature) for n, s in signed.items()})

    def records(self, key: str) -> dict[str, ConfigRecord]:
        return {key: ConfigRecord(dict(self.keys)), key + SIGNERS_SUFFIX: ConfigRecord(dict(self.signers)),
                key + SIGNATURES_SUFFIX: ConfigRecord(dict(self.signatures))}

    @classmethod
    def parse(cls, content: RecordDict, key: str) -> KeySet:
        keys_rec = _optional(content, key, ConfigRecord)
        keys = {n: config_bytes(keys_rec, key, n, length=KEY_BYTES) for n in _node_keys(keys_rec, key)}
        out: list[dict[str, Any]] = []
        for suffix, kind in ((SIGNERS_SUFFIX, str), (SIGNATURES_SUFFIX, bytes)):
            rec = _optional(content, key + suffix, ConfigRecord)
            out.append({n: config_field(rec, key + suffix, n, kind) for n in _node_keys(rec, key + suffix)})
        return cls(keys, out[0], out[1])

    def entries(self) -> dict[str, SignedKey]:
        """``{node: SignedKey}``.

        Raises
        ------
        IdentityError
            A key without signer or signature (unsigned keys are refused).
        """
        out = {}
        for node, pk in self.keys.items():
            if node not in self.signers or node not in self.signatures:
                raise IdentityError(f"key of node {node} is not signed (unsigned keys are refused)")
            out[node] = SignedKey(self.signers[node], pk, self.signatures[node])
        return out


# ------------------------------------------------------------------ step 0: role query
@dataclasses.dataclass(frozen=True)
class RoleRequest(Payload):
    """``query.fedeval_role`` request: ``nonce`` (str, P's fresh nonce, optional: without one the reply is unsigned)."""

    LABEL = "role request"
    nonce: str | None = None

    def _to_record(self) -> RecordDict:
        return RecordDict({ROLE_KEY: config_of({"nonce": self.nonce})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> RoleRequest:
        if ROLE_KEY not in content:
            return cls()
        rec = config_record(content, ROLE_KEY)
        return cls(config_field(rec, ROLE_KEY, "nonce", str) if "nonce" in rec else None)


@dataclasses.dataclass(frozen=True)
class RoleReply(Payload):
    """``query.fedeval_role`` reply (ConfigRecord ``role``).

    Attributes
    ----------
    role : str
        One of :data:`ROLES`.
    partition : (int, int) or None
        ``(partition id, number of partitions)`` of a data client in simulation (unsigned; the
        harness's reference numbers only).
    signer, signature : str and bytes, or None
        The node's roster name and its signature over ``("fedeval-role", nonce, 0, role, its
        roster key)``; ``None`` without a nonce or an identity.
    identity_error : str or None
        Why a node asked for a signature has none (no identity configured).
    """

    LABEL = "role reply"
    role: str
    partition: tuple[int, int] | None = None
    signer: str | None = None
    signature: bytes | None = None
    identity_error: str | None = None

    def _to_record(self) -> RecordDict:
        part = self.partition or (None, None)
        return RecordDict({ROLE_KEY: config_of({
            "role": self.role, "partition-id": part[0], "num-partitions": part[1], "signer": self.signer,
            "signature": self.signature, "identity-error": self.identity_error})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> RoleReply:
        rec, k = config_record(content, ROLE_KEY), ROLE_KEY
        pid, parts = (config_field(rec, k, n, int) if n in rec else None for n in ("partition-id", "num-partitions"))
        signer, error = (config_field(rec, k, n, str) if n in rec else None for n in ("signer", "identity-error"))
        signature = config_field(rec, k, "signature", bytes) if "signature" in rec else None
        part = (pid, parts) if pid is not None and parts is not None else None
        return cls(config_field(rec, k, "role", str, choices=ROLES), part, signer, signature, error)


# ------------------------------------------------------------------ step 1: hello
@dataclasses.dataclass(frozen=True)
class HelloRequest(Payload):
    """``query.shapley_hello`` request: the new phase's ``session`` (non-empty str)."""

    LABEL = "SecSV hello request"
    session: str

    def _to_record(self) -> RecordDict:
        return RecordDict({REQUEST_KEY: ConfigRecord({"session": self.session})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> HelloRequest:
        return cls(session_of(content))


@dataclasses.dataclass(frozen=True)
class HelloReply(Payload):
    """``query.shapley_hello`` reply (ConfigRecord ``shapley-hello``): a fresh X25519 key, signed.

    Attributes
    ----------
    role : str
        ``"client"`` or ``"shapley-aux"``.
    public_key : bytes
        The node's X25519 public key for this session, exactly 32 bytes.
    signer, signature : str, bytes
        Roster name and signature over ``("secsv", session, 0, "client" | "aux", public_key)``.
    num_examples, num_test, n_features, n_classes : int or None
        A data client's FedAvg weight basis (training examples), test samples, features ``d``
        and classes of its linear model; ``None`` for A.
    rounds : tuple of int
        The training rounds with a recorded local model (a client: at least one).
    """

    LABEL = "SecSV hello reply"
    role: str
    public_key: bytes
    signer: str
    signature: bytes
    num_examples: int | None = None
    num_test: int | None = None
    n_features: int | None = None
    n_classes: int | None = None
    rounds: tuple[int, ...] = ()

    @property
    def signed_key(self) -> SignedKey:
        return SignedKey(self.signer, self.public_key, self.signature)

    def _to_record(self) -> RecordDict:
        client: dict[str, object] = {} if self.role != "client" else {
            "num-examples": self.num_examples, "num-test": self.num_test, "n-features": self.n_features,
            "n-classes": self.n_classes, "rounds": [int(r) for r in self.rounds]}
        return RecordDict({HELLO_KEY: config_of({"role": self.role, "public-key": self.public_key,
                                                 "signer": self.signer, "signature": self.signature, **client})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> HelloReply:
        rec, k = config_record(content, HELLO_KEY), HELLO_KEY
        role = config_field(rec, k, "role", str, choices=ROLES)
        common = (role, config_bytes(rec, k, "public-key", length=KEY_BYTES), config_field(rec, k, "signer", str),
                  config_field(rec, k, "signature", bytes))
        if role != "client":
            return cls(*common)
        rounds = config_list(rec, k, "rounds", int)
        if not rounds or min(rounds) < 1:
            raise MalformedMessage(f"{k}.rounds", f"expected recorded rounds >= 1, got {rounds}")
        return cls(*common, config_field(rec, k, "num-examples", int, minimum=0),
                   config_field(rec, k, "num-test", int, minimum=0), config_field(rec, k, "n-features", int, minimum=1),
                   config_field(rec, k, "n-classes", int, minimum=2), tuple(sorted(set(rounds))))


# ------------------------------------------------------------------ step 2: key generation
@dataclasses.dataclass(frozen=True)
class KeygenRequest(Payload):
    """``query.shapley_keygen`` request to the leader (Algorithm 3 step 1): the other clients' keys
    (:class:`KeySet` ``shapley-peers``)."""

    LABEL = "SecSV key generation request"
    public: PublicParams
    peers: KeySet

    def _to_record(self) -> RecordDict:
        return RecordDict({REQUEST_KEY: ConfigRecord(self.public.fields()), **self.peers.records(PEERS_KEY)})

    @classmethod
    def _from_record(cls, content: RecordDict) -> KeygenRequest:
        return cls(PublicParams.parse(config_record(content, REQUEST_KEY), layout=False),
                   KeySet.parse(content, PEERS_KEY))


@dataclasses.dataclass(frozen=True)
class KeygenReply(Payload):
    """``query.shapley_keygen`` reply: ``shapley-context.public`` (public CKKS context: public and
    relinearisation keys, no rotation keys, no secret key; uint8), ``shapley-bundles`` (``{node:
    sealed secret context}``, uint8) and ``shapley-leader`` (``signer``, ``signature`` of the
    leader's X25519 key for role ``"key-holder"``)."""

    LABEL = "SecSV key generation reply"
    public_context: bytes
    bundles: dict[str, bytes]
    signer: str
    signature: bytes

    def _to_record(self) -> RecordDict:
        return RecordDict({
            CONTEXT_KEY: ArrayRecord({"public": bytes_array(self.public_context)}),
            BUNDLES_KEY: ArrayRecord({n: bytes_array(b) for n, b in self.bundles.items()}),
            LEADER_KEY: ConfigRecord({"signer": self.signer, "signature": self.signature})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> KeygenReply:
        bundles = array_record(content, BUNDLES_KEY)
        leader = config_record(content, LEADER_KEY)
        return cls(array_bytes(array_record(content, CONTEXT_KEY), CONTEXT_KEY, "public"),
                   {n: array_bytes(bundles, BUNDLES_KEY, n) for n in _node_keys(bundles, BUNDLES_KEY)},
                   config_field(leader, LEADER_KEY, "signer", str),
                   config_field(leader, LEADER_KEY, "signature", bytes))


# ------------------------------------------------------------------ step 3: test-set shares
@dataclasses.dataclass(frozen=True)
class ShareRequest(Payload):
    """``query.shapley_share`` request (Algorithm 3 steps 2-3): the key holder's and A's signed
    X25519 keys (in ``shapley``: ``leader-public-key``/``-signer``/``-signature``,
    ``aux-public-key``/...) and, except for the leader, ``shapley-bundle.sealed`` (uint8)."""

    LABEL = "SecSV share request"
    public: PublicParams
    leader: SignedKey
    aux: SignedKey
    bundle: bytes | None = None

    def _to_record(self) -> RecordDict:
        signed = {f"{who}-{f}": v for who, s in (("leader", self.leader), ("aux", self.aux))
                  for f, v in (("public-key", s.key), ("signer", s.signer), ("signature", s.signature))}
        rd = RecordDict({REQUEST_KEY: ConfigRecord({**self.public.fields(), **signed})})
        if self.bundle is not None:
            rd[BUNDLE_KEY] = ArrayRecord({"sealed": bytes_array(self.bundle)})
        return rd

    @classmethod
    def _from_record(cls, content: RecordDict) -> ShareRequest:
        rec, k = config_record(content, REQUEST_KEY), REQUEST_KEY
        leader, aux = (SignedKey(config_field(rec, k, f"{who}-signer", str),
                                 config_bytes(rec, k, f"{who}-public-key", length=KEY_BYTES),
                                 config_field(rec, k, f"{who}-signature", bytes)) for who in ("leader", "aux"))
        bundle = array_bytes(array_record(content, BUNDLE_KEY), BUNDLE_KEY, "sealed") if BUNDLE_KEY in content else None
        return cls(PublicParams.parse(rec), leader, aux, bundle)


@dataclasses.dataclass(frozen=True, eq=False)
class ShareReply(Payload):
    """``query.shapley_share`` reply ``shapley-share``: P's share of the test set, ``x`` uint64
    ``(M, d + 1)`` (uniform on ``Z_{2^k}``) and ``y`` uint64 ``(M,)`` (uniform on ``F_p``, checked
    ``< p``), and ``sealed-aux`` (A's share as a raw ``.npz``, sealed for A; uint8)."""

    LABEL = "SecSV share reply"
    x: np.ndarray
    y: np.ndarray
    sealed_aux: bytes

    def _to_record(self) -> RecordDict:
        return RecordDict({SHARE_KEY: ArrayRecord({"x": _array(self.x, np.uint64), "y": _array(self.y, np.uint64),
                                                   "sealed-aux": bytes_array(self.sealed_aux)})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> ShareReply:
        rec = array_record(content, SHARE_KEY)
        y = array_field(rec, SHARE_KEY, "y", dtype=np.uint64, shape=(None,))
        if y.size and int(y.max()) >= LABEL_PRIME:
            raise MalformedMessage(f"{SHARE_KEY}.y", f"label shares >= p = {LABEL_PRIME}")
        return cls(array_field(rec, SHARE_KEY, "x", dtype=np.uint64, shape=(len(y), None)), y,
                   array_bytes(rec, SHARE_KEY, "sealed-aux"))


# ------------------------------------------------------------------ step 4: A's setup
@dataclasses.dataclass(frozen=True)
class AuxSetupRequest(Payload):
    """``query.shapley_aux_setup`` request to A: the client ``order`` (node IDs as decimal strings,
    in sample-id order; in ``shapley``), ``shapley-context.public`` (uint8), A's sealed share of
    every client (``shapley-aux-shares``: ``sealed-<node>``, uint8) and the clients' keys
    (:class:`KeySet` ``shapley-aux-keys``). Every node of ``order`` has a share."""

    LABEL = "SecSV aux setup request"
    public: PublicParams
    order: tuple[str, ...]
    public_context: bytes
    shares: dict[str, bytes]
    clients: KeySet

    def _to_record(self) -> RecordDict:
        return RecordDict({
            REQUEST_KEY: ConfigRecord({**self.public.fields(), "order": list(self.order)}),
            CONTEXT_KEY: ArrayRecord({"public": bytes_array(self.public_context)}),
            AUX_SHARES_KEY: ArrayRecord({f"sealed-{n}": bytes_array(s) for n, s in self.shares.items()}),
            **self.clients.records(AUX_KEYS_KEY)})

    @classmethod
    def _from_record(cls, content: RecordDict) -> AuxSetupRequest:
        rec = config_record(content, REQUEST_KEY)
        order = tuple(config_list(rec, REQUEST_KEY, "order", str))
        shares_rec = _optional(content, AUX_SHARES_KEY, ArrayRecord)
        shares = {n: array_bytes(shares_rec, AUX_SHARES_KEY, f"sealed-{n}")
                  for n in _node_keys(shares_rec, AUX_SHARES_KEY, "sealed-")}
        if sorted(shares) != sorted(order):
            raise MalformedMessage(AUX_SHARES_KEY, f"shares of nodes {sorted(shares)}, order lists {sorted(order)}")
        return cls(PublicParams.parse(rec, layout=False), order,
                   array_bytes(array_record(content, CONTEXT_KEY), CONTEXT_KEY, "public"), shares,
                   KeySet.parse(content, AUX_KEYS_KEY))


@dataclasses.dataclass(frozen=True)
class AuxSetupReply(Payload):
    """``query.shapley_aux_setup`` reply ``shapley-aux``: ``samples`` (int, test samples A holds shares of)."""

    LABEL = "SecSV aux setup reply"
    samples: int

    def _to_record(self) -> RecordDict:
        return RecordDict({AUX_KEY: ConfigRecord({"samples": int(self.samples)})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> AuxSetupReply:
        return cls(config_field(config_record(content, AUX_KEY), AUX_KEY, "samples", int, minimum=0))


# ------------------------------------------------------------------ step 5: encrypted models
@dataclasses.dataclass(frozen=True)
class ModelsRequest(Payload):
    """``query.shapley_models`` request (Algorithm 5 steps 1-3): the training ``round`` t and the
    client's integer FedAvg ``weight`` w_i (8-bit quantised example count)."""

    LABEL = "SecSV models request"
    public: PublicParams
    round: int
    weight: int

    def _to_record(self) -> RecordDict:
        return RecordDict({REQUEST_KEY: ConfigRecord({**self.public.fields(), "round": self.round,
                                                      "weight": self.weight})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> ModelsRequest:
        rec = config_record(content, REQUEST_KEY)
        return cls(PublicParams.parse(rec), config_field(rec, REQUEST_KEY, "round", int, minimum=1),
                   config_field(rec, REQUEST_KEY, "weight", int, minimum=1))


@dataclasses.dataclass(frozen=True)
class ModelsReply(Payload):
    """``query.shapley_models`` reply ``shapley-model.cts``: the ``d + 1`` packed ciphertexts of
    ``⟦w_i·round(θ_i^t 2^f)⟧`` in the Matrix Reducing layout (uint8), and
    ``shapley-model-signature``: the client's roster name ``signer`` and its ``signature`` over
    ``("secsv-model", session, t, "client", SHA-256 of cts)`` (:func:`model_digest`), which A
    checks before computing on the model."""

    LABEL = "SecSV models reply"
    cts: bytes
    signer: str
    signature: bytes

    def _to_record(self) -> RecordDict:
        return RecordDict({MODEL_KEY: ArrayRecord({"cts": bytes_array(self.cts)}),
                           MODEL_SIGNATURE_KEY: ConfigRecord({"signer": self.signer, "signature": self.signature})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> ModelsReply:
        sig, k = config_record(content, MODEL_SIGNATURE_KEY), MODEL_SIGNATURE_KEY
        return cls(array_bytes(array_record(content, MODEL_KEY), MODEL_KEY, "cts"),
                   config_field(sig, k, "signer", str), config_field(sig, k, "signature", bytes))


# ------------------------------------------------------------------ step 6: A's products
@dataclasses.dataclass(frozen=True, eq=False)
class AuxEvalRequest(Payload):
    """``query.shapley_aux_eval`` request (Algorithm 4 step 4) for training ``round``.

    ``jobs``: ``{j: (members, ids)}``: the coalition as indices into the client order of the
    setup (int64, ``(|S|,)``) and the batch's sample ids (int64, ``(≤ m,)``) (``shapley-jobs``:
    ``members-<j>``, ``ids-<j>``). ``round_models`` (``shapley-round-models``, first request of a
    round only): ``{node: packed model ciphertexts}`` as the clients sent them (uint8), with
    ``model_signatures`` (``shapley-round-models-signatures``: ``{node: signature}``, each client's
    signature of :class:`ModelsReply`; A checks it against the roster name it verified for that
    node at setup).
    """

    LABEL = "SecSV aux products request"
    public: PublicParams
    round: int
    jobs: dict[int, tuple[np.ndarray, np.ndarray]]
    round_models: dict[str, bytes] | None = None
    model_signatures: dict[str, bytes] | None = None

    def _to_record(self) -> RecordDict:
        jobs = {f"{n}-{j}": _array(a, np.int64) for j, (members, ids) in self.jobs.items()
                for n, a in (("members", members), ("ids", ids))}
        rd = RecordDict({REQUEST_KEY: ConfigRecord({**self.public.fields(), "round": self.round}),
                         JOBS_KEY: ArrayRecord(jobs)})
        if self.round_models is not None:
            rd[ROUND_MODELS_KEY] = ArrayRecord({n: bytes_array(b) for n, b in self.round_models.items()})
            rd[ROUND_MODEL_SIGNATURES_KEY] = ConfigRecord(dict(self.model_signatures or {}))
        return rd

    @classmethod
    def _from_record(cls, content: RecordDict) -> AuxEvalRequest:
        rec, jobs = config_record(content, REQUEST_KEY), array_record(content, JOBS_KEY)
        parsed = {j: (array_field(jobs, JOBS_KEY, f"members-{j}", dtype=np.int64, shape=(None,)),
                      array_field(jobs, JOBS_KEY, f"ids-{j}", dtype=np.int64, shape=(None,)))
                  for j in _jobs(jobs, JOBS_KEY, ("members", "ids"))}
        models, sigs = None, None
        if ROUND_MODELS_KEY in content:
            mrec = array_record(content, ROUND_MODELS_KEY)
            models = {n: array_bytes(mrec, ROUND_MODELS_KEY, n) for n in _node_keys(mrec, ROUND_MODELS_KEY)}
            srec, sk = _optional(content, ROUND_MODEL_SIGNATURES_KEY, ConfigRecord), ROUND_MODEL_SIGNATURES_KEY
            sigs = {n: config_field(srec, sk, n, bytes) for n in _node_keys(srec, sk)}
        return cls(PublicParams.parse(rec), config_field(rec, REQUEST_KEY, "round", int, minimum=1), parsed, models,
                   sigs)


@dataclasses.dataclass(frozen=True)
class AuxEvalReply(Payload):
    """``query.shapley_aux_eval`` reply ``shapley-products``: ``cts-<j>``, A's half ``⟦A_S B''_l⟧``
    of job ``j``, one packed ciphertext per limb (uint8); ``shapley-products-signatures``:
    ``sig-<j>``, A's signature over (``"secsv-products"``, session, round, ``"aux"``,
    :func:`products_digest` of the job's coalition, sample ids and ``cts-<j>``).
    ``products``: ``{j: (cts, signature)}``."""

    LABEL = "SecSV aux products reply"
    products: dict[int, tuple[bytes, bytes]]

    def _to_record(self) -> RecordDict:
        return RecordDict({
            PRODUCTS_KEY: ArrayRecord({f"cts-{j}": bytes_array(b) for j, (b, _) in self.products.items()}),
            PRODUCT_SIGNATURES_KEY: ConfigRecord({f"sig-{j}": sig for j, (_, sig) in self.products.items()})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> AuxEvalReply:
        rec, sigs = array_record(content, PRODUCTS_KEY), config_record(content, PRODUCT_SIGNATURES_KEY)
        jobs = _jobs(rec, PRODUCTS_KEY, ("cts",))
        if _jobs(sigs, PRODUCT_SIGNATURES_KEY, ("sig",)) != jobs:
            raise MalformedMessage(PRODUCT_SIGNATURES_KEY, f"signatures do not match the jobs {jobs}")
        return cls({j: (array_bytes(rec, PRODUCTS_KEY, f"cts-{j}"),
                        config_field(sigs, PRODUCT_SIGNATURES_KEY, f"sig-{j}", bytes)) for j in jobs})


# ------------------------------------------------------------------ step 7: helper decryption
@dataclasses.dataclass(frozen=True, eq=False)
class HelperRequest(Payload):
    """``query.shapley_helper`` request (Algorithm 4 steps 6-11) for training ``round`` (in
    ``shapley``, with A's X25519 key ``aux-public-key``, 32 bytes). Per job ``j``: in
    ``shapley-batches`` P's half ``own-<j>`` and A's half ``aux-<j>`` of the products (packed limb
    ciphertexts, uint8; the helper adds them, Algorithm 4 step 6) and the sample ids ``ids-<j>``
    (int64, ``(n_j,)``); in ``shapley-batch-proofs`` the coalition ``members-<j>`` (node IDs,
    decimal strings) and A's signature ``aux-signature-<j>`` of ``aux-<j>`` (:class:`AuxEvalReply`).
    ``batches``: ``{j: (own, aux, ids, members, aux signature)}``."""

    LABEL = "SecSV helper request"
    public: PublicParams
    aux_public_key: bytes
    round: int
    batches: dict[int, tuple[bytes, bytes, np.ndarray, tuple[str, ...], bytes]]

    def _to_record(self) -> RecordDict:
        rec: dict[str, Array] = {}
        proofs = ConfigRecord()
        for j, (own, aux, ids, members, sig) in self.batches.items():
            rec[f"own-{j}"], rec[f"aux-{j}"] = bytes_array(own), bytes_array(aux)
            rec[f"ids-{j}"] = _array(ids, np.int64)
            proofs[f"members-{j}"], proofs[f"aux-signature-{j}"] = list(members), sig
        return RecordDict({REQUEST_KEY: ConfigRecord({**self.public.fields(), "aux-public-key": self.aux_public_key,
                                                      "round": self.round}),
                           BATCHES_KEY: ArrayRecord(rec), PROOFS_KEY: proofs})

    @classmethod
    def _from_record(cls, content: RecordDict) -> HelperRequest:
        rec, batches = config_record(content, REQUEST_KEY), array_record(content, BATCHES_KEY)
        proofs = config_record(content, PROOFS_KEY)
        jobs = _jobs(batches, BATCHES_KEY, ("own", "aux", "ids"))
        if _jobs(proofs, PROOFS_KEY, ("members", "aux-signature")) != jobs:
            raise MalformedMessage(PROOFS_KEY, f"proofs do not match the jobs {jobs}")
        out = {}
        for j in jobs:
            ids = array_field(batches, BATCHES_KEY, f"ids-{j}", dtype=np.int64, shape=(None,))
            if ids.size < 1:
                raise MalformedMessage(f"{BATCHES_KEY}.ids-{j}", "no samples")
            members = tuple(config_list(proofs, PROOFS_KEY, f"members-{j}", str))
            if not members or any(not m.isdecimal() for m in members):
                raise MalformedMessage(f"{PROOFS_KEY}.members-{j}", "expected node IDs (decimal strings)")
            out[j] = (array_bytes(batches, BATCHES_KEY, f"own-{j}"), array_bytes(batches, BATCHES_KEY, f"aux-{j}"),
                      ids, members, config_field(proofs, PROOFS_KEY, f"aux-signature-{j}", bytes))
        return cls(PublicParams.parse(rec), config_bytes(rec, REQUEST_KEY, "aux-public-key", length=KEY_BYTES),
                   config_field(rec, REQUEST_KEY, "round", int, minimum=1), out)


@dataclasses.dataclass(frozen=True, eq=False)
class HelperReply(Payload):
    """``query.shapley_helper`` reply ``shapley-pred``: per job ``j`` the helper's deal of the zero
    test (:mod:`flwr_fedeval.shapley.zerotest`): P's part ``q-<j>``, ``u-<j>``, ``c-<j>`` (uint64
    ``(n_j,)``, elements of ``F_p``: P's share of ``r·Ŷ`` and its multiplication triple part) and
    ``a-<j>`` (A's part ``q'', r, v, c''`` as a raw ``.npz``, sealed for A; uint8).
    ``preds``: ``{j: (PDeal, sealed)}``."""

    LABEL = "SecSV helper reply"
    preds: dict[int, tuple[PDeal, bytes]]

    def _to_record(self) -> RecordDict:
        rec = {}
        for j, (d, a) in self.preds.items():
            rec[f"q-{j}"], rec[f"u-{j}"], rec[f"c-{j}"] = (_array(x, np.uint64) for x in (d.q, d.u, d.c))
            rec[f"a-{j}"] = bytes_array(a)
        return RecordDict({PRED_KEY: ArrayRecord(rec)})

    @classmethod
    def _from_record(cls, content: RecordDict) -> HelperReply:
        rec = array_record(content, PRED_KEY)
        out = {}
        for j in _jobs(rec, PRED_KEY, ("q", "u", "c", "a")):
            q = array_field(rec, PRED_KEY, f"q-{j}", dtype=np.uint64, shape=(None,))
            u, c = (array_field(rec, PRED_KEY, f"{n}-{j}", dtype=np.uint64, shape=(len(q),)) for n in ("u", "c"))
            for name, arr in (("q", q), ("u", u), ("c", c)):
                if arr.size and int(arr.max()) >= LABEL_PRIME:
                    raise MalformedMessage(f"{PRED_KEY}.{name}-{j}", f"values >= p = {LABEL_PRIME}")
            out[j] = (PDeal(q, u, c), array_bytes(rec, PRED_KEY, f"a-{j}"))
        return cls(out)


# ------------------------------------------------------------------ step 8: A's share of the zero test
@dataclasses.dataclass(frozen=True, eq=False)
class AuxDiffRequest(Payload):
    """``query.shapley_aux_diff`` request (the zero test replacing Algorithm 4 steps 12-14): per job
    ``j``, A's sealed deal ``sealed-<j>`` (uint8), the batch's sample ids ``ids-<j>`` (int64,
    ``(n_j,)``) and P's masked label share ``e-<j> = Y' − u`` (uint64 ``(n_j,)``, in ``F_p``) in
    ``shapley-preds``, and the helper's X25519 key ``helper-<j>`` (32 bytes) in
    ``shapley-helper-keys``. ``jobs``: ``{j: (sealed, ids, helper key, e)}``."""

    LABEL = "SecSV aux differences request"
    public: PublicParams
    jobs: dict[int, tuple[bytes, np.ndarray, bytes, np.ndarray]]

    def _to_record(self) -> RecordDict:
        rec: dict[str, Array] = {}
        keys = ConfigRecord()
        for j, (sealed, ids, helper_key, e) in self.jobs.items():
            rec[f"sealed-{j}"], rec[f"ids-{j}"] = bytes_array(sealed), _array(ids, np.int64)
            rec[f"e-{j}"] = _array(e, np.uint64)
            keys[f"helper-{j}"] = helper_key
        return RecordDict({REQUEST_KEY: ConfigRecord(self.public.fields()), PREDS_KEY: ArrayRecord(rec),
                           HELPER_KEYS_KEY: keys})

    @classmethod
    def _from_record(cls, content: RecordDict) -> AuxDiffRequest:
        preds, keys = array_record(content, PREDS_KEY), config_record(content, HELPER_KEYS_KEY)
        jobs = _jobs(preds, PREDS_KEY, ("sealed", "ids", "e"))
        if _jobs(keys, HELPER_KEYS_KEY, ("helper",)) != jobs:
            raise MalformedMessage(HELPER_KEYS_KEY, f"helper keys do not match the jobs {jobs}")
        out = {}
        for j in jobs:
            ids = array_field(preds, PREDS_KEY, f"ids-{j}", dtype=np.int64, shape=(None,))
            e = array_field(preds, PREDS_KEY, f"e-{j}", dtype=np.uint64, shape=(len(ids),))
            if e.size and int(e.max()) >= LABEL_PRIME:
                raise MalformedMessage(f"{PREDS_KEY}.e-{j}", f"values >= p = {LABEL_PRIME}")
            out[j] = (array_bytes(preds, PREDS_KEY, f"sealed-{j}"), ids,
                      config_bytes(keys, HELPER_KEYS_KEY, f"helper-{j}", length=KEY_BYTES), e)
        return cls(PublicParams.parse(config_record(content, REQUEST_KEY), layout=False), out)


@dataclasses.dataclass(frozen=True, eq=False)
class AuxDiffReply(Payload):
    """``query.shapley_aux_diff`` reply ``shapley-diffs``: per job ``j``, ``f-<j> = r − v`` and
    ``z-<j>``, A's share of ``r·(Ŷ − Y)`` (uint64 ``(n_j,)`` each, in ``F_p``).
    ``diffs``: ``{j: (f, z)}``."""

    LABEL = "SecSV aux differences reply"
    diffs: dict[int, tuple[np.ndarray, np.ndarray]]

    def _to_record(self) -> RecordDict:
        rec = {}
        for j, (f, z) in self.diffs.items():
            rec[f"f-{j}"], rec[f"z-{j}"] = _array(f, np.uint64), _array(z, np.uint64)
        return RecordDict({DIFFS_KEY: ArrayRecord(rec)})

    @classmethod
    def _from_record(cls, content: RecordDict) -> AuxDiffReply:
        rec = array_record(content, DIFFS_KEY)
        out = {}
        for j in _jobs(rec, DIFFS_KEY, ("f", "z")):
            f = array_field(rec, DIFFS_KEY, f"f-{j}", dtype=np.uint64, shape=(None,))
            z = array_field(rec, DIFFS_KEY, f"z-{j}", dtype=np.uint64, shape=(len(f),))
            for name, arr in (("f", f), ("z", z)):
                if arr.size and int(arr.max()) >= LABEL_PRIME:
                    raise MalformedMessage(f"{DIFFS_KEY}.{name}-{j}", f"values >= p = {LABEL_PRIME}")
            out[j] = (f, z)
        return cls(out)


# ------------------------------------------------------------------ the step table
ROLE_QUERY = Step("step 0 (roles)", "query.fedeval_role", "every node", RoleRequest, RoleReply)
HELLO = Step("step 1 (hello)", "query.shapley_hello", "client, shapley-aux", HelloRequest, HelloReply)
KEYGEN = Step("step 2 (key generation)", "query.shapley_keygen", "key-holder", KeygenRequest, KeygenReply)
SHARE = Step("step 3 (test-set shares)", "query.shapley_share", "client", ShareRequest, ShareReply)
AUX_SETUP = Step("step 4 (aux setup)", "query.shapley_aux_setup", "shapley-aux", AuxSetupRequest, AuxSetupReply)
MODELS = Step("step 5 (encrypted models)", "query.shapley_models", "client", ModelsRequest, ModelsReply)
AUX_EVAL = Step("step 6 (aux products)", "query.shapley_aux_eval", "shapley-aux", AuxEvalRequest, AuxEvalReply)
HELPER = Step("step 7 (helper decryption)", "query.shapley_helper", "client", HelperRequest, HelperReply)
AUX_DIFF = Step("step 8 (aux differences)", "query.shapley_aux_diff", "shapley-aux", AuxDiffRequest, AuxDiffReply)

#: The role query and the SecSV steps, in protocol order.
STEPS = (ROLE_QUERY, HELLO, KEYGEN, SHARE, AUX_SETUP, MODELS, AUX_EVAL, HELPER, AUX_DIFF)
