"""Secure Shapley-value contribution evaluation (Zheng, Cao, Yoshikawa, PVLDB 16(7) 2023).

* :mod:`.fsv` — plaintext Federated Shapley Values (exact, and SampleSkip);
* :mod:`.matrix_reducing` — Algorithm 5 (rotation-free HE matrix product);
* :mod:`.matrix_squaring` — §4.2 (HESV's baseline HE matrix product, with rotations);
* :mod:`.sharing` — additive secret shares over Z_{2^k} with fixed point;
* :mod:`.secsv` — two-server SecSV (Algorithms 3, 4, 6, 7);
* :mod:`.hesv` — one-server HESV (Algorithms 1, 2);
* :mod:`.parties` — SecSV one function per party and step (used by the Flower phase).

No flwr and no TensorFlow imports.
"""

from flwr_fedeval.shapley.fsv import (
    FSVResult,
    coalitions,
    fedavg,
    federated_shapley,
    find_skippable,
    fsv_from_utilities,
    predict,
    round_utilities,
    sample_skip_utilities,
    shapley_values,
)
from flwr_fedeval.shapley.matrix_reducing import matrix_reducing, reduce_data, reduce_model

__all__ = [
    "FSVResult",
    "coalitions",
    "fedavg",
    "federated_shapley",
    "find_skippable",
    "fsv_from_utilities",
    "matrix_reducing",
    "predict",
    "reduce_data",
    "reduce_model",
    "round_utilities",
    "sample_skip_utilities",
    "shapley_values",
]
