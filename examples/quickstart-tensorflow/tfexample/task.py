"""tfexample: the model, the data and the training (no flwr-fedeval here).

Flower's quickstart-tensorflow shape on a binary task: scikit-learn's breast-cancer data (569 rows,
30 features, bundled with scikit-learn, so the example runs offline), split IID into
``num-partitions`` clients, each with its own 80/20 train/test split, and a 30→16→2 Keras MLP.
TensorFlow is imported inside the functions that need it: the ClientApp's secure-aggregation and
AUC steps that carry no model never pay its start-up.
"""

from __future__ import annotations

import os

import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

# Make TensorFlow log less verbose
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def load_model(learning_rate: float = 0.01):
    """A compiled 30→16→2 MLP (softmax over benign, malignant) with the Adam optimizer."""
    import keras

    model = keras.Sequential([
        keras.Input(shape=(30,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(2, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def load_data(partition_id: int, num_partitions: int, seed: int = 42):
    """This client's (x_train, y_train, x_test, y_test): float32 features, int64 labels.

    The IID partition is a fixed shuffle of the 569 rows (the seed is the data split's, not a
    secret); the features are standardised with the client's own training statistics.
    """
    x, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    part = np.array_split(order, num_partitions)[partition_id]
    x_train, x_test, y_train, y_test = train_test_split(
        x[part], y[part], test_size=0.2, random_state=seed, stratify=y[part])
    scaler = StandardScaler().fit(x_train)
    return (scaler.transform(x_train).astype(np.float32), y_train.astype(np.int64),
            scaler.transform(x_test).astype(np.float32), y_test.astype(np.int64))


def scores(model, x: np.ndarray) -> np.ndarray:
    """Positive-class (malignant) probabilities, float64, shape (len(x),)."""
    return np.asarray(model.predict(x, verbose=0), dtype=np.float64)[:, 1]
