"""Message types and record codecs shared by our strategies and client handlers.

Flower message types have the form ``<train|evaluate|query>[.<identifier>]``.
Record contents are numpy arrays in ``ArrayRecord``s (never object arrays)
and Python scalars in ``ConfigRecord``s, so every message survives the
deployment engine's serialization.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from flwr_fedeval.protocol import ReplyCode  # noqa: F401  (re-exported: the codes live in the protocol layer)

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
from flwr_fedeval.protocol._base import array_bytes as _array_bytes
from flwr_fedeval.protocol._base import bytes_array as bytes_to_array  # noqa: F401
from flwr_fedeval.protocol.xmk import (  # noqa: F401
    QUERY_XMK_KEYGEN,
    QUERY_XMK_PDEC,
    QUERY_XMK_REVEAL,
    XMK_C1_KEY,
    XMK_CIPHERTEXT_KEY,
    XMK_CONFIG_KEY,
    XMK_SHARE_KEY,
)


def array_to_bytes(array: Array) -> bytes:
    """Inverse of :func:`bytes_to_array` (:func:`flwr_fedeval.protocol.bytes_array`).

    Raises
    ------
    flwr_fedeval.protocol.MalformedMessage
        (a ``ValueError``) If ``array`` is not a 1-D uint8 byte array.
    """
    return _array_bytes(ArrayRecord({"bytes": array}), "array", "bytes")

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
