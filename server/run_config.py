"""The run config (``[tool.flwr.app.config]``) → validated settings, before round 1."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, get_type_hints

from fedroute.client.devices import check_device_name
from fedroute.core.settings import MAX_SIGNATURE_DIM, MAX_SIGNATURE_HOLD_ROUNDS, MAX_START_UPDATES, RoutingSettings
from fedroute.monitoring.alarms import AlarmSettings
from fedroute.core.aggregation import SERVER_UPDATES
from fedroute.core.config_keys import dashed_keys
from fedroute.core.influence import AGGREGATION_RULES, InfluenceBounds
from fedroute.core.methods import ALL_METHODS, EXP3, FEDAVG, GREEDY, LOCAL, METHODS, PRESETS, method_settings
from fedroute.core.task import Task
from fedroute.core.validation import invalid
from fedroute.tasks.registry import task_from_config

__all__ = ["RunSettings", "parse_run_config", "explicit_num_clients", "results_directory"]

# run-config key → AlarmSettings field (every field).
_ALARM_KEYS = dashed_keys(AlarmSettings)
_ALARM_TYPES = get_type_hints(AlarmSettings)

# Keys that name outputs or the run's length, not its dynamics (the alarms only watch).
_NOT_DYNAMICS = {"method", "num-server-rounds", "results-dir", "checkpoint-dir", "client-state-dir", "round-timeout",
                 "tensorboard", *_ALARM_KEYS, "progress-interval", "save-round-models", "node-wait-timeout",
                 "evaluate-every", "fraction-evaluate", "min-evaluate-nodes"}

# Settings whose default value leaves the digest of the runs before they existed unchanged.
_DIGEST_NEUTRAL = {("server-update", "average")}

EVERY_METHOD = "all"
"""The ``method`` value that runs :data:`~fedroute.core.methods.METHODS` (the references not)."""

ROUTING_KEYS = dashed_keys(RoutingSettings)
"""Run-config key → :class:`~fedroute.core.settings.RoutingSettings` field: every field, its name with dashes
(``"auto"`` = the method's value in the chosen preset or generic default)."""

_ROUTING_TYPES = get_type_hints(RoutingSettings)

PRESET_CHOICES = ("auto", "generic", *PRESETS)
"""Values of the run-config key ``preset``: ``auto`` = the task's paper preset when the task
is one of the paper's (:data:`~fedroute.core.methods.PRESETS`), else the generic
default; ``generic`` = the generic default; a preset name = that paper configuration."""


@dataclass(frozen=True)
class RunSettings:
    """Everything the ServerApp needs, validated."""

    methods: tuple[str, ...]
    routing: dict[str, RoutingSettings]
    task: Task
    num_rounds: int
    seed: int
    fraction_train: float
    min_train_nodes: int
    report_memory: Optional[int]
    """Rounds a client's latest report counts in the masses (``None``: the participation's default)."""
    round_timeout: float
    results_dir: Path
    checkpoint_dir: Optional[Path]
    run_digest: str
    """Digest of everything that defines the run's dynamics (not its length or
    output paths): client-state keys and checkpoints of a resumed run match it."""
    alarm_settings: AlarmSettings = AlarmSettings()
    """Collapse-alarm thresholds (``starvation-rounds``, ``duplication-tolerance``, ``dead-rounds``)."""
    tensorboard: bool = False
    """Write TensorBoard event files under ``<results>/<run-id>/tensorboard/<method>``."""
    progress_interval: float = 5.0
    """Seconds between progress lines (0: every round)."""
    influence: InfluenceBounds = InfluenceBounds()
    """How much one reply may move a cluster and the masses (``max-weight-ratio``,
    ``max-update-norm``, ``aggregation``, ``trim-fraction``)."""
    save_round_models: bool = False
    """Also write every round's cluster models (``round_models.npz``; run-config key
    ``save-round-models``)."""
    node_wait_timeout: float = 120.0
    """Seconds to wait for the federation's SuperNodes before round 1 (``node-wait-timeout``)."""
    evaluate_every: int = 0
    """Evaluate the clients after every ``evaluate-every``-th round (0: only the final evaluation)."""
    fraction_evaluate: float = 1.0
    """Share of the nodes an evaluation during training asks (``fraction-evaluate``, as in ``FedAvg``)."""
    min_evaluate_nodes: int = 2
    """The fewest nodes an evaluation during training asks (``min-evaluate-nodes``)."""


def explicit_num_clients(config: Mapping[str, Any]) -> bool:
    """Whether the run config fixes ``num-clients`` (else ``"auto"``: the federation's size decides)."""
    return config.get("num-clients", "auto") != "auto"


CHECKPOINT_ENVIRONMENT = "FEDROUTE_CHECKPOINT_DIR"
"""With ``checkpoint-dir = ""``, checkpoints go to ``$FEDROUTE_CHECKPOINT_DIR/<run digest>/`` if it is set."""

SIGNATURE_TASKS = ("boundaries", "digit-rotations", "characters", "femnist")
"""The built-in tasks whose clients carry class samples (the signature start, ``signature-hold-rounds > 0``)."""

MAX_ROUNDS = 10**6
MAX_NODES = 10**6
MAX_SEED = 2**63 - 1
MAX_ROUTING_INTEGER = 10**9
_ROUTING_INTEGER_RANGES = {"entry-max-candidates": (0, MAX_ROUTING_INTEGER), "start-updates": (1, MAX_START_UPDATES),
                           "signature-hold-rounds": (0, MAX_SIGNATURE_HOLD_ROUNDS),
                           "signature-dim": (1, MAX_SIGNATURE_DIM)}
"""Integer routing keys whose range is not ``[1, MAX_ROUTING_INTEGER]``."""


SHOWN_LENGTH = 60
"""A run-config value in an error message is cut after this many characters."""


def _invalid(key: str, value: Any, allowed: str, fix: Optional[str] = None) -> ValueError:
    """The error for run-config ``key`` (:func:`fedroute.core.validation.invalid`, long values cut)."""
    return invalid(f"run-config '{key}'", value, allowed, fix, limit=SHOWN_LENGTH)


def _integer(config: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = config[key]
    integral = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if isinstance(value, bool) or not integral or not low <= value <= high:
        raise _invalid(key, value, f"an integer in [{low}, {high}]")
    return int(value)


def _number(config: Mapping[str, Any], key: str, low: float, high: float) -> float:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise _invalid(key, value, f"a number in [{low}, {high}]" if math.isfinite(high) or math.isfinite(low)
                       else "a finite number")
    return float(value)


def _boolean(config: Mapping[str, Any], key: str) -> bool:
    value = config[key]
    if not isinstance(value, bool):
        raise _invalid(key, value, "true or false")
    return value


def _alarm_settings(config: Mapping[str, Any]) -> AlarmSettings:
    values = {}
    for key, name in _ALARM_KEYS.items():
        if key in config:
            values[name] = _integer(config, key, 1, MAX_ROUNDS) if _ALARM_TYPES[name] is int else \
                _number(config, key, 0.0, 1.0)
    try:
        return AlarmSettings(**values)
    except ValueError as error:
        message = str(error)
        for key, name in _ALARM_KEYS.items():
            message = message.replace(name, f"run-config '{key}'")
        raise ValueError(message) from None


def _influence(config: Mapping[str, Any]) -> InfluenceBounds:
    """``max-weight-ratio`` (0 = no cap), ``max-update-norm`` (0 = none), ``aggregation``, ``trim-fraction``."""
    defaults = InfluenceBounds()
    ratio = _number(config, "max-weight-ratio", 0.0, 1e6) if "max-weight-ratio" in config else defaults.max_weight_ratio
    if ratio == 0.0:
        ratio = math.inf
    elif ratio < 1.0:
        raise _invalid("max-weight-ratio", ratio, "0 (no cap) or a number in [1, 1e6]")
    norm = _number(config, "max-update-norm", 0.0, 1e300) if "max-update-norm" in config else 0.0
    rule = str(config.get("aggregation", defaults.aggregation))
    if rule not in AGGREGATION_RULES:
        raise _invalid("aggregation", rule, str(AGGREGATION_RULES))
    beta = _number(config, "trim-fraction", 0.0, 0.49) if "trim-fraction" in config else defaults.trim_fraction
    update = str(config.get("server-update", defaults.server_update))
    if update not in SERVER_UPDATES:
        raise _invalid("server-update", update, f"{SERVER_UPDATES} (\"average\": the paper's model averaging; "
                       "\"ifca-gradient\": IFCA's gradient step)")
    return InfluenceBounds(max_weight_ratio=ratio, max_update_norm=norm or None, aggregation=rule,
                           trim_fraction=beta, server_update=update)


def _routing_overrides(config: Mapping[str, Any]) -> dict[str, Any]:
    """Routing overrides from the run config; ``"auto"`` and ``0`` for H_max mean the method default."""
    overrides: dict[str, Any] = {}
    for key, name in ROUTING_KEYS.items():
        if key in config and config[key] != "auto" and not (key == "hysteresis-max-rounds" and config[key] == 0):
            overrides[name] = _routing_value(config, key, _ROUTING_TYPES[name])
    return overrides


def _routing_value(config: Mapping[str, Any], key: str, kind: Any) -> Any:
    """Run-config ``key``'s value as the routing field's type (its ranges: :class:`RoutingSettings`)."""
    value = config[key]
    if kind == tuple[str, ...]:  # controllers: "gr,rh"
        return tuple(part.strip() for part in str(value).split(",") if part.strip())
    if kind is bool:
        if not isinstance(value, bool):
            raise _invalid(key, value, 'true, false or "auto"')
        return value
    if kind is str:
        return str(value)
    if kind is int:
        return _integer(config, key, *_ROUTING_INTEGER_RANGES.get(key, (1, MAX_ROUTING_INTEGER)))
    if kind is float:
        return _number(config, key, -sys.float_info.max, sys.float_info.max)
    raise TypeError(f"routing setting for run-config '{key}' has the type {kind}, which the run config cannot set")


def routing_preset(config: Mapping[str, Any]) -> Optional[str]:
    """The paper preset the run config asks for (``None`` = the generic default).

    ``preset = "auto"`` (the default) takes the task's own paper preset when the
    task is one of the paper's, else the generic default; ``"generic"`` always the
    generic default; a preset name that configuration.
    """
    preset = str(config.get("preset", "auto"))
    if preset not in PRESET_CHOICES:
        raise _invalid("preset", preset, f"one of {PRESET_CHOICES}")
    if preset == "auto":
        task = str(config.get("task", "linear"))
        return task if task in PRESETS else None
    return None if preset == "generic" else preset


def parse_run_config(config: Mapping[str, Any]) -> RunSettings:
    """Validate the run config; every error names the key and the allowed values.

    Parameters
    ----------
    config : mapping
        Flower's ``context.run_config`` (defaults from ``pyproject.toml``
        overridden by ``--run-config``).

    Returns
    -------
    RunSettings
    """
    method = str(config.get("method", EVERY_METHOD))
    methods = METHODS if method == EVERY_METHOD else tuple(part.strip() for part in method.split(","))
    if not methods or any(name not in ALL_METHODS for name in methods) or len(set(methods)) != len(methods):
        raise _invalid("method", method, f"{EVERY_METHOD!r} ({', '.join(METHODS)}), one of {ALL_METHODS} or several "
                       f"of them, comma-separated and distinct (e.g. '{','.join((GREEDY, EXP3, FEDAVG, LOCAL))}')")
    # Run-level numbers first: their errors name their key before a task sees them.
    num_rounds = _integer(config, "num-server-rounds", 1, MAX_ROUNDS) if "num-server-rounds" in config else 80
    seed = _integer(config, "seed", 0, MAX_SEED) if "seed" in config else 0
    fraction_train = _number(config, "fraction-train", 1e-9, 1.0) if "fraction-train" in config else 1.0
    min_train_nodes = _integer(config, "min-train-nodes", 1, MAX_NODES) if "min-train-nodes" in config else 2
    report_memory = _integer(config, "report-memory", 0, MAX_ROUNDS) if "report-memory" in config else 0
    round_timeout = _number(config, "round-timeout", 1e-3, 1e7) if "round-timeout" in config else 600.0
    if "client-device" in config:  # every task's (a plugin app reads it with fedroute.client.devices)
        check_device_name(config["client-device"])
    overrides = _routing_overrides(config)
    task_name = str(config.get("task", "linear"))
    if overrides.get("signature_hold_rounds", 0) > 0 and task_name not in SIGNATURE_TASKS:
        raise _invalid("signature-hold-rounds", overrides["signature_hold_rounds"],
                       f"0 for task {task_name!r}: the signature start needs clients with class samples "
                       f"(tasks {', '.join(SIGNATURE_TASKS)}; a plugin app's clients pass signature_data)")
    task = task_from_config(config)
    preset = routing_preset(config)
    influence = _influence(config)
    routing = {}
    for name in methods:
        try:
            routing[name] = method_settings(name, preset=preset, **overrides)
        except ValueError as error:
            message = str(error)
            for key, field in ROUTING_KEYS.items():
                message = message.replace(f"'{field}'", f"'{key}'")
            raise ValueError(f"run config, method {name!r}: {message}") from None
    results_dir = results_directory(config)
    checkpoint_text = str(config.get("checkpoint-dir", ""))
    dynamics = {key: value for key, value in sorted(config.items())
                if key not in _NOT_DYNAMICS and (key, value) not in _DIGEST_NEUTRAL}
    digest = hashlib.sha256(json.dumps(dynamics, sort_keys=True, default=str).encode()).hexdigest()[:12]
    checkpoint_dir = _absolute(checkpoint_text) if checkpoint_text else None
    if checkpoint_dir is None and os.environ.get(CHECKPOINT_ENVIRONMENT):
        # A deployment's default (the compose executor sets it to a volume): one directory per
        # configuration, so runs of other settings never meet each other's checkpoints.
        checkpoint_dir = Path(os.environ[CHECKPOINT_ENVIRONMENT]) / digest
    return RunSettings(
        methods=methods,
        routing=routing,
        task=task,
        num_rounds=num_rounds,
        seed=seed,
        fraction_train=fraction_train,
        min_train_nodes=min_train_nodes,
        report_memory=report_memory or None,
        round_timeout=round_timeout,
        results_dir=results_dir,
        checkpoint_dir=checkpoint_dir,
        run_digest=digest,
        alarm_settings=_alarm_settings(config),
        tensorboard=_boolean(config, "tensorboard") if "tensorboard" in config else False,
        progress_interval=_number(config, "progress-interval", 0.0, 1e7) if "progress-interval" in config else 5.0,
        influence=influence,
        save_round_models=_boolean(config, "save-round-models") if "save-round-models" in config else False,
        node_wait_timeout=_number(config, "node-wait-timeout", 1e-3, 1e7) if "node-wait-timeout" in config else 120.0,
        evaluate_every=_evaluate_every(config, num_rounds),
        fraction_evaluate=_number(config, "fraction-evaluate", 0.0, 1.0) if "fraction-evaluate" in config else 1.0,
        min_evaluate_nodes=_integer(config, "min-evaluate-nodes", 0, MAX_NODES) if "min-evaluate-nodes" in config
        else 2,
    )


def _evaluate_every(config: Mapping[str, Any], num_rounds: int) -> int:
    """``evaluate-every``: 0 (only the final evaluation) or a number of rounds in ``[1, num-server-rounds]``."""
    if "evaluate-every" not in config:
        return 0
    value = config["evaluate-every"]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= num_rounds:
        raise _invalid("evaluate-every", value, f"0 (only the final evaluation) or an integer in [1, "
                       f"num-server-rounds = {num_rounds}] (evaluate the clients after every that many rounds)",
                       fix="e.g. --run-config 'evaluate-every=5'")
    return value


def results_directory(config: Mapping[str, Any]) -> Path:
    """Where ``<run-id>/`` goes: run-config ``results-dir``, absolute (:func:`_absolute`)."""
    return _absolute(str(config.get("results-dir", "results")))


def _absolute(text: str) -> Path:
    """An absolute path; relative paths are taken from $FEDROUTE_RESULTS_ROOT or the working directory."""
    path = Path(os.path.expanduser(text))
    return path if path.is_absolute() else Path(os.environ.get("FEDROUTE_RESULTS_ROOT", os.getcwd())) / path
