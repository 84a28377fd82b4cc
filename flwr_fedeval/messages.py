"""Message types and record codecs shared by our strategies and client handlers.

Flower message types have the form ``<train|evaluate|query>[.<identifier>]``.
Record contents are numpy arrays in ``ArrayRecord``s (never object arrays)
and Python scalars in ``ConfigRecord``s, so every message survives the
deployment engine's serialization.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from flwr_fedeval.metrics.counts import ConfusionCounts
from flwr_fedeval.protocol import ReplyCode  # noqa: F401  (re-exported: the codes live in the protocol layer)

__all__ = [
    "ReplyCode",
    "EVALUATE_THRESHOLD_COUNTS",
    "counts_to_record",
    "counts_from_record",
    "EVALUATE_DPAUC_LAPLACE",
    "EVALUATE_DPAUC_RR",
    "EVALUATE_FEDAUC_SCORES",
    "EVALUATE_FEDAUC_STATS",
    "noisy_counts_from_record",
    "noisy_counts_to_record",
    "local_stats_from_record",
    "local_stats_to_record",
    "scores_from_record",
]

#: Evaluation phase of the plaintext global AUC: thresholds in, counts out.
EVALUATE_THRESHOLD_COUNTS = "evaluate.threshold_counts"
#: DPAUC_Lap: thresholds + DP parameters in, Laplace-noised counts (float64) out.
EVALUATE_DPAUC_LAPLACE = "evaluate.dpauc_laplace"
#: DPAUC_RR: thresholds + ε in, exact counts of the randomized-response labels out.
EVALUATE_DPAUC_RR = "evaluate.dpauc_rr"
#: FedAUC round 1: global model + session id in, the client's shuffled scores out.
EVALUATE_FEDAUC_SCORES = "evaluate.fedauc_scores"
#: FedAUC round 2: global ranks of those shuffled scores + DP parameters in,
#: (localSum, localP, localN) out.
EVALUATE_FEDAUC_STATS = "evaluate.fedauc_stats"


# --- record keys of the AUC phases (plain, DP, FHE) ---------------------------
#: Request: ArrayRecord ``thresholds`` (float64, shape (N,)), the public decision points.
EVALUATION_KEY = "evaluation"
#: Reply (plain, DPAUC_RR): ArrayRecord ``tp``/``fp``/``tn``/``fn`` (int64, shape (N,)).
COUNTS_KEY = "counts"
#: Request of the DP phases: ConfigRecord ``epsilon`` (+ ``session``, ``mechanism``, ... for FedAUC).
DP_KEY = "dp"
#: Reply (DPAUC_Lap): ArrayRecord ``tp``/``fp``/``tn``/``fn`` (float64, noisy).
NOISY_COUNTS_KEY = "noisy-counts"
#: Reply (FedAUC round 1): ArrayRecord ``scores`` (float64, shuffled).
SCORES_KEY = "scores"
#: Request (FedAUC round 2): ArrayRecord ``ranks`` (global ranks of the shuffled scores).
FEDAUC_KEY = "fedauc"
#: Reply (FedAUC round 2): ConfigRecord ``local-sum``, ``local-p``, ``local-n``.
STATS_KEY = "stats"
#: Flower's default record keys (``FedAvg(arrayrecord_key=..., configrecord_key=...)``):
#: the model's ArrayRecord, the train config, and the reply's MetricRecord.
ARRAYS_KEY = "arrays"
CONFIG_KEY = "config"
METRICS_KEY = "metrics"

_COUNT_FIELDS = ("tp", "fp", "tn", "fn")


def counts_to_record(counts: ConfusionCounts) -> ArrayRecord:
    """Pack TP/FP/TN/FN (int64 arrays of shape (N,)) into an ArrayRecord."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v, dtype=np.int64)) for k, v in zip(_COUNT_FIELDS, counts)})


def counts_from_record(record: ArrayRecord, num_points: int) -> ConfusionCounts:
    """Unpack and validate counts sent by a client.

    Raises
    ------
    ValueError
        If a field is missing, has the wrong length or dtype, is negative,
        or the counts are inconsistent (TP/FP not non-decreasing over the
        descending decision points, or TP+FN / FP+TN not constant).
    """
    missing = [k for k in _COUNT_FIELDS if k not in record]
    if missing:
        raise ValueError(f"counts record lacks field(s) {missing}")
    arrays = {}
    for k in _COUNT_FIELDS:
        a = record[k].numpy()
        if a.shape != (num_points,):
            raise ValueError(f"field '{k}' has shape {a.shape}, expected ({num_points},)")
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"field '{k}' has dtype {a.dtype}, expected an integer type")
        if (a < 0).any():
            raise ValueError(f"field '{k}' has negative counts")
        arrays[k] = a.astype(np.int64)
    counts = ConfusionCounts(**arrays)
    if (np.diff(counts.tp) < 0).any() or (np.diff(counts.fp) < 0).any():
        raise ValueError("TP/FP must be non-decreasing over descending decision points")
    if len(set((counts.tp + counts.fn).tolist())) > 1 or len(set((counts.fp + counts.tn).tolist())) > 1:
        raise ValueError("TP+FN and FP+TN must be the same at every decision point")
    return counts


def noisy_counts_to_record(counts) -> ArrayRecord:
    """Pack noisy TP/FP/TN/FN (float64 arrays of shape (N,)) into an ArrayRecord."""
    return ArrayRecord(
        {k: Array(np.ascontiguousarray(v, dtype=np.float64)) for k, v in zip(_COUNT_FIELDS, counts)}
    )


def noisy_counts_from_record(record: ArrayRecord, num_points: int) -> tuple[np.ndarray, ...]:
    """Unpack noisy counts sent by a DPAUC_Lap client: ``(tp, fp, tn, fn)`` float64.

    Noisy counts may be negative or fractional; they must be finite floats of
    shape ``(num_points,)``.

    Raises
    ------
    ValueError
        If a field is missing, has the wrong shape or dtype, or is not finite.
    """
    missing = [k for k in _COUNT_FIELDS if k not in record]
    if missing:
        raise ValueError(f"noisy counts record lacks field(s) {missing}")
    out = []
    for k in _COUNT_FIELDS:
        a = record[k].numpy()
        if a.shape != (num_points,):
            raise ValueError(f"field '{k}' has shape {a.shape}, expected ({num_points},)")
        if a.dtype != np.float64:
            raise ValueError(f"field '{k}' has dtype {a.dtype}, expected float64")
        if not np.isfinite(a).all():
            raise ValueError(f"field '{k}' has NaN or infinite values")
        out.append(a.astype(np.float64))
    return tuple(out)


def scores_from_record(record: ArrayRecord) -> np.ndarray:
    """Unpack a FedAUC client's shuffled scores: finite float64 of shape (n,).

    Raises
    ------
    ValueError
        If ``scores`` is missing, not 1-D float64, or not finite.
    """
    if "scores" not in record:
        raise ValueError("scores record lacks field 'scores'")
    a = record["scores"].numpy()
    if a.ndim != 1 or a.dtype != np.float64:
        raise ValueError(f"scores must be 1-D float64, got shape {a.shape} dtype {a.dtype}")
    if not np.isfinite(a).all():
        raise ValueError("scores contain NaN or infinite values")
    return a


_STATS_FIELDS = ("local-sum", "local-p", "local-n")


def local_stats_to_record(stats) -> ConfigRecord:
    """Pack FedAUC ``(localSum, localP, localN)`` as Python floats."""
    return ConfigRecord({k: float(v) for k, v in zip(_STATS_FIELDS, stats)})


def local_stats_from_record(record: ConfigRecord, num_samples: int) -> tuple[float, float, float]:
    """Unpack and check a FedAUC client's ``(localSum, localP, localN)``.

    ``localP + localN`` must equal the number of scores the client sent in
    round 1 (``localN′ = n_k - localP′`` holds for the noisy variants too).

    Raises
    ------
    ValueError
        If a field is missing, not a finite number, or the totals disagree.
    """
    missing = [k for k in _STATS_FIELDS if k not in record]
    if missing:
        raise ValueError(f"stats record lacks field(s) {missing}")
    values = []
    for k in _STATS_FIELDS:
        v = record[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise ValueError(f"field '{k}' must be a finite number, got {v!r}")
        values.append(float(v))
    if not np.isclose(values[1] + values[2], num_samples, rtol=0.0, atol=1e-6 * max(1, num_samples)):
        raise ValueError(
            f"local-p + local-n = {values[1] + values[2]:g}, but the client sent {num_samples} scores"
        )
    return values[0], values[1], values[2]

# --- xMK-CKKS secure aggregation (DESIGN.md §3) -----------------------------
#: Step 1: key generation; the reply carries a signed commitment to b_i and the mask key.
QUERY_XMK_KEYGEN = "query.xmk_keygen"
#: Step 1b: the signed commitments in; the reply opens b_i and the X25519 mask key.
QUERY_XMK_REVEAL = "query.xmk_reveal"
#: Step 3: partial decryption of the summed C1; the reply carries D_i.
QUERY_XMK_PDEC = "query.xmk_pdec"
#: Record keys of the secure-aggregation messages.
XMK_CONFIG_KEY = "xmk"
XMK_CIPHERTEXT_KEY = "xmk-ciphertext"
XMK_C1_KEY = "xmk-c1"
XMK_SHARE_KEY = "xmk-share"


def bytes_to_array(data: bytes) -> Array:
    """Wrap bytes as a uint8 ``Array`` (large ArrayRecords are chunked by Flower)."""
    return Array(np.frombuffer(data, dtype=np.uint8).copy())


def array_to_bytes(array: Array) -> bytes:
    """Inverse of :func:`bytes_to_array`; raises ``ValueError`` for another dtype."""
    a = array.numpy()
    if a.dtype != np.uint8 or a.ndim != 1:
        raise ValueError(f"expected a 1-D uint8 byte array, got {a.dtype} of shape {a.shape}")
    return a.tobytes()

# --- FHE AUC evaluation phase (DESIGN.md §4; strategies/fhe_phase.py) -------
#: Step 1: every client makes an X25519 key pair; the reply carries the public key.
QUERY_FHE_PUBKEY = "query.fhe_pubkey"
#: Step 2: the key holder makes the CKKS keys; the reply carries the public
#: context and one sealed (secret context, seed) bundle per other client.
QUERY_FHE_KEYGEN = "query.fhe_keygen"
#: Steps 3-4: global model + decision points (+ sealed bundle) in, encrypted counts out.
EVALUATE_FHE_COUNTS = "evaluate.fhe_counts"
#: Steps 5-6: the aggregated (masked) ciphertexts in; the client decrypts.
QUERY_FHE_RESULT = "query.fhe_result"

#: The two protocols of the FHE AUC phase.
FHE_PROTOCOLS = ("semi-honest", "malicious")
#: ConfigRecord of every request: ``session`` (str) and the step's parameters.
FHE_REQUEST_KEY = "fhe"
#: Reply of step 1: ConfigRecord ``public-key`` (32 bytes), ``test-size-bucket`` (int),
#: ``signer`` (roster name) and ``signature`` (over the key statement of the public key).
FHE_PUBKEY_KEY = "fhe-pubkey"
#: Request of step 2: ConfigRecord ``{str(node_id): public key}`` of the other clients.
FHE_PEERS_KEY = "fhe-peers"
#: Request of step 2: ConfigRecords ``{str(node_id): roster name}`` and ``{str(node_id): signature}``
#: of the peers' keys (as each peer signed it at step 1).
FHE_PEER_SIGNERS_KEY = "fhe-peer-signers"
FHE_PEER_SIGNATURES_KEY = "fhe-peer-signatures"
#: Reply of step 2: ConfigRecord ``signer``, ``signature``: the key holder's X25519 key signed
#: for role ``"key-holder"``.
FHE_HOLDER_KEY = "fhe-holder"
#: ``protocol`` field of the signed key statements (:func:`flwr_fedeval.identity.key_statement`);
#: the phase has no rounds: ``round`` is 0, the session id binds the keys to one run.
FHE_SIGNED_PROTOCOL = "fhe-auc"
#: Reply of step 2: ArrayRecord ``public`` (public context, uint8).
FHE_CONTEXT_KEY = "fhe-context"
#: Reply of step 2: ArrayRecord ``{str(node_id): sealed bundle}``; request of step 3: ``sealed``.
FHE_BUNDLES_KEY = "fhe-bundles"
FHE_BUNDLE_KEY = "fhe-bundle"
#: Reply of step 3: ArrayRecord ``auc`` (+ ``metrics``), packed ciphertexts.
FHE_COUNTS_KEY = "fhe-counts"
#: Request of step 5: ArrayRecord ``auc`` (+ ``metrics``), the aggregated ciphertexts.
FHE_RESULT_KEY = "fhe-result"
#: Reply of step 6: ConfigRecord ``status``, ``shared`` and, if shared, the values.
FHE_REPORT_KEY = "fhe-report"

# --- SecSV contribution phase (flwr_fedeval.protocol.secsv) -----------------------
# The old constant names, re-exported: the message types, record keys and field names are
# spelled only in flwr_fedeval.protocol.secsv (one payload dataclass per request and reply).
from flwr_fedeval.protocol import secsv as _secsv

QUERY_FEDEVAL_ROLE = _secsv.ROLE_QUERY.message_type
QUERY_SHAPLEY_HELLO = _secsv.HELLO.message_type
QUERY_SHAPLEY_KEYGEN = _secsv.KEYGEN.message_type
QUERY_SHAPLEY_SHARE = _secsv.SHARE.message_type
QUERY_SHAPLEY_MODELS = _secsv.MODELS.message_type
QUERY_SHAPLEY_AUX_SETUP = _secsv.AUX_SETUP.message_type
QUERY_SHAPLEY_AUX_EVAL = _secsv.AUX_EVAL.message_type
QUERY_SHAPLEY_HELPER = _secsv.HELPER.message_type
QUERY_SHAPLEY_AUX_DIFF = _secsv.AUX_DIFF.message_type
SHAPLEY_AUX_KEY = _secsv.AUX_KEY
SHAPLEY_AUX_KEYS_KEY = _secsv.AUX_KEYS_KEY
SHAPLEY_AUX_SHARES_KEY = _secsv.AUX_SHARES_KEY
SHAPLEY_BATCHES_KEY = _secsv.BATCHES_KEY
SHAPLEY_BUNDLE_KEY = _secsv.BUNDLE_KEY
SHAPLEY_BUNDLES_KEY = _secsv.BUNDLES_KEY
SHAPLEY_CONTEXT_KEY = _secsv.CONTEXT_KEY
SHAPLEY_DIFFS_KEY = _secsv.DIFFS_KEY
SHAPLEY_HELLO_KEY = _secsv.HELLO_KEY
SHAPLEY_HELPER_KEYS_KEY = _secsv.HELPER_KEYS_KEY
SHAPLEY_JOBS_KEY = _secsv.JOBS_KEY
SHAPLEY_LEADER_KEY = _secsv.LEADER_KEY
SHAPLEY_MODEL_KEY = _secsv.MODEL_KEY
SHAPLEY_PEERS_KEY = _secsv.PEERS_KEY
SHAPLEY_PRED_KEY = _secsv.PRED_KEY
SHAPLEY_PREDS_KEY = _secsv.PREDS_KEY
SHAPLEY_PRODUCTS_KEY = _secsv.PRODUCTS_KEY
SHAPLEY_REQUEST_KEY = _secsv.REQUEST_KEY
ROLE_KEY = _secsv.ROLE_KEY
ROLE_PROTOCOL = _secsv.ROLE_PROTOCOL
ROLES = _secsv.ROLES
SHAPLEY_ROUND_MODELS_KEY = _secsv.ROUND_MODELS_KEY
SHAPLEY_SHARE_KEY = _secsv.SHARE_KEY
SIGNATURES_SUFFIX = _secsv.SIGNATURES_SUFFIX
SHAPLEY_SIGNED_PROTOCOL = _secsv.SIGNED_PROTOCOL
SHAPLEY_SIGNED_ROLE = _secsv.SIGNED_ROLE
SIGNERS_SUFFIX = _secsv.SIGNERS_SUFFIX
