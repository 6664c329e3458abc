"""A user's ClientApp for the linear task written on the plugin API (own torch model, loss and training loop).

The model and training restate the linear task (float64), so the strategy under this
app routes exactly as the batched simulator does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MessageType

from fedroute import cluster_models_from_torch, routing_evaluate, routing_query, routing_train
from fedroute.tasks.linear import LinearTask

from support.grid import Handler


class LinearModel(torch.nn.Module):
    """``x ↦ xᵀw`` in float64 (the linear task's model as a torch module)."""

    def __init__(self, dimension: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(dimension, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def linear_user_app(task: LinearTask, calls: dict[str, int] | None = None) -> dict[str, Handler]:
    """A user's ClientApp for the linear task: own data, loss and training loop, one fedroute call per handler."""
    samples = task.samples(np.arange(task.num_clients))
    calls = calls if calls is not None else {}

    def data(context: Context) -> tuple[torch.Tensor, ...]:
        i = int(context.node_config["partition-id"])
        return tuple(torch.from_numpy(np.ascontiguousarray(a[i])) for a in (
            samples.train_inputs, samples.train_targets, samples.test_inputs, samples.test_targets))

    def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
        return float(0.5 * torch.mean((model(x) - y) ** 2))

    def make_train_fn(x: torch.Tensor, y: torch.Tensor) -> Callable[[torch.nn.Module], None]:
        def train_fn(model: torch.nn.Module) -> None:
            calls["train_fn"] = calls.get("train_fn", 0) + 1
            optimizer = torch.optim.SGD(model.parameters(), lr=task.learning_rate)
            for _ in range(task.local_steps):
                optimizer.zero_grad()
                (0.5 * torch.mean((model(x) - y) ** 2)).backward()
                optimizer.step()
        return train_fn

    def train(message: Message, context: Context) -> Message:
        x, y, _, _ = data(context)
        return routing_train(message, context, LinearModel(task.dimension), make_train_fn(x, y),
                             lambda model: loss(model, x, y), num_examples=len(y))

    def evaluate(message: Message, context: Context) -> Message:
        x, y, x_test, y_test = data(context)
        return routing_evaluate(message, context, LinearModel(task.dimension), lambda model: loss(model, x, y),
                                num_examples=len(y), test_loss_fn=lambda model: loss(model, x_test, y_test),
                                group=int(samples.groups[int(context.node_config["partition-id"])]))

    def query(message: Message, context: Context) -> Message:
        x, y, _, _ = data(context)
        return routing_query(message, context, LinearModel(task.dimension), lambda model: loss(model, x, y),
                             num_examples=len(y))

    return {MessageType.TRAIN: train, MessageType.EVALUATE: evaluate, MessageType.QUERY: query}


def linear_initial_models(task: LinearTask, num_clusters: int) -> list[ArrayRecord]:
    """The task's initial cluster models as the ``ArrayRecord`` s of :class:`LinearModel` modules."""
    modules = []
    for model in task.initial_models(num_clusters):
        module = LinearModel(task.dimension)
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(model))
        modules.append(module)
    return cluster_models_from_torch(modules)


TASK = LinearTask(num_clients=8, samples_per_client=20, test_samples_per_client=10, init="collapsed", seed=2)
"""The small collapsed-start linear federation the in-process plugin tests route."""
