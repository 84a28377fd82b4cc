"""Adapter between a compiled Keras model and flat float vectors.

Secure aggregation encrypts one flat vector per client; this module turns the
list of arrays Keras uses into that vector (with a recorded
:class:`WeightLayout`), pads it to a multiple of the ring dimension, and
restores the arrays exactly (Walskaar et al. 2023, §3.3: flatten, encrypt,
and reshape the aggregate).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flwr_fedeval.weights import WeightLayout  # moved; importable from here too

__all__ = ["WeightLayout", "KerasModelAdapter"]


class KerasModelAdapter:
    """Wrap a compiled Keras model for federated use.

    Parameters
    ----------
    model : keras.Model
        A compiled classifier whose output is either softmax over classes
        (shape ``(n, C)``, class 1 = positive) or one sigmoid unit ``(n, 1)``.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.layout = WeightLayout.of(self.get_weights())

    @property
    def num_parameters(self) -> int:
        """Number of scalars in :meth:`get_weights` (trainable and not)."""
        return self.layout.size

    def get_weights(self) -> list[np.ndarray]:
        """The weights as the list of arrays Keras uses (``model.get_weights()``)."""
        return [np.asarray(w) for w in self.model.get_weights()]

    def set_weights(self, arrays: list[np.ndarray]) -> None:
        """Set weights from a list of arrays in Keras order (shapes checked)."""
        self.layout.flatten(arrays)  # validates count, shapes and finiteness
        self.model.set_weights(arrays)

    def flatten(self, *, pad_to_multiple: int | None = None) -> np.ndarray:
        """Current weights as one float64 vector (see :meth:`WeightLayout.flatten`)."""
        return self.layout.flatten(self.get_weights(), pad_to_multiple=pad_to_multiple)

    def set_flat(self, vector: np.ndarray) -> None:
        """Set weights from a flat (possibly padded) vector."""
        self.model.set_weights(self.layout.unflatten(vector))

    def predict_scores(self, x: np.ndarray, *, batch_size: int = 256) -> np.ndarray:
        """Scores in ``[0, 1]`` for the positive class.

        Returns
        -------
        ndarray of shape (n_samples,), dtype float64
        """
        if len(x) == 0:
            return np.empty(0, dtype=np.float64)
        # Direct calls (no Model.predict): no tf.function retracing for each new model.
        prob = np.concatenate(
            [
                np.asarray(self.model(x[i : i + batch_size], training=False), dtype=np.float64)
                for i in range(0, len(x), batch_size)
            ]
        )
        if prob.ndim == 2 and prob.shape[1] >= 2:
            scores = prob[:, 1]
        elif prob.ndim == 2 and prob.shape[1] == 1:
            scores = prob[:, 0]
        else:
            raise ValueError(f"unsupported model output shape {prob.shape}")
        if not np.isfinite(scores).all():
            raise ValueError("model produced NaN/inf scores")
        return np.clip(scores, 0.0, 1.0)
