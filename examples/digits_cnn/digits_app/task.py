"""The user's own ML code: data, model, training loop and loss — nothing here knows about routing.

Data: scikit-learn's embedded 8×8 digits (no download).  Client ``i`` belongs
to group ``i mod 4``; each group sees the digits through its own transform, so
no single model fits every group:

====== ==========================
group  transform
====== ==========================
0      identity
1      images rotated by 90°
2      images rotated by 180°
3      labels permuted (y → 9 − y)
====== ==========================

Client ``i`` takes ``samples-per-client`` consecutive images of one fixed
shuffle of the 1,797 digits (disjoint while the clients fit, wrapping around
for many clients) and keeps 80 % for training, 20 % held out.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

NUM_GROUPS = 4
GROUP_TRANSFORMS = ("identity", "rotate-90", "rotate-180", "label-permutation")
TRAIN_FRACTION = 0.8


@dataclass(frozen=True)
class Split:
    """Images ``(n, 1, 8, 8)`` float32 in [0, 1] and labels ``(n,)`` int64."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class ClientData:
    """One client's training and held-out data, and its group (known to the experiment only)."""

    train: Split
    test: Split
    group: int


@lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    order = np.random.default_rng(0).permutation(len(images))
    return images[order], digits.target.astype(np.int64)[order]


def _transform(images: np.ndarray, labels: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    if group == 1:
        images = np.rot90(images, k=1, axes=(2, 3))
    elif group == 2:
        images = np.rot90(images, k=2, axes=(2, 3))
    elif group == 3:
        labels = 9 - labels
    return np.ascontiguousarray(images), labels


@lru_cache(maxsize=64)
def client_data(partition_id: int, samples_per_client: int = 120) -> ClientData:
    """The data of client ``partition_id`` (cached per process)."""
    images, labels = _digits()
    index = (partition_id * samples_per_client + np.arange(samples_per_client)) % len(images)
    group = partition_id % NUM_GROUPS
    x, y = _transform(images[index], labels[index], group)
    cut = int(round(TRAIN_FRACTION * samples_per_client))
    return ClientData(
        train=Split(torch.from_numpy(x[:cut]), torch.from_numpy(y[:cut])),
        test=Split(torch.from_numpy(x[cut:]), torch.from_numpy(y[cut:])),
        group=group,
    )


class DigitsCNN(nn.Module):
    """Two 3×3 convolutions, max-pooling, two dense layers (≈ 38 k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def make_model(seed: int) -> DigitsCNN:
    """A freshly initialised CNN (deterministic in ``seed``)."""
    torch.manual_seed(seed)
    return DigitsCNN()


def train(model: nn.Module, data: Split, epochs: int, batch_size: int, learning_rate: float, seed: int) -> float:
    """Plain mini-batch SGD (momentum 0.9); returns the mean training loss of the last epoch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=0.9)
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(epochs):
        total = 0.0
        for batch in torch.randperm(len(data), generator=generator).split(batch_size):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data.images[batch]), data.labels[batch])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
    return total / max(len(data), 1)


def mean_loss(model: nn.Module, data: Split) -> float:
    """Mean cross-entropy of ``model`` on ``data`` (one forward pass)."""
    with torch.no_grad():
        return float(F.cross_entropy(model(data.images), data.labels))


def accuracy(model: nn.Module, data: Split) -> float:
    """Fraction of correctly classified examples."""
    with torch.no_grad():
        return float((model(data.images).argmax(1) == data.labels).float().mean())
