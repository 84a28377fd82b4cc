"""SecSV contribution phase: secure Federated Shapley Values after training (server P side).

Zheng, Cao, Yoshikawa, "Secure Shapley Value for Cross-Silo Federated
Learning", PVLDB 16(7) 2023: Algorithm 3 (SecSV), 4 (Π_Sec), 5 (Matrix
Reducing), 6–7 (SampleSkip). The ServerApp is the **principal server P**; the
**auxiliary server A** is a SuperNode whose node config says
``fedeval-role="shapley-aux"`` (run by a party that does not collude with
P); the data clients are the other nodes. Handlers:
:mod:`flwr_fedeval.clients.shapley_handlers`; messages (one payload dataclass per
request and reply, parsed and checked at the edge): :mod:`flwr_fedeval.protocol.secsv`;
protocol steps: :mod:`flwr_fedeval.shapley.parties`.

=====  =================================  =======================================================
step   message (to)                       what
=====  =================================  =======================================================
0      ``query.fedeval_role`` (all)       roles (:func:`discover_roles`; run before training so
                                          that A is left out of FedAvg, :class:`NodeSubsetGrid`)
1      ``query.shapley_hello`` (C, A)     X25519 keys; sizes, features, classes, recorded rounds
2      ``query.shapley_keygen`` (leader)  CKKS keys of the clients; public context to P
3      ``query.shapley_share`` (C)        test-set shares: P's in the clear, A's sealed for A
4      ``query.shapley_aux_setup`` (A)    A opens and keeps its shares
5      ``query.shapley_models`` (I^t)     per round: encrypted local models (Matrix Reducing)
6      ``query.shapley_aux_eval`` (A)     per round and coalition size: A's products
7      ``query.shapley_helper`` (C)       helpers check A's signature, add both halves, decrypt
                                          (each (round, coalition, sample) once), predict and deal
                                          the zero test (:mod:`flwr_fedeval.shapley.zerotest`)
8      ``query.shapley_aux_diff`` (A)     A's share of r·(Ŷ − Y); P opens it: 0 iff correct (the
                                          correct-prediction mask, nothing else)
=====  =================================  =======================================================

Coalitions are evaluated by increasing size, one exchange of steps 6–8 per
size, all coalitions of that size at once; with SampleSkip a sample both
halves of a split predict correctly is not evaluated (Theorem 6.3: the
utility of a linear classifier does not change).

Failures: a data client or A that fails steps 1–6 or 8 ends the phase with
:class:`ShapleyPhaseError` naming every node and reason — Shapley values over
a smaller set of players would be values of a different game, so none are
reported. A helper that fails step 7 is replaced by another eligible client
(never the owner of the batch) and the batch re-sent; the phase only fails
when no eligible helper is left.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any, TypedDict, TypeVar

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_fedeval.fhe.backend import CKKSContext, load_context, pack_blobs, unpack_blobs
from flwr_fedeval.identity import IdentityError, Roster, SignedKey, verify_key
from flwr_fedeval.protocol import secsv as proto
from flwr_fedeval.shapley.fsv import coalitions, find_skippable, fsv_from_utilities
from flwr_fedeval.shapley.matrix_reducing import max_batch
from flwr_fedeval.shapley.parties import (
    aggregate_model,
    choose_batches,
    plan_batches,
    server_plaintexts,
    server_products,
)
from flwr_fedeval.shapley.secsv import (
    SecSVParams,
    pick_helper,
    quantize_weights,
    shapley_ckks_params,
)
from flwr_fedeval.shapley.zerotest import PDeal, mask_label_share, open_zero_test
from flwr_fedeval.strategies.base import EvaluationPhase, Failures, exchange_replies
from flwr_fedeval.strategies.collect import GridView, PhaseGrid

__all__ = ["NodeSubsetGrid", "SecSVPhase", "ShapleyPhaseError", "ShapleyPhaseResult", "discover_roles"]

_LABEL = "Shapley phase"


class ShapleyPhaseError(RuntimeError):
    """The phase could not compute the FSVs; ``failed`` maps node ID → reason."""

    def __init__(self, step: str, failed: dict[int, str]) -> None:
        self.step = step
        self.failed = dict(failed)
        super().__init__(f"Shapley phase aborted at {step}: {self.failed} (no Shapley values reported)")


class NodeSubsetGrid(GridView):
    """A :class:`~flwr_fedeval.strategies.collect.GridView` that hides some nodes from ``get_node_ids``.

    Lets Flower's strategies train on the data clients only, while the
    auxiliary server A stays connected to the same run. Everything else is
    delegated to the wrapped grid (its exchanges, and so its failure record, included).
    """

    def __init__(self, grid: Grid, exclude: Iterable[int]) -> None:
        super().__init__(grid)
        self._exclude = frozenset(int(n) for n in exclude)

    def get_node_ids(self) -> list[int]:
        return [n for n in self._grid.get_node_ids() if n not in self._exclude]


def discover_roles(grid: Grid, *, timeout: float = 600.0, strict: bool = True, roster: Roster | None = None,
                   refused: dict[int, str] | None = None,
                   partitions: dict[int, tuple[int, int]] | None = None, nodes: Iterable[int] | None = None,
                   identities: dict[int, str] | None = None) -> dict[int, str]:
    """``{node_id: role}`` of every connected node (``query.fedeval_role``).

    With ``strict=False`` a node that does not answer counts as a ``"client"``
    (logged), e.g. a ClientApp without the Shapley handlers.

    With a ``roster``, every node must sign its role (with a fresh nonce) as
    a distinct roster member; a node that does not — e.g. an extra SuperNode
    whose key is not in the roster — is left out of the result and put in
    ``refused`` (node ID → reason), so the caller can keep it out of
    training and every phase. (The nodes check every relayed key
    themselves; this only keeps strangers from spoiling key sets.)

    ``partitions`` (optional, filled in): node ID → ``(partition id, number
    of partitions)`` as each data client reports it (unsigned; for the
    harness's reference numbers only, see :mod:`flwr_fedeval.app.harness`).

    ``nodes`` (optional): ask only these nodes (default: every connected
    node). ``identities`` (optional, filled in, with a ``roster``): node ID →
    the roster name it proved (a signature over the fresh nonce); what a
    :class:`~flwr_fedeval.strategies.collect.Rejoin` knows a node by.

    Raises
    ------
    ShapleyPhaseError
        (``strict``) A node did not answer or answered an unknown role.
    """
    failed = Failures()
    nonce = secrets.token_hex(16)

    def parse(node: int, content: RecordDict) -> tuple[str, str | None, str | None]:
        reply = proto.RoleReply.from_record(content, node=node)
        role = reply.role
        if partitions is not None and reply.partition is not None:
            partitions[node] = reply.partition
        if roster is None:
            return role, None, None
        if reply.signer is None or reply.signature is None:
            return role, None, f"no signed identity ({reply.identity_error or 'node sent none'})"
        try:
            verify_key(roster, reply.signer, reply.signature, protocol=proto.ROLE_PROTOCOL, session=nonce, round=0,
                       role=role, key=roster.public_key_bytes(reply.signer))
        except IdentityError as exc:
            return role, None, str(exc)
        return role, reply.signer, None

    nodes = list(grid.get_node_ids()) if nodes is None else [int(n) for n in nodes]
    request = proto.RoleRequest(nonce).to_record()
    got = exchange_replies(grid, dict.fromkeys(nodes, request), proto.ROLE_QUERY.message_type, parse, failed,
                           step="roles", what="role", timeout=timeout, label=_LABEL)
    if failed and strict:
        raise ShapleyPhaseError("role discovery", failed.reasons())
    roles = {**dict.fromkeys(failed, "client"), **{n: r for n, (r, _, _) in got.items()}}
    if roster is not None:
        out = {} if refused is None else refused
        signers: dict[str, int] = {}
        for n in sorted(got):
            _, signer, why = got[n]
            if why is not None or signer is None:
                out[n] = why or "no signed identity"
            elif signer in signers:
                out[n] = out[signers[signer]] = f"two nodes sign as roster member {signer!r}"
            else:
                signers[signer] = n
        out.update({n: f"no role reply: {why}" for n, why in failed.reasons().items()})
        for n in out:
            roles.pop(n, None)
        if identities is not None:
            identities.update({n: s for s, n in signers.items() if n not in out})
        if out:
            log(WARNING, "Role discovery: node(s) left out, not authenticated against the roster: %s", out)
    return roles


@dataclass
class ShapleyPhaseResult:
    """Federated Shapley values of the clients (SecSV), and what it took.

    Attributes
    ----------
    fsv : dict of int to float
        Node ID → ``FSV_i = Σ_t φ_i^t`` (accuracy points; Σ_i FSV_i =
        ``v(I^T) − 1/n_classes``).
    ssv : ndarray of shape (n_rounds, n_clients)
        Single-round SVs, columns in the order of ``clients``.
    utilities : list of dict
        Per round, ``{tuple(sorted node IDs): accuracy}`` of every coalition.
    empty_utilities : list of float
    rounds, clients : list of int
    weights : dict of int to int
        Integer FedAvg weights used (8-bit quantised example counts).
    aux_node, leader : int
    stats : dict
        ``seconds``, ``bytes_sent``/``bytes_received`` (array payloads, P's
        view), ``evaluated_samples``/``skipped_samples`` ((sample, coalition)
        pairs), ``batches``, ``helper_replacements``.
    """

    fsv: dict[int, float]
    ssv: np.ndarray
    utilities: list[dict[tuple[int, ...], float]]
    empty_utilities: list[float]
    rounds: list[int]
    clients: list[int]
    weights: dict[int, int]
    aux_node: int
    leader: int
    sample_skip: bool
    stats: dict[str, Any] = field(default_factory=dict[str, Any])

    def to_metric_record(self) -> MetricRecord:
        """The result as Flower metrics (see :meth:`~flwr_fedeval.strategies.base.EvaluationPhase.evaluate_fn`):
        ``shapley-fsv`` (list of float, FSV_i in accuracy points, in the order of ``clients``),
        ``shapley-fsv-sum`` (float) and ``shapley-rounds`` (int). Node IDs (unsigned 64-bit) stay in
        ``clients`` and :meth:`to_json`."""
        fsv = [float(self.fsv[n]) for n in self.clients]
        return MetricRecord({"shapley-fsv": fsv, "shapley-fsv-sum": float(sum(fsv)),
                             "shapley-rounds": len(self.rounds)})

    def to_json(self) -> dict[str, Any]:
        return {
            "method": "secsv" + ("+sampleskip" if self.sample_skip else ""),
            "fsv": {str(k): v for k, v in self.fsv.items()},
            "ssv": self.ssv.tolist(),
            "utilities": [{"-".join(map(str, k)): v for k, v in u.items()} for u in self.utilities],
            "empty_utilities": self.empty_utilities,
            "rounds": self.rounds,
            "clients": self.clients,
            "weights": {str(k): v for k, v in self.weights.items()},
            "aux_node": self.aux_node,
            "leader": self.leader,
            "stats": self.stats,
        }


_T = TypeVar("_T")


@dataclass(frozen=True)
class _ClientHello:
    """The fields of a data client's hello reply (a client's reply carries every one)."""

    num_examples: int
    num_test: int
    n_features: int
    n_classes: int
    rounds: tuple[int, ...]

    @classmethod
    def of(cls, node: int, reply: proto.HelloReply) -> _ClientHello:
        if (reply.num_examples is None or reply.num_test is None or reply.n_features is None
                or reply.n_classes is None):
            raise ShapleyPhaseError("hello", {node: "a client's hello without its sizes"})
        return cls(reply.num_examples, reply.num_test, reply.n_features, reply.n_classes, reply.rounds)


#: One job of steps 6-8: a coalition and the sample ids of one batch (int64, ``(n_j,)``).
_Job = tuple[frozenset[int], np.ndarray]


def _all_jobs(by_job: dict[int, _T], n_jobs: int) -> dict[int, _T]:
    """``by_job`` if it has exactly the jobs ``0..n_jobs-1``; raises ``ValueError`` naming the difference."""
    if sorted(by_job) != list(range(n_jobs)):
        raise ValueError(f"reply has jobs {sorted(by_job)}, the request sent jobs 0..{n_jobs - 1}")
    return by_job


def _payload_bytes(content: RecordDict) -> int:
    total = 0
    for rec in content.values():
        if isinstance(rec, ArrayRecord):
            total += sum(len(a.data) for a in rec.values())
    return total


@dataclass
class _SecSVRun:
    """Per-run state of :class:`SecSVPhase`, filled step by step (nothing is set on the phase)."""

    clients: list[int]
    aux: int
    #: The phase's session id (hex), sent in every request.
    session: str
    stats: dict[str, Any]
    # step 1 (hello)
    _params: SecSVParams | None = None
    #: The public fields of every request after hello (session, parameters, layout).
    _public: proto.PublicParams | None = None
    n_classes: int = 0
    m: int = 0
    d_out: int = 0
    weights: dict[int, int] = field(default_factory=dict)
    pk: dict[int, bytes] = field(default_factory=dict)
    n_test: dict[int, int] = field(default_factory=dict)
    recorded: dict[int, set[int]] = field(default_factory=dict)
    #: The checked hello replies of every node (relayed keys and their signatures come from here).
    hello: dict[int, proto.HelloReply] = field(default_factory=dict)
    # step 2 (keygen)
    leader: int = -1
    #: The leader's X25519 key signed for role "key-holder".
    _leader_key: SignedKey | None = None
    _ctx: CKKSContext | None = None
    public_context: bytes = b""
    # step 3 (share)
    _X_P: np.ndarray | None = None
    _y_P: np.ndarray | None = None
    #: Owner of every sample as an index into ``clients`` (node IDs are 64-bit unsigned).
    _owners: np.ndarray | None = None
    # steps 5-8
    full_batches: list[np.ndarray] = field(default_factory=list)
    full_keys: set[bytes] = field(default_factory=set)
    full_plain: dict[bytes, list[Any]] = field(default_factory=dict)
    helper_turn: int = 0
    failed_helpers: set[int] = field(default_factory=set)

    @staticmethod
    def _set(value: _T | None, what: str) -> _T:
        if value is None:
            raise RuntimeError(f"SecSV phase: {what} is read before the step that sets it")
        return value

    @property
    def params(self) -> SecSVParams:
        """The public fixed-point and CKKS parameters (step 1)."""
        return self._set(self._params, "params")

    @property
    def public(self) -> proto.PublicParams:
        """The public fields of every request after hello: session, parameters, layout (step 1)."""
        return self._set(self._public, "public")

    @property
    def leader_key(self) -> SignedKey:
        """The leader's X25519 key signed for role "key-holder" (step 2)."""
        return self._set(self._leader_key, "leader_key")

    @property
    def ctx(self) -> CKKSContext:
        """The clients' public CKKS context, as the leader made it (step 2)."""
        return self._set(self._ctx, "ctx")

    @property
    def X_P(self) -> np.ndarray:
        """P's shares of the stacked test features, uint64 ``(M, d+1)`` (step 3)."""
        return self._set(self._X_P, "X_P")

    @property
    def y_P(self) -> np.ndarray:
        """P's shares of the stacked labels, uint64 ``(M,)`` (step 3)."""
        return self._set(self._y_P, "y_P")

    @property
    def owners(self) -> np.ndarray:
        """Owner of every sample as an index into ``clients``, int64 ``(M,)`` (step 3)."""
        return self._set(self._owners, "owners")

    @property
    def index(self) -> dict[int, int]:
        return {n: i for i, n in enumerate(self.clients)}

    @property
    def num_samples(self) -> int:
        return 0 if self._y_P is None else len(self._y_P)


class _Bounds(TypedDict):
    """The public bounds and fixed-point widths :meth:`SecSVParams.for_bounds` fits parameters to."""

    model_bound: float
    feature_bound: float
    data_frac_bits: int
    model_frac_bits: int
    weight_bits: int


def _new_stats() -> dict[str, Any]:
    return {"bytes_sent": 0, "bytes_received": 0, "messages": 0, "batches": 0,
            "evaluated_samples": 0, "skipped_samples": 0, "helper_replacements": 0}


class SecSVPhase(EvaluationPhase[ShapleyPhaseResult]):
    """Secure Federated Shapley Values with two non-colluding servers (Zheng et al. 2023, Alg. 3).

    One method per protocol step (see the module docstring): :meth:`hello`
    (1), :meth:`keygen` (2), :meth:`share` (3), :meth:`aux_setup` (4),
    :meth:`encrypted_models` (5), :meth:`aux_products` (6),
    :meth:`helper_decryption` (7), :meth:`aux_differences` (8); per-run state
    lives in one ``_SecSVRun`` object passed between them.

    Parameters
    ----------
    sample_skip : bool, default=True
        SampleSkip (Algorithms 6–7).
    binary_margin : bool, default=True
        With 2 classes evaluate the single row ``θ_1 − θ_0`` (same decision,
        twice the samples per ciphertext).
    model_bound : float, default=8.0
        Public bound on ``|θ|``; clients refuse to encrypt larger models.
    feature_bound : float, default=16.0
        Public bound on ``|x|`` of the test features; clients refuse larger ones.
        16 holds standardised features (the embedded breast-cancer data reach
        |z| = 12.07) as well as [0, 1]-scaled ones; it costs 4 ring bits over 1.
    data_frac_bits, model_frac_bits, weight_bits : int
        Fixed point (see :class:`~flwr_fedeval.shapley.secsv.SecSVParams`); the
        ring ``Z_{2^k}`` and the limbs follow from the bounds (``for_bounds``).
    min_nodes : int, default=2
        Fewest data clients the phase runs with, at least 2 (a helper must not
        own the batch it decrypts).
    timeout : float, default=600
        Seconds per exchange.
    roster : flwr_fedeval.identity.Roster, optional
        The federation's roster: P checks the signed hello keys and aborts
        naming a node whose key does not verify (e.g. one not in the roster).
        The nodes check every relayed key themselves, with or without it.
    clients : iterable of int, optional
        The data clients' node IDs (e.g. those that trained); with ``aux_node``,
        :meth:`run` skips role discovery.
    aux_node : int, optional
        The node ID of the auxiliary server A.

    Raises
    ------
    ValueError
        A bound is not > 0, a number of bits is not an integer >= 1,
        ``min_nodes`` < 2 or ``timeout`` is not > 0. Bounds that fit no
        fixed-point parameters are refused when :meth:`run` derives them
        (``SecSVParams.for_bounds``).
    """

    method = "secsv"
    label = _LABEL

    def __init__(self, *, sample_skip: bool = True, binary_margin: bool = True, model_bound: float = 8.0,
                 feature_bound: float = 16.0, data_frac_bits: int = 10, model_frac_bits: int = 10,
                 weight_bits: int = 8, min_nodes: int = 2, timeout: float = 600.0,
                 roster: Roster | None = None, clients: Iterable[int] | None = None,
                 aux_node: int | None = None) -> None:
        super().__init__(min_nodes=min_nodes, timeout=timeout, min_nodes_floor=2)
        self.roster = roster
        self.clients = None if clients is None else sorted(int(c) for c in clients)
        self.aux_node = None if aux_node is None else int(aux_node)
        if not (model_bound > 0 and feature_bound > 0):
            raise ValueError("model_bound and feature_bound must be > 0")
        for name, bits in (("data_frac_bits", data_frac_bits), ("model_frac_bits", model_frac_bits),
                           ("weight_bits", weight_bits)):
            if isinstance(bits, bool) or not isinstance(bits, int) or bits < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {bits!r}")
        self.sample_skip = bool(sample_skip)
        self.binary_margin = bool(binary_margin)
        self.bounds = _Bounds(model_bound=float(model_bound), feature_bound=float(feature_bound),
                              data_frac_bits=int(data_frac_bits), model_frac_bits=int(model_frac_bits),
                              weight_bits=int(weight_bits))

    def _summary_items(self) -> list[tuple[str, str]]:
        return [("Protocol", f"SecSV (two servers, Matrix Reducing{', SampleSkip' if self.sample_skip else ''})"),
                ("Public bounds", f"|θ| ≤ {self.bounds['model_bound']}, |x| ≤ {self.bounds['feature_bound']}"),
                ("Fixed point", f"data 2^-{self.bounds['data_frac_bits']}, model 2^-{self.bounds['model_frac_bits']}, "
                                f"weights {self.bounds['weight_bits']} bits"),
                ("Minimum nodes", str(self.min_nodes)), ("Timeout per step", f"{self.timeout:g} s")]

    # -- plumbing -------------------------------------------------------------
    def _exchange(self, grid: PhaseGrid, contents: dict[int, RecordDict], mtype: str,
                  parse: Callable[[int, RecordDict], _T], step: str, *, st: _SecSVRun,
                  allow_failures: bool = False) -> tuple[dict[int, _T], dict[int, str]]:
        """Send the request contents, parse the replies (``parse(node, content)``, which raises a
        ``ValueError`` such as :class:`~flwr_fedeval.protocol.MalformedMessage` for a malformed
        reply), count bytes; a failure ends the phase with :class:`ShapleyPhaseError` unless
        ``allow_failures``."""
        for c in contents.values():
            st.stats["bytes_sent"] += _payload_bytes(c)
        failures = Failures()

        def counted(node: int, content: RecordDict) -> _T:
            st.stats["bytes_received"] += _payload_bytes(content)
            return parse(node, content)

        valid = self.exchange(grid, contents, mtype, counted, step=step, what=step, failures=failures)
        self.failures.update(failures)
        st.stats["messages"] += len(contents)
        if failures and not allow_failures:
            raise ShapleyPhaseError(step, failures.reasons())
        return valid, failures.reasons()

    # -- the phase ------------------------------------------------------------
    def run(self, grid: Grid, arrays: ArrayRecord | None = None) -> ShapleyPhaseResult:
        """Run steps 1–8 and return the clients' FSVs.

        Parameters
        ----------
        grid : flwr.serverapp.Grid
        arrays : ArrayRecord, optional
            The global model of the last round (the one phase contract,
            :class:`~flwr_fedeval.strategies.base.EvaluationPhase`). Not sent:
            SecSV values the local models every client recorded during training
            (:func:`~flwr_fedeval.clients.shapley_handlers.shapley_record_mod`).

        Notes
        -----
        The clients and the auxiliary server are the constructor's ``clients`` /
        ``aux_node``, else found by :func:`discover_roles` (step 0).

        Raises
        ------
        ShapleyPhaseError
            A node failed a step (see the module docstring), or no auxiliary
            server is connected.
        ValueError
            Fewer than ``min_nodes`` clients, inconsistent models, or public
            bounds that fit no fixed-point parameters.
        """
        t0 = time.perf_counter()
        self._start_run()
        self.summary()
        clients, aux_node = self.clients, self.aux_node
        if clients is None or aux_node is None:
            with self.step("step 0 (roles)"):
                roles = discover_roles(grid, timeout=self.timeout)
            auxes = sorted(n for n, r in roles.items() if r == "shapley-aux")
            if not auxes:
                raise ShapleyPhaseError("role discovery", {0: "no node has fedeval-role = 'shapley-aux' "
                                                               "(the auxiliary server A)"})
            aux_node = auxes[0] if aux_node is None else aux_node
            clients = [n for n, r in roles.items() if r == "client"] if clients is None else clients
        clients = sorted(int(c) for c in clients)
        aux = int(aux_node)
        if aux in clients:
            raise ValueError("the auxiliary server cannot be a data client")
        if len(clients) < self.min_nodes:
            raise ValueError(f"{len(clients)} clients, the phase needs at least {self.min_nodes}")
        st = _SecSVRun(clients=clients, aux=aux, session=secrets.token_hex(16), stats=_new_stats())

        with self.step("step 1 (hello)"):
            self.hello(grid, st)
        with self.step("step 2 (key generation)"):
            bundles = self.keygen(grid, st)
        with self.step("step 3 (test-set shares)"):
            sealed_for_aux = self.share(grid, st, bundles)
        with self.step("step 4 (aux setup)"):
            self.aux_setup(grid, st, sealed_for_aux)

        # steps 5-8, round by round
        rounds = sorted(set().union(*st.recorded.values()))
        players: list[list[int]] = []
        utilities: list[dict[frozenset[int], float]] = []
        for t in rounds:       # every round in the union has at least one member
            members = [n for n in clients if t in st.recorded[n]]
            with self.step(f"steps 5-8 (round {t})"):
                utilities.append(self.round_utilities(grid, st, t, members))
            players.append(members)
            log(INFO, "%s: round %d, %d coalitions, v(I^t) = %.4f", _LABEL, t, len(utilities[-1]),
                utilities[-1][frozenset(members)])
        res = fsv_from_utilities(utilities, players, n_classes=st.n_classes)
        st.stats["seconds"] = time.perf_counter() - t0
        st.stats["samples"] = st.num_samples
        log(INFO, "%s: FSV %s (%.1f s, %d (sample, coalition) pairs evaluated, %d skipped, %.1f MB sent, "
            "%.1f MB received)", _LABEL, " ".join(f"node {n}: {v:+.4f}" for n, v in zip(res.clients, res.fsv)),
            st.stats["seconds"], st.stats["evaluated_samples"], st.stats["skipped_samples"],
            st.stats["bytes_sent"] / 1e6, st.stats["bytes_received"] / 1e6)
        return ShapleyPhaseResult(
            fsv={int(n): float(v) for n, v in zip(res.clients, res.fsv)}, ssv=res.ssv,
            utilities=[{tuple(sorted(S)): float(v) for S, v in u.items()} for u in res.utilities],
            empty_utilities=res.empty_utilities, rounds=rounds,
            clients=res.clients, weights=st.weights, aux_node=aux, leader=st.leader, sample_skip=self.sample_skip,
            stats=dict(st.stats))

    # -- step 1 ---------------------------------------------------------------
    def hello(self, grid: PhaseGrid, st: _SecSVRun) -> None:
        """Step 1: roles, X25519 keys, sizes and recorded rounds of every client and A; fixes the
        public parameters (fixed point, CKKS, batch size m, output rows d_out, FedAvg weights)."""
        clients, aux = st.clients, st.aux
        hello, _ = self._exchange(grid, {n: proto.HelloRequest(st.session).to_record() for n in clients + [aux]},
                                  proto.HELLO.message_type,
                                  lambda n, c: proto.HelloReply.from_record(c, node=n), "hello",
                                  st=st)
        self._check_roles(hello, clients, aux)
        self._check_signatures(st, hello)
        st.hello = hello
        info = {n: _ClientHello.of(n, hello[n]) for n in clients}
        n_features = {i.n_features for i in info.values()}
        n_classes = {i.n_classes for i in info.values()}
        if len(n_features) != 1 or len(n_classes) != 1:
            raise ValueError(f"clients disagree on the model: features {sorted(n_features)}, "
                             f"classes {sorted(n_classes)}")
        (d,), (c,) = n_features, n_classes
        st.n_test = {n: info[n].num_test for n in clients}
        if sum(st.n_test.values()) == 0:
            raise ValueError("no client has test samples")
        params = SecSVParams.for_bounds(n_features=d, max_clients=len(clients), ckks=shapley_ckks_params(),
                                        **self.bounds)
        st._params, st.n_classes = params, c
        st.d_out = 1 if (self.binary_margin and c == 2) else c
        st.m = max_batch(params.ckks.slot_count, st.d_out)
        st.weights = quantize_weights({n: info[n].num_examples for n in clients}, bits=params.weight_bits)
        st._public = proto.PublicParams(st.session, params, st.m, st.d_out, c)
        st.pk = {n: hello[n].public_key for n in clients + [aux]}
        st.recorded = {n: set(info[n].rounds) for n in clients}
        log(INFO, "%s: %s; %d clients, aux server node %d, ring Z_2^%d, %d limbs of %d bits, m=%d, d_out=%d",
            _LABEL, self.describe(), len(clients), aux, params.ring_bits, params.n_limbs, params.limb_bits,
            st.m, st.d_out)

    def _check_signatures(self, st: _SecSVRun, hello: dict[int, proto.HelloReply]) -> None:
        """Every hello key signed by a distinct roster member for its role (checked against the roster if given)."""
        failed: dict[int, str] = {}
        signers: dict[str, int] = {}
        for n, h in hello.items():
            signer, sig = h.signer, h.signature
            if signer in signers:
                failed[n] = failed[signers[signer]] = f"two nodes sign as roster member {signer!r}"
            signers[signer] = n
            if self.roster is None:
                continue
            try:
                verify_key(self.roster, signer, sig, protocol=proto.SIGNED_PROTOCOL, session=st.session,
                           round=0, role=proto.SIGNED_ROLE[h.role], key=h.public_key)
            except IdentityError as exc:
                failed[n] = str(exc)
        if failed:
            raise ShapleyPhaseError("hello", failed)

    @staticmethod
    def _signed_keys(nodes: list[int], hello: dict[int, proto.HelloReply]) -> proto.KeySet:
        """The nodes' hello keys with their signers and signatures, as relayed."""
        return proto.KeySet.of({n: hello[n].signed_key for n in nodes})

    @staticmethod
    def _check_roles(hello: dict[int, proto.HelloReply], clients: list[int], aux: int) -> None:
        wrong = {n: f"role {hello[n].role!r}" for n in clients if hello[n].role != "client"}
        if hello[aux].role != "shapley-aux":
            wrong[aux] = f"role {hello[aux].role!r}, expected 'shapley-aux'"
        if wrong:
            raise ShapleyPhaseError("hello", wrong)

    # -- step 2 ---------------------------------------------------------------
    def keygen(self, grid: PhaseGrid, st: _SecSVRun) -> dict[str, bytes]:
        """Step 2: a random leader makes the clients' CKKS keys; P loads and checks the public
        context. Returns the sealed key bundles ``{str(node): bytes}`` for the other clients."""
        clients = st.clients
        leader = secrets.choice(clients)
        others = [n for n in clients if n != leader]
        request = proto.KeygenRequest(st.public, self._signed_keys(others, st.hello)).to_record()
        keyrep, _ = self._exchange(grid, {leader: request}, proto.KEYGEN.message_type,
                                   lambda n, ct: proto.KeygenReply.from_record(ct, node=n), "keygen", st=st)
        reply: proto.KeygenReply = keyrep[leader]
        public_bytes, bundles = reply.public_context, reply.bundles
        leader_key = SignedKey(reply.signer, st.pk[leader], reply.signature)
        if self.roster is not None:
            try:
                verify_key(self.roster, leader_key.signer, leader_key.signature, protocol=proto.SIGNED_PROTOCOL,
                           session=st.session, round=0, role="key-holder", key=leader_key.key)
            except IdentityError as exc:
                raise ShapleyPhaseError("keygen", {leader: str(exc)}) from None
        ctx = load_context(public_bytes)
        if ctx.is_private:
            raise ShapleyPhaseError("keygen", {leader: "the public context carries a secret key"})
        if ctx.params != st.params.ckks:
            raise ShapleyPhaseError("keygen", {leader: f"CKKS parameters {ctx.params} differ from {st.params.ckks}"})
        missing = [n for n in clients if n != leader and str(n) not in bundles]
        if missing:
            raise ShapleyPhaseError("keygen", {leader: f"no key bundle for nodes {missing}"})
        st.leader, st._leader_key, st._ctx, st.public_context = leader, leader_key, ctx, public_bytes
        return bundles

    # -- step 3 ---------------------------------------------------------------
    def share(self, grid: PhaseGrid, st: _SecSVRun, bundles: dict[str, bytes]) -> dict[int, bytes]:
        """Step 3: every client's test-set shares (P's in the clear, checked; A's sealed for A).
        Returns ``{node: sealed share for A}``."""
        clients, d = st.clients, st.params.n_features
        aux_key = st.hello[st.aux].signed_key
        contents = {n: proto.ShareRequest(st.public, st.leader_key, aux_key,
                                    None if n == st.leader else bundles[str(n)]).to_record() for n in clients}

        def parse_share(n: int, ct: RecordDict) -> proto.ShareReply:
            reply = proto.ShareReply.from_record(ct, node=n)
            if reply.x.shape != (st.n_test[n], d + 1):
                raise ValueError(f"share shapes {reply.x.shape}/{reply.y.shape}, announced {st.n_test[n]} samples "
                                 f"of {d} features")
            return reply

        shares, _ = self._exchange(grid, contents, proto.SHARE.message_type, parse_share, "share", st=st)
        st._X_P = np.vstack([shares[n].x for n in clients])
        st._y_P = np.concatenate([shares[n].y for n in clients])
        st._owners = np.concatenate([np.full(st.n_test[n], i, dtype=np.int64) for i, n in enumerate(clients)])
        M = st.num_samples
        st.full_batches = [np.arange(M)[pos] for pos in plan_batches(st.owners, st.m, range(len(clients)))]
        st.full_keys = {b.tobytes() for b in st.full_batches}
        return {n: shares[n].sealed_aux for n in clients}

    # -- step 4 ---------------------------------------------------------------
    def aux_setup(self, grid: PhaseGrid, st: _SecSVRun, sealed_for_aux: dict[int, bytes]) -> None:
        """Step 4: A opens and keeps its shares; it must hold as many samples as P."""
        clients, aux = st.clients, st.aux
        aux_content = proto.AuxSetupRequest(st.public, tuple(str(n) for n in clients), st.public_context,
                                      {str(n): sealed_for_aux[n] for n in clients},
                                      self._signed_keys(clients, st.hello)).to_record()
        got, _ = self._exchange(grid, {aux: aux_content}, proto.AUX_SETUP.message_type,
                                lambda n, ct: proto.AuxSetupReply.from_record(ct, node=n).samples, "aux setup", st=st)
        if got[aux] != st.num_samples:
            raise ShapleyPhaseError("aux setup", {aux: f"holds {got[aux]} samples, P holds {st.num_samples}"})

    # -- step 5 ---------------------------------------------------------------
    def encrypted_models(self, grid: PhaseGrid, st: _SecSVRun, t: int, members: list[int],
                         ) -> tuple[dict[int, list[Any]], tuple[dict[str, bytes], dict[str, bytes]]]:
        """Step 5: the members' encrypted local models of round ``t`` (each ciphertext checked).

        Returns ``({node: ciphertexts}, (the packed models as received, their signatures), for A)``.
        """
        d_in = st.params.n_features + 1

        def parse_model(n: int, ct: RecordDict) -> tuple[proto.ModelsReply, list[Any]]:
            reply = proto.ModelsReply.from_record(ct, node=n)
            return reply, [st.ctx.deserialize_ciphertext(b) for b in unpack_blobs(reply.cts, expected=d_in)]

        enc, _ = self._exchange(
            grid, {n: proto.ModelsRequest(st.public, t, st.weights[n]).to_record() for n in members},
            proto.MODELS.message_type, parse_model, f"models of round {t}", st=st)
        models = {n: enc[n][1] for n in members}
        # checked above, relayed as received with the clients' signatures (A checks them)
        forward = ({str(n): enc[n][0].cts for n in members}, {str(n): enc[n][0].signature for n in members})
        return models, forward

    def round_utilities(self, grid: PhaseGrid, st: _SecSVRun, t: int, members: list[int],
                        ) -> dict[frozenset[int], float]:
        """Steps 5–8 for round ``t``: utilities of every coalition of ``members``.

        Coalitions are evaluated by increasing size, all coalitions of one size in
        one exchange of steps 6–8; with SampleSkip, the samples that
        :func:`~flwr_fedeval.shapley.fsv.find_skippable` (Algorithm 7) marks are
        not evaluated and count as correct (Algorithm 6).
        """
        models, forward = self.encrypted_models(grid, st, t, members)
        M = st.num_samples
        correct: dict[frozenset[int], np.ndarray] = {}
        utilities: dict[frozenset[int], float] = {}
        for size in range(1, len(members) + 1):
            jobs = []   # (coalition, sample ids of one batch)
            masks = {}
            for S in coalitions(members, min_size=size):
                if len(S) != size:
                    continue
                skip = (find_skippable(S, correct) if (self.sample_skip and size > 1)
                        else np.zeros(M, dtype=bool))
                idx = np.flatnonzero(~skip)
                masks[S] = skip.copy()
                st.stats["skipped_samples"] += int(skip.sum())
                st.stats["evaluated_samples"] += int(idx.size)
                for ids in choose_batches(idx, st.owners, st.m, range(len(st.clients)), st.full_batches):
                    jobs.append((S, ids))
            if jobs:
                ok = self.secure_test(grid, st, t, jobs, models, forward if size == 1 else None)
                for (S, ids), res in zip(jobs, ok):
                    use = ~masks[S][ids]      # results of skipped samples in a cached batch are not used
                    masks[S][ids[use]] = res[use]
            for S, mask in masks.items():
                correct[S] = mask
                utilities[S] = float(mask.mean())
        return utilities

    def secure_test(self, grid: PhaseGrid, st: _SecSVRun, t: int, jobs: list[_Job], models: dict[int, list[Any]],
                    forward: tuple[dict[str, bytes], dict[str, bytes]] | None) -> list[np.ndarray]:
        """Π_Sec (Algorithm 4) for a list of (coalition, batch) jobs: steps 6–8; correct-prediction masks."""
        st.stats["batches"] += len(jobs)
        from_aux = self.aux_products(grid, st, t, jobs, forward)
        own = self._own_products(st, jobs, models)
        preds = self.helper_decryption(grid, st, t, jobs, own, from_aux)
        return self.aux_differences(grid, st, t, jobs, preds)

    # -- step 6 ---------------------------------------------------------------
    def aux_products(self, grid: PhaseGrid, st: _SecSVRun, t: int, jobs: list[_Job],
                     forward: tuple[dict[str, bytes], dict[str, bytes]] | None) -> list[tuple[bytes, bytes]]:
        """Step 6 (A): its half of every product, per job (ciphertexts checked), with A's signature
        of each. ``forward``: the round's signed models (first exchange of a round).
        Returns ``[(packed ciphertexts, A's signature)]`` per job, relayed as received."""
        p, ctx, aux = st.params, st.ctx, st.aux
        index = st.index
        job_rec = {j: (np.array([index[n] for n in sorted(S)], dtype=np.int64), ids.astype(np.int64))
                   for j, (S, ids) in enumerate(jobs)}
        models, sigs = forward if forward is not None else (None, None)
        content = proto.AuxEvalRequest(st.public, t, job_rec, models, sigs).to_record()

        def parse_products(n: int, ct: RecordDict) -> list[tuple[bytes, bytes]]:
            products = _all_jobs(proto.AuxEvalReply.from_record(ct, node=n).products, len(jobs))
            for j in range(len(jobs)):          # well-formed ciphertexts, or A is named now
                [ctx.deserialize_ciphertext(b) for b in unpack_blobs(products[j][0], expected=p.n_limbs)]
            return [products[j] for j in range(len(jobs))]

        from_aux, _ = self._exchange(grid, {aux: content}, proto.AUX_EVAL.message_type, parse_products,
                                     f"aux products, round {t}", st=st)
        return from_aux[aux]

    def _own_products(self, st: _SecSVRun, jobs: list[_Job], models: dict[int, list[Any]]) -> list[bytes]:
        """Step 5 (P): its own half of every product (aggregated model × its data shares), packed;
        the helper adds A's half (Algorithm 4 step 6)."""
        ctx = st.ctx
        agg: dict[frozenset[int], list[Any]] = {}
        layer_plain: dict[bytes, list[Any]] = {}
        totals = []
        for S, ids in jobs:
            if S not in agg:
                agg[S] = aggregate_model(ctx, [models[n] for n in sorted(S)])
            key = ids.tobytes()
            cache = st.full_plain if key in st.full_keys else layer_plain
            if key not in cache:
                cache[key] = server_plaintexts(ctx, st.X_P[ids], st.params, m=st.m, d_out=st.d_out)
            totals.append(pack_blobs([ctx.serialize_ciphertext(c) for c in server_products(ctx, agg[S], cache[key])]))
        return totals

    # -- step 7 ---------------------------------------------------------------
    def helper_decryption(self, grid: PhaseGrid, st: _SecSVRun, t: int, jobs: list[_Job], own: list[bytes],
                          from_aux: list[tuple[bytes, bytes]]) -> list[tuple[PDeal, bytes, int]]:
        """Step 7: send each batch — P's half, A's signed half, sample ids, coalition — to a helper
        client that owns none of it (and, when possible, is outside the coalition); the helper adds
        the halves and decrypts. Failing helpers are replaced for the rest of the phase.
        Returns ``(P's part of the zero-test deal, A's part sealed for A, helper)``."""
        failed_helpers = st.failed_helpers      # a helper that failed once is not asked again
        pending = list(range(len(jobs)))
        out: dict[int, tuple[PDeal, bytes, int]] = {}
        while pending:
            assign: dict[int, list[int]] = {}
            for j in pending:
                S, ids = jobs[j]
                owners = {st.clients[i] for i in set(st.owners[ids].tolist())}
                try:
                    h, _ = pick_helper(st.clients, owners | failed_helpers, set(S), st.helper_turn)
                except ValueError:
                    raise ShapleyPhaseError("helper decryption", dict.fromkeys(failed_helpers, "failed as helper")
                                            | {0: f"no eligible helper left for a batch owned by {sorted(owners)}"}
                                            ) from None
                st.helper_turn += 1
                assign.setdefault(h, []).append(j)
            contents = {h: proto.HelperRequest(st.public, st.pk[st.aux], t, {
                j: (own[j], from_aux[j][0], jobs[j][1].astype(np.int64), tuple(str(n) for n in sorted(jobs[j][0])),
                    from_aux[j][1]) for j in js}
            ).to_record() for h, js in assign.items()}

            def parse(h: int, ct: RecordDict, assign: dict[int, list[int]] = assign,
                      ) -> dict[int, tuple[PDeal, bytes, int]]:
                preds = proto.HelperReply.from_record(ct, node=h).preds
                if sorted(preds) != sorted(assign[h]):
                    raise ValueError(f"prediction shares of jobs {sorted(preds)}, sent jobs {sorted(assign[h])}")
                res: dict[int, tuple[PDeal, bytes, int]] = {}
                for j in assign[h]:
                    deal_p, sealed = preds[j]
                    if deal_p.q.shape != jobs[j][1].shape:
                        raise ValueError(f"zero-test deal {j}: {deal_p.q.shape}, batch {jobs[j][1].shape}")
                    res[j] = (deal_p, sealed, h)
                return res

            valid, failed = self._exchange(grid, contents, proto.HELPER.message_type, parse, "helper decryption",
                                           allow_failures=True, st=st)
            for res in valid.values():
                out.update(res)
            if failed:
                failed_helpers |= set(failed)
                st.stats["helper_replacements"] += sum(len(assign[h]) for h in failed)
                log(WARNING, "%s: helpers %s failed (not asked again); their %d batches go to other clients", _LABEL,
                    sorted(failed), sum(len(assign[h]) for h in failed))
            pending = [j for j in pending if j not in out]
        return [out[j] for j in range(len(jobs))]

    # -- step 8 ---------------------------------------------------------------
    def aux_differences(self, grid: PhaseGrid, st: _SecSVRun, t: int, jobs: list[_Job],
                        preds: list[tuple[PDeal, bytes, int]]) -> list[np.ndarray]:
        """Step 8 (A): the zero test (:mod:`flwr_fedeval.shapley.zerotest`). P sends ``e = Y' − u``,
        A answers ``f`` and its share of ``r·(Ŷ − Y)``; P opens it: the correct-prediction mask of
        every job (its only view: 0, or a uniform non-zero element, per sample)."""
        aux = st.aux
        masked = [mask_label_share(st.y_P[ids], preds[j][0]) for j, (_S, ids) in enumerate(jobs)]
        content = proto.AuxDiffRequest(st.public, {j: (preds[j][1], ids.astype(np.int64), st.pk[preds[j][2]],
                                                       masked[j])
                                                   for j, (S, ids) in enumerate(jobs)}).to_record()

        def parse_diffs(n: int, ct: RecordDict) -> list[tuple[np.ndarray, np.ndarray]]:
            diffs = _all_jobs(proto.AuxDiffReply.from_record(ct, node=n).diffs, len(jobs))
            out = []
            for j, (_S, ids) in enumerate(jobs):
                f, z = diffs[j]
                if f.shape != ids.shape:
                    raise ValueError(f"zero-test share {j} has {f.dtype} {f.shape}, expected uint64 {ids.shape}")
                out.append((f, z))
            return out

        diffs, _ = self._exchange(grid, {aux: content}, proto.AUX_DIFF.message_type, parse_diffs,
                                  f"aux differences, round {t}", st=st)
        return [self._open(t, S, ids, preds[j][0], masked[j], *diffs[aux][j]) for j, (S, ids) in enumerate(jobs)]

    def _open(self, t: int, S: frozenset[int], ids: np.ndarray, deal_p: PDeal, e: np.ndarray, f: np.ndarray,
              z_aux: np.ndarray) -> np.ndarray:
        """P opens ``r·(Ŷ − Y)`` of the job (round ``t``, coalition ``S``, samples ``ids``): ``True``
        where it is 0, a correct prediction. Everything P learns from the comparison passes here."""
        return open_zero_test(deal_p, e, f, z_aux)[0]
