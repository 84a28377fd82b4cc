"""FHE federated AUC as an evaluation phase (server side).

Implementation based on Baykara, Ünal, Akgün (2025), "Enabling
Privacy-preserving Model Evaluation in Federated Learning via Fully
Homomorphic Encryption", §IV-C (semi-honest aggregator) and §IV-D
(malicious aggregator); DESIGN.md §4. The protocol steps are in
:mod:`flwr_fedeval.fhe.auc` and :mod:`flwr_fedeval.fhe.auc_malicious`, the
key relay in :mod:`flwr_fedeval.keyshare`, the client handlers in
:mod:`flwr_fedeval.clients.fhe_handlers`.

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

Dropouts: in the semi-honest protocol a client that fails at step 4 is simply
left out. In the malicious protocol the zero-sum offsets are drawn for an
ordered list of M parties, so step 4 is re-run (fresh nonce, new indices)
with the clients that answered, until all of them answer or fewer than
``min_nodes`` remain. If a participant is lost at step 4 while new nodes
have joined since step 1 (a restarted SuperNode comes back under a new node
ID), the whole phase runs again from step 1 with the current node list
(fresh session, keys and key holder; at most ``max_restarts`` times), so the
restarted node contributes; its identity is checked at step 1 like
everyone's.

Who learns the AUC: the clients. With ``share_auc_with_server`` the server
expects the clients to report it (each client decides with its *own*
``share-auc-with-server`` configuration); otherwise ``AUCPhaseResult.auc`` is
``nan`` and ``details["auc_known_to"] == "clients"``. A client whose
verification fails (malicious protocol) replies ``TamperingDetectedError``;
the phase then raises :class:`TamperingReportedError` naming those clients.

Count encoding: every client reports a power-of-two upper bound of its
test-set size at step 1; their sum is the public pooled bound ``max_rows``
from which every client derives the count scale ``K``
(:class:`~flwr_fedeval.fhe.auc.FHEAUCConfig`); a client whose counts exceed
it refuses.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_fedeval.fhe.auc import (
    FHEAUCConfig,
    aggregate_auc,
    aggregate_threshold_metrics,
    max_pooled_rows,
)
from flwr_fedeval.fhe.auc_malicious import MaliciousAUCConfig, aggregate_auc_malicious, required_slots
from flwr_fedeval.fhe.backend import BACKENDS, CKKSContext, CKKSParams, load_context, unpack_blobs
from flwr_fedeval.fhe.counts import decision_points
from flwr_fedeval.identity import Roster, SignedKey, verify_key
from flwr_fedeval.messages import (
    ARRAYS_KEY,
    ReplyCode,
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
from flwr_fedeval.metrics.auc import UndefinedAUCError
from flwr_fedeval.strategies.auc_phase import AUCPhaseResult
from flwr_fedeval.strategies.base import EvaluationPhase, Failures

__all__ = ["FHEAUCPhase", "TamperingReportedError"]

_METRICS = ("accuracy", "precision", "recall", "f1")
#: Clients decrypt the same ciphertexts with the same key: their reports agree exactly;
#: a larger spread is logged.
_REPORT_SPREAD = 1e-6


class _Restart(Exception):
    """A participant was lost while new nodes joined: run the phase again from step 1."""

    def __init__(self, step: str, lost: list[int], newcomers: list[int]) -> None:
        super().__init__(step)
        self.step, self.lost, self.newcomers = step, lost, newcomers


class TamperingReportedError(RuntimeError):
    """Clients of the malicious protocol detected a deviating aggregator.

    Attributes
    ----------
    reports : dict of int to str
        Node ID → the client's ``TamperingDetectedError`` message.
    """

    def __init__(self, reports: dict[int, str]) -> None:
        self.reports = dict(reports)
        super().__init__(
            f"FHE AUC phase: {len(reports)} client(s) detected tampering with the aggregate "
            f"and accepted no AUC: {self.reports}"
        )


class FHEAUCPhase(EvaluationPhase):
    """Global AUC under FHE; only the clients can decrypt (Baykara et al. 2025).

    Parameters
    ----------
    num_decision_points : int, default=100
        N, the number of public decision points.
    protocol : {"semi-honest", "malicious"}, default="semi-honest"
        §IV-C, or §IV-D (zero-sum offsets, multipliers, S splits, permutation,
        double execution verified by the clients).
    n_splits : int, default=4
        S, additive shares per value (malicious only). Needs
        ``S·(N+1) + 2 ≤`` slot count (4096 with TenSEAL).
    backend : {"tenseal", "openfhe"}, default="tenseal"
        CKKS engine the key holder uses (OpenFHE: the ``[openfhe]`` extra,
        CPython 3.10 here; without it ``MissingExtraError``, an ``ImportError``).
    spacing : {"linear", "logit"}, default="linear"
        See :func:`flwr_fedeval.fhe.counts.decision_points`.
    share_auc_with_server : bool, default=True
        Expect the clients to report the AUC (and, semi-honest, the threshold
        metrics). Each client still decides for itself (its own
        ``share-auc-with-server``, default true like this one, so that the
        App's FINAL line has a number). Off, as in the paper, the server
        learns nothing.
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
    #: Re-runs of the whole phase (fresh session, keys and key holder) when a participant is lost at
    #: steps 3-4 while new nodes have joined (a restarted SuperNode comes back under a new node ID).
    max_restarts = 2

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
        if protocol not in FHE_PROTOCOLS:
            raise ValueError(f"protocol must be one of {FHE_PROTOCOLS}, got {protocol!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "openfhe":  # the aggregator needs the engine too: fail before any client works
            import flwr_fedeval.fhe.openfhe_backend  # noqa: F401  (MissingExtraError names [openfhe])
        if isinstance(n_splits, bool) or not isinstance(n_splits, int) or n_splits < 2:
            raise ValueError(f"n_splits must be an integer >= 2, got {n_splits!r}")
        if metrics_threshold is not None and not 0.0 <= float(metrics_threshold) <= 1.0:
            raise ValueError(f"metrics_threshold must be None or in [0, 1], got {metrics_threshold!r}")
        self.thresholds = decision_points(num_decision_points, spacing=spacing)  # type: ignore[arg-type]
        n = self.thresholds.size
        self.slots = required_slots(n, n_splits) if protocol == "malicious" else n + 1
        self.slots = max(self.slots, 4)  # the threshold metrics use 4 slots
        try:
            CKKSParams.for_slots(self.slots, backend)
        except ValueError as exc:
            raise ValueError(
                f"N={n} decision points{f' with S={n_splits} splits' if protocol == 'malicious' else ''} "
                f"need {self.slots} slots: {exc}"
            ) from None
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
    def _exchange(self, grid: Grid, contents: dict[int, RecordDict], message_type: str,
                  parse: Callable[[int, RecordDict], Any], failed: Failures, what: str) -> dict[int, Any]:
        """:meth:`EvaluationPhase.exchange` recording failures in ``failed``."""
        return self.exchange(grid, contents, message_type, parse, step=what, what=what, failures=failed)

    def _require(self, nodes, failed: Failures, step: str) -> None:
        self.require(nodes, f"({self.protocol}), {step}")

    def _request(self, session: str, **values: Any) -> ConfigRecord:
        return ConfigRecord({"session": session, **values})

    # --- step 1 -------------------------------------------------------------------
    def collect_public_keys(self, grid: Grid, nodes: list[int], session: str,
                            failed: Failures) -> dict[int, tuple[bytes, int, SignedKey]]:
        """Step 1: ``{node: (X25519 public key, test-size bucket, signed key)}``.

        With a :attr:`roster`, a node whose signature does not verify is left
        out (named in ``failed``); two nodes signing as one roster member are
        both left out."""

        def parse(node: int, content: RecordDict) -> tuple[bytes, int, SignedKey]:
            rec = content[FHE_PUBKEY_KEY]
            pk, bucket = rec["public-key"], rec["test-size-bucket"]
            if not isinstance(pk, bytes) or len(pk) != 32:
                raise ValueError("public key must be 32 bytes")
            if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0 or bucket & (bucket - 1):
                raise ValueError(f"test-size-bucket must be 0 or a power of two, got {bucket!r}")
            signer, sig = rec.get("signer"), rec.get("signature")
            if not isinstance(signer, str) or not isinstance(sig, bytes):
                raise ValueError("public key is not signed (signer, signature missing)")
            if self.roster is not None:
                verify_key(self.roster, signer, sig, protocol=FHE_SIGNED_PROTOCOL, session=session, round=0,
                           role="client", key=pk)
            return pk, bucket, SignedKey(signer, pk, sig)

        request = RecordDict({FHE_REQUEST_KEY: self._request(session)})
        keys = self._exchange(grid, dict.fromkeys(nodes, request), QUERY_FHE_PUBKEY, parse, failed, "public key")
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
                   max_rows: int = 1) -> tuple[CKKSContext, bytes, dict[int, bytes], SignedKey] | None:
        """Step 2: the key holder's public context (loaded, checked), sealed bundles and
        its signed key (role ``"key-holder"``).

        Returns ``None`` (and records the reason in ``failed``) if the key holder fails.
        """
        content = RecordDict(
            {
                FHE_REQUEST_KEY: self._request(session, backend=self.backend, slots=self.slots,
                                               **{"max-rows": int(max_rows)}),
                FHE_PEERS_KEY: ConfigRecord({str(n): p.key for n, p in peers.items()}),
                FHE_PEER_SIGNERS_KEY: ConfigRecord({str(n): p.signer for n, p in peers.items()}),
                FHE_PEER_SIGNATURES_KEY: ConfigRecord({str(n): p.signature for n, p in peers.items()}),
            }
        )

        def parse(node: int, reply: RecordDict):
            public = array_to_bytes(reply[FHE_CONTEXT_KEY]["public"])
            ctx = load_context(public)
            if ctx.is_private:  # never kept: the server must not hold a secret key
                raise ValueError("the key holder sent a context WITH the secret key; refused")
            if ctx.backend != self.backend or ctx.slot_count < self.slots:
                raise ValueError(f"public context is {ctx.backend} with {ctx.slot_count} slots, "
                                 f"expected {self.backend} with >= {self.slots}")
            if max_pooled_rows(ctx.params) < max_rows:
                raise ValueError(f"public context supports {max_pooled_rows(ctx.params):,} pooled rows, "
                                 f"the public bound is {max_rows:,}")
            bundles = {int(k): array_to_bytes(v) for k, v in reply[FHE_BUNDLES_KEY].items()}
            rec = reply[FHE_HOLDER_KEY]
            signed = SignedKey(str(rec["signer"]), holder_pk, bytes(rec["signature"]))
            if self.roster is not None:
                verify_key(self.roster, signed.signer, signed.signature, protocol=FHE_SIGNED_PROTOCOL, session=session,
                           round=0, role="key-holder", key=signed.key)
            return ctx, public, bundles, signed

        got = self._exchange(grid, {holder: content}, QUERY_FHE_KEYGEN, parse, failed, "key setup")
        return got.get(holder)

    # --- steps 3-4 ------------------------------------------------------------------
    def collect_counts(self, grid: Grid, arrays: ArrayRecord, ctx: CKKSContext, participants: list[int],
                       bundles: dict[int, bytes], holder: int, holder_key: SignedKey, session: str,
                       config: FHEAUCConfig, failed: Failures) -> tuple[dict[int, tuple[bytes, bytes | None]], bytes]:
        """Steps 3–4: relay the bundles and the key holder's signed key, collect and check the
        encrypted counts.

        Every ciphertext must deserialise under the public context and have a
        fresh ciphertext's slot count, level and scale
        (:meth:`~flwr_fedeval.fhe.backend.CKKSContext.check_fresh`); a node
        sending anything else is left out and named, before aggregation.

        Returns ``({node: (auc message, metrics message or None)}, nonce)``.
        """
        nonce = secrets.token_bytes(16)
        per_client = 6 if self.protocol == "malicious" else 3
        metrics_threshold = -1.0 if self.metrics_threshold is None else self.metrics_threshold
        contents = {}
        for index, node in enumerate(participants):
            request = self._request(
                session,
                protocol=self.protocol,
                **{
                    "n-points": int(self.thresholds.size),
                    "max-rows": int(config.max_rows),
                    "n-splits": int(self.n_splits),
                    "party-index": index,
                    "n-parties": len(participants),
                    "nonce": nonce,
                    "holder-public-key": holder_key.key,
                    "holder-signer": holder_key.signer,
                    "holder-signature": holder_key.signature,
                    "metrics-threshold": float(metrics_threshold),
                },
            )
            records: dict[str, Any] = {
                self.arrayrecord_key: arrays,
                EVALUATION_KEY: ArrayRecord({"thresholds": Array(self.thresholds)}),
                FHE_REQUEST_KEY: request,
            }
            if node != holder:
                records[FHE_BUNDLE_KEY] = ArrayRecord({"sealed": bytes_to_array(bundles[node])})
            contents[node] = RecordDict(records)

        def check(data: bytes, expected: int) -> bytes:
            for blob in unpack_blobs(data, expected=expected):
                # envelope, key set and native format; then slot count, level and scale
                ctx.check_fresh(ctx.deserialize_ciphertext(blob))
            return data

        def parse(node: int, reply: RecordDict):
            rec = reply[FHE_COUNTS_KEY]
            auc_msg = check(array_to_bytes(rec["auc"]), per_client)
            metrics_msg = None
            if self.metrics_threshold is not None:
                metrics_msg = check(array_to_bytes(rec["metrics"]), 1)
            return auc_msg, metrics_msg

        valid = self._exchange(grid, contents, EVALUATE_FHE_COUNTS, parse, failed, "encrypted counts")
        return valid, nonce

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
    def distribute_result(self, grid: Grid, nodes: list[int], result: bytes, metrics: bytes | None,
                          session: str) -> tuple[dict[int, dict], Failures]:
        """Step 6: send the result; ``({node: report}, {node: failure})``."""
        records = {"auc": bytes_to_array(result)}
        if metrics is not None:
            records["metrics"] = bytes_to_array(metrics)
        content = RecordDict({FHE_REQUEST_KEY: self._request(session), FHE_RESULT_KEY: ArrayRecord(records)})

        def parse(node: int, reply: RecordDict) -> dict:
            report = dict(reply[FHE_REPORT_KEY])
            if report.get("status") != "ok":
                raise ValueError(f"status {report.get('status')!r}")
            for k in ("auc", *_METRICS):
                if k in report and (isinstance(report[k], bool) or not isinstance(report[k], float)):
                    raise ValueError(f"report '{k}' must be a float")
            return report

        errors = Failures()
        reports = self._exchange(grid, dict.fromkeys(nodes, content), QUERY_FHE_RESULT, parse, errors,
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
            (``share-auc-with-server``), ``nan`` when none did (only the
            clients know it then); ``counts`` is ``None`` (the server never
            sees counts); ``contributors``: the node IDs whose encrypted counts
            are in the result; ``failed``: node ID → reason for every node
            left out; ``details``: protocol, backend, N, count scale, key
            holder, public-context size, step-4 attempts, aggregation and
            phase seconds, who decrypted and who reported, and the threshold
            metrics when enabled and reported.

        Raises
        ------
        RuntimeError
            If fewer than ``min_nodes`` clients contribute at any step, or no
            client could decrypt the result.
        TamperingReportedError
            If a client's verification failed (malicious protocol).
        flwr_fedeval.metrics.auc.UndefinedAUCError
            If the clients report a single-class pooled test set.
        """
        self.summary()
        t0 = time.perf_counter()
        failed = self._start_run()
        restarts = 0
        while True:
            nodes = sorted(grid.get_node_ids())
            try:
                result = self._run_once(grid, arrays, nodes, failed, t0,
                                        can_restart=restarts < self.max_restarts)
            except _Restart as exc:
                restarts += 1
                log(WARNING, "FHE AUC phase: node(s) %s lost at %s and node(s) %s joined since step 1: "
                    "re-running the phase from step 1 (restart %d of at most %d)", exc.lost, exc.step,
                    exc.newcomers, restarts, self.max_restarts)
                continue
            result.details["restarts"] = restarts
            return result

    def _run_once(self, grid: Grid, arrays: ArrayRecord, nodes: list[int], failed: Failures, t0: float, *,
                  can_restart: bool) -> AUCPhaseResult:
        """Steps 1-6 with ``nodes`` (a fresh session: new keys, new key holder).

        Raises :class:`_Restart` (when ``can_restart``) if a participant is lost at steps 3-4 while
        nodes that were not in ``nodes`` have joined (e.g. a restarted SuperNode under a new node ID)."""
        session = secrets.token_hex(16)

        # 1. public keys
        with self.step("step 1 (public keys)"):
            keys = self.collect_public_keys(grid, nodes, session, failed)
        self._require(keys, failed, "step 1 (public keys)")
        total_bound = sum(v[1] for v in keys.values())
        config_kw = {"n_points": int(self.thresholds.size), "max_rows": max(int(total_bound), 1)}
        config: FHEAUCConfig = (MaliciousAUCConfig(n_splits=self.n_splits, **config_kw)
                                if self.protocol == "malicious" else FHEAUCConfig(**config_kw))

        # 2. key holder (another one if it fails)
        candidates = sorted(keys)
        setup = None
        while setup is None:
            self._require(candidates, failed, "step 2 (key holder)")
            holder = secrets.choice(candidates)
            peers = {n: keys[n][2] for n in candidates if n != holder}
            with self.step("step 2 (key setup)"):
                setup = self.setup_keys(grid, holder, peers, session, failed, holder_pk=keys[holder][0],
                                        max_rows=config.max_rows)
            candidates.remove(holder)
            if setup is not None:
                candidates.append(holder)
        ctx, self.public_context_bytes, bundles, holder_key = setup
        participants = sorted(n for n in candidates if n == holder or n in bundles)
        for n in candidates:
            if n not in participants:
                failed[n] = "the key holder sent no sealed bundle for it"
        log(INFO, "FHE AUC phase: key holder node %d; public context %.1f MB; %d sealed bundles relayed",
            holder, len(self.public_context_bytes) / 1e6, len(bundles))

        # 3-4. encrypted counts (malicious: re-run until every party of the list answered)
        attempts = 0
        while True:
            self._require(participants, failed, "step 4 (encrypted counts)")
            attempts += 1
            with self.step("steps 3-4 (encrypted counts)"):
                valid, _ = self.collect_counts(grid, arrays, ctx, participants, bundles, holder,
                                               holder_key, session, config, failed)
            lost = sorted(set(participants) - set(valid))
            newcomers = sorted(set(int(n) for n in grid.get_node_ids()) - set(nodes)) if lost else []
            if lost and newcomers and can_restart:
                raise _Restart("steps 3-4", lost, newcomers)
            if len(valid) == len(participants) or self.protocol == "semi-honest":
                participants = sorted(valid)
                break
            log(WARNING, "FHE AUC phase (malicious): %d of %d parties answered; re-running step 4 without %s",
                len(valid), len(participants), sorted(set(participants) - set(valid)))
            participants = sorted(valid)
        self._require(participants, failed, "step 4 (encrypted counts)")
        for n in participants:
            failed.pop(n, None)

        # 5. aggregation, public context only
        t_agg = time.perf_counter()
        with self.step("step 5 (aggregation, public context only)"):
            result = self.aggregate(ctx, [valid[n][0] for n in participants], config)
            metrics = None
            if self.metrics_threshold is not None:
                metrics = self.aggregate_metrics(ctx, [valid[n][1] for n in participants], config)
        t_agg = time.perf_counter() - t_agg

        # 6. clients decrypt
        with self.step("step 6 (clients decrypt)"):
            reports, errors = self.distribute_result(grid, participants, result, metrics, session)
        return self._finish(participants, failed, reports, errors, holder=holder, config=config,
                            attempts=attempts, t_agg=t_agg, t_total=time.perf_counter() - t0)

    def _finish(self, contributors: list[int], failed: Failures, reports: dict[int, dict],
                errors: Failures, *, holder: int, config: FHEAUCConfig, attempts: int,
                t_agg: float, t_total: float) -> AUCPhaseResult:
        tampering = {n: f.summary for n, f in errors.with_code(ReplyCode.TAMPERING_DETECTED).items()}
        if tampering:
            for node, reason in tampering.items():
                log(ERROR, "FHE AUC phase: node %d detected tampering: %s", node, reason)
            raise TamperingReportedError(tampering)
        undefined = {n: f.summary for n, f in errors.with_code(ReplyCode.UNDEFINED_AUC).items()}
        if not reports:
            if undefined:
                raise UndefinedAUCError(f"FHE AUC phase: {next(iter(undefined.values()))}")
            raise RuntimeError(f"FHE AUC phase: no client could decrypt the result: {'; '.join(errors.lines())}")

        shared = {n: r for n, r in reports.items() if r.get("shared") and "auc" in r}
        details: dict[str, Any] = {
            "variant": self.protocol,
            "backend": self.backend,
            "num_decision_points": int(self.thresholds.size),
            "max_rows": int(config.max_rows),
            "count_scale": float(config.count_scale),
            "key_holder": int(holder),
            "public_context_bytes": len(self.public_context_bytes or b""),
            "attempts_step4": attempts,
            "aggregation_s": t_agg,
            "phase_s": t_total,
            "decrypted_by": sorted(reports),
            "decrypt_failed": errors.reasons(),
        }
        if self.protocol == "malicious":
            details["n_splits"] = self.n_splits
        auc = bound = math.nan
        if self.share_auc_with_server and shared:
            values = np.array([r["auc"] for r in shared.values()])
            auc = float(np.median(values))
            bounds = [r["resolution-bound"] for r in shared.values() if "resolution-bound" in r]
            bound = float(np.median(bounds)) if bounds else math.nan
            if values.max() - values.min() > _REPORT_SPREAD:
                log(WARNING, "FHE AUC phase: client reports differ by %.3g: %s", values.max() - values.min(),
                    {n: r["auc"] for n, r in shared.items()})
            details["auc_known_to"] = "clients and server"
            details["reported_by"] = sorted(shared)
        else:
            if self.share_auc_with_server:
                log(WARNING, "FHE AUC phase: share_auc_with_server is set but no client reported the AUC "
                             "(their own 'share-auc-with-server' is false)")
            details["auc_known_to"] = "clients"
        if self.metrics_threshold is not None:
            details["metrics_threshold"] = self.metrics_threshold
            details["threshold_metrics_verified"] = self.protocol == "semi-honest"
            with_metrics = [r for r in shared.values() if all(k in r for k in _METRICS)]
            if self.share_auc_with_server and with_metrics:
                details["threshold_metrics"] = {k: float(np.median([r[k] for r in with_metrics])) for k in _METRICS}

        if details["auc_known_to"] == "clients":
            log(INFO, "FHE AUC phase (%s): %d clients; the AUC is known to the clients only "
                "(%d decrypted it); %.1f s", self.protocol, len(contributors), len(reports), t_total)
        else:
            log(INFO, "FHE AUC phase (%s): %d clients, global AUC %.6f (reported by %d clients); "
                "aggregation %.2f s, phase %.1f s", self.protocol, len(contributors), auc, len(shared),
                t_agg, t_total)
        if "threshold_metrics" in details:
            tm = details["threshold_metrics"]
            log(INFO, "FHE metrics at threshold %g (reported by the clients): accuracy %.6f precision %.6f "
                "recall %.6f F1 %.6f", self.metrics_threshold, *(tm[k] for k in _METRICS))
        return AUCPhaseResult(
            auc=auc,
            thresholds=np.asarray(self.thresholds, dtype=np.float64),
            counts=None,
            contributors=sorted(contributors),
            failed=failed.reasons(),
            method=self.method,
            details=details,
            resolution_bound=bound,
        )
