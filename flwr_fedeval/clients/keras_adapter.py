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
        clipped: np.ndarray = np.clip(scores, 0.0, 1.0)
        return clipped

    def predict_margin_scores(self, x: np.ndarray, *, margin_range: float = 64.0, logit_range: float = 12.0,
                              batch_size: int = 256) -> np.ndarray:
        """Scores in ``[0, 1]`` from the logit margin, for logit-spaced decision points.

        ``expit(margin · logit_range / margin_range)`` in float64: a public,
        data-independent monotone map (the AUC is unchanged) that spreads
        margins ``±margin_range`` over the logit-spaced decision points
        ``±logit_range`` of :func:`flwr_fedeval.metrics.counts.decision_points`
        (``spacing="logit"``), so confident scores no longer collapse into
        the two outermost bins as float32 softmax outputs do.

        Returns
        -------
        ndarray of shape (n_samples,), dtype float64, in ``[0, 1]``
        """
        if not (margin_range > 0 and logit_range > 0):
            raise ValueError(f"margin_range and logit_range must be > 0, got {margin_range!r}, {logit_range!r}")
        z = self.predict_logit_margin(x, batch_size=batch_size) * (float(logit_range) / float(margin_range))
        return 0.5 * (1.0 + np.tanh(0.5 * z))  # expit without overflow warnings

    def predict_logit_margin(self, x: np.ndarray, *, batch_size: int = 256) -> np.ndarray:
        """Pre-softmax logit margin ``z_1 − z_0 = log(p_1/p_0)`` of the positive class.

        For a ``Sequential`` model whose last layer is a ``Dense`` with softmax
        (two classes) or sigmoid (one unit) activation, e.g. the seed CNN and
        the MLP: the last layer is applied in float64 without its activation,
        so scores far out in the tails stay distinct where float32 softmax
        rounds them to exactly 0 or 1 (which collapses the ROC bins).
        ``expit(margin)`` is the positive-class probability.

        Returns
        -------
        ndarray of shape (n_samples,), dtype float64, any real value

        Raises
        ------
        ValueError
            If the model's last layer is not such a ``Dense`` layer.
        """
        layers = list(getattr(self.model, "layers", []))
        last = layers[-1] if layers else None
        weights = last.get_weights() if last is not None else []
        act = getattr(getattr(last, "activation", None), "__name__", "")
        if len(weights) != 2 or act not in ("softmax", "sigmoid") or np.ndim(weights[0]) != 2:
            raise ValueError(
                "predict_logit_margin needs a Sequential model ending in a Dense layer with softmax "
                f"or sigmoid activation, got {type(last).__name__} ({act or 'no activation'})"
            )
        kernel, bias = (np.asarray(w, dtype=np.float64) for w in weights)
        if len(x) == 0:
            return np.empty(0, dtype=np.float64)
        out = []
        for i in range(0, len(x), batch_size):
            h = x[i : i + batch_size]
            for layer in layers[:-1]:
                h = layer(h, training=False)
            out.append(np.asarray(h, dtype=np.float64).reshape(len(x[i : i + batch_size]), -1) @ kernel + bias)
        z = np.concatenate(out)
        if z.shape[1] == 1 and act == "sigmoid":
            margin = z[:, 0]
        elif z.shape[1] == 2 and act == "softmax":
            margin = z[:, 1] - z[:, 0]
        else:
            raise ValueError(f"unsupported output layer: {z.shape[1]} units with {act}")
        if not np.isfinite(margin).all():
            raise ValueError("model produced NaN/inf logits")
        return margin
