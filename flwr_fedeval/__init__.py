"""flwr-fedeval: privacy-preserving federated training and evaluation for Flower.

Layers (imports point downward only, see DESIGN.md §2):

- protocol layers, importing neither flwr nor TensorFlow:
  ``rlwe`` (xMK-CKKS), ``fhe`` (CKKS AUC), ``dp`` (DP AUC baselines),
  ``metrics`` (plaintext references), ``shapley`` (contribution evaluation);
- Flower glue: ``strategies``, ``clients``, ``app``; data loading in ``data``.
"""

__version__ = "0.1.0"

# TenSEAL must be loaded before TensorFlow: with TensorFlow's protobuf/absl
# symbols loaded first, TenSEAL's serialization fails ("failed to save proto")
# or segfaults (measured with tensorflow-cpu 2.21 and tenseal 0.3.18). Loading
# it here, before any model code imports TensorFlow, keeps the FHE backend
# usable in the same process as Keras (simulation, the in-process test grid).
try:  # pragma: no cover - absent in the OpenFHE-only venv
    import tenseal as _tenseal  # noqa: F401
except ImportError:
    pass
