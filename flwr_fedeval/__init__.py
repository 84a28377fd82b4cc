"""flwr-fedeval: privacy-preserving federated training and evaluation for Flower.

Layers (imports point downward only, see DESIGN.md §2):

- protocol layers, importing neither flwr nor TensorFlow:
  ``rlwe`` (xMK-CKKS), ``fhe`` (CKKS AUC), ``dp`` (DP AUC baselines),
  ``metrics`` (plaintext references), ``shapley`` (contribution evaluation);
- Flower glue: ``strategies`` (server side), ``clients`` (client side),
  ``messages`` (message types and record keys shared by both), ``testing``
  (the serializing in-process Grid for your own tests), ``app``; data loading
  in ``data``.
"""

__version__ = "0.1.0"

# TenSEAL must not bind to TensorFlow's protobuf/absl: TensorFlow loads its
# libraries with RTLD_GLOBAL, and a TenSEAL loaded after it resolves protobuf
# symbols to TensorFlow's copy — serialization then fails ("failed to save
# proto") or segfaults (measured with tensorflow-cpu 2.21 and tenseal 0.3.18).
# Loading it here, before any model code imports TensorFlow, is not enough:
# Flower's simulation imports TensorFlow itself (flwr.simulation.ray_transport.
# utils) before the ServerApp and the Ray ClientApp actors load our package.
# RTLD_DEEPBIND makes TenSEAL's extension prefer its own symbols in either order.
def _load_tenseal() -> None:
    import os
    import sys

    flags = sys.getdlopenflags()
    if hasattr(os, "RTLD_DEEPBIND"):
        sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL | os.RTLD_DEEPBIND)
    try:  # pragma: no cover - absent in the OpenFHE-only venv
        import tenseal  # noqa: F401
    except ImportError:
        pass
    finally:
        sys.setdlopenflags(flags)


_load_tenseal()
