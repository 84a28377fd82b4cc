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
# Spelled in flwr_fedeval.protocol.fhe_auc (step table, payloads); the old names stay importable.
from flwr_fedeval.protocol import fhe_auc as _fhe_auc

#: Step 1: every client makes an X25519 key pair; the reply carries the public key.
QUERY_FHE_PUBKEY = _fhe_auc.PUBKEY.message_type
#: Step 2: the key holder makes the CKKS keys; the reply carries the public
#: context and one sealed (secret context, seed) bundle per other client.
QUERY_FHE_KEYGEN = _fhe_auc.KEYGEN.message_type
#: Steps 3-4: global model + decision points (+ sealed bundle) in, encrypted counts out.
EVALUATE_FHE_COUNTS = _fhe_auc.COUNTS.message_type
#: Steps 5-6: the aggregated (masked) ciphertexts in; the client decrypts.
QUERY_FHE_RESULT = _fhe_auc.RESULT.message_type
#: The two protocols, the signed-key ``protocol`` and the record keys (see the payload classes).
FHE_PROTOCOLS = _fhe_auc.PROTOCOLS
FHE_SIGNED_PROTOCOL = _fhe_auc.SIGNED_PROTOCOL
FHE_REQUEST_KEY = _fhe_auc.REQUEST_KEY
FHE_PUBKEY_KEY = _fhe_auc.PUBKEY_KEY
FHE_PEERS_KEY = _fhe_auc.PEERS_KEY
FHE_PEER_SIGNERS_KEY = _fhe_auc.PEER_SIGNERS_KEY
FHE_PEER_SIGNATURES_KEY = _fhe_auc.PEER_SIGNATURES_KEY
FHE_HOLDER_KEY = _fhe_auc.HOLDER_KEY
FHE_CONTEXT_KEY = _fhe_auc.CONTEXT_KEY
FHE_BUNDLES_KEY = _fhe_auc.BUNDLES_KEY
FHE_BUNDLE_KEY = _fhe_auc.BUNDLE_KEY
FHE_COUNTS_KEY = _fhe_auc.COUNTS_KEY
FHE_RESULT_KEY = _fhe_auc.RESULT_KEY
FHE_REPORT_KEY = _fhe_auc.REPORT_KEY

# --- SecSV contribution phase (strategies/shapley_phase.py, clients/shapley_handlers.py) ---
#: Every node: its role ("client" or "shapley-aux").
QUERY_FEDEVAL_ROLE = "query.fedeval_role"
QUERY_SHAPLEY_HELLO = "query.shapley_hello"
QUERY_SHAPLEY_KEYGEN = "query.shapley_keygen"
QUERY_SHAPLEY_SHARE = "query.shapley_share"
QUERY_SHAPLEY_MODELS = "query.shapley_models"
QUERY_SHAPLEY_AUX_SETUP = "query.shapley_aux_setup"
QUERY_SHAPLEY_AUX_EVAL = "query.shapley_aux_eval"
QUERY_SHAPLEY_HELPER = "query.shapley_helper"
QUERY_SHAPLEY_AUX_DIFF = "query.shapley_aux_diff"

#: The roles a node can answer to ``query.fedeval_role``.
ROLES = ("client", "shapley-aux")
#: Reply of ``query.fedeval_role``: ConfigRecord ``role``.
ROLE_KEY = "role"
#: ConfigRecord of every Shapley request: ``session`` and the public parameters.
SHAPLEY_REQUEST_KEY = "shapley"
#: Reply of hello: ConfigRecord ``role``, ``public-key``, sizes, ``rounds``.
SHAPLEY_HELLO_KEY = "shapley-hello"
#: Request of keygen: ConfigRecord ``{str(node_id): X25519 public key}``.
SHAPLEY_PEERS_KEY = "shapley-peers"
#: Reply of keygen / request of aux setup: ArrayRecord ``public`` (public CKKS context).
SHAPLEY_CONTEXT_KEY = "shapley-context"
#: Reply of keygen: ConfigRecord, the leader's X25519 key signed for role ``"key-holder"``.
SHAPLEY_LEADER_KEY = "shapley-leader"
#: Reply of keygen: ArrayRecord ``{str(node_id): sealed bundle}``; request of share: ``sealed``.
SHAPLEY_BUNDLES_KEY = "shapley-bundles"
SHAPLEY_BUNDLE_KEY = "shapley-bundle"
#: Reply of share: ArrayRecord ``x``, ``y`` (P's shares, uint64), ``sealed-aux``.
SHAPLEY_SHARE_KEY = "shapley-share"
#: Request of aux setup: ArrayRecord ``sealed-<node>``; ConfigRecord ``{node: public key}``.
SHAPLEY_AUX_SHARES_KEY = "shapley-aux-shares"
SHAPLEY_AUX_KEYS_KEY = "shapley-aux-keys"
#: Reply of aux setup: ConfigRecord ``samples``.
SHAPLEY_AUX_KEY = "shapley-aux"
#: Reply of models: ArrayRecord ``cts`` (packed ciphertexts of one local model).
SHAPLEY_MODEL_KEY = "shapley-model"
#: Request of aux eval: ArrayRecord ``members-<j>``, ``ids-<j>``; the round's models as relayed.
SHAPLEY_JOBS_KEY = "shapley-jobs"
SHAPLEY_ROUND_MODELS_KEY = "shapley-round-models"
#: Reply of aux eval: ArrayRecord ``cts-<j>``.
SHAPLEY_PRODUCTS_KEY = "shapley-products"
#: Request of helper: ArrayRecord ``cts-<j>``, ``n-<j>``; reply: ArrayRecord ``p-<j>``, ``a-<j>``.
SHAPLEY_BATCHES_KEY = "shapley-batches"
SHAPLEY_PRED_KEY = "shapley-pred"
#: Request of aux diff: ArrayRecord ``sealed-<j>``, ``ids-<j>``; ConfigRecord ``helper-<j>``.
SHAPLEY_PREDS_KEY = "shapley-preds"
SHAPLEY_HELPER_KEYS_KEY = "shapley-helper-keys"
#: Reply of aux diff: ArrayRecord ``d-<j>``.
SHAPLEY_DIFFS_KEY = "shapley-diffs"
#: Relayed keys are signed (:mod:`flwr_fedeval.identity`): a record ``<key>`` of relayed keys
#: comes with ConfigRecords ``<key>-signers`` (roster names) and ``<key>-signatures``.
SIGNERS_SUFFIX = "-signers"
SIGNATURES_SUFFIX = "-signatures"
#: ``protocol`` of the SecSV signed key statements; ``round`` is 0 (the session id binds a key to one phase).
SHAPLEY_SIGNED_PROTOCOL = "secsv"
#: Signing role per node role.
SHAPLEY_SIGNED_ROLE = {"client": "client", "shapley-aux": "aux"}
#: ``protocol`` of the signed role statement of ``query.fedeval_role``.
ROLE_PROTOCOL = "fedeval-role"
