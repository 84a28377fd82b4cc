"""flwr-fedeval: privacy-preserving federated training and evaluation for Flower.

Layers (imports point downward only, see DESIGN.md §2):

- protocol layers, importing neither flwr nor TensorFlow:
  ``rlwe`` (xMK-CKKS), ``fhe`` (CKKS AUC), ``dp`` (DP AUC baselines),
  ``metrics`` (plaintext references), ``shapley`` (contribution evaluation);
- Flower glue: ``strategies``, ``clients``, ``app``; data loading in ``data``.
"""

__version__ = "0.1.0"
