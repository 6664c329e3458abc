"""Named methods: how each paper method sets the routing (ALGORITHM.md §2–§6, paper B.1)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fedroute.client.settings import RoutingSettings

__all__ = ["METHODS", "TASK_CONTROLLERS", "method_settings"]

METHODS = ("greedy", "exp3", "sync-entry", "fedcam")
"""``greedy``: Greedy IFCA (every client on ``gr`` forever).
``fedcam``: the FedCAM baseline (a global part plus cluster parts, Greedy on the
combined predictor; :class:`fedroute.strategies.fedcam.FedCAM`).
``exp3``: autonomous EXP3 over the task's controllers (fixed blocks, or
actions when the set contains ``hys``).
``sync-entry``: synchronized entry, then EXP3 over ``{gr, hys}`` in action mode."""

TASK_CONTROLLERS = {
    "linear": ("gr", "rh"),
    "gmm": ("gr", "rh"),
    "housing": ("gr", "com", "rev"),
    "characters": ("gr", "hys"),
    "femnist": ("gr", "hys"),
}
"""Controller sets per task (paper B.1)."""

TASK_ENTRY_THRESHOLDS = {"characters": 0.221, "femnist": 0.221}
"""Calibrated entry threshold ``τ`` per task (default 0.0 elsewhere).  Characters:
midpoint between the groups' benefits at α = 0.70 on calibration data seeds 10–12
(never the evaluation seeds 0–2); see :func:`fedroute.tasks.characters.calibrate_entry_threshold`."""

SYNC_ENTRY_MAX_ROUNDS = 800
AUTONOMOUS_MAX_ROUNDS = 160


def method_settings(method: str, task: str, **overrides: Any) -> RoutingSettings:
    """Routing settings of a named method on a named task.

    Parameters
    ----------
    method : str
        One of :data:`METHODS`.
    task : str
        A key of :data:`TASK_CONTROLLERS` (selects the EXP3 controller set).
    **overrides
        Any :class:`RoutingSettings` field; ``None`` values are ignored
        (they mean "the method's default").

    Returns
    -------
    RoutingSettings
    """
    if method not in METHODS:
        raise ValueError(f"method = {method!r} is invalid; allowed: {METHODS}")
    if task not in TASK_CONTROLLERS:
        raise ValueError(f"task = {task!r} is invalid; allowed: {tuple(TASK_CONTROLLERS)}")
    if method in ("greedy", "fedcam"):
        base = RoutingSettings(controllers=("gr",))
    elif method == "exp3":
        controllers = TASK_CONTROLLERS[task]
        base = RoutingSettings(
            controllers=controllers,
            exp3_mode="action" if "hys" in controllers else "block",
            hysteresis_max_rounds=AUTONOMOUS_MAX_ROUNDS,
        )
    else:
        base = RoutingSettings(
            controllers=("gr", "hys"), exp3_mode="action", synchronized_entry=True,
            hysteresis_max_rounds=SYNC_ENTRY_MAX_ROUNDS,
        )
    if task in TASK_ENTRY_THRESHOLDS:
        base = replace(base, entry_threshold=TASK_ENTRY_THRESHOLDS[task])
    chosen = {key: value for key, value in overrides.items() if value is not None}
    if method in ("greedy", "fedcam"):
        chosen.pop("controllers", None)  # Greedy IFCA is Greedy whatever the controller set
        chosen.pop("synchronized_entry", None)
    return replace(base, **chosen)
