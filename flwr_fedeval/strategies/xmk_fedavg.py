"""FedAvg under xMK-CKKS multi-key homomorphic encryption.

Implementation based on Walskaar, Tran, Catak 2023 (Eqs. 1-11) and Ma et al.
2022 (xMK-CKKS), on Flower's Message API (DESIGN.md §3), hardened against a
deviating server (DESIGN.md §7): signed commit-then-reveal key sets
(:mod:`flwr_fedeval.rlwe.keyset`), pairwise zero-sum masks and self-masks
(:mod:`flwr_fedeval.rlwe.masking`, :mod:`flwr_fedeval.rlwe.selfmask`, Bonawitz
et al. 2017) and t-out-of-N threshold decryption over a signed contributor set
(:mod:`flwr_fedeval.rlwe.threshold`, Mouchet et al. 2021), without retries
(issue 21). The server sees only the sum of the contributors' encrypted,
example-weighted updates and ``Σ n_i``; no single party can decrypt one
client's update or a partial sum, and it holds one running sum, not M
ciphertexts.
The server is trusted for nothing: every check is the clients'
(:mod:`flwr_fedeval.clients.xmkckks`); the checks here only name a failing
node early.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
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
from flwr_fedeval.rlwe import capsule, compact, kahe, keyset, masking, selfmask
from flwr_fedeval.rlwe import serialization as ser
from flwr_fedeval.rlwe import threshold as shamir
from flwr_fedeval.secagg import BULK_MODES, KeySetParameters, ProtocolParameters, protocol_keywords
from flwr_fedeval.strategies.base import (
    Failures,
    ReadableFailuresMixin,
    StepTimer,
    code_name,
    exchange_replies,
    log_failures,
    replies_by_node,
)
from flwr_fedeval.strategies.collect import Collected, DetectingGrid, OnReply, collect
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
    running: _RunningSum | None = None  # Σ c_j of the attempt in progress, folded as the replies arrive
    inboxes: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)  # step 1c: name -> (sender, box)
    train_results: dict[int, Any] = field(default_factory=dict)  # node -> its reply's metrics, or the error
    pdec_attempts: list[tuple[str, ...]] = field(default_factory=list)  # step 3: every active set A asked
    kahe_sum: kahe.KaheSum | None = None  # KAHE mode: Σ of the KAHE ciphertexts, folded as the replies arrive
    capsules: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # KAHE mode: node -> (c1, signature)

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


class _Received:
    """A grid view whose exchange returns replies already received: the step-2 (``train``) replies,
    which Flower's ``Strategy.start`` collected, checked by the same
    :func:`~flwr_fedeval.strategies.base.exchange_replies` as the other steps.

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


class _OnReplyGrid:
    """A grid view whose exchanges pass ``on_reply`` to :func:`~flwr_fedeval.strategies.collect.collect`:
    each reply is parsed (and its bulk folded into a running sum) as it arrives, then dropped."""

    def __init__(self, grid: Any, on_reply: OnReply) -> None:
        self._grid = grid
        self._on_reply = on_reply

    def collect_replies(self, messages: Iterable[Message], *, timeout: float | None = None) -> Collected:
        return collect(self._grid, messages, timeout=timeout, on_reply=self._on_reply)


class _FoldingGrid:
    """The grid :meth:`XMKFedAvg.start` hands to Flower's loop: the ``train`` step's replies (step 2) are
    folded into the round's running sum as they arrive (:meth:`XMKFedAvg.fold_train_reply`) and only their
    metrics are kept, so the server never holds more than a few ciphertexts at once; everything else is
    delegated."""

    def __init__(self, grid: Any, strategy: Any) -> None:
        self._grid = grid
        self._strategy = strategy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def get_node_ids(self) -> Iterable[int]:
        return self._grid.get_node_ids()

    def collect_replies(self, messages: Iterable[Message], *, timeout: float | None = None,
                        on_reply: OnReply | None = None) -> Collected:
        return collect(self._grid, messages, timeout=timeout, on_reply=on_reply)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        state = self._strategy._round
        train = state is not None and any(m is s for m in messages for s in state.sent)
        on_reply = self._strategy.fold_train_reply if train else None
        return self.collect_replies(messages, timeout=timeout, on_reply=on_reply).replies


def _active_set(signatures: dict[str, bytes], t: int) -> tuple[str, ...]:
    """A of step 3: the first t signers of C by name (a loss outside A costs nothing)."""
    return tuple(sorted(signatures)[:t])


#: Polynomials per range when the server folds, rebuilds masks and decodes (issue 21 item 3): ranges
#: of a few MB instead of whole arrays of hundreds of MB (64 × 4096 coefficients × L limbs).
CHUNK_POLYS = 64


def _add_ranges(accs: Sequence[tuple[np.ndarray, np.ndarray]],
                ranges: Callable[[], Iterator[tuple[Any, ...]]]) -> None:
    """acc[start:stop] ← acc[start:stop] + part mod q for every range ``(start, part, ...)`` of ``ranges()``
    (one part per ``(acc, q_col)`` of ``accs``; reduced accumulators, parts reduced uint64, used as scratch).

    ``ranges()`` checks each range before yielding it; if one raises ``ValueError``, the ranges already
    added are read again and subtracted (exactly: arithmetic mod q), so the accumulators are left as
    they were, then the error is raised: nothing is lost and nothing half-added.
    """

    def fold(start: int, parts: Sequence[np.ndarray], negate: bool) -> None:
        for (acc, q), part in zip(accs, parts):
            rows = acc[start : start + part.shape[0]]
            if negate:
                np.subtract(q, part, out=part)  # −x mod q = q − x
            np.add(part, rows, out=part)  # < 2q < 2^32: no overflow in uint64
            np.minimum(part, part - q, out=rows, casting="unsafe")  # part - q wraps around below q: mod q

    done = 0
    try:
        for start, *parts in ranges():
            fold(start, parts, False)
            done = start + parts[0].shape[0]
            del parts  # not alive while the next range is read
    except ValueError:
        for start, *parts in ranges():
            if start >= done:
                break
            fold(start, parts, True)
        raise


class _RunningSum:
    """Σ c_j of step 2 (Eq. 3) over compact ciphertexts (C0' at L' limbs, C1 at L), folded one at a
    time straight from the wire bytes, ``chunk_polys`` polynomials at a time, kept reduced in uint32
    (residues < 2^31: half the bytes of a parsed ciphertext); ``folded`` maps each node to what its
    reply carried besides the ciphertext."""

    def __init__(self, params: rlwe.ParameterSet, limbs: int, num_polys: int, chunk_polys: int = CHUNK_POLYS) -> None:
        self.params = params
        self.limbs = limbs
        self.level = compact.level_parameter_set(params, limbs)
        self.num_polys = num_polys
        self.chunk_polys = chunk_polys
        self.c0: np.ndarray | None = None
        self.c1: np.ndarray | None = None
        self.folded: dict[int, Any] = {}

    def add(self, node: int, data: bytes | memoryview, extra: Any = None) -> None:
        """Check and add one ciphertext's bytes (:meth:`~flwr_fedeval.rlwe.compact.CompactCiphertext.to_bytes`).

        Every check of :meth:`~flwr_fedeval.rlwe.compact.CompactCiphertext.from_bytes` is made: the
        headers and lengths before anything is added (:func:`~flwr_fedeval.rlwe.compact.compact_count`),
        the residues of each range of polynomials before that range is added
        (:func:`~flwr_fedeval.rlwe.compact.compact_rows`). If a later range is malformed, the ranges
        already added are subtracted again (exactly: arithmetic mod q), so a refused ciphertext leaves
        the sum as it was.

        Raises
        ------
        ValueError
            The node's second ciphertext in this round, or a malformed ciphertext (naming the field),
            or one of another size than the model's.
        """
        if node in self.folded:
            raise ValueError(f"node {node}: a second ciphertext in one round")
        count = compact.compact_count(data, self.params, self.limbs)
        if count != self.num_polys:
            raise ValueError(f"{count} polynomials, expected {self.num_polys}")
        fresh = self.c0 is None or self.c1 is None
        if fresh:
            self.c0 = np.zeros((count, self.limbs, self.params.n), dtype=np.uint32)
            self.c1 = np.zeros((count, self.params.limbs, self.params.n), dtype=np.uint32)
        try:
            _add_ranges(((self.c0, self.level.ring.q_col), (self.c1, self.params.ring.q_col)),
                        lambda: compact.compact_rows(data, self.params, self.limbs, chunk_polys=self.chunk_polys))
        except ValueError:
            if fresh:
                self.c0 = self.c1 = None
            raise
        self.folded[node] = extra

    def _check_total(self, nodes: Iterable[int]) -> None:
        nodes = set(nodes)
        if self.c0 is None or self.c1 is None or nodes != set(self.folded):
            raise ValueError(f"the running sum holds nodes {sorted(self.folded)}, not {sorted(nodes)}")

    def total(self, nodes: Iterable[int]) -> _CiphertextSum:
        """C = Σ_{j ∈ nodes} c_j: C0' (uint32, the decryption's accumulator) and C1's bytes
        (:func:`flwr_fedeval.rlwe.polys_to_bytes`, packed a range at a time from the uint32 sum).
        The running sum is released.

        Raises
        ------
        ValueError
            If ``nodes`` are not exactly the folded nodes.
        """
        self._check_total(nodes)
        assert self.c0 is not None and self.c1 is not None
        c0, self.c0 = self.c0, None
        params, count = self.params, self.num_polys
        header = ser.pack_header(ser.KIND_POLYNOMIALS, params, count)
        out = bytearray(len(header) + ser.packed_size(params, count, 1))
        out[: len(header)] = header
        payload = memoryview(out)[len(header):]
        for start in range(0, count, self.chunk_polys):
            ser.pack_rows_into(params, payload, count, start, self.c1[start : start + self.chunk_polys])
        del payload
        self.c1 = None
        return _CiphertextSum(c0, bytes(out))


@dataclass(frozen=True, eq=False)
class _CiphertextSum:
    """C = Σ_{j∈C} c_j of step 2 as step 3 uses it: C0' of shape (k, L', n) uint32 (reduced mod q'), C1 as
    :func:`flwr_fedeval.rlwe.polys_to_bytes` (sent to the decryptors as is)."""

    c0: np.ndarray
    c1: bytes


class XMKFedAvg(ReadableFailuresMixin, FedAvg):
    """Weighted FedAvg whose client updates are aggregated under xMK-CKKS.

    Each round (issue 21: no retries): (1a) ``query.xmk_keygen`` to the sampled
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
        self.key_sets: list[dict] = []
        #: Every round that reached the contributor set, by roster identity (see Attributes).
        self.contributor_sets: list[dict] = []

    # ------------------------------------------------------------------ info
    def start(self, grid: Grid, *args: Any, **kwargs: Any) -> Any:
        """Flower's ``Strategy.start`` over a grid that folds each ``train`` reply into the round's running
        sum as it arrives (:meth:`fold_train_reply`): the server holds one model-sized sum and the
        replies in flight, not M ciphertexts (issue 21 item 3)."""
        if not callable(getattr(grid, "collect_replies", None)):
            grid = DetectingGrid(grid)
        # not super(): the checkpointing loop calls this with a view of the strategy as ``self``
        return ReadableFailuresMixin.start(self, _FoldingGrid(grid, self), *args, **kwargs)

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
            state.kahe_sum = None
            state.capsules = {}

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
        """Step 2, per reply as it arrives (``on_reply`` of the train exchange): check the ciphertext and
        add it into the round's running sum (Eq. 3) a range of polynomials at a time, straight from the
        message's bytes (no parsed copy); the reply is kept without its bulk.

        A reply to no request of this attempt, or an error reply, is kept as it is; a malformed one
        is kept stripped, its error stored for :meth:`sum_ciphertexts` (which names the node).
        """
        state = self._current()
        sent = {m.metadata.message_id: int(m.metadata.dst_node_id) for m in state.sent}
        node = sent.get(reply.metadata.reply_to_message_id)
        if reply.has_error() or node is None:
            return reply
        try:
            parsed = xmk.TrainReply.from_record(reply.content, node=node)
            reply.content = RecordDict()  # the ciphertext is a view into the message's buffer: one copy
            state.train_results[node] = self._fold_ciphertext(node, parsed)
            del parsed
        except (KeyError, ValueError, TypeError, kahe.KaheError) as exc:
            state.train_results[node] = exc
        reply.content = RecordDict()
        return reply

    def _fold_ciphertext(self, node: int, reply: xmk.TrainReply) -> MetricRecord | None:
        """Check one step-2 reply and add it into the round's running sums; return the reply's metrics.

        CKKS mode: the ciphertext into the running sum (canonical compact encoding, c0 at the key set's L',
        c1 at L, of the model's size: the checks of
        :meth:`flwr_fedeval.rlwe.compact.CompactCiphertext.from_bytes`, made a range of polynomials at a
        time by :meth:`_RunningSum.add`; a malformed ciphertext adds nothing). KAHE mode: the capsule is
        parsed strictly first (one polynomial), then the KAHE ciphertext is added into the KAHE sum
        (:meth:`flwr_fedeval.rlwe.kahe.KaheSum.add`, which adds nothing from a malformed one), then the
        capsule into the capsule sum; the capsule's c1 and its signature are kept for step 3.

        Raises
        ------
        ValueError, flwr_fedeval.rlwe.kahe.KaheError
            The ciphertext or capsule is malformed, at another level, or of another size, or it is the
            node's second in this round.
        """
        state = self._current()
        keys = state.keys
        if keys.parameters.bulk != "kahe":
            if state.running is None:
                num_polys = -(-self._plaintext_length() // self.params.n)
                state.running = _RunningSum(self.params, keys.parameters.limbs, num_polys, self.chunk_polys)
            state.running.add(node, reply.ciphertext, reply.metrics)
            return reply.metrics
        assert keys.parameters.kahe is not None
        if reply.capsule is None or not reply.capsule_signature:
            raise ValueError("KAHE mode: the reply carries no key capsule or no signature over its c1")
        if state.running is None:
            state.running = _RunningSum(self.params, keys.parameters.limbs, capsule.CAPSULE_POLYS, self.chunk_polys)
        if node in state.running.folded:
            raise ValueError(f"node {node}: a second ciphertext in one round")
        parsed = compact.CompactCiphertext.from_bytes(bytes(reply.capsule), self.params, keys.parameters.limbs)
        if parsed.c1.shape[0] != capsule.CAPSULE_POLYS:
            raise ValueError(f"the key capsule has {parsed.c1.shape[0]} polynomials, expected {capsule.CAPSULE_POLYS}")
        c1 = rlwe.polys_to_bytes(self.params, parsed.c1)
        if state.kahe_sum is None:
            state.kahe_sum = kahe.KaheSum(keys.parameters.kahe, kahe.public_seed(keys.transcript, state.server_round),
                                          self._plaintext_length())
        state.kahe_sum.add(reply.ciphertext)
        state.running.add(node, reply.capsule, reply.metrics)  # parsed above: cannot fail now
        state.capsules[node] = (c1, bytes(reply.capsule_signature))
        return reply.metrics

    def sum_ciphertexts(self, replies: list[Message]) -> tuple[_CiphertextSum, list[MetricRecord], list[int]]:
        """Step 2 (replies) and Eq. 3: the sum of the well-formed fresh ciphertexts, one per contributor.

        The ciphertexts were folded into a running sum as they arrived (:meth:`fold_train_reply`, in
        :meth:`start`'s loop); a reply that was not (``aggregate_train`` called with the replies
        themselves) is folded here, one at a time. A member that failed, timed out or sent a
        malformed ciphertext is left out of the contributor set (recorded in ``left_out``), not retried.

        Returns
        -------
        (_CiphertextSum, list of MetricRecord, list of int)
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

        received = _Received(replies_by_node(state.sent, replies))
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
        graph = masking.mask_neighbours(key_set.names, self.protocol.mask_degree, key_set.transcript)
        parts = masking.induced_components(graph, [key_set.name_of(n) for n in contributors])
        if len(parts) > 1:
            reason = f"the mask graph induced on the contributor set is not connected ({parts}): the members refuse"
            raise RoundAborted("contributor set", dict.fromkeys(contributors, reason))
        assert state.running is not None  # at least one ciphertext was folded
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
            round(Σ_{j∈C} m_j / Q) mod q' plus bounded noise (Q = the dropped primes; 1 if L' = L).

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
        order = sorted(key_set.names)  # the members' points: 1..N in name order
        points = dict(zip(order, shamir.member_points(len(order), params=self.params)))
        c_names = tuple(key_set.name_of(n) for n in contributors)
        dropped = tuple(name for name in order if name not in c_names)
        level = compact.level_parameter_set(self.params, key_set.parameters.limbs)
        ring = level.ring
        seed_shares: dict[str, dict[int, bytes]] = {name: {} for name in c_names}
        key_shares: dict[str, dict[int, bytes]] = {name: {} for name in dropped}
        lost: dict[int, str] = {}
        # Σ_{j∈A} D_j in its own accumulator (the masks cancel only over all of A; C0 stays intact for the next
        # attempt), kept reduced in uint32 as the running sum of step 2: half the bytes of C0
        acc = np.zeros(c0.shape, dtype=np.uint32)

        sent_at = key_set.parameters.limbs  # the level of the attempt in progress: L' for k = 1, L for a retry

        def rows_at_l_prime(share: bytes | memoryview) -> Iterator[tuple[int, np.ndarray]]:
            """The share's ranges at L' limbs: as sent in attempt 1, switched on arrival in a retry (one
            rounding term per share, as attempt 1's: the masks still cancel, Σ m_j ≡ 0 mod q)."""
            for start, rows in compact.share_rows(share, self.params, sent_at, chunk_polys=self.chunk_polys):
                yield start, (rows if sent_at == key_set.parameters.limbs
                              else compact.switch_modulus(self.params, rows, key_set.parameters.limbs))

        def check(node: int, reply: xmk.PdecReply) -> None:
            count = compact.share_count(reply.share, self.params, sent_at)  # strict, at the attempt's level
            if count != acc.shape[0]:
                raise ValueError(f"share has {count} polynomials, expected {acc.shape[0]}")
            if len(reply.seed_shares) != len(c_names) or len(reply.mask_shares) != len(dropped):
                raise ValueError("recovery shares are not one per contributor and one per dropped member")
            # Eq. 5, a range of polynomials at a time straight from the bytes (a malformed share adds nothing)
            _add_ranges(((acc, ring.q_col),), lambda: rows_at_l_prime(reply.share))
            x = points[key_set.name_of(node)]
            for name, part in zip(c_names, reply.seed_shares):  # the same Shamir shares in every attempt
                seed_shares[name][x] = part
            for name, part in zip(dropped, reply.mask_shares):
                key_shares[name][x] = part

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
            capsule_c1s = tuple(state.capsules[n][0] for n in contributors) if key_set.parameters.bulk == "kahe" else ()
            capsule_signatures = (tuple(state.capsules[n][1] for n in contributors)
                                  if key_set.parameters.bulk == "kahe" else ())
            request = xmk.PdecRequest(self.params.name, key_set.key_id, state.server_round, c_names,
                                      len(key_set.nodes), c1 if key_set.parameters.bulk != "kahe" else b"",
                                      key_set.parameters.limbs,
                                      xmk.model_hash(state.arrays), active, tuple(signatures[n] for n in active),
                                      active, attempt, capsule_c1s, capsule_signatures)
            sent_at = shamir.share_limbs(self.params, key_set.parameters.limbs, attempt)
            acc.fill(0)
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
        np.add(c0, acc, out=c0)  # C0' + Σ_{j∈A} D'_j (Eq. 5), in C0's buffer (both < 2^31: no overflow)
        del acc
        acc = c0
        np.minimum(acc, acc - ring.q_col, out=acc, casting="unsafe")  # < 2q -> mod q (x - q wraps around below q)
        # −Σ_{i∈C} u_i (u_i = PRG(seed_i)) and the pairwise masks between C and K∖C, expanded at L limbs a
        # range of polynomials at a time (the clients' streams, :class:`~flwr_fedeval.rlwe.masking.MaskSum`),
        # each range switched to L' once and added into the accumulator
        try:
            pairs = [(selfmask.self_mask_key(shamir.combine_bytes(seed_shares[name], threshold=t)), np.subtract)
                     for name in c_names]
            if dropped:
                mask_keys = dict(zip(key_set.names, key_set.mask_keys))
                graph = masking.mask_neighbours(order, self.protocol.mask_degree, key_set.transcript)
                context = masking.mask_context(key_set.transcript, state.server_round)
                for name in dropped:
                    peers = {j: mask_keys[j] for j in graph[name] if j in c_names}
                    if not peers:
                        continue
                    private = shamir.combine_bytes(key_shares[name], threshold=t)
                    pairs += masking.mask_pairs(own_name=name, own_private=private, peers=peers, context=context)
            masks = masking.MaskSum(self.params, pairs, acc.shape[0])
        except (ValueError, shamir.ThresholdError) as exc:
            raise RoundAborted("mask recovery", dict.fromkeys(key_set.nodes, f"{type(exc).__name__}: {exc}")) from None
        chunk = masks.rows * -(-self.chunk_polys // masks.rows)  # whole PRG steps per range
        zero = np.zeros((chunk, self.params.limbs, self.params.n), dtype=np.uint64)
        for start in range(0, acc.shape[0], chunk):
            rows = acc[start : start + chunk]
            correction = masks.next_rows(zero[: rows.shape[0]])
            # one rounding, < 1 unit of q'
            switched = compact.switch_modulus(self.params, correction, key_set.parameters.limbs)
            np.add(switched, rows, out=switched)  # < 2q' (uint64)
            np.minimum(switched, switched - ring.q_col, out=rows, casting="unsafe")  # mod q' (wraps around below q')
        return acc.astype(np.uint64, copy=False)

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
        layout = WeightLayout.of(state.arrays.to_numpy_ndarrays())
        scale_bits = state.keys.parameters.scale_bits or self.protocol.scale_bits_for(len(nodes))
        limbs = state.keys.parameters.limbs or self.params.limbs
        level = compact.level_parameter_set(self.params, limbs)
        kahe_mode = state.keys.parameters.bulk == "kahe"
        length = self.params.n if kahe_mode else self._plaintext_length()  # KAHE mode: the capsule sum, K_C
        level.ring.check(plaintext, "plaintext")
        if plaintext.ndim != 3 or length > plaintext.shape[0] * self.params.n:
            raise ValueError(f"plaintext of shape {plaintext.shape} does not hold {length} values")
        decoded = np.empty(length, dtype=np.float64)
        step = self.chunk_polys * self.params.n
        for start in range(0, length, step):  # a range of polynomials at a time: CRT temporaries stay small
            part = plaintext[start // self.params.n : -(-min(start + step, length) // self.params.n)]
            decoded[start : start + step] = rlwe.decode(level, part, scale_bits=scale_bits,
                                                        length=min(step, length - start))
        decoded *= float(compact.dropped_modulus(self.params, limbs))
        if kahe_mode:
            decoded, total_examples = self._decode_kahe(decoded, nodes)
        else:
            total_examples = decoded[-1]
            decoded = decoded[:-1]
        if not (np.isfinite(total_examples) and total_examples >= count - 0.5
                and abs(total_examples - round(total_examples)) < 1e-3):
            raise RoundAborted("decoding",
                               dict.fromkeys(nodes, f"decoded Σ n_i = {total_examples!r} is not a valid count"))
        mean_update = decoded
        mean_update /= round(total_examples)
        new_flat = layout.flatten(state.arrays.to_numpy_ndarrays())
        new_flat += mean_update
        del decoded, mean_update
        if not np.isfinite(new_flat).all():
            raise RoundAborted("decoding", dict.fromkeys(nodes, "aggregate is not finite"))
        # the keys the global model came with (a PyTorch state_dict's names, a Keras list's "0", "1", ...)
        arrays = ArrayRecord({key: Array(a) for key, a in zip(state.arrays.keys(), layout.unflatten(new_flat))})
        return arrays, int(round(total_examples))

    def _decode_kahe(self, key_sum: np.ndarray, nodes: Sequence[int]) -> tuple[np.ndarray, float]:
        """KAHE mode, step 4: round K_C = Σ_{i∈C} k_i from the decrypted capsule sum and decode the KAHE sum
        (Σ_C c_j − a_j·K_C = Δ·Σ x_j + Σ e_j). Returns ``(Σ_C clip(n_i·Δw_i) (float64, the weights'
        length), Σ_C n_i)``; warns with the total of clipped values (decrypted from the integer slot).

        Raises
        ------
        RoundAborted
            At ``"decoding"``: a coefficient of K_C is more than 1/4 from an integer (a wrong rounding
            would be a silently wrong model: the round is aborted, the model unchanged), or the KAHE sum
            does not decode.
        """
        state = self._current()
        assert state.kahe_sum is not None
        try:
            rounded = kahe.round_key_sum(key_sum)
            sums, integers = state.kahe_sum.decode(rounded)
        except kahe.KaheError as exc:
            raise RoundAborted("decoding", dict.fromkeys(nodes, f"the key sum of the capsules does not decode: "
                                                                f"{exc}")) from None
        total_examples, clipped = int(integers[0]), int(integers[1])
        self.clipped_values.append((state.server_round, clipped))
        if clipped:
            log(WARNING, "Round %d: %d values clipped to max_abs_value = %.4g in all (|n_i·Δw| beyond the bound; "
                "the mean is biased): raise max_abs_value of XMKFedAvg / SecureAggregation", state.server_round,
                clipped, self.protocol.max_abs_value)
        return np.asarray(sums, dtype=np.float64), float(total_examples)

    # ------------------------------------------------------------ internals
    def _plaintext_length(self) -> int:
        """Encoded values per update: every weight and n_i (CKKS mode), every weight (KAHE mode: n_i is an
        integer slot)."""
        state = self._current()
        size = WeightLayout.of(state.arrays.to_numpy_ndarrays()).size
        return size if state.keys.parameters.bulk == "kahe" else size + 1

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
                       request: Payload | None, check: Callable[[int, Any], Any], *, grid: Any = None,
                       parsed: dict[int, Any] | None = None, partial: bool = True) -> tuple[dict[int, Any], dict]:
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
        nodes = list(nodes)
        content = request.to_record() if request is not None else RecordDict()
        failures = Failures()
        results: dict[int, Any] = {} if parsed is None else parsed

        def run_check(node: int, reply: RecordDict) -> Any:
            try:
                return check(node, protocol_step.reply.from_record(reply, node=node))
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

        valid = exchange_replies(_OnReplyGrid(state.grid if grid is None else grid, on_reply),
                                 dict.fromkeys(nodes, content),
                                 protocol_step.message_type, parse, failures, step=step, what=what,
                                 timeout=self.protocol.step_timeout, label=f"Round {state.server_round}: XMKFedAvg")
        if grid is not None:  # step 2: the train replies came within Strategy.start's timeout, not ours
            for n, f in list(failures.items()):
                if f.code == ReplyCode.TIMEOUT:
                    failures[n] = replace(f, reason=f"no reply to {step} within the train timeout")
        failed = {n: f"{f.reason} [{code_name(f.code)}, code {f.code}]" for n, f in failures.items()}
        if failures and not partial:
            raise RoundAborted(step, failed, failures=failures)
        return valid, failed

    def _exchange(self, step: str, what: str, nodes: Iterable[int], protocol_step: Step,
                  request: Payload | None, check: Callable[[int, Any], Any], *, grid: Any = None,
                  parsed: dict[int, Any] | None = None) -> list:
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
        state.running, state.train_results, state.kahe_sum, state.capsules = None, {}, None, {}
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
        state.running = None
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
        rejoin = getattr(state.grid, "rejoin", None)
        identities = getattr(rejoin, "identities", {}) or {}
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
