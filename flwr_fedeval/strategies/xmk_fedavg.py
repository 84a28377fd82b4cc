"""FedAvg under xMK-CKKS multi-key homomorphic encryption.

Implementation based on Walskaar, Tran, Catak 2023 (Eqs. 1-11) and Ma et al.
2022 (xMK-CKKS), on Flower's Message API (DESIGN.md §3), hardened against a
deviating server (DESIGN.md §7): signed commit-then-reveal key sets
(:mod:`flwr_fedeval.rlwe.keyset`), pairwise zero-sum masks and self-masks
(:mod:`flwr_fedeval.rlwe.masking`, :mod:`flwr_fedeval.rlwe.selfmask`, Bonawitz
et al. 2017) and t-out-of-N threshold decryption over a signed contributor set
(:mod:`flwr_fedeval.rlwe.threshold`, Mouchet et al. 2021), without retries
(no retries). The server sees only the sum of the contributors' encrypted,
example-weighted updates and ``Σ n_i``; no single party can decrypt one
client's update or a partial sum, and it holds one running sum, not M
ciphertexts.
The server is trusted for nothing: every check is the clients'
(:mod:`flwr_fedeval.secagg.member`, through :mod:`flwr_fedeval.clients.xmkckks`); the checks here only
name a failing node early. This module is the Flower glue (sampling, the exchanges, the round records);
the arithmetic of the round is the server party's (:class:`flwr_fedeval.secagg.server.Aggregator`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from flwr_fedeval import rlwe
from flwr_fedeval.protocol import Payload, ReplyCode, Step, xmk
from flwr_fedeval.rlwe import keyset
from flwr_fedeval.secagg import BULK_MODES, KeySetParameters, ProtocolParameters, protocol_keywords
from flwr_fedeval.secagg.server import CHUNK_POLYS, AggregationError, Aggregator, CiphertextSum, ShareSum
from flwr_fedeval.strategies.base import (
    Failures,
    ReadableFailuresMixin,
    StepTimer,
    code_name,
    exchange_replies,
    log_failures,
    replies_by_node,
)
from flwr_fedeval.strategies.collect import Collected, FoldingGrid, OnReply, PhaseGrid, ReplyCollector
from flwr_fedeval.strategies.exchange import rejoin_of
from flwr_fedeval.weights import WeightLayout

__all__ = ["RoundAborted", "XMKFedAvg"]

BULK_CHOICES = BULK_MODES
#: Default parameter set (the protocol layer's): n = 4096, log2 q ≈ 108 ≤ 109 (HE-Standard, 128-bit).
DEFAULT_PARAMETER_SET = rlwe.DEFAULT_PARAMETER_SET.name


class RoundAborted(RuntimeError):
    """A secure-aggregation attempt failed; ``failed`` maps node IDs to reasons.

    ``failures`` (when the attempt failed at a reply exchange) holds the same nodes with
    their reply codes (:class:`~flwr_fedeval.protocol.ReplyCode`: ``TIMEOUT``,
    ``MALFORMED_REPLY``, the error reply's code); it is ``None`` for a failure the
    server found itself (a roster name claimed twice, a sum that does not decode).
    """

    def __init__(self, step: str, failed: dict[int, str], *, failures: Failures | None = None) -> None:
        self.step = step
        self.failed = failed
        self.failures = failures
        detail = "; ".join(f"node {n}: {r}" for n, r in failed.items())
        super().__init__(f"{step} failed for {len(failed)} node(s): {detail}")


@dataclass
class _Commitments:
    """Step 1a: every member's signed commitment (names as the members claim them)."""

    key_id: str
    seed_a: bytes
    round: int
    nodes: tuple[int, ...]
    names: tuple[str, ...]
    commitments: tuple[bytes, ...]
    signatures: tuple[bytes, ...]


@dataclass
class _KeySet:
    """A revealed key set: what every member needs to check and sum b = Σ b_i and derive its mask."""

    parameters: KeySetParameters  # every public parameter, signed in T
    nodes: tuple[int, ...]
    names: tuple[str, ...]  # roster names, aligned with ``nodes``
    shares: tuple[bytes, ...]  # every b_i, sent so that clients check and sum them
    mask_keys: tuple[bytes, ...]  # every X25519 mask key
    transcript_signatures: tuple[bytes, ...]  # every member's signature over the key-set digest
    transcript: bytes = b""  # T, as the members computed it (the mask graph is derived from it)

    @property
    def key_id(self) -> str:
        return self.parameters.key_id

    def name_of(self, node: int) -> str:
        return self.names[self.nodes.index(node)]

    def node_of(self, name: str) -> int:
        return self.nodes[self.names.index(name)]


@dataclass
class _RoundState:
    """The state of the round in progress (one per ``configure_train``), read through
    :meth:`XMKFedAvg._current`."""

    server_round: int
    arrays: ArrayRecord
    config: ConfigRecord
    grid: Grid
    key_set: _KeySet | None = None
    aborted: list[RoundAborted] = field(default_factory=list)
    sent: list[Message] = field(default_factory=list)  # the step-2 requests (replies matched by message id)
    known: set[int] = field(default_factory=set)  # the node list when the round started
    tried: set[int] = field(default_factory=set)  # every node of an attempt of this round
    running: Aggregator | None = None  # the server party of the attempt in progress (its running sums)
    inboxes: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)  # step 1c: name -> (sender, box)
    train_results: dict[int, Any] = field(default_factory=dict)  # node -> its reply's metrics, or the error
    pdec_attempts: list[tuple[str, ...]] = field(default_factory=list)  # step 3: every active set A asked

    @property
    def keys(self) -> _KeySet:
        """The key set of the attempt in progress.

        Raises
        ------
        RuntimeError
            If step 1 (key generation) has not completed in this round.
        """
        if self.key_set is None:
            raise RuntimeError(f"XMKFedAvg: round {self.server_round} has no key set (step 1 has not completed)")
        return self.key_set


class _TrainReplies(ReplyCollector):
    """The step-2 (``train``) replies that Flower's ``Strategy.start`` already collected, handed back
    as the replies of an exchange so that :func:`~flwr_fedeval.strategies.base.exchange_replies` checks
    them as it checks every other step's.

    ``by_node`` maps each node to its reply (matched to the train request by message id); each is
    handed back as the reply to the exchange's request for that node.
    """

    def __init__(self, by_node: dict[int, Message]) -> None:
        self.by_node = by_node

    def collect_replies(self, messages: Iterable[Message], *, timeout: float | None = None,
                        on_reply: OnReply | None = None) -> Collected:
        out = Collected()
        for msg in messages:
            reply = self.by_node.get(int(msg.metadata.dst_node_id))
            if reply is not None:
                reply = Message(reply.error if reply.has_error() else reply.content, reply_to=msg)
                out.replies.append(reply if on_reply is None else on_reply(reply))
        return out


def _active_set(signatures: dict[str, bytes], t: int) -> tuple[str, ...]:
    """A of step 3: the first t signers of C by name (a loss outside A costs nothing)."""
    return tuple(sorted(signatures)[:t])


class XMKFedAvg(ReadableFailuresMixin, FedAvg):
    """Weighted FedAvg whose client updates are aggregated under xMK-CKKS.

    Each round (no retries): (1a) ``query.xmk_keygen`` to the sampled
    clients: each draws s_i, b_i (Eq. 1) and an X25519 mask key and replies a
    commitment signed with its roster key; (1b) ``query.xmk_reveal`` relays all
    signed commitments and the public parameters (scale, value bound B, mask
    degree, threshold t); each client checks them and opens b_i and its mask key
    with its signature over the transcript T that binds them all; (1c)
    ``query.xmk_shares``: each member Shamir-splits (t of N) s_i, its mask key
    and a fresh self-mask seed and seals each share to each member (Mouchet et
    al. 2021; Bonawitz et al. 2017 double masking); (2) ``train`` with every
    opening and the member's inbox: each client checks T, opens a valid share
    from every member, clips n_i·Δw_i and n_i to B and replies
    Enc(n_i·Δw_i, n_i) + r_i + u_i (Eq. 6; r_i its pairwise mask, u_i its
    self-mask) with c0 modulus-switched to the L' limbs signed in T (c1 exact,
    :mod:`flwr_fedeval.rlwe.compact`), at most once per global model; the server folds each ciphertext
    into a running sum as it arrives; (2b) ``query.xmk_contributors``: the
    contributors still listed sign C, the set whose ciphertexts were summed;
    (3) ``query.xmk_pdec`` to t of the signers (the active set A) with
    C1 = Σ_{j∈C} c1_j, C and t signatures: each replies
    D_j = λ_j·sk_j·C1 + e*_j (threshold Eq. 7), switched to L' limbs and masked pairwise over A
    (a lost decryptor is replaced by a new A, at most ``decryption_attempts``; a retry's shares are sent
    at the full L limbs and switched by the server on arrival), and its shares of the seeds of C
    and the mask keys of K∖C; (4) the server folds the D_j, reconstructs the
    seeds and mask keys, removes Σ u_i and the pairwise masks between C and
    K∖C, decodes Σ n_i·Δw_i and Σ n_i (Eq. 5) and sets
    ``w ← w + Σ n_i·Δw_i / Σ n_i`` over C. Every client needs a roster identity
    (:func:`flwr_fedeval.clients.identity.node_identity`).

    A member lost before its upload (or whose ciphertext is malformed) is left
    out of C (``left_out``); one lost after it costs nothing
    (``lost_after_upload``): the round completes while t members sign C and the
    t decryptors answer; a decryptor lost during the partial decryption is
    replaced by the next signer of C in a new active set A' (its shares are
    masked pairwise over A, so the incomplete attempt reveals nothing), at most
    ``decryption_attempts`` active sets in all. The round fails (global model
    unchanged, **no retry**: the clients that uploaded refuse that model again)
    only when fewer than t members upload or sign, or fewer than t signers are
    left or the a attempts are used up in the partial decryption. Failures
    before training (key generation, reveal, key shares) drop the failing
    nodes and re-key, at most ``max_attempts`` times (nobody trained yet: a
    re-key leaks nothing). A node is given up as soon as
    it leaves the SuperLink's node list (or, over a
    :class:`~flwr_fedeval.strategies.base.FailureRecordingGrid` with a
    :class:`~flwr_fedeval.strategies.collect.Rejoin`, as soon as its identity
    comes back under a new node ID), not at ``step_timeout``
    (:mod:`flwr_fedeval.strategies.collect`); nodes that joined during key setup
    (a restarted SuperNode) take the lost ones' places in the new key set, at
    most as many as were lost.

    Parameters
    ----------
    parameter_set : str, default="xmk-n4096-q109"
        Name of an :data:`flwr_fedeval.rlwe.PARAMETER_SETS` entry (all are
        128-bit secure under the HomomorphicEncryption.org standard). The
        decoding error of the sum is about M·B_smudge/Δ (smudging dominates)
        plus the switching rounding 2MQ/Δ; with 10 clients and
        ``max_abs_value=2**16`` its worst-case bound is 2.7e-6 at the default
        (q≈2^109, primes of 24, 23, 31, 31 bits, the 31-bit ones dropped before
        sending: 203 bits per coefficient uploaded), 3.5e-6 at q109-l5 (five
        limbs, 199 bits), 4.8e-6 at q108 (four 27-bit primes, 216 bits) and
        0.18 at q≈2^93, hence the default
        (:data:`flwr_fedeval.rlwe.DEFAULT_PARAMETER_SET`).
    max_abs_value : float, default=2**16
        Public bound B on every encrypted value ``|n_i·Δw|`` and ``n_i``,
        signed in the key-set transcript: clients clip to [-B, B] (as Flower's
        SecAgg+ ``clipping_range``) and count the clipped values on the node;
        they never refuse (a refusal that depends on private data is an oracle).
        Together with the number of clients it fixes the scale Δ.
    scale_bits : int, optional
        log2 of Δ; default: the largest the noise budget allows
        (:func:`flwr_fedeval.rlwe.max_scale_bits`).
    rekey : {"every-round", "per-client-set"}, default="every-round"
        Generate new keys every round, or reuse a key set while the same
        clients take part.
    step_timeout : float, default=600
        Seconds to wait for the replies of key generation and partial
        decryption (the training step uses the ``timeout`` of ``start``).
    max_attempts : int, default=3
        Key setups per round (the first one included); after the train request
        nothing is retried.
    threshold : int, optional
        t of the t-out-of-N decryption; default floor(N/2) + 1 (each client
        refuses t <= N/2: two disjoint survivor groups must not both decrypt).
    limbs : int, optional
        L', the RNS limbs every client switches c0 and its decryption share
        to before sending them (OpenFHE's ``Compress``; c1 stays at L):
        default the fewest the noise budget allows for the key set's N, the
        scale and ``max_abs_value`` (:func:`flwr_fedeval.rlwe.compact.compact_limbs`),
        clamped up to that fewest; the parameter set's L sends the
        uncompressed form. Signed in the key-set transcript.
    decryption_attempts : int, default=2
        a, the most active sets A of step 3 per round (1 <= a <=
        :data:`flwr_fedeval.rlwe.params.MAX_DECRYPTION_ATTEMPTS`, which the smudging noise is sized
        for), signed in the key-set transcript: a decryptor lost during the partial decryption is
        replaced by the next signer of C, at most a - 1 times; each member answers each A once
        and at most a of them.
    mask_degree : int, default=4
        Degree k of the pairwise-mask graph (SecAgg+, Bell et al. 2020):
        each client masks with k neighbours derived from the signed key-set
        transcript (:func:`flwr_fedeval.rlwe.masking.mask_neighbours`), not
        with all M - 1 others; 0 (or any k >= M - 1) is the complete graph
        of Bonawitz et al. 2017. Partial sums stay masked for every
        connected graph; stripping an honest client's mask needs its k
        neighbours to collude with the server. Each client refuses a degree
        below its own floor (config ``xmk-mask-degree``).
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes, \
arrayrecord_key, configrecord_key, evaluate_metrics_aggr_fn
        As :class:`flwr.serverapp.strategy.FedAvg`. ``min_train_nodes``
        (default 2) is also the fewest clients a key set may have; it is
        raised to 2 if lower.
    train_metrics_aggr_fn : None
        Must be ``None``: the clients' train metrics are averaged unweighted
        (n_i stays encrypted).
    weighted_by_key : str, default="num-examples"
        Must be ``"num-examples"``: the count :func:`~flwr_fedeval.clients.xmkckks.xmkckks_mod`
        encrypts beside the update.

    Attributes
    ----------
    aborted_attempts : list of (int, RoundAborted)
        Every aborted key setup and failed round with its round; the reason per
        node is in ``RoundAborted.failed``.
    left_out : list of (int, dict)
        Members left out of a round's contributor set: ``(round, {node: reason})``.
    lost_after_upload : list of (int, dict)
        Contributors lost after their upload (they cost nothing): ``(round, {node: reason})``.
    contributor_sets : list of dict
        Every round that got as far as its contributor set C, in order, by the members' roster
        identities (the names signed in the key-set transcript, never node IDs):
        ``{"round": int, "key_set": str, "threshold": int (t), "members": list of str (K),
        "contributors": list of str (C, the set the members signed), "num_contributors": int (|C|),
        "left_out": {name: reason} (members of K lost before uploading, not in C),
        "lost_after_upload": {name: reason} (members of C that did not sign C),
        "signers": list of str (the members that signed C), "decryptors": list of str (the t
        members of the last active set asked for a decryption share: the ones that decrypted when
        completed), "decryption_attempts": list of list of str (every active set asked, in order),
        "completed": bool}``. ``completed`` is false when the
        round failed after C was fixed (its reason is in ``aborted_attempts``). The App writes them
        to ``results.json`` (``xmk_rounds``).
    key_sets : list of dict
        Every key set this strategy generated, in order: ``{"round": int,
        "key_set": str (the key-set ID), "nodes": list of int (its members'
        node IDs)}``. Public values only (no key material); the App writes
        them to ``results.json`` and every checkpoint's ``state.json``.
    timer : StepTimer
        ``timer.timings``: ``(step, seconds)`` of every protocol step run so
        far (key generation, sum, partial decryption, decoding; waits for the
        clients' replies included), in order; each is also logged at INFO.

    Raises
    ------
    ValueError
        At construction: ``parameter_set`` is unknown or weaker than the
        128-bit HomomorphicEncryption.org bound, ``max_abs_value`` is not a
        finite number ≥ 1, ``rekey`` is not one of its choices,
        ``max_attempts < 1``, ``mask_degree`` is not an integer ≥ 0,
        ``weighted_by_key`` is not ``"num-examples"``, or ``train_metrics_aggr_fn``
        is given.
    flwr_fedeval.rlwe.NoiseBudgetError
        From ``configure_train``/``aggregate_train`` (and so from ``start``):
        ``scale_bits`` (or, when unset, any scale) does not fit the noise
        budget for the number of clients and ``max_abs_value`` (see
        :meth:`scale_bits_for`).
        A failed or malformed client reply never raises: before training the
        key setup is re-run without the node; after it the node is left out,
        or the round fails (:class:`RoundAborted`, recorded in
        ``aborted_attempts``) and the global model is left unchanged.
    """

    @protocol_keywords
    def __init__(
        self,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        **protocol: Any,
    ) -> None:
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
                         min_train_nodes=min_train_nodes, min_evaluate_nodes=min_evaluate_nodes,
                         min_available_nodes=min_available_nodes, weighted_by_key=weighted_by_key,
                         arrayrecord_key=arrayrecord_key, configrecord_key=configrecord_key,
                         train_metrics_aggr_fn=train_metrics_aggr_fn, evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn)
        if train_metrics_aggr_fn is not None:
            raise ValueError("train_metrics_aggr_fn: XMKFedAvg averages the clients' train metrics unweighted "
                             "(n_i stays encrypted); pass it to the inner strategy of SecureAggregation instead")
        if weighted_by_key != "num-examples":
            raise ValueError(f"weighted_by_key must be 'num-examples' (the count xmkckks_mod encrypts beside the "
                             f"update), got {weighted_by_key!r}")
        #: The protocol's settings (:class:`~flwr_fedeval.secagg.ProtocolParameters`), checked once.
        self.protocol = ProtocolParameters(**protocol)
        self.params = self.protocol.params
        if self.min_train_nodes < 2:
            log(WARNING, "XMKFedAvg: min_train_nodes raised to 2 (one client's sum is its update)")
            self.min_train_nodes = 2
        #: polynomials per range of the server's fold, mask rebuild and decoding (memory, not results)
        self.chunk_polys = CHUNK_POLYS
        #: Total values clipped to ``max_abs_value`` per round (KAHE mode: the decrypted total): (round, count).
        self.clipped_values: list[tuple[int, int]] = []
        #: Members left out of a round's contributor set: (round, {node: reason}); no retry was run.
        self.left_out: list[tuple[int, dict[int, str]]] = []
        #: Contributors lost after their upload (no signature of C): (round, {node: reason}); they cost nothing.
        self.lost_after_upload: list[tuple[int, dict[int, str]]] = []
        self._round: _RoundState | None = None
        #: ``timer.timings``: (step, seconds) of every protocol step run so far.
        self.timer = StepTimer("XMKFedAvg")
        self._key_cache: dict[tuple[int, ...], _KeySet] = {}
        #: Every aborted attempt, for logs and tests: (round, RoundAborted).
        self.aborted_attempts: list[tuple[int, RoundAborted]] = []
        #: Every key set generated: {"round", "key_set" (ID), "nodes"}; public values only.
        self.key_sets: list[dict[str, Any]] = []
        #: Every round that reached the contributor set, by roster identity (see Attributes).
        self.contributor_sets: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ info
    def start(self, grid: Grid, *args: Any, **kwargs: Any) -> Any:
        """Flower's ``Strategy.start`` over a grid that folds each ``train`` reply into the round's running
        sum as it arrives (a :class:`~flwr_fedeval.strategies.collect.FoldingGrid` with
        :meth:`fold_train_reply`): the server holds one model-sized sum and the replies in flight, not M
        ciphertexts. A node that leaves the node list is given up at once
        (:class:`~flwr_fedeval.strategies.collect.GridView`)."""
        # not super(): the checkpointing loop calls this with a view of the strategy as ``self``
        return ReadableFailuresMixin.start(self, FoldingGrid(grid, self.fold_train_reply), *args, **kwargs)

    def summary(self) -> None:
        """Log the configuration, including the parameter set and its security."""
        super().summary()
        p = self.params
        log(INFO, "\t└──> xMK-CKKS secure aggregation:")
        log(INFO, "\t\t├── Parameter set: %s (n=%d, log2 q=%.1f ≤ %d: 128-bit)",
            p.name, p.n, p.log2_q, p.security_bound_log2_q)
        log(INFO, "\t\t├── Max |n_i·Δw|: %.4g, scale: %s", self.protocol.max_abs_value,
            f"2^{self.protocol.scale_bits}" if self.protocol.scale_bits else "auto (noise budget)")
        log(INFO, "\t\t└── Re-key: %s, attempts per round: %d, step timeout: %.0f s",
            self.protocol.rekey, self.protocol.max_attempts, self.protocol.step_timeout)

    # ------------------------------------------------------------ training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample clients, run key generation (step 1), build the train messages (step 2)."""
        num_nodes = int(len(list(grid.get_node_ids())) * self.fraction_train)
        sample_size = max(num_nodes, self.min_train_nodes)
        node_ids, _ = sample_nodes(grid, self.min_available_nodes, sample_size)
        config["server-round"] = server_round
        return self.configure_train_for(server_round, arrays, config, grid, node_ids)

    def configure_train_for(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                            node_ids: Iterable[int]) -> list[Message]:
        """Steps 1 and 2 (request) with the sampled ``node_ids`` (``configure_train`` samples them;
        :class:`~flwr_fedeval.strategies.secure_aggregation.SecureAggregation` takes the inner strategy's).
        Returns the ``train`` messages, or ``[]`` when the key setup failed (recorded in ``aborted_attempts``)."""
        self._round = _RoundState(server_round, arrays, config, grid, known={int(n) for n in grid.get_node_ids()})
        try:
            return self._start_attempt(sorted(int(n) for n in node_ids))
        except RoundAborted as exc:
            self._record_abort(exc)
            return []

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Steps 2-4 (:meth:`sum_ciphertexts`, :meth:`sign_contributors`, :meth:`partial_decryptions`,
        :meth:`decode`), **without retries**: a member lost before its upload is left out of the signed
        contributor set C; one lost after its upload costs nothing (t-out-of-N decryption). The round
        fails (global model unchanged, no retry: the clients refuse this model again) only when fewer
        than t members upload, sign C, or answer the partial decryption."""
        state = self._round
        if state is None or state.key_set is None:
            log(WARNING, "aggregate_train: round %d has no key set; global model unchanged", server_round)
            return None, None
        try:
            return self._finish_attempt(list(replies))
        except RoundAborted as exc:
            self._record_abort(exc)
            log(WARNING, "Round %d: secure aggregation failed at %s; global model unchanged (no retry: a client "
                "gives one update per global model)", server_round, exc.step)
            return None, None
        finally:
            state.running = None

    # ------------------------------------------------------- protocol steps
    def keygen(self, nodes: list[int]) -> _KeySet:
        """Step 1: signed commit (:meth:`commit`) then reveal (:meth:`reveal`) of every b_i and mask key.

        With ``rekey="per-client-set"`` the key set of the same nodes is reused.

        Raises
        ------
        RoundAborted
            A node failed, timed out or sent a malformed reply.
        """
        cached = self._key_cache.get(tuple(nodes))
        if self.protocol.rekey == "per-client-set" and cached is not None:
            return cached
        key_set = self.reveal(self.commit(nodes))
        self._key_cache = {tuple(nodes): key_set}
        return key_set

    def commit(self, nodes: list[int]) -> _Commitments:
        """Step 1a (``query.xmk_keygen``): each node draws s_i, b_i (Eq. 1) and a mask key and
        replies only a commitment to them, signed with its roster key.

        Raises
        ------
        RoundAborted
            A node failed, timed out, sent a malformed reply, or claims a roster
            name another node claims too.
        """
        state = self._current()
        seed_a = rlwe.new_public_seed()
        key_id = keyset.key_set_id(self.params, seed_a)
        request = xmk.KeygenRequest(self.params.name, seed_a, key_id, state.server_round)

        def check(node: int, reply: xmk.KeygenReply) -> xmk.KeygenReply:
            if reply.key_id != key_id:
                raise ValueError("reply is for another key set")
            return reply

        parsed = self._exchange("key generation", "commitment", nodes, xmk.KEYGEN, request, check)
        names = [reply.signer for reply in parsed]
        dup = {n: f"claims roster name {names[i]!r} like another node" for i, n in enumerate(nodes)
               if names.count(names[i]) > 1}
        if dup:
            raise RoundAborted("key generation", dup)
        return _Commitments(key_id, seed_a, state.server_round, tuple(nodes), tuple(names),
                            tuple(r.commitment for r in parsed), tuple(r.signature for r in parsed))

    def reveal(self, committed: _Commitments) -> _KeySet:
        """Step 1b (``query.xmk_reveal``): relay every signed commitment; each node checks them
        all against the roster and opens (b_i, X_i) with its signature over the key-set digest.

        Raises
        ------
        RoundAborted
            A node refused, timed out, or opened keys that do not match its commitment.
        """
        nodes = committed.nodes
        signed = self.protocol.key_set_parameters(len(nodes), key_id=committed.key_id, seed_a=committed.seed_a,
                                                  round_=committed.round)
        request = xmk.RevealRequest.of(signed, committed.names, committed.commitments, committed.signatures)
        expected = dict(zip(nodes, zip(committed.names, committed.commitments)))

        def check(node: int, reply: xmk.RevealReply) -> xmk.RevealReply:
            name, h = expected[node]
            if reply.key_id != committed.key_id or reply.signer != name:
                raise ValueError("reply is for another key set or member")
            if keyset.commitment(committed.key_id, reply.public_share, reply.mask_key) != h:
                raise ValueError("the opened share or mask key does not match the node's commitment")
            rlwe.PublicKey.from_bytes(reply.public_share, self.params)
            return reply

        parsed = self._exchange("key reveal", "opening", nodes, xmk.REVEAL, request, check)
        return _KeySet(signed, nodes, committed.names, tuple(r.public_share for r in parsed),
                       tuple(r.mask_key for r in parsed), tuple(r.transcript_signature for r in parsed),
                       parsed[0].transcript)

    def share_keys(self, key_set: _KeySet) -> dict[str, list[tuple[str, bytes]]]:
        """Step 1c (``query.xmk_shares``): every member Shamir-splits s_i, x_i and a fresh self-mask seed and
        seals each share to its member; returns each member's inbox ``{name: [(sender, box), ...]}``.

        Raises
        ------
        RoundAborted
            A node refused, timed out, or replied for another member or set of recipients.
        """
        state = self._current()
        request = xmk.SharesRequest(self.params.name, key_set.key_id, state.server_round, key_set.names,
                                    key_set.shares, key_set.mask_keys, key_set.transcript_signatures)

        def check(node: int, reply: xmk.SharesReply) -> xmk.SharesReply:
            name = key_set.name_of(node)
            if reply.key_id != key_set.key_id or reply.signer != name or reply.round != state.server_round:
                raise ValueError("reply is for another key set, member or round")
            if sorted(reply.recipients) != sorted(set(key_set.names) - {name}):
                raise ValueError("the boxes are not one per other member")
            return reply

        parsed = self._exchange("key shares", "sealed shares", key_set.nodes, xmk.SHARES, request, check)
        inboxes: dict[str, list[tuple[str, bytes]]] = {name: [] for name in key_set.names}
        for reply in parsed:
            for recipient, box in zip(reply.recipients, reply.sealed_shares):
                inboxes[recipient].append((reply.signer, box))
        return inboxes

    def train_messages(self, key_set: _KeySet) -> list[Message]:
        """Step 2 (request): global model, train config and the key set to every key holder."""
        state = self._current()
        m = len(key_set.nodes)
        out = []
        for node, name in zip(key_set.nodes, key_set.names):
            inbox = state.inboxes.get(name, [])
            keys = xmk.TrainRequest(self.params.name, key_set.key_id, state.server_round, key_set.names,
                                    key_set.shares, key_set.mask_keys, key_set.transcript_signatures, m,
                                    tuple(s for s, _ in inbox), tuple(b for _, b in inbox))
            content = RecordDict({self.arrayrecord_key: state.arrays, self.configrecord_key: state.config})
            content.update(keys.to_record())
            out.append(Message(content=content, dst_node_id=node, message_type=xmk.TRAIN.message_type))
        return out

    def fold_train_reply(self, reply: Message) -> Message:
        """Step 2, per reply as it arrives (the callback of :meth:`start`'s
        :class:`~flwr_fedeval.strategies.collect.FoldingGrid`): check the ciphertext and
        add it into the round's running sum (Eq. 3) a range of polynomials at a time, straight from the
        message's bytes (no parsed copy); the reply is kept without its bulk.

        Every reply of every exchange over :meth:`start`'s grid comes here: one to no train request of
        the round in progress (another step's, an evaluation's), or an error reply, is kept as it is; a
        malformed one is kept stripped, its error stored for :meth:`sum_ciphertexts` (which names the node).
        """
        state = self._round
        if state is None:
            return reply
        sent = {m.metadata.message_id: int(m.metadata.dst_node_id) for m in state.sent}
        node = sent.get(reply.metadata.reply_to_message_id)
        if reply.has_error() or node is None:
            return reply
        try:
            parsed = xmk.TrainReply.from_record(reply.content, node=node)
            reply.content = RecordDict()  # the ciphertext is a view into the message's buffer: one copy
            state.train_results[node] = self._fold_ciphertext(node, parsed)
            del parsed
        except (KeyError, ValueError, TypeError) as exc:
            state.train_results[node] = exc
        reply.content = RecordDict()
        return reply

    def _fold_ciphertext(self, node: int, reply: xmk.TrainReply) -> MetricRecord | None:
        """Check one step-2 reply and fold it into the round's running sums
        (:meth:`flwr_fedeval.secagg.server.Aggregator.add_upload`: a malformed upload adds nothing); return
        the reply's metrics.

        Raises
        ------
        ValueError
            The ciphertext or capsule is malformed, at another level, or of another size, or it is the
            node's second in this round (a :class:`~flwr_fedeval.rlwe.kahe.KaheError` is one).
        """
        self._aggregator().add_upload(node, reply.ciphertext, reply.capsule, reply.capsule_signature, reply.metrics)
        return reply.metrics

    def sum_ciphertexts(self, replies: list[Message]) -> tuple[CiphertextSum, list[MetricRecord], list[int]]:
        """Step 2 (replies) and Eq. 3: the sum of the well-formed fresh ciphertexts, one per contributor.

        The ciphertexts were folded into a running sum as they arrived (:meth:`fold_train_reply`, in
        :meth:`start`'s loop); a reply that was not (``aggregate_train`` called with the replies
        themselves) is folded here, one at a time. A member that failed, timed out or sent a
        malformed ciphertext is left out of the contributor set (recorded in ``left_out``), not retried.

        Returns
        -------
        (CiphertextSum, list of MetricRecord, list of int)
            C = Σ_{j∈C} c_j (C0' at L' limbs, uint32; C1 at L as bytes), the contributors' metric records,
            the contributors' node IDs (key-set order).

        Raises
        ------
        RoundAborted
            Fewer than t members contributed.
        """
        state = self._current()
        key_set = state.keys

        def check(node: int, reply: xmk.TrainReply) -> MetricRecord | None:
            return self._fold_ciphertext(node, reply)

        received = _TrainReplies(replies_by_node(state.sent, replies))
        valid, failed = self._exchange_some("encrypted training", "ciphertext", key_set.nodes, xmk.TRAIN, None, check,
                                            grid=received, parsed=state.train_results)
        contributors = [n for n in key_set.nodes if n in valid]
        if failed:
            self.left_out.append((state.server_round, failed))
            log(WARNING, "Round %d: %d member(s) left out of the contributor set (no ciphertext): %s",
                state.server_round, len(failed), sorted(failed))
        if len(contributors) < max(key_set.parameters.threshold, 1):
            raise RoundAborted("encrypted training", failed or dict.fromkeys(key_set.nodes, "no contributor"))
        # every decryptor refuses a C whose induced mask graph is disconnected: name it here, before asking
        assert state.running is not None  # at least one ciphertext was folded
        parts = state.running.contributor_components([key_set.name_of(n) for n in contributors])
        if len(parts) > 1:
            reason = f"the mask graph induced on the contributor set is not connected ({parts}): the members refuse"
            raise RoundAborted("contributor set", dict.fromkeys(contributors, reason))
        return state.running.total(contributors), [valid[n] for n in contributors if valid[n] is not None], \
            contributors

    def sign_contributors(self, contributors: list[int]) -> dict[str, bytes]:
        """Step 2b (``query.xmk_contributors``): every contributor still listed signs (key set, round, model
        hash, C) once; returns ``{name: signature}`` of the members that signed (at least t). A contributor
        lost now is recorded in ``lost_after_upload`` and costs nothing.

        Raises
        ------
        RoundAborted
            Fewer than t members signed.
        """
        state = self._current()
        key_set = state.keys
        names = tuple(key_set.name_of(n) for n in contributors)
        request = xmk.ContributorsRequest(key_set.key_id, state.server_round, xmk.model_hash(state.arrays), names)
        listed = {int(n) for n in state.grid.get_node_ids()}
        asked = [n for n in contributors if n in listed]  # the members known alive after their upload

        def check(node: int, reply: xmk.ContributorsReply) -> bytes:
            if reply.key_id != key_set.key_id or reply.signer != key_set.name_of(node):
                raise ValueError("reply is for another key set or member")
            return reply.signature

        valid, failed = self._exchange_some("contributor set", "signature", asked, xmk.CONTRIBUTORS, request, check)
        failed.update({n: "left the SuperLink's node list after its upload" for n in contributors if n not in asked})
        if failed:
            self.lost_after_upload.append((state.server_round, dict(failed)))
        if len(valid) < key_set.parameters.threshold:
            raise RoundAborted("contributor set", failed or dict.fromkeys(key_set.nodes, "too few signatures"))
        return {key_set.name_of(n): sig for n, sig in valid.items()}

    def partial_decryptions(self, c0: np.ndarray, c1: bytes, contributors: list[int],
                            signatures: dict[str, bytes]) -> np.ndarray:
        """Step 3: ``query.xmk_pdec`` to the active decryptors A (the first t signers of C); each replies
        D_j = λ_j·sk_j·C1 + e*_j (threshold Eq. 7), switched to L' limbs, plus its pairwise masks over A
        (:func:`flwr_fedeval.rlwe.threshold.mask_decryption_share`, cancelling in Σ_{j∈A} D_j), and its
        shares of the self-mask seeds of C and the mask keys of K∖C. Shares are folded into their own
        accumulator as they arrive; a member of A lost during this step is dropped and the first t
        signers still listed and not lost are asked as A' (a fresh request; the members already in A
        answer again for A', with the next attempt index k), at most a (``decryption_attempts``, signed in
        T) active sets. Attempt 1's shares arrive at L' limbs; a retry's at the full L limbs
        (:func:`flwr_fedeval.rlwe.threshold.share_limbs`, which keeps several complete attempts
        simulatable), each range parsed strictly at L and switched to L' on arrival. Then
        C0 + Σ D_j (Eq. 5), the seeds and mask keys are reconstructed (t shares each: the recovery
        shares of every attempt are the same Shamir shares) and the masks removed. C0' and the D'_j
        are at the key set's L' limbs (modulus-switched, :mod:`flwr_fedeval.rlwe.compact`): the masks
        are summed at L limbs and switched once (one more rounding term, counted in
        :func:`~flwr_fedeval.rlwe.compact.compact_noise_bound`).

        Parameters
        ----------
        c0 : ndarray of shape (k, L', n), uint32 or uint64, reduced
            C0' = Σ_{j∈C} c0'_j (uint32 from :meth:`sum_ciphertexts`: residues < 2^31, half the bytes); kept
            intact until an attempt is complete, then the result is computed in its buffer (overwritten).
        c1 : bytes
            C1 = Σ_{j∈C} c1_j, :func:`flwr_fedeval.rlwe.polys_to_bytes` (sent as is).
        contributors : list of int
            The node IDs of C (:meth:`sum_ciphertexts`).
        signatures : dict of str to bytes
            The members' signatures over C (:meth:`sign_contributors`).

        Returns
        -------
        ndarray of shape (k, L', n), uint64
            The unmasked plaintext of Σ_{j∈C} m_j at L' limbs
            (:meth:`flwr_fedeval.secagg.server.ShareSum.unmask`).

        Raises
        ------
        RoundAborted
            At ``"partial decryption"``: fewer than t signers of C are left, or a decryptor failed in
            each of the a attempts; at ``"mask recovery"``: a seed or mask key does not reconstruct.
            Every active set asked is in the round state's ``pdec_attempts``.
        """
        state = self._current()
        key_set = state.keys
        t = key_set.parameters.threshold
        aggregator = self._aggregator()
        c_names = tuple(key_set.name_of(n) for n in contributors)
        shares: ShareSum = aggregator.share_sum(c_names, c0.shape[0])
        lost: dict[int, str] = {}

        def check(node: int, reply: xmk.PdecReply) -> None:
            shares.add(key_set.name_of(node), reply.share, reply.seed_shares, reply.mask_shares)

        attempts = max(int(key_set.parameters.decryption_attempts), 1)
        for attempt in range(1, attempts + 1):
            listed = {int(n) for n in state.grid.get_node_ids()}
            lost.update({key_set.node_of(n): "left the SuperLink's node list before its partial decryption"
                         for n in signatures if key_set.node_of(n) not in listed | set(lost)})
            active = _active_set({n: sig for n, sig in signatures.items() if key_set.node_of(n) not in lost}, t)
            if len(active) < t:
                raise RoundAborted("partial decryption", {**lost, **{key_set.node_of(n): "fewer than t signers of C "
                                                                     "left to decrypt" for n in active}})
            state.pdec_attempts.append(active)
            # KAHE mode: each contributor's signed capsule c1 (one polynomial each), never a C1 of the server's
            kahe_mode = key_set.parameters.bulk == "kahe"
            capsule_c1s = tuple(aggregator.capsules[n][0] for n in contributors) if kahe_mode else ()
            capsule_signatures = tuple(aggregator.capsules[n][1] for n in contributors) if kahe_mode else ()
            request = xmk.PdecRequest(self.params.name, key_set.key_id, state.server_round, c_names,
                                      len(key_set.nodes), b"" if kahe_mode else c1,
                                      key_set.parameters.limbs,
                                      xmk.model_hash(state.arrays), active, tuple(signatures[n] for n in active),
                                      active, attempt, capsule_c1s, capsule_signatures)
            shares.start(attempt)
            _, failed = self._exchange_some("partial decryption", "decryption share",
                                            [key_set.node_of(n) for n in active], xmk.PDEC, request, check)
            if not failed:
                break
            lost.update(failed)
            if attempt == attempts:
                raise RoundAborted("partial decryption", {n: f"{r} (all {attempts} decryption attempts failed)"
                                                          for n, r in lost.items()})
            log(WARNING, "Round %d: decryptor(s) %s lost during the partial decryption (attempt %d of %d); "
                "asking the next signers of C", state.server_round, sorted(key_set.name_of(n) for n in failed),
                attempt, attempts)
        try:
            return shares.unmask(c0)
        except AggregationError as exc:
            raise RoundAborted(exc.step, dict.fromkeys(key_set.nodes, str(exc))) from None

    def decode(self, plaintext: np.ndarray, num_contributors: int | None = None) -> tuple[ArrayRecord, int]:
        """Step 4: decode Σ m = C0' + Σ D'_j minus the masks (:meth:`partial_decryptions`, at the key
        set's L' limbs, scale Δ / Q: :func:`flwr_fedeval.rlwe.compact.compact_combine_and_decode`'s rule),
        ``w ← w + Σ n_j·Δw_j / Σ n_j`` over the contributors.

        Returns ``(new global model, Σ n_j)``.

        Raises
        ------
        RoundAborted
            The decoded Σ n_j is not a valid count (< |C|, or not an integer) or the aggregate is not finite.
        """
        state = self._current()
        nodes = state.keys.nodes
        count = len(nodes) if num_contributors is None else num_contributors
        global_arrays = state.arrays.to_numpy_ndarrays()
        layout = WeightLayout.of(global_arrays)
        try:
            decoded = self._aggregator().decode(plaintext, count)
        except AggregationError as exc:
            raise RoundAborted(exc.step, dict.fromkeys(nodes, str(exc))) from None
        if decoded.clipped is not None:  # KAHE mode: the total decrypted from the integer slot
            self.clipped_values.append((state.server_round, decoded.clipped))
            if decoded.clipped:
                log(WARNING, "Round %d: %d values clipped to max_abs_value = %.4g in all (|n_i·Δw| beyond the "
                    "bound; the mean is biased): raise max_abs_value of XMKFedAvg / SecureAggregation",
                    state.server_round, decoded.clipped, self.protocol.max_abs_value)
        new_flat = layout.flatten(global_arrays)
        del global_arrays
        new_flat += decoded.mean_update
        total = decoded.total_examples
        del decoded
        if not np.isfinite(new_flat).all():
            raise RoundAborted("decoding", dict.fromkeys(nodes, "aggregate is not finite"))
        # the keys the global model came with (a PyTorch state_dict's names, a Keras list's "0", "1", ...)
        arrays = ArrayRecord({key: Array(a) for key, a in zip(state.arrays.keys(), layout.unflatten(new_flat))})
        return arrays, total

    # ------------------------------------------------------------ internals
    def _model_size(self) -> int:
        """d, the global model's weights (the update's length)."""
        return WeightLayout.of(self._current().arrays.to_numpy_ndarrays()).size

    def _aggregator(self) -> Aggregator:
        """The server party of the round's key set (:class:`~flwr_fedeval.secagg.server.Aggregator`), built
        when the first upload arrives (or here)."""
        state = self._current()
        if state.running is None:
            keys = state.keys
            state.running = Aggregator(keys.parameters, keys.names, keys.mask_keys, keys.transcript,
                                       state.server_round, self._model_size(), self.chunk_polys)
        return state.running

    def _record_abort(self, exc: RoundAborted) -> None:
        self._key_cache = {}  # no key set survives a failed attempt (DESIGN.md §8)
        rnd = self._round.server_round if self._round else -1
        self.aborted_attempts.append((rnd, exc.with_traceback(None)))  # its frames would hold the sums
        log(WARNING, "Round %d: secure aggregation aborted at %s: %d node(s) failed", rnd, exc.step, len(exc.failed))
        if exc.failures is None:  # an exchange's failures are logged by the exchange
            log_failures(f"Round {rnd}: XMKFedAvg", exc.step, exc.failed)

    def _current(self) -> _RoundState:
        """The state of the round in progress.

        Raises
        ------
        RuntimeError
            If no round is in progress (``configure_train`` has not run).
        """
        if self._round is None:
            raise RuntimeError("XMKFedAvg: no round in progress (configure_train has not run)")
        return self._round

    def _exchange_some(self, step: str, what: str, nodes: Iterable[int], protocol_step: Step,
                       request: Payload | None, check: Callable[[int, Any], Any], *, grid: PhaseGrid | None = None,
                       parsed: dict[int, Any] | None = None,
                       partial: bool = True) -> tuple[dict[int, Any], dict[int, str]]:
        """Send ``request`` to every node (over ``grid``, default the round's), parse every reply with
        ``protocol_step.reply.from_record(content, node=node)`` and ``check(node, reply)``; return
        ``({node: result} of the valid replies, {node: reason} of the others)`` (``partial``), or (not
        ``partial``) raise :class:`RoundAborted` naming each node that timed out, replied
        with an error, or sent a malformed ``what`` (a :class:`~flwr_fedeval.protocol.MalformedMessage`
        or a failed check: ``MALFORMED_REPLY``), through the shared
        :func:`~flwr_fedeval.strategies.base.exchange_replies`.

        Each reply is parsed and checked as it arrives and its content dropped (``on_reply``), so a
        ``check`` that folds the reply into a running sum keeps no more than one reply at a time;
        ``parsed`` holds results (or errors) of replies already parsed so (step 2's, in Flower's loop)."""
        state = self._current()
        reply_type = protocol_step.reply
        if reply_type is None:
            raise TypeError(f"step {protocol_step.message_type!r} has no reply type to parse")
        nodes = list(nodes)
        content = request.to_record() if request is not None else RecordDict()
        failures = Failures()
        results: dict[int, Any] = {} if parsed is None else parsed

        def run_check(node: int, reply: RecordDict) -> Any:
            try:
                return check(node, reply_type.from_record(reply, node=node))
            except (KeyError, ValueError, TypeError) as exc:
                return exc

        def on_reply(reply: Message) -> Message:
            node = int(reply.metadata.src_node_id)
            if not reply.has_error() and node in nodes and node not in results:
                results[node] = run_check(node, reply.content)
                reply.content = RecordDict()
            return reply

        def parse(node: int, reply: RecordDict) -> Any:
            result = results.pop(node) if node in results else run_check(node, reply)
            if isinstance(result, Exception):
                raise result
            return result

        valid = exchange_replies(state.grid if grid is None else grid, dict.fromkeys(nodes, content),
                                 protocol_step.message_type, parse, failures, step=step, what=what,
                                 timeout=self.protocol.step_timeout, label=f"Round {state.server_round}: XMKFedAvg",
                                 on_reply=on_reply)
        if grid is not None:  # step 2: the train replies came within Strategy.start's timeout, not ours
            for n, f in list(failures.items()):
                if f.code == ReplyCode.TIMEOUT:
                    failures[n] = replace(f, reason=f"no reply to {step} within the train timeout")
        failed = {n: f"{f.reason} [{code_name(f.code)}, code {f.code}]" for n, f in failures.items()}
        if failures and not partial:
            raise RoundAborted(step, failed, failures=failures)
        return valid, failed

    def _exchange(self, step: str, what: str, nodes: Iterable[int], protocol_step: Step,
                  request: Payload | None, check: Callable[[int, Any], Any], *, grid: PhaseGrid | None = None,
                  parsed: dict[int, Any] | None = None) -> list[Any]:
        """:meth:`_exchange_some` that raises :class:`RoundAborted` for any failure; the results in node order."""
        nodes = list(nodes)
        valid, _ = self._exchange_some(step, what, nodes, protocol_step, request, check, grid=grid, parsed=parsed,
                                       partial=False)
        return [valid[n] for n in nodes]

    def _start_attempt(self, nodes: list[int]) -> list[Message]:
        """Steps 1a-1c with ``nodes`` (again without the failing ones, at most ``max_attempts`` times:
        nobody has trained yet, so a re-key leaks nothing), then the step-2 messages."""
        state = self._current()
        for attempt in range(1, self.protocol.max_attempts + 1):
            if len(nodes) < self.min_train_nodes:
                raise RoundAborted(
                    "sampling",
                    {n: f"only {len(nodes)} clients, a key set needs {self.min_train_nodes}" for n in nodes},
                )
            state.tried.update(nodes)
            try:
                with self.timer.step("step 1 (key generation)"):
                    key_set = self.keygen(nodes)
                    state.key_set = key_set
                    state.inboxes = self.share_keys(key_set)
                break
            except RoundAborted as exc:
                if attempt == self.protocol.max_attempts:
                    raise
                self._record_abort(exc)
                remaining = [n for n in nodes if n not in exc.failed]
                nodes = sorted(remaining + self._newcomers(remaining, len(exc.failed)))
        self.key_sets.append({"round": int(state.server_round), "key_set": str(key_set.key_id),
                              "nodes": [int(n) for n in key_set.nodes]})
        log(INFO, "configure_train: key set %s of %d clients ready (t = %d)", key_set.key_id, len(key_set.nodes),
            key_set.parameters.threshold)
        state.running, state.train_results = None, {}
        state.sent = self.train_messages(key_set)
        return state.sent

    def _finish_attempt(self, replies: list[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """Steps 2 (replies), 2b, 3 and 4 of the round (no retry)."""
        state = self._current()
        key_set = state.keys
        n_left, n_lost = len(self.left_out), len(self.lost_after_upload)
        with self.timer.step("step 2 (sum of the encrypted updates)"):
            total, metrics, contributors = self.sum_ciphertexts(replies)
        if len(contributors) < len(key_set.nodes):
            self._key_cache = {}  # mask keys of K∖C are reconstructed: that key set is not used again

        def by_name(entries: list[tuple[int, dict[int, str]]]) -> dict[str, str]:
            return {key_set.name_of(n): reason for _, failed in entries for n, reason in failed.items()
                    if n in key_set.nodes}

        record = {"round": int(state.server_round), "key_set": str(key_set.key_id),
                  "threshold": key_set.parameters.threshold,
                  "members": sorted(key_set.names), "contributors": sorted(key_set.name_of(n) for n in contributors),
                  "num_contributors": len(contributors), "left_out": by_name(self.left_out[n_left:]),
                  "lost_after_upload": {}, "signers": [], "decryptors": [], "decryption_attempts": [],
                  "completed": False}
        self.contributor_sets.append(record)
        try:
            with self.timer.step("step 2b (contributor set)"):
                signatures = self.sign_contributors(contributors)
        finally:
            record["lost_after_upload"] = by_name(self.lost_after_upload[n_lost:])
        record["signers"] = sorted(signatures)
        record["decryptors"] = list(_active_set(signatures, key_set.parameters.threshold))
        c0, c1 = total.c0, total.c1
        del total  # C1 is only sent; C0 is added to the shares' sum
        state.pdec_attempts = []
        try:
            with self.timer.step("step 3 (partial decryption)"):
                plaintext = self.partial_decryptions(c0, c1, contributors, signatures)
        finally:
            record["decryption_attempts"] = [list(a) for a in state.pdec_attempts]
            if state.pdec_attempts:
                record["decryptors"] = list(state.pdec_attempts[-1])
        del c0, c1
        with self.timer.step("step 4 (decoding)"):
            arrays, total_examples = self.decode(plaintext, len(contributors))
        record["completed"] = True
        log(INFO, "aggregate_train: %d encrypted updates summed and decrypted by %d members (Σ n_i = %d)",
            len(contributors), len(signatures), total_examples)
        agg_metrics = self._mean_metrics(metrics)
        agg_metrics["num-examples"] = total_examples
        agg_metrics["num-clients"] = len(contributors)
        return arrays, agg_metrics

    def _newcomers(self, remaining: list[int], lost: int) -> list[int]:
        """Up to ``lost`` nodes that joined during this round (e.g. a restarted SuperNode under a new ID),
        for the next attempt; none whose known identity a remaining member already has.

        Identities are those a :class:`~flwr_fedeval.strategies.collect.Rejoin` of the grid proved
        (roster names); the clients check every member of a key set against the roster themselves
        and refuse one that lists a member twice.
        """
        state = self._current()
        if lost <= 0:
            return []
        rejoin = rejoin_of(state.grid)
        identities = {} if rejoin is None else rejoin.identities
        taken = {identities[n] for n in remaining if n in identities}
        out = []
        for node in sorted(int(n) for n in state.grid.get_node_ids()):
            if node in state.known or node in state.tried or node in remaining:
                continue
            ident = identities.get(node)
            if ident is not None and ident in taken:
                continue
            if ident is not None:
                taken.add(ident)
            out.append(node)
        out = out[:lost]
        if out:
            log(INFO, "Round %d: node(s) %s joined during the round; taken into the next attempt",
                state.server_round, out)
        return out

    @staticmethod
    def _mean_metrics(records: list[MetricRecord]) -> MetricRecord:
        """Unweighted mean of the clients' metrics (n_i stays encrypted)."""
        keys = set.intersection(*(set(r.keys()) for r in records)) if records else set()
        out = MetricRecord()
        for k in sorted(keys):
            values = [r[k] for r in records]
            if all(isinstance(v, (int, float)) for v in values):
                out[k] = float(np.mean(values))
        return out
