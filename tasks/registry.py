"""Build a task from run-config keys (``[tool.flwr.app.config]`` or a dict).

A task's run-config keys are its dataclass fields, each with dashes (field ``a_b``
↔ key ``a-b``, :func:`task_keys`), except the few of :data:`NOT_KEYS` and
:data:`TASK_NOT_KEYS`.  Keys of other tasks are ignored, so one run config can
carry every task's keys.  Range checks live in the task dataclasses; their
messages name the run-config key and the allowed values.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any, Callable, Mapping, Optional, get_type_hints

from fedroute.core.config_keys import dashed_keys
from fedroute.core.task import Task
from fedroute.core.validation import invalid

__all__ = ["TASKS", "TASK_CLASSES", "NOT_KEYS", "TASK_NOT_KEYS", "task_class", "task_keys", "task_from_config"]

TASK_CLASSES: dict[str, str] = {
    "linear": "fedroute.tasks.linear:LinearTask",
    "housing": "fedroute.tasks.housing:HousingTask",
    "gmm": "fedroute.tasks.gmm:GMMTask",
    "characters": "fedroute.tasks.characters:CharactersTask",
    "femnist": "fedroute.tasks.femnist:FemnistTask",
    "boundaries": "fedroute.tasks.boundaries:BoundariesTask",
    "digit-rotations": "fedroute.tasks.digit_rotations:DigitRotationsTask",
    "collinear": "fedroute.tasks.collinear:CollinearTask",
    "dataset": "fedroute.tasks.dataset:DatasetTask",
}
"""Task name → ``module:class`` of the task.  Only the task a run names is imported (every deployed
message starts a fresh ClientApp process, which pays for each import)."""

TASKS = tuple(TASK_CLASSES)

NOT_KEYS = ("name",)
"""Fields of any task that are no run-config keys: ``name`` (the key ``task`` chooses the task)."""

TASK_NOT_KEYS: dict[str, tuple[str, ...]] = {
    # The paper's E5 mixture (G = 3, C = 5, d = 10, its teachers and start) stays fixed: ``num-groups``,
    # ``num-classes`` and ``dimension`` are keys of other tasks (one run config carries them all).
    "gmm": ("num_groups", "num_classes", "dimension", "centre_norm", "teacher_scale", "label_temperature",
            "max_init_draws", "rounds"),
    # The paper's housing start: ``entrance`` is the GMM task's key.
    "housing": ("entrance", "max_init_draws"),
}
"""Task name → its fields that are no run-config keys (they keep the task's defaults)."""

_KIND = {int: int, float: float, str: str, Optional[str]: str}
"""A task field's type → the kind its run-config value is converted to."""


def task_class(name: str) -> Callable[..., Task]:
    """The task class registered as ``name`` (imported on first use)."""
    module, _, attribute = TASK_CLASSES[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


@lru_cache(maxsize=None)
def task_keys(name: str) -> dict[str, tuple[str, type]]:
    """Run-config key → (field, kind) of the task ``name``: every field of its dataclass but the exceptions.

    Raises
    ------
    TypeError
        If a key's field has a type the run config cannot give (not ``int``, ``float`` or ``str``).
    """
    factory = task_class(name)
    types = get_type_hints(factory)
    exclude = (*(field for field in NOT_KEYS if field in types), *TASK_NOT_KEYS.get(name, ()))
    table = {}
    for key, field in dashed_keys(factory, exclude).items():
        if types[field] not in _KIND:
            raise TypeError(f"task {name!r}: field {field!r} has the type {types[field]}, which the run config "
                            "cannot give; add it to TASK_NOT_KEYS or give it a type int, float or str")
        table[key] = (field, _KIND[types[field]])
    return table


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
    "routing-loss-rows": 10**8,
}
"""Upper bounds of the size-like task keys (a larger value would exhaust memory long after the
start); the task classes check the lower bounds and the rest of the ranges."""


def _convert(key: str, value: Any, kind: type) -> Any:
    """``value`` as ``kind``; errors name the run-config key."""
    if kind is str:
        return str(value)
    field = f"run-config '{key}'"
    if isinstance(value, bool):
        raise invalid(field, value, "an integer" if kind is int else "a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise invalid(field, value, "an integer" if kind is int else "a number") from None
    if kind is int:
        if number != number or number in (float("inf"), float("-inf")) or number != int(number) \
                or not -MAX_INTEGER <= int(number) <= MAX_INTEGER:
            raise invalid(field, value, f"an integer in [{-MAX_INTEGER}, {MAX_INTEGER}]")
        if key in UPPER_BOUNDS and int(number) > UPPER_BOUNDS[key]:
            raise invalid(field, value, f"at most {UPPER_BOUNDS[key]}")
        return int(number)
    if number != number or number in (float("inf"), float("-inf")):
        raise invalid(field, value, "a finite number")
    return number


def task_from_config(config: Mapping[str, Any]) -> Task:
    """The task named by ``config["task"]`` with the settings present in ``config``.

    Missing keys and keys set to ``"auto"`` take the task's defaults; keys of
    other tasks and unrelated keys are ignored.
    """
    name = config.get("task", "linear")
    if name not in TASK_CLASSES:
        raise invalid("run-config 'task'", name, str(TASKS))
    arguments = {}
    for key, (field, kind) in task_keys(name).items():
        if key in config and config[key] != "auto":  # "auto": the task's own default
            arguments[field] = _convert(key, config[key], kind)
    if name == "dataset":
        for key in ("batched-losses", "routing-early-stop"):
            if isinstance(config.get(key), bool):
                arguments[key.replace("-", "_")] = str(config[key]).lower()
    if name == "housing" and arguments.get("data_file") == "":
        arguments["data_file"] = None
    return task_class(name)(**arguments)
