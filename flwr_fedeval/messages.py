"""The old flat names of message types and record keys, kept importable.

Every message type, record key and field name is spelled in its protocol module
(:mod:`flwr_fedeval.protocol.xmk`, ``auc``, ``dp_auc``, ``fhe_auc``, ``secsv``), with
the step table and one payload dataclass per request and reply; new code imports
from there. This module only re-exports the names older code and users import,
plus Flower's own default record keys.
"""

from __future__ import annotations

from flwr.app import Array, ArrayRecord

from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.protocol import fhe_auc as _fhe_auc
from flwr_fedeval.protocol import secsv as _secsv
from flwr_fedeval.protocol._base import array_bytes as _array_bytes
from flwr_fedeval.protocol._base import bytes_array as bytes_to_array  # noqa: F401

# --- plaintext and DP AUC phases: spelled in their protocol modules, re-exported here ----------
from flwr_fedeval.protocol.auc import COUNTS_KEY, EVALUATE_THRESHOLD_COUNTS, EVALUATION_KEY  # noqa: F401
from flwr_fedeval.protocol.dp_auc import (  # noqa: F401
    DP_KEY,
    EVALUATE_DPAUC_LAPLACE,
    EVALUATE_DPAUC_RR,
    EVALUATE_FEDAUC_SCORES,
    EVALUATE_FEDAUC_STATS,
    FEDAUC_KEY,
    NOISY_COUNTS_KEY,
    SCORES_KEY,
    STATS_KEY,
)
from flwr_fedeval.protocol.xmk import (  # noqa: F401
    QUERY_XMK_KEYGEN,
    QUERY_XMK_PDEC,
    QUERY_XMK_REVEAL,
    XMK_C1_KEY,
    XMK_CIPHERTEXT_KEY,
    XMK_CONFIG_KEY,
    XMK_SHARE_KEY,
)

__all__ = [
    "ReplyCode",
    "EVALUATE_THRESHOLD_COUNTS",
    "EVALUATE_DPAUC_LAPLACE",
    "EVALUATE_DPAUC_RR",
    "EVALUATE_FEDAUC_SCORES",
    "EVALUATE_FEDAUC_STATS",
]

#: Flower's default record keys (``FedAvg(arrayrecord_key=..., configrecord_key=...)``):
#: the model's ArrayRecord, the train config, and the reply's MetricRecord.
ARRAYS_KEY = "arrays"
CONFIG_KEY = "config"
METRICS_KEY = "metrics"

# --- xMK-CKKS secure aggregation (DESIGN.md §3) -----------------------------
# The message types and record keys are spelled in :mod:`flwr_fedeval.protocol.xmk` (with the
# payload classes of every step); re-exported here for older imports.


def array_to_bytes(array: Array) -> bytes:
    """Inverse of :func:`bytes_to_array` (:func:`flwr_fedeval.protocol.bytes_array`).

    Raises
    ------
    flwr_fedeval.protocol.MalformedMessage
        (a ``ValueError``) If ``array`` is not a 1-D uint8 byte array.
    """
    return _array_bytes(ArrayRecord({"bytes": array}), "array", "bytes")

# --- FHE AUC evaluation phase (DESIGN.md §4; strategies/fhe_phase.py) -------
# Spelled in flwr_fedeval.protocol.fhe_auc (step table, payloads); the old names stay importable.

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

# --- SecSV contribution phase (flwr_fedeval.protocol.secsv) -----------------------
# The old constant names, re-exported: the message types, record keys and field names are
# spelled only in flwr_fedeval.protocol.secsv (one payload dataclass per request and reply).

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
