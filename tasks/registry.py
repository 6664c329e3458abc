"""Build a task from run-config keys (``[tool.flwr.app.config]`` or a dict).

Each task has one key table: run-config key → (dataclass field, kind).  Keys
of other tasks are ignored, so one run config can carry every task's keys.
Range checks live in the task dataclasses; their messages name the run-config
key and the allowed values.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

from fedroute.core.task import Task

__all__ = ["TASKS", "TASK_KEYS", "task_class", "task_from_config"]

_KeyTable = dict[str, tuple[str, type]]

_LINEAR_KEYS: _KeyTable = {
    "num-clients": ("num_clients", int),
    "dimension": ("dimension", int),
    "group-distance": ("group_distance", float),
    "samples-per-client": ("samples_per_client", int),
    "test-samples-per-client": ("test_samples_per_client", int),
    "noise-std": ("noise_std", float),
    "local-steps": ("local_steps", int),
    "learning-rate": ("learning_rate", float),
    "init": ("init", str),
    "init-spread": ("init_spread", float),
    "seed": ("seed", int),
}

_HOUSING_KEYS: _KeyTable = {
    "num-clients": ("num_clients", int),
    "test-fraction": ("test_fraction", float),
    "local-steps": ("local_steps", int),
    "learning-rate": ("learning_rate", float),
    "init-radius": ("init_radius", float),
    "init-jitter": ("init_jitter", float),
    "seed": ("seed", int),
    "data-file": ("data_file", str),  # "" = not given ($FEDROUTE_HOUSING_FILE, else download)
}

_GMM_KEYS: _KeyTable = {
    "num-clients": ("num_clients", int),
    "samples-per-client": ("samples_per_client", int),
    "test-samples-per-client": ("test_samples_per_client", int),
    "noise-std": ("noise_std", float),
    "local-steps": ("local_steps", int),
    "learning-rate": ("learning_rate", float),
    "init-radius": ("init_radius", float),
    "init-jitter": ("init_jitter", float),
    "entrance": ("entrance", str),
    "seed": ("seed", int),
}

_CHARACTERS_KEYS: _KeyTable = {
    "num-clients": ("num_clients", int),
    "test-fraction": ("test_fraction", float),
    "hidden-units": ("hidden_units", int),
    "local-steps": ("local_steps", int),
    "learning-rate": ("learning_rate", float),
    "pretrain-epochs": ("pretrain_epochs", int),
    "pretrain-learning-rate": ("pretrain_learning_rate", float),
    "base-epochs": ("base_epochs", int),
    "alpha": ("alpha", float),
    "seed": ("seed", int),
}

_FEMNIST_KEYS: _KeyTable = {
    **_CHARACTERS_KEYS,
    "dataset": ("dataset", str),
    "data-file": ("data_file", str),  # "" = the hub
    "first-writer": ("first_writer", int),
    "num-classes": ("num_classes", int),
    "image-size": ("image_size", int),
}

_BOUNDARIES_KEYS: _KeyTable = {
    "num-clients": ("num_clients", int),
    "num-groups": ("num_groups", int),
    "samples-per-client": ("samples_per_client", int),
    "test-samples-per-client": ("test_samples_per_client", int),
    "label-sharpness": ("label_sharpness", float),
    "hidden-units": ("hidden_units", int),
    "local-steps": ("local_steps", int),
    "learning-rate": ("learning_rate", float),
    "seed": ("seed", int),
}

_DIGIT_ROTATIONS_KEYS: _KeyTable = {
    "num-clients": ("num_clients", int),
    "num-groups": ("num_groups", int),
    "test-fraction": ("test_fraction", float),
    "hidden-units": ("hidden_units", int),
    "local-steps": ("local_steps", int),
    "learning-rate": ("learning_rate", float),
    "weight-decay": ("weight_decay", float),
    "seed": ("seed", int),
}

_DATASET_KEYS: _KeyTable = {
    "num-clients": ("num_clients", int),
    "dataset": ("dataset", str),
    "partitioner": ("partitioner", str),
    "dirichlet-alpha": ("dirichlet_alpha", float),
    "partition-by": ("partition_by", str),
    "classes-per-client": ("classes_per_client", int),
    "num-groups": ("num_groups", int),
    "group-transform": ("group_transform", str),
    "label-column": ("label_column", str),
    "test-fraction": ("test_fraction", float),
    "model": ("model", str),
    "local-epochs": ("local_epochs", int),
    "batch-size": ("batch_size", int),
    "learning-rate": ("learning_rate", float),
    "client-device": ("client_device", str),
    "batched-losses": ("batched_losses", str),
    "seed": ("seed", int),
}

TASK_KEYS: dict[str, tuple[str, _KeyTable]] = {
    "linear": ("fedroute.tasks.linear:LinearTask", _LINEAR_KEYS),
    "housing": ("fedroute.tasks.housing:HousingTask", _HOUSING_KEYS),
    "gmm": ("fedroute.tasks.gmm:GMMTask", _GMM_KEYS),
    "characters": ("fedroute.tasks.characters:CharactersTask", _CHARACTERS_KEYS),
    "femnist": ("fedroute.tasks.femnist:FemnistTask", _FEMNIST_KEYS),
    "boundaries": ("fedroute.tasks.boundaries:BoundariesTask", _BOUNDARIES_KEYS),
    "digit-rotations": ("fedroute.tasks.digit_rotations:DigitRotationsTask", _DIGIT_ROTATIONS_KEYS),
    "collinear": ("fedroute.tasks.collinear:CollinearTask", _LINEAR_KEYS),
    "dataset": ("fedroute.tasks.dataset:DatasetTask", _DATASET_KEYS),
}
"""Task name → (``module:class`` of the task, run-config key table).  Only the task a run names is
imported (every deployed message starts a fresh ClientApp process, which pays for each import)."""


def task_class(name: str) -> Callable[..., Task]:
    """The task class registered as ``name`` (imported on first use)."""
    module, _, attribute = TASK_KEYS[name][0].partition(":")
    return getattr(importlib.import_module(module), attribute)

TASKS = tuple(TASK_KEYS)

MAX_INTEGER = 2**63 - 1
"""Largest integer a task key takes (what a Flower ConfigRecord carries)."""

UPPER_BOUNDS = {
    "num-clients": 10**6,
    "dimension": 10**6,
    "samples-per-client": 10**8,
    "test-samples-per-client": 10**8,
    "local-steps": 10**6,
    "hidden-units": 10**6,
    "pretrain-epochs": 10**6,
    "base-epochs": 10**6,
    "num-classes": 10**6,
    "image-size": 10**4,
    "classes-per-client": 10**6,
    "local-epochs": 10**6,
    "batch-size": 10**8,
}
"""Upper bounds of the size-like task keys (a larger value would exhaust memory long after the
start); the task classes check the lower bounds and the rest of the ranges."""


def _convert(key: str, value: Any, kind: type) -> Any:
    """``value`` as ``kind``; errors name the run-config key."""
    if kind is str:
        return str(value)
    if isinstance(value, bool):
        raise ValueError(f"run-config '{key}' = {value!r} is invalid; allowed: "
                         f"{'an integer' if kind is int else 'a number'}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"run-config '{key}' = {value!r} is invalid; allowed: "
                         f"{'an integer' if kind is int else 'a number'}") from None
    if kind is int:
        if number != number or number in (float("inf"), float("-inf")) or number != int(number) \
                or not -MAX_INTEGER <= int(number) <= MAX_INTEGER:
            raise ValueError(f"run-config '{key}' = {value!r} is invalid; allowed: an integer in "
                             f"[{-MAX_INTEGER}, {MAX_INTEGER}]")
        if key in UPPER_BOUNDS and int(number) > UPPER_BOUNDS[key]:
            raise ValueError(f"run-config '{key}' = {value!r} is invalid; allowed: at most {UPPER_BOUNDS[key]}")
        return int(number)
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"run-config '{key}' = {value!r} is invalid; allowed: a finite number")
    return number


def task_from_config(config: Mapping[str, Any]) -> Task:
    """The task named by ``config["task"]`` with the settings present in ``config``.

    Missing keys and keys set to ``"auto"`` take the task's defaults; keys of
    other tasks and unrelated keys are ignored.
    """
    name = config.get("task", "linear")
    if name not in TASK_KEYS:
        raise ValueError(f"run-config 'task' = {name!r} is invalid; allowed: {TASKS}")
    factory, keys = task_class(name), TASK_KEYS[name][1]
    arguments = {}
    for key, (field, kind) in keys.items():
        if key in config and config[key] != "auto":  # "auto": the task's own default
            arguments[field] = _convert(key, config[key], kind)
    if name == "dataset" and isinstance(config.get("batched-losses"), bool):
        arguments["batched_losses"] = str(config["batched-losses"]).lower()
    if name == "housing" and arguments.get("data_file") == "":
        arguments["data_file"] = None
    return factory(**arguments)
