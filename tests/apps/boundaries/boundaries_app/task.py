"""The user's own model, data and training: a 2-16-2 MLP on 2-D points (no fedroute here).

Client ``i`` is in group ``g = i mod 3``; its points ``x ~ N(0, I_2)`` get the label
``y ~ Bernoulli(sigmoid(5 u_gᵀx))`` with the boundary normal ``u_g`` rotated by ``120° · g``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

NUM_GROUPS = 3
TRAIN_POINTS, TEST_POINTS = 200, 200


@dataclass(frozen=True)
class ClientData:
    group: int
    train: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def client_data(client: int, seed: int) -> ClientData:
    group = client % NUM_GROUPS
    angle = 2.0 * np.pi * group / NUM_GROUPS
    rng = np.random.default_rng([seed, client])
    points = rng.standard_normal((TRAIN_POINTS + TEST_POINTS, 2))
    probability = 1.0 / (1.0 + np.exp(-5.0 * points @ np.array([np.cos(angle), np.sin(angle)])))
    labels = torch.from_numpy((rng.random(len(points)) < probability).astype(np.int64))
    points = torch.from_numpy(points.astype(np.float32))
    return ClientData(group, (points[:TRAIN_POINTS], labels[:TRAIN_POINTS]),
                      (points[TRAIN_POINTS:], labels[TRAIN_POINTS:]))


def mean_loss(model: torch.nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    return float(torch.nn.functional.cross_entropy(model(data[0]), data[1]))


def train(model: torch.nn.Module, data: tuple[torch.Tensor, torch.Tensor], steps: int, learning_rate: float) -> None:
    optimiser = torch.optim.SGD(model.parameters(), lr=learning_rate)
    for _ in range(steps):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(model(data[0]), data[1]).backward()
        optimiser.step()
