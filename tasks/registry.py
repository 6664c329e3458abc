"""Build a task from run-config keys (``[tool.flwr.app.config]`` or a dict)."""

from __future__ import annotations

from typing import Any, Mapping

from fedroute.tasks.base import Task
from fedroute.tasks.linear import LinearTask

__all__ = ["TASKS", "task_from_config"]

TASKS = ("linear",)

_LINEAR_KEYS = {
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


def task_from_config(config: Mapping[str, Any]) -> Task:
    """The task named by ``config["task"]`` with the settings present in ``config``.

    Missing keys take the task's defaults; unrelated keys are ignored.
    """
    name = config.get("task", "linear")
    if name not in TASKS:
        raise ValueError(f"run-config 'task' = {name!r} is invalid; allowed: {TASKS}")
    arguments = {}
    for key, (field, kind) in _LINEAR_KEYS.items():
        if key in config:
            value = config[key]
            if kind is int and (isinstance(value, bool) or float(value) != int(value)):
                raise ValueError(f"run-config '{key}' = {value!r} is invalid; allowed: an integer")
            arguments[field] = kind(value)
    return LinearTask(**arguments)
