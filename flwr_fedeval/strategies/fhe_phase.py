"""FHE federated AUC as an evaluation phase (server side).

Implementation based on Baykara, Ünal, Akgün (2025), "Enabling
Privacy-preserving Model Evaluation in Federated Learning via Fully
Homomorphic Encryption", §IV-C (semi-honest aggregator) and §IV-D
(malicious aggregator); DESIGN.md §4. The protocol steps are in
:mod:`flwr_fedeval.fhe.auc` and :mod:`flwr_fedeval.fhe.auc_malicious`, the
key relay in :mod:`flwr_fedeval.keyshare`, the client handlers in
:mod:`flwr_fedeval.clients.fhe_handlers`, the messages (step table, request and reply
payloads) in :mod:`flwr_fedeval.protocol.fhe_auc`. Every reply is parsed with its payload's
``from_record``; a :class:`~flwr_fedeval.protocol.MalformedMessage` is a malformed reply of
that node (``ReplyCode.MALFORMED_REPLY``, named in ``AUCPhaseResult.failed``). The state of
one run (session, key holder, public context, participants, counts) is an :class:`FHERun`.

=====  ===========================  ==============================================
step   message type                 what
=====  ===========================  ==============================================
1      ``query.fhe_pubkey``         every client: X25519 key pair, public key up
2      ``query.fhe_keygen``         key holder (picked at random): CKKS keys and
                                    common seed; public context + one sealed
                                    bundle per other client up
3–4    ``evaluate.fhe_counts``      global model, decision points, the sealed
                                    bundle relayed; encrypted counts up
5      (server)                     aggregate with the **public** context only
6      ``query.fhe_result``         masked result down; clients decrypt, divide,
                                    verify (malicious) and report if configured
=====  ===========================  ==============================================

The server never holds a secret key: it loads the key holder's public
context and refuses it if it carries one; the bundles are AES-GCM sealed
for their recipients (X25519 + HKDF) and opaque to the server. Every reply
is checked before use (public keys, context, every ciphertext deserialised
under the public context); failing nodes are named in the log and in
``AUCPhaseResult.failed``.

Participants: who takes part is not the server's word. At step 2 the
key holder signs the ordered list of the roster members it sealed the secret
context to, itself included (:class:`~flwr_fedeval.protocol.fhe_auc.ParticipantList`);
the server relays that list with every step-3–4 request and each client derives
its party index and the party count from it (and binds its digest into the
malicious protocol's randomness). The participants of steps 3–6 are exactly the
listed nodes.

Dropouts: a node lost before step 2 is left out (nothing of its test data was
used). A participant lost at steps 3–4 makes the phase fail
(:class:`FHEPhaseFailedError`, the failures recorded): there is no re-run over
another subset, since two evaluations of one model over different subsets give
their difference (and a deviating server could fake the loss); the clients
refuse a second evaluation of the same model anyway (node config
``fedeval-evaluations-per-model``, default 1).

Who learns the AUC: the clients. With ``share_auc_with_server`` the server
expects the clients to report it; each client decides with its node policy
(``fedeval-share-auc``, default false; :mod:`flwr_fedeval.clients.policy`);
otherwise ``AUCPhaseResult.auc`` is ``nan``,
``details["auc_known_to"] == "clients"``, ``details["withheld_by"]`` lists the nodes that
replied "not shared", and ``str(result)`` (logged as a WARNING) says "not shared by policy"
with the command that changes the policy (:func:`flwr_fedeval.reporting.auc_summary`).
A resolution bound above 0.01 is logged as a WARNING with the fix (logit-spaced decision points). A client whose
verification fails (malicious protocol) replies ``TamperingDetectedError``;
the phase then raises :class:`TamperingReportedError` naming those clients.

Count encoding: every client reports a power-of-two upper bound of its
test-set size at step 1; their sum is the public pooled bound ``max_rows``
from which every client derives the count scale ``K``
(:class:`~flwr_fedeval.fhe.auc.FHEAUCConfig`); a client whose counts exceed
it refuses.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from logging import ERROR, INFO, WARNING
from numbers import Integral, Real
from typing import Any, ClassVar, TypeVar

import numpy as np
from flwr.app import ArrayRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_fedeval import constraints
from flwr_fedeval.constraints import Choices, Interval
from flwr_fedeval.fhe.auc import (
    FHEAUCConfig,
    aggregate_auc,
    aggregate_threshold_metrics,
    max_pooled_rows,
)
from flwr_fedeval.fhe.auc_malicious import (
    MaliciousAUCConfig,
    aggregate_auc_malicious,
    required_slots,
)
from flwr_fedeval.fhe.backend import (
    BACKENDS,
    CKKSContext,
    CKKSParams,
    load_context,
    unpack_blobs,
)
from flwr_fedeval.identity import Roster, SignedKey
from flwr_fedeval.metrics.auc import UndefinedAUCError
from flwr_fedeval.metrics.counts import SPACINGS, decision_points
from flwr_fedeval.protocol import ARRAYS_KEY, ReplyCode, Step, fhe_auc
from flwr_fedeval.strategies.auc_phase import AUCPhaseResult
from flwr_fedeval.strategies.base import EvaluationPhase, Failures

__all__ = ["FHEAUCPhase", "FHEPhaseFailedError", "FHERun", "TamperingReportedError"]

#: Clients decrypt the same ciphertexts with the same key: their reports agree exactly;
#: a larger spread is logged.
_REPORT_SPREAD = 1e-6


class FHEPhaseFailedError(RuntimeError):
    """A participant of the signed list was lost at steps 3–4: the phase fails (no re-run).

    Attributes
    ----------
    failed : dict of int to str
        Node ID → reason, every node left out or lost in the phase.
    lost : list of int
        The listed participants whose encrypted counts did not arrive.
    """

    def __init__(self, lost: list[int], failed: dict[int, str]) -> None:
        self.lost, self.failed = list(lost), dict(failed)
        reasons = "; ".join(f"node {n}: {failed.get(n, 'no reply')}" for n in lost)
        super().__init__(
            f"FHE AUC phase failed: {len(lost)} participant(s) of the signed list lost at steps 3-4 ({reasons}); "
            "no re-run over another subset (the clients answer one evaluation per global model)")


class TamperingReportedError(RuntimeError):
    """Clients of the malicious protocol refused the aggregate (a deviating aggregator, or a result
    they could not certify: a client that shares its AUC replies one code, ``RESULT_REJECTED``,
    whichever check failed, so as not to be a decryption oracle).

    Attributes
    ----------
    reports : dict of int to str
        Node ID → the client's error reply.
    """

    def __init__(self, reports: dict[int, str]) -> None:
        self.reports = dict(reports)
        super().__init__(
            f"FHE AUC phase: {len(reports)} client(s) detected tampering with the aggregate, or could not "
            f"certify it (single-class pooled data or too little CKKS precision; each node's log says which), "
            f"and accepted no AUC: {self.reports}"
        )


@dataclasses.dataclass(frozen=True)
class FHERun:
    """The per-run state of :class:`FHEAUCPhase` (one session: fresh keys, one key holder), filled
    step by step with :meth:`replace`.

    Attributes
    ----------
    session : str
        The session id (32 hex digits) every request carries and every signed key binds.
    nodes : tuple of int
        The node list at step 1 (nodes that join later are newcomers).
    config : FHEAUCConfig or None
        From step 1: N and the public pooled bound ``max_rows`` (malicious: ``MaliciousAUCConfig``).
    holder : int or None
        Step 2: the key holder's node ID.
    holder_key : SignedKey or None
        Step 2: its X25519 key signed for role ``"key-holder"``.
    context : CKKSContext or None
        Step 2: the key holder's *public* context (never a secret key).
    bundles : mapping of int to bytes
        Step 2: the sealed bundles to relay, by recipient node ID.
    participant_list : fhe_auc.ParticipantList or None
        Step 2: the key holder's signed participant list (relayed with every step-3–4 request).
    participants : tuple of int
        The node IDs of the listed participants: the clients of steps 3–6.
    counts : mapping of int to fhe_auc.CountsReply
        Step 4: the checked encrypted counts of the participants.
    """

    session: str
    nodes: tuple[int, ...]
    config: FHEAUCConfig | None = None
    holder: int | None = None
    holder_key: SignedKey | None = None
    context: CKKSContext | None = None
    bundles: Mapping[int, bytes] = dataclasses.field(default_factory=dict)
    participant_list: fhe_auc.ParticipantList | None = None
    participants: tuple[int, ...] = ()
    counts: Mapping[int, fhe_auc.CountsReply] = dataclasses.field(default_factory=dict)

    def replace(self, **changes: Any) -> FHERun:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    @property
    def auc_config(self) -> FHEAUCConfig:
        """:attr:`config`, set at step 1 (``RuntimeError`` before)."""
        return _need(self.config, "config (step 1)")

    @property
    def public_context(self) -> CKKSContext:
        """:attr:`context`, set at step 2 (``RuntimeError`` before)."""
        return _need(self.context, "context (step 2)")


_T = TypeVar("_T")


def _need(value: _T | None, what: str) -> _T:
    """``value``, set by an earlier step of the run (``RuntimeError`` if it is not)."""
    if value is None:
        raise RuntimeError(f"FHE AUC phase: {what} is read before the step that sets it")
    return value


class FHEAUCPhase(EvaluationPhase[Any]):
    """Global AUC under FHE; only the clients can decrypt (Baykara et al. 2025).

    Parameters
    ----------
    num_decision_points : int, default=100
        N, the number of public decision points.
    protocol : {"semi-honest", "malicious"}, default="semi-honest"
        §IV-C, or §IV-D (zero-sum offsets, multipliers, S splits, permutation,
        double execution verified by the clients).
    n_splits : int, default=4
        S, additive shares per value (malicious only). The slots N and S need are
        :meth:`slots_needed`; they must fit the backend's slot count (:meth:`parameter_relations`).
    backend : {"tenseal", "openfhe"}, default="tenseal"
        CKKS engine the key holder uses (OpenFHE: the ``[openfhe]`` extra,
        CPython 3.10 here; without it ``MissingExtraError``, an ``ImportError``).
    spacing : {"linear", "logit"}, default="linear"
        See :func:`flwr_fedeval.metrics.counts.decision_points`.
    share_auc_with_server : bool, default=True
        Expect the clients to report the AUC (and, semi-honest, the threshold
        metrics). Each client still decides for itself: its node policy
        ``fedeval-share-auc`` (default false, as in the paper;
        :mod:`flwr_fedeval.clients.policy`); off, the server learns nothing.
    metrics_threshold : float or None, default=None
        Also compute accuracy, precision, recall and F1 at this threshold
        (predicted positive iff score ≥ threshold) through the same phase.
    min_nodes : int, default=2
        Fewer contributing clients than this raises ``RuntimeError``.
    arrayrecord_key : str, default="arrays"
    timeout : float, default=3600
        Seconds to wait for the replies of each step.
    roster : flwr_fedeval.identity.Roster, optional
        The federation's roster. The server uses it only to leave out, and
        name, nodes whose signed keys do not verify (e.g. a SuperNode that is
        not in the roster) before they spoil a key set; the clients check
        every relayed key themselves, with or without it.
    """

    method = "fhe"
    label = "FHE AUC phase"

    #: What each parameter accepts (:mod:`flwr_fedeval.constraints`); relations: :meth:`parameter_relations`.
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "num_decision_points": [Interval(Integral, 2, None, closed="left")],
        "protocol": [Choices(fhe_auc.PROTOCOLS)],
        "n_splits": [Interval(Integral, 2, None, closed="left")],
        "backend": [Choices(BACKENDS)],
        "spacing": [Choices(SPACINGS)],
        "share_auc_with_server": ["boolean"],
        "metrics_threshold": [None, Interval(Real, 0, 1, closed="both")],
    }

    @staticmethod
    def slots_needed(num_decision_points: int, protocol: str = "semi-honest", n_splits: int = 4) -> int:
        """CKKS slots one ciphertext of the phase needs: N + 1 (semi-honest), S·(N+2) + 2 (malicious,
        :func:`flwr_fedeval.fhe.auc_malicious.required_slots`), at least 4 (the threshold metrics)."""
        n = int(num_decision_points)
        return max(required_slots(n, int(n_splits)) if protocol == "malicious" else n + 1, 4)

    @classmethod
    def parameter_relations(cls, **params: Any) -> list[constraints.Problem]:
        """Problems between parameters each valid alone (:mod:`flwr_fedeval.constraints`): the slots
        N decision points (with S splits) need (:meth:`slots_needed`) exceed the backend's."""
        names = ("num_decision_points", "protocol", "n_splits", "backend")
        full = {name: constraints.default_of(cls, name) for name in names}
        full.update({k: v for k, v in params.items() if k in full})
        slots = cls.slots_needed(full["num_decision_points"], full["protocol"], full["n_splits"])
        try:
            CKKSParams.for_slots(slots, full["backend"])
        except ValueError as exc:
            malicious = full["protocol"] == "malicious"
            splits = f" with S={full['n_splits']} splits" if malicious else ""
            involved = names if malicious else ("num_decision_points", "protocol", "backend")
            return [constraints.Problem(involved, f"N={full['num_decision_points']} decision points{splits} need "
                                                  f"{slots} slots (FHEAUCPhase.slots_needed): {exc}")]
        return []

    def __init__(
        self,
        num_decision_points: int = 100,
        *,
        protocol: str = "semi-honest",
        n_splits: int = 4,
        backend: str = "tenseal",
        spacing: str = "linear",
        share_auc_with_server: bool = True,
        metrics_threshold: float | None = None,
        min_nodes: int = 2,
        arrayrecord_key: str = ARRAYS_KEY,
        timeout: float = 3600,
        roster: Roster | None = None,
    ) -> None:
        super().__init__(min_nodes=min_nodes, arrayrecord_key=arrayrecord_key, timeout=timeout)
        constraints.check_params(type(self), {
            "num_decision_points": num_decision_points, "protocol": protocol, "n_splits": n_splits,
            "backend": backend, "spacing": spacing, "share_auc_with_server": share_auc_with_server,
            "metrics_threshold": metrics_threshold})
        if backend == "openfhe":  # the aggregator needs the engine too: fail before any client works
            import flwr_fedeval.fhe.openfhe_backend  # noqa: F401  (MissingExtraError names [openfhe])
        self.thresholds = decision_points(num_decision_points, spacing=spacing)  # type: ignore[arg-type]
        self.slots = self.slots_needed(self.thresholds.size, protocol, n_splits)
        self.protocol = protocol
        self.n_splits = n_splits
        self.backend = backend
        self.share_auc_with_server = bool(share_auc_with_server)
        self.metrics_threshold = None if metrics_threshold is None else float(metrics_threshold)
        self.roster = roster
        #: The public context of the last run (bytes), for inspection; never a secret key.
        self.public_context_bytes: bytes | None = None

    def _summary_items(self) -> list[tuple[str, str]]:
        splits = f", S={self.n_splits}" if self.protocol == "malicious" else ""
        who = "clients (reported to the server)" if self.share_auc_with_server else "clients only"
        items = [("Protocol", f"{self.protocol}{splits}"),
                 ("Decision points", f"N={self.thresholds.size}"),
                 ("CKKS", f"{self.backend}, {self.slots} slots"),
                 ("AUC known to", who)]
        if self.metrics_threshold is not None:
            items.append(("Threshold metrics at", f"{self.metrics_threshold:g}"))
        return [*items, *super()._summary_items()]

    # --- message exchange -------------------------------------------------------
    def _exchange(self, grid: Grid, contents: dict[int, RecordDict], step: Step,
                  parse: Callable[[int, RecordDict], Any], failed: Failures, what: str) -> dict[int, Any]:
        """:meth:`EvaluationPhase.exchange` of ``step`` recording failures in ``failed``."""
        return self.exchange(grid, contents, step.message_type, parse, step=what, what=what, failures=failed)

    def _require(self, nodes: Iterable[int], step: str) -> None:
        self.require(nodes, f"({self.protocol}), {step}")

    # --- step 1 -------------------------------------------------------------------
    def collect_public_keys(self, grid: Grid, nodes: list[int], session: str,
                            failed: Failures) -> dict[int, tuple[bytes, int, SignedKey]]:
        """Step 1: ``{node: (X25519 public key, test-size bucket, signed key)}``.

        Replies are parsed by :class:`~flwr_fedeval.protocol.fhe_auc.PubkeyReply`. With a
        :attr:`roster`, a node whose signature does not verify is left out (named in
        ``failed``); two nodes with one key, or signing as one roster member, are both left out."""

        def parse(node: int, content: RecordDict) -> tuple[bytes, int, SignedKey]:
            reply = fhe_auc.PubkeyReply.from_record(content, node=node)
            if self.roster is not None:
                fhe_auc.verify(self.roster, reply.signed_key, session=session, role=fhe_auc.CLIENT_ROLE)
            return reply.public_key, reply.test_size_bucket, reply.signed_key

        request = fhe_auc.PubkeyRequest(session).to_record()
        keys = self._exchange(grid, dict.fromkeys(nodes, request), fhe_auc.PUBKEY, parse, failed, "public key")
        seen: dict[bytes, int] = {}
        names: dict[str, int] = {}
        for node in sorted(keys):
            pk, signer = keys[node][0], keys[node][2].signer
            if pk in seen:  # two nodes with one key: neither can be addressed safely
                failed[node] = failed[seen[pk]] = "duplicate X25519 public key"
            if signer in names:  # the clients would refuse the whole key set
                failed[node] = failed[names[signer]] = f"two nodes sign as roster member {signer!r}"
            seen[pk] = node
            names[signer] = node
        return {n: v for n, v in keys.items() if n not in failed}

    # --- step 2 -------------------------------------------------------------------
    def setup_keys(self, grid: Grid, holder: int, peers: dict[int, SignedKey], session: str,
                   failed: Failures, *, holder_pk: bytes,
                   max_rows: int = 1) -> tuple[CKKSContext, bytes, dict[int, bytes], SignedKey,
                                               fhe_auc.ParticipantList] | None:
        """Step 2: the key holder's public context (loaded, checked), sealed bundles, its signed
        key (role ``"key-holder"``) and its signed participant list.

        Returns ``None`` (and records the reason in ``failed``) if the key holder fails.
        """
        request = fhe_auc.KeygenRequest(session, self.backend, self.slots, int(max_rows), peers, self.protocol)

        def parse(node: int, content: RecordDict) -> tuple[CKKSContext, bytes, dict[int, bytes], SignedKey,
                                                           fhe_auc.ParticipantList]:
            reply = fhe_auc.KeygenReply.from_record(content, node=node)
            ctx = load_context(reply.public_context)
            if ctx.is_private:  # never kept: the server must not hold a secret key
                raise ValueError("the key holder sent a context WITH the secret key; refused")
            if ctx.backend != self.backend or ctx.slot_count < self.slots:
                raise ValueError(f"public context is {ctx.backend} with {ctx.slot_count} slots, "
                                 f"expected {self.backend} with >= {self.slots}")
            if max_pooled_rows(ctx.params) < max_rows:
                raise ValueError(f"public context supports {max_pooled_rows(ctx.params):,} pooled rows, "
                                 f"the public bound is {max_rows:,}")
            signed = reply.holder_key(holder_pk)
            if reply.participants.protocol != self.protocol:
                raise ValueError(f"the key holder signed its participant list for the {reply.participants.protocol} "
                                 f"protocol, this phase runs {self.protocol}")
            if self.roster is not None:
                fhe_auc.verify(self.roster, signed, session=session, role=fhe_auc.HOLDER_ROLE)
                reply.participants.verify(self.roster, session=session, holder=signed.signer, floor=1,
                                           protocol=self.protocol)
            return ctx, reply.public_context, dict(reply.bundles), signed, reply.participants

        got = self._exchange(grid, {holder: request.to_record()}, fhe_auc.KEYGEN, parse, failed, "key setup")
        return got.get(holder)

    def _key_holder(self, grid: Grid, run: FHERun, keys: dict[int, tuple[bytes, int, SignedKey]],
                    failed: Failures) -> FHERun:
        """Step 2 with a key holder picked at random among ``keys`` (another one if it fails; no
        test data has been used yet). The participants are the nodes of the signed list."""
        candidates = sorted(keys)
        setup = None
        while setup is None:
            self._require(candidates, "step 2 (key holder)")
            holder = secrets.choice(candidates)
            peers = {n: keys[n][2] for n in candidates if n != holder}
            with self.step(fhe_auc.KEYGEN.name):
                setup = self.setup_keys(grid, holder, peers, run.session, failed, holder_pk=keys[holder][0],
                                        max_rows=run.auc_config.max_rows)
            candidates.remove(holder)
            if setup is not None:
                candidates.append(holder)
        ctx, self.public_context_bytes, bundles, holder_key, listed = setup
        by_key = {keys[n][2].signer: (n, keys[n][0]) for n in candidates}
        participants = []
        for name, key in zip(listed.names, listed.keys):
            node, step1_key = by_key.get(name, (None, None))
            if node is None or step1_key != key or (node != holder and node not in bundles):
                raise RuntimeError(f"FHE AUC phase: the key holder's participant list names {name!r}, which "
                                   "is not a step-1 node with that key and a sealed bundle")
            participants.append(node)
        for n in candidates:
            if n not in participants:
                failed[n] = "not in the key holder's signed participant list"
        log(INFO, "FHE AUC phase: key holder node %d; public context %.1f MB; %d sealed bundles relayed; "
            "signed participant list of %d: %s", holder, len(self.public_context_bytes) / 1e6, len(bundles),
            len(listed.names), ", ".join(listed.names))
        return run.replace(holder=holder, holder_key=holder_key, context=ctx, bundles=bundles,
                           participant_list=listed, participants=tuple(sorted(participants)))

    # --- steps 3-4 ------------------------------------------------------------------
    def encrypted_counts(self, grid: Grid, arrays: ArrayRecord, run: FHERun,
                         failed: Failures) -> dict[int, fhe_auc.CountsReply]:
        """Steps 3–4 with ``run.participants``: relay the bundles, the key holder's signed key and
        its signed participant list, collect and check the encrypted counts
        (:class:`~flwr_fedeval.protocol.fhe_auc.CountsReply`).

        Every ciphertext must deserialise under the public context and have a
        fresh ciphertext's slot count, level and scale
        (:meth:`~flwr_fedeval.fhe.backend.CKKSContext.check_fresh`); a node
        sending anything else is named in ``failed``, before aggregation.
        A fresh 16-byte nonce is drawn per call.

        Returns ``{node: counts reply}`` of the nodes whose replies passed.
        """
        nonce = secrets.token_bytes(fhe_auc.NONCE_BYTES)
        per_client = 6 if self.protocol == "malicious" else 3
        metrics_threshold = -1.0 if self.metrics_threshold is None else self.metrics_threshold
        params = fhe_auc.EncryptionParams(self.protocol, int(self.thresholds.size), int(run.auc_config.max_rows),
                                          int(self.n_splits), nonce, float(metrics_threshold))
        contents = {}
        for node in run.participants:
            request = fhe_auc.CountsRequest(run.session, params, _need(run.holder_key, "holder key (step 2)"),
                                            self.thresholds, _need(run.participant_list, "participant list (step 2)"),
                                            None if node == run.holder else run.bundles[node])
            content = RecordDict({self.arrayrecord_key: arrays})
            for key, record in request.to_record().items():
                content[key] = record
            contents[node] = content

        ctx = run.public_context

        def check(data: bytes, expected: int) -> None:
            for blob in unpack_blobs(data, expected=expected):
                # envelope, key set and native format; then slot count, level and scale
                ctx.check_fresh(ctx.deserialize_ciphertext(blob))

        def parse(node: int, content: RecordDict) -> fhe_auc.CountsReply:
            reply = fhe_auc.CountsReply.from_record(content, node=node)
            reply.checked(with_metrics=self.metrics_threshold is not None, node=node)
            check(reply.auc, per_client)
            if self.metrics_threshold is not None:
                check(_need(reply.metrics, "metrics ciphertext"), 1)
            return reply

        return self._exchange(grid, contents, fhe_auc.COUNTS, parse, failed, "encrypted counts")

    def collect_counts(self, grid: Grid, arrays: ArrayRecord, ctx: CKKSContext, participants: list[int],
                       bundles: dict[int, bytes], holder: int, holder_key: SignedKey, session: str,
                       config: FHEAUCConfig, failed: Failures, *,
                       participant_list: fhe_auc.ParticipantList) -> tuple[dict[int, fhe_auc.CountsReply], None]:
        """Steps 3–4 driven by hand (tests, deviating-server experiments): :meth:`encrypted_counts`
        of the :class:`FHERun` these values make; ``({node: counts reply}, None)``."""
        run = FHERun(session, tuple(participants), config=config, holder=holder, holder_key=holder_key,
                     context=ctx, bundles=bundles, participant_list=participant_list,
                     participants=tuple(participants))
        return self.encrypted_counts(grid, arrays, run, failed), None

    def _counts_of_all(self, grid: Grid, arrays: ArrayRecord, run: FHERun, failed: Failures) -> FHERun:
        """Steps 3–4, once: every listed participant must answer.

        Raises
        ------
        FHEPhaseFailedError
            A participant's counts did not arrive or failed the checks (no re-run over another subset).
        """
        with self.step(fhe_auc.COUNTS.name):
            valid = self.encrypted_counts(grid, arrays, run, failed)
        lost = sorted(set(run.participants) - set(valid))
        if lost:
            error = FHEPhaseFailedError(lost, failed.reasons())
            log(ERROR, "%s", error)
            raise error
        return run.replace(counts=valid)

    # --- step 5 -----------------------------------------------------------------------
    def aggregate(self, ctx: CKKSContext, messages: list[bytes], config: FHEAUCConfig) -> bytes:
        """Step 5: the masked ``E(num)``, ``E(denom)`` (per run) from the public context."""
        if isinstance(config, MaliciousAUCConfig):
            return aggregate_auc_malicious(ctx, messages, config=config)
        return aggregate_auc(ctx, messages, config=config)

    def aggregate_metrics(self, ctx: CKKSContext, messages: list[bytes], config: FHEAUCConfig) -> bytes:
        """Step 5 for the threshold metrics: eight masked values."""
        return aggregate_threshold_metrics(ctx, messages, config=config)

    # --- step 6 -----------------------------------------------------------------------
    def distribute_result(self, grid: Grid, run: FHERun, result: bytes,
                          metrics: bytes | None) -> tuple[dict[int, fhe_auc.ResultReport], Failures]:
        """Step 6: send the result to ``run.participants``; ``({node: report}, {node: failure})``
        (:class:`~flwr_fedeval.protocol.fhe_auc.ResultReport`)."""
        content = fhe_auc.ResultRequest(run.session, result, metrics).to_record()
        errors = Failures()
        reports = self._exchange(grid, dict.fromkeys(run.participants, content), fhe_auc.RESULT,
                                 lambda node, reply: fhe_auc.ResultReport.from_record(reply, node=node), errors,
                                 "report")
        return reports, errors

    # --- the phase ------------------------------------------------------------------------
    def run(self, grid: Grid, arrays: ArrayRecord) -> AUCPhaseResult:
        """Steps 1–6 over every node of ``grid``.

        Parameters
        ----------
        grid : flwr.serverapp.Grid
            Every node of it is asked to take part.
        arrays : ArrayRecord
            The global model the clients score their test sets with.

        Returns
        -------
        AUCPhaseResult
            ``auc``: the median of the AUCs the clients chose to report
            (node policy and run config ``fedeval-share-auc``), ``nan`` when none did (only the
            clients know it then); ``counts`` is ``None`` (the server never
            sees counts); ``contributors``: the node IDs whose encrypted counts
            are in the result; ``failed``: node ID → reason for every node
            left out; ``details``: protocol, backend, N, count scale, key
            holder, public-context size, participant list (roster names), aggregation and
            phase seconds, who decrypted and who reported, and the threshold
            metrics when enabled and reported.

        Raises
        ------
        RuntimeError
            If fewer than ``min_nodes`` clients contribute at any step, or no
            client could decrypt the result.
        FHEPhaseFailedError
            If a participant of the signed list is lost at steps 3–4 (a ``RuntimeError``;
            no re-run over another subset).
        TamperingReportedError
            If a client's verification failed (malicious protocol).
        flwr_fedeval.metrics.auc.UndefinedAUCError
            If the clients report a single-class pooled test set.
        """
        self.summary()
        t0 = time.perf_counter()
        failed = self._start_run()
        run = FHERun(secrets.token_hex(16), tuple(sorted(grid.get_node_ids())))

        # 1. public keys; their test-size buckets sum to the public pooled bound
        with self.step(fhe_auc.PUBKEY.name):
            keys = self.collect_public_keys(grid, list(run.nodes), run.session, failed)
        self._require(keys, fhe_auc.PUBKEY.name)
        n_points, max_rows = int(self.thresholds.size), max(sum(v[1] for v in keys.values()), 1)
        run = run.replace(config=MaliciousAUCConfig(n_points=n_points, max_rows=max_rows, n_splits=self.n_splits)
                          if self.protocol == "malicious" else FHEAUCConfig(n_points=n_points, max_rows=max_rows))

        # 2. key holder (another one if it fails) and its signed participant list; 3-4. encrypted counts
        run = self._key_holder(grid, run, keys, failed)
        self._require(run.participants, "step 2 (signed participant list)")
        run = self._counts_of_all(grid, arrays, run, failed)

        # 5. aggregation, public context only
        t_agg = time.perf_counter()
        with self.step("step 5 (aggregation, public context only)"):
            result = self.aggregate(run.public_context, [run.counts[n].auc for n in run.participants],
                                    run.auc_config)
            metrics = None
            if self.metrics_threshold is not None:
                metrics = self.aggregate_metrics(
                    run.public_context, [_need(run.counts[n].metrics, "metrics ciphertext") for n in run.participants],
                    run.auc_config)
        t_agg = time.perf_counter() - t_agg

        # 6. clients decrypt
        with self.step(fhe_auc.RESULT.name):
            reports, errors = self.distribute_result(grid, run, result, metrics)
        return self._finish(run, failed, reports, errors, t_agg=t_agg, t_total=time.perf_counter() - t0)

    def _finish(self, run: FHERun, failed: Failures, reports: dict[int, fhe_auc.ResultReport], errors: Failures, *,
                t_agg: float, t_total: float) -> AUCPhaseResult:
        contributors, config = run.participants, run.auc_config
        tampering = {n: f.summary for n, f in errors.with_code(ReplyCode.TAMPERING_DETECTED).items()}
        rejected = {n: f.summary for n, f in errors.with_code(ReplyCode.RESULT_REJECTED).items()}
        if self.protocol == "malicious":  # an honest aggregate fails only on single-class or imprecise data
            tampering.update(rejected)
        if tampering:
            for node, reason in tampering.items():
                log(ERROR, "FHE AUC phase: node %d detected tampering: %s", node, reason)
            raise TamperingReportedError(tampering)
        undefined = {n: f.summary for n, f in errors.with_code(ReplyCode.UNDEFINED_AUC).items()}
        if not reports:
            if undefined:
                raise UndefinedAUCError(f"FHE AUC phase: {next(iter(undefined.values()))}")
            raise RuntimeError(f"FHE AUC phase: no client could decrypt the result: {'; '.join(errors.lines())}")

        shared = {n: r for n, r in reports.items() if r.shared and r.auc is not None}
        details: dict[str, Any] = {
            "variant": self.protocol,
            "backend": self.backend,
            "num_decision_points": int(self.thresholds.size),
            "max_rows": int(config.max_rows),
            "count_scale": float(config.count_scale),
            "key_holder": int(_need(run.holder, "key holder (step 2)")),
            "public_context_bytes": len(self.public_context_bytes or b""),
            "participants": list(run.participant_list.names) if run.participant_list is not None else [],
            "aggregation_s": t_agg,
            "phase_s": t_total,
            "decrypted_by": sorted(reports),
            "decrypt_failed": errors.reasons(),
        }
        if self.protocol == "malicious":
            details["n_splits"] = self.n_splits
        details["share_requested"] = self.share_auc_with_server
        details["withheld_by"] = sorted(n for n, r in reports.items() if not r.shared)
        auc = bound = math.nan
        if self.share_auc_with_server and shared:
            values = np.array([r.auc for r in shared.values()])
            auc = float(np.median(values))
            bounds = [r.resolution_bound for r in shared.values() if r.resolution_bound is not None]
            bound = float(np.median(bounds)) if bounds else math.nan
            if values.max() - values.min() > _REPORT_SPREAD:
                log(WARNING, "FHE AUC phase: client reports differ by %.3g: %s", values.max() - values.min(),
                    {n: r.auc for n, r in shared.items()})
            details["auc_known_to"] = "clients and server"
            details["reported_by"] = sorted(shared)
        else:
            details["auc_known_to"] = "clients"
        if self.metrics_threshold is not None:
            details["metrics_threshold"] = self.metrics_threshold
            details["threshold_metrics_verified"] = self.protocol == "semi-honest"
            with_metrics = [r.threshold_metrics for r in shared.values() if r.threshold_metrics is not None]
            if self.share_auc_with_server and with_metrics:
                details["threshold_metrics"] = {k: float(np.median([m[k] for m in with_metrics]))
                                                for k in fhe_auc.METRICS}

        result = AUCPhaseResult(
            auc=auc,
            thresholds=np.asarray(self.thresholds, dtype=np.float64),
            counts=None,
            contributors=sorted(contributors),
            failed=failed.reasons(),
            method=self.method,
            details=details,
            resolution_bound=bound,
        )
        self._log_result(result, t_agg=t_agg, t_total=t_total)
        if "threshold_metrics" in details:
            tm = details["threshold_metrics"]
            log(INFO, "FHE metrics at threshold %g (reported by the clients): accuracy %.6f precision %.6f "
                "recall %.6f F1 %.6f", self.metrics_threshold, *(tm[k] for k in fhe_auc.METRICS))
        return result

    def _log_result(self, result: AUCPhaseResult, *, t_agg: float, t_total: float) -> None:
        """The result as a person reads it on the server (:func:`flwr_fedeval.reporting.auc_summary`):
        INFO with the resolution bound; WARNING when the bound exceeds 0.01 (with the fix) or when the
        clients kept an AUC the phase asked for (with the command that changes their policy)."""
        from flwr_fedeval.metrics.auc import RESOLUTION_WARN_THRESHOLD

        wide = result.resolution_bound > RESOLUTION_WARN_THRESHOLD  # nan: unknown, no warning
        withheld = self.share_auc_with_server and not math.isfinite(result.auc)
        log(WARNING if wide or withheld else INFO, "FHE AUC phase (%s): %d clients: %s; aggregation %.2f s, "
            "phase %.1f s", self.protocol, len(result.contributors), result, t_agg, t_total)
