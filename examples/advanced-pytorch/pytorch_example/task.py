"""pytorch_example: the model, the data, training and evaluation (no flwr-fedeval here).

Flower's advanced-pytorch shape on a binary task: scikit-learn's breast-cancer data (569 rows, 30
features, bundled with scikit-learn, so the example runs offline). A fixed 20 % of the rows is the
server's centralised test set (Flower's example evaluates on Fashion-MNIST's test split on the
server); the rest is split IID into ``num-partitions`` clients, each with its own 80/20 train/test
split. The model is a 30→32→2 MLP with BatchNorm (its int64 ``num_batches_tracked`` travels too).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn

SEED = 42  # the data split's, not a secret
SERVER_SHARE = 0.2


class Net(nn.Module):
    """A 30→32→2 MLP with BatchNorm (two logits: benign, malignant)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(30, 32)
        self.bn1 = nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn1(self.fc1(x))))


def _rows():
    x, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(SEED).permutation(len(y))
    n_server = int(round(SERVER_SHARE * len(y)))
    return x, y, order[:n_server], order[n_server:]


def load_data(partition_id: int, num_partitions: int):
    """This client's (x_train, y_train, x_test, y_test): float32 features, int64 labels, standardised
    with the client's own training statistics."""
    x, y, _, client_rows = _rows()
    part = np.array_split(client_rows, num_partitions)[partition_id]
    x_train, x_test, y_train, y_test = train_test_split(
        x[part], y[part], test_size=0.2, random_state=SEED, stratify=y[part]
    )
    scaler = StandardScaler().fit(x_train)
    return (
        scaler.transform(x_train).astype(np.float32),
        y_train.astype(np.int64),
        scaler.transform(x_test).astype(np.float32),
        y_test.astype(np.int64),
    )


def load_centralized_data():
    """The server's test set (x, y), standardised with its own statistics."""
    x, y, server_rows, _ = _rows()
    xs = StandardScaler().fit_transform(x[server_rows]).astype(np.float32)
    return xs, y[server_rows].astype(np.int64)


def train(net: Net, x: np.ndarray, y: np.ndarray, epochs: int, lr: float, batch_size: int = 16) -> float:
    """Train in place with SGD (momentum 0.9); returns the mean loss of the last epoch."""
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    net.train()
    loss_sum = 0.0
    for _ in range(epochs):
        loss_sum = 0.0
        for i in range(0, len(yt) - 1, batch_size):  # BatchNorm needs 2+ rows per batch
            xb, yb = xt[i : i + batch_size], yt[i : i + batch_size]
            if len(yb) < 2:
                continue
            opt.zero_grad()
            loss = loss_fn(net(xb), yb)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(yb)
    return loss_sum / len(yt)


def test(net: Net, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy loss, accuracy) on (x, y)."""
    net.eval()
    with torch.no_grad():
        logits = net(torch.from_numpy(x))
        loss = nn.functional.cross_entropy(logits, torch.from_numpy(y)).item()
        accuracy = (logits.argmax(dim=1).numpy() == y).mean().item()
    return loss, accuracy


def scores(net: Net, x: np.ndarray) -> np.ndarray:
    """Positive-class (malignant) probabilities, float64, shape (len(x),)."""
    net.eval()
    with torch.no_grad():
        return torch.softmax(net(torch.from_numpy(x)), dim=1)[:, 1].double().numpy()
