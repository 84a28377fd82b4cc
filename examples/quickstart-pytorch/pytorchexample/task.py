"""pytorchexample: the model, the data and the training loop (no flwr-fedeval here).

Flower's quickstart-pytorch shape on a binary task: scikit-learn's breast-cancer data (569 rows,
30 features, bundled with scikit-learn, so the example runs offline), split IID into
``num-partitions`` clients, each with its own 80/20 train/test split, and a 30→16→2 MLP.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn


class Net(nn.Module):
    """A 30→16→2 MLP (two logits: benign, malignant)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(30, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


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


def train(net: Net, x: np.ndarray, y: np.ndarray, epochs: int, lr: float, batch_size: int = 16) -> float:
    """Train in place with Adam; returns the mean loss of the last epoch."""
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    net.train()
    loss_sum = 0.0
    for _ in range(epochs):
        loss_sum = 0.0
        for i in range(0, len(yt), batch_size):
            opt.zero_grad()
            loss = loss_fn(net(xt[i:i + batch_size]), yt[i:i + batch_size])
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(yt[i:i + batch_size])
    return loss_sum / len(yt)


def scores(net: Net, x: np.ndarray) -> np.ndarray:
    """Positive-class (malignant) probabilities, float64, shape (len(x),)."""
    net.eval()
    with torch.no_grad():
        return torch.softmax(net(torch.from_numpy(x)), dim=1)[:, 1].double().numpy()
