"""Keras models of the experiments (TensorFlow is imported lazily, on call).

* :func:`build_seed_cnn` — the COVID-19 CNN of Walskaar et al. 2023 (§4.2,
  Table 1): 949,002 parameters for a 128×128×1 input and 2 classes.
* :func:`build_mlp` — the small MLP used with the embedded breast-cancer data.
"""

from __future__ import annotations

from typing import Any

from flwr_fedeval._extras import require

__all__ = ["SEED_CNN_NUM_PARAMETERS", "build_seed_cnn", "build_mlp", "compile_classifier"]

#: Parameter count of :func:`build_seed_cnn` at its default input and classes.
SEED_CNN_NUM_PARAMETERS = 949_002


def compile_classifier(model: Any, learning_rate: float = 1e-3) -> Any:
    """Compile ``model`` for integer labels with Adam and accuracy."""
    keras = require("keras", purpose="the Keras models")

    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def build_seed_cnn(
    input_shape: tuple[int, int, int] = (128, 128, 1),
    num_classes: int = 2,
    *,
    learning_rate: float = 1e-3,
    bn_momentum: float = 0.9,
) -> Any:
    """The seed experiment's CNN, compiled.

    Conv2D(32, 5×5, ReLU, L2 0.01) → BatchNorm → MaxPool(2) →
    Conv2D(16, 5×5, ReLU) → BatchNorm → MaxPool(2) →
    Conv2D(32, 5×5, ReLU) → BatchNorm → MaxPool(2) → Flatten →
    Dense(200, ReLU, L2 0.01) → Dropout(0.5) → Dense(num_classes, softmax).

    With the default ``input_shape=(128, 128, 1)`` and 2 classes it has
    exactly 949,002 parameters (trainable and BatchNorm statistics).

    BatchNorm uses ``momentum=bn_momentum`` (default 0.9, not Keras's 0.99):
    with 0.99 the moving statistics need hundreds of steps to forget their
    initial values, more than a client runs in a federated round, and the
    model then predicts one class at inference (measured on the chest X-rays:
    test accuracy 0.53 vs 0.69 after 3 local epochs).

    Source: Walskaar, Tran, Catak 2023, §4.2.
    """
    keras = require("keras", purpose="the Keras models")
    layers, regularizers = keras.layers, keras.regularizers

    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, 5, activation="relu", kernel_regularizer=regularizers.l2(0.01)),
            layers.BatchNormalization(momentum=bn_momentum),
            layers.MaxPooling2D(2),
            layers.Conv2D(16, 5, activation="relu"),
            layers.BatchNormalization(momentum=bn_momentum),
            layers.MaxPooling2D(2),
            layers.Conv2D(32, 5, activation="relu"),
            layers.BatchNormalization(momentum=bn_momentum),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(200, activation="relu", kernel_regularizer=regularizers.l2(0.01)),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ],
        name="seed_cnn",
    )
    return compile_classifier(model, learning_rate)


def build_mlp(
    num_features: int,
    num_classes: int = 2,
    *,
    hidden_units: tuple[int, ...] = (32, 16),
    learning_rate: float = 1e-3,
) -> Any:
    """A small dense classifier for tabular data, compiled (softmax output)."""
    keras = require("keras", purpose="the Keras models")
    layers = keras.layers

    stack = [keras.Input(shape=(num_features,))]
    stack += [layers.Dense(units, activation="relu") for units in hidden_units]
    stack.append(layers.Dense(num_classes, activation="softmax"))
    return compile_classifier(keras.Sequential(stack, name="mlp"), learning_rate)
