"""The dataset task's model: a small CNN or MLP chosen by the rows' shape, or the user's own factory.

run-config ``model``:

``auto``
    ``cnn`` for images at least 8×8, else ``mlp``.
``cnn``
    Two 3×3 convolutions (16 and 32 channels, ReLU, each followed by 2×2
    max-pooling while the side is ≥ 8), one hidden dense layer of 64 units, the
    output layer (``digits 8×8``: 38 k parameters; ``MNIST 28×28``: 121 k).
``mlp``
    The flattened row, one hidden layer of 64 units (ReLU), the output layer.
``package.module:factory`` (or ``package.module.factory``)
    The user's ``factory(input_shape, num_classes) -> torch.nn.Module``,
    importable where the ServerApp and the ClientApps run.

Cluster ``k``'s start is the factory's module built under
``torch.manual_seed(seed · 1000 + k)`` (torch's default initialisation).
"""

from __future__ import annotations

import importlib
import math
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from fedroute.core.validation import invalid

__all__ = ["BUILT_IN_MODELS", "build_model", "model_factory", "initial_vectors", "SmallCNN", "SmallMLP"]

BUILT_IN_MODELS = ("auto", "cnn", "mlp")
"""Values of run-config ``model`` besides a dotted path."""

HIDDEN = 64


class SmallCNN(nn.Module):
    """Conv(16)–ReLU–[pool]–Conv(32)–ReLU–[pool]–Dense(64)–ReLU–Dense(classes) for ``(C, H, W)`` rows."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        layers: list[nn.Module] = []
        for inputs, outputs in ((channels, 16), (16, 32)):
            layers += [nn.Conv2d(inputs, outputs, kernel_size=3, padding=1), nn.ReLU()]
            if min(height, width) >= 8:
                layers.append(nn.MaxPool2d(2))
                height, width = height // 2, width // 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * height * width, HIDDEN), nn.ReLU(),
                                  nn.Linear(HIDDEN, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class SmallMLP(nn.Module):
    """Flatten–Dense(64)–ReLU–Dense(classes)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), HIDDEN), nn.ReLU(),
                                    nn.Linear(HIDDEN, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _imported(path: str) -> Callable[..., nn.Module]:
    module, separator, attribute = path.partition(":")
    if not separator:
        module, _, attribute = path.rpartition(".")
    if not module or not attribute:
        raise invalid("run-config 'model'", path, f"{BUILT_IN_MODELS} or a dotted path 'package.module:factory' to "
                      "factory(input_shape, num_classes) -> torch.nn.Module")
    try:
        factory = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"run-config 'model' = {path!r} cannot be imported ({type(error).__name__}: {error}); "
                         f"allowed: {BUILT_IN_MODELS} or 'package.module:factory' importable where the ServerApp and "
                         "the ClientApps run") from None
    if not callable(factory):
        raise ValueError(f"run-config 'model' = {path!r} is not callable; it must be "
                         "factory(input_shape, num_classes) -> torch.nn.Module")
    return factory


def model_factory(spec: str, input_shape: tuple[int, ...]) -> Callable[[tuple[int, ...], int], nn.Module]:
    """The factory run-config ``model = spec`` names, for rows of ``input_shape``."""
    if spec == "auto":
        spec = "cnn" if len(input_shape) == 3 and min(input_shape[1:]) >= 8 else "mlp"
    if spec == "cnn":
        if len(input_shape) != 3:
            raise ValueError(f"run-config 'model' = 'cnn' needs image rows (C, H, W), got rows of shape {input_shape}; "
                             "use 'mlp' or 'auto'")
        return SmallCNN
    if spec == "mlp":
        return SmallMLP
    return _imported(spec)


def build_model(spec: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The module run-config ``model = spec`` names (float32).

    Raises
    ------
    ValueError
        The factory does not return a ``torch.nn.Module``.
    """
    module = model_factory(spec, input_shape)(tuple(input_shape), int(num_classes))
    if not isinstance(module, nn.Module):
        raise ValueError(f"run-config 'model' = {spec!r} returned {type(module).__name__}; the factory must return a "
                         "torch.nn.Module")
    return module.float()


def initial_vectors(spec: str, input_shape: tuple[int, ...], num_classes: int, num_clusters: int,
                    seed: int) -> NDArray[np.float32]:
    """``K`` starts as a ``(K, P)`` float32 array: module ``k`` built under ``torch.manual_seed(seed·1000 + k)``."""
    return _initial_vectors(spec, tuple(input_shape), int(num_classes), int(num_clusters), int(seed)).copy()


@lru_cache(maxsize=8)
def _initial_vectors(spec: str, input_shape: tuple[int, ...], num_classes: int, num_clusters: int,
                     seed: int) -> NDArray[np.float32]:
    rows: list[Any] = []
    with torch.random.fork_rng(devices=[]):
        for k in range(num_clusters):
            torch.manual_seed(int(seed) * 1000 + k)
            state = build_model(spec, input_shape, num_classes).state_dict()
            rows.append(np.concatenate([tensor.detach().reshape(-1).double().numpy() for tensor in state.values()]))
    return np.stack(rows).astype(np.float32)
