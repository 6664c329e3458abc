"""Run-config validation (before round 1) and the ``fedroute simulate`` command."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from fedroute.core.methods import EXP3
from fedroute.core.settings import (EXP3_MODES, EXPLORE_ON, MASS_THRESHOLD_UNITS, SIGNATURE_START_ON, TIE_BREAKING,
                                    RoutingSettings)
from fedroute.server.run_config import ROUTING_KEYS, parse_run_config
from fedroute.cli import main


def test_defaults_parse_to_three_methods(defaults: dict) -> None:
    settings = parse_run_config(defaults)
    assert settings.methods == ("greedy", "exp3", "sync-entry", "fedcam")
    assert settings.routing["greedy"].controllers == ("gr",)
    assert settings.routing["exp3"].controllers == ("gr", "rh") and settings.routing["exp3"].exp3_mode == "block"
    assert settings.routing["sync-entry"].synchronized_entry
    assert settings.routing["sync-entry"].hysteresis_max_rounds == 800
    assert settings.task.num_clients == 80 and settings.num_rounds == defaults["num-server-rounds"]
    assert settings.results_dir.is_absolute()


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("method", "ifca", "'method'"),
        ("method", "greedy,ifca", "'method'"),
        ("method", "exp3,exp3", "'method'"),
        ("method", "", "'method'"),
        ("save-round-models", "yes", "'save-round-models'"),
        ("num-clusters", 0, "'num-clusters'"),
        ("exp3-exploration", 1.5, "'exp3-exploration'"),
        ("controllers", "gr,magic", "'controllers'"),
        ("num-server-rounds", 0, "'num-server-rounds'"),
        ("num-clients", 1, "'num-clients'"),
        ("init", "random", "'init'"),
        ("learning-rate", 2.0, "'learning-rate'"),
        ("fraction-train", 0.0, "'fraction-train'"),
        ("task", "vision", "'task'"),
    ],
)
def test_bad_values_name_the_key(defaults: dict, key: str, value: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_run_config({**defaults, key: value})


def test_method_list_and_round_models_switch(defaults: dict) -> None:
    settings = parse_run_config({**defaults, "method": "exp3, greedy"})
    assert settings.methods == ("exp3", "greedy") and set(settings.routing) == {"exp3", "greedy"}
    assert not settings.save_round_models
    saving = parse_run_config({**defaults, "save-round-models": True})
    assert saving.save_round_models and saving.run_digest == parse_run_config(defaults).run_digest  # output only


def test_auto_and_zero_keep_method_defaults(defaults: dict) -> None:
    settings = parse_run_config({**defaults, "controllers": "auto", "hysteresis-max-rounds": 0})
    assert settings.routing["exp3"].hysteresis_max_rounds == 160
    overridden = parse_run_config({**defaults, "method": "exp3", "controllers": "gr,com,rev", "block-length": 4})
    assert overridden.routing["exp3"].controllers == ("gr", "com", "rev")
    assert overridden.routing["exp3"].block_length == 4


def test_simulate_command_reports_collapse_and_recovery(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--method", "all", "--rounds", "100"]) == 0
    summaries = json.loads(capsys.readouterr().out)
    assert summaries["greedy"]["recovery_error"] >= 0.5 and summaries["greedy"]["persistent_collapse"]
    assert summaries["exp3"]["recovery_error"] < 0.5 and summaries["exp3"]["usable_models_test"] == 2
    assert summaries["fedcam"]["recovery_error"] >= 0.5  # the additive baseline stays collapsed too


def test_run_config_text_for_flwr() -> None:
    from fedroute.deployment.flwr_config import format_run_config, parse_config_value

    text = format_run_config({"method": "exp3", "num-clients": 12, "noise-std": 0.5, "flag": True,
                              "results-dir": "/tmp/it's"})
    assert text == "method='exp3' num-clients=12 noise-std=0.5 flag=true results-dir=\"/tmp/it's\""
    with pytest.raises(ValueError, match="results-dir"):
        format_run_config({"results-dir": "a\nb"})
    assert [parse_config_value(v) for v in ("12", "0.5", "true", "exp3")] == [12, 0.5, True, "exp3"]


def test_every_task_is_built_from_run_config_keys(tmp_path: Path) -> None:
    from fedroute.tasks.registry import task_from_config

    gmm = task_from_config({"task": "gmm", "num-clients": 9, "init-radius": 4.0, "seed": 2})
    assert (gmm.name, gmm.num_clients, gmm.init_radius, gmm.seed) == ("gmm", 9, 4.0, 2)
    linear = task_from_config({"task": "linear", "init-radius": 4.0, "dimension": 3})
    assert linear.dimension == 3  # keys of other tasks are ignored
    with pytest.raises(ValueError, match="'num-clients'"):
        task_from_config({"task": "gmm", "num-clients": 2.5})


_CHOICES = {"exp3_mode": EXP3_MODES, "tie_breaking": TIE_BREAKING, "mass_threshold_unit": MASS_THRESHOLD_UNITS,
            "explore_on": EXPLORE_ON, "signature_start_on": SIGNATURE_START_ON}
"""The values of the routing settings that are words."""


def _other_value(name: str, value: object) -> tuple[object, object]:
    """A valid value of routing field ``name`` other than ``value``: (as the run config writes it, as the field)."""
    if isinstance(value, bool):
        return not value, not value
    if isinstance(value, int):
        return value + 1, value + 1
    if isinstance(value, float):
        other = value / 2 if value > 0 else 0.1
        return other, other
    if isinstance(value, tuple):
        return "gr,com", ("gr", "com")
    other = next(choice for choice in _CHOICES[name] if choice != value)
    return other, other


@pytest.mark.parametrize("field", [field.name for field in fields(RoutingSettings)])
def test_every_routing_setting_is_a_run_config_key(defaults: dict, field: str) -> None:
    """Field ``a_b`` is key ``a-b`` of ``[tool.flwr.app.config]``, and a value set there reaches the method."""
    key = field.replace("_", "-")
    assert ROUTING_KEYS[key] == field and key in defaults
    if field == "signature_hold_rounds":          # needs a task with class samples (tests/test_signature_start.py)
        defaults = {**defaults, "task": "boundaries"}
    base = getattr(parse_run_config({**defaults, "method": EXP3}).routing[EXP3], field)
    written, expected = _other_value(field, base)
    settings = parse_run_config({**defaults, "method": EXP3, key: written})
    assert getattr(settings.routing[EXP3], field) == expected != base


_CHARACTERS_KEYS = ("num-clients test-fraction hidden-units local-steps learning-rate pretrain-epochs "
                    "pretrain-learning-rate base-epochs alpha seed")
_LINEAR_KEYS = ("num-clients dimension group-distance samples-per-client test-samples-per-client noise-std local-steps "
                "learning-rate init init-spread seed")
TASK_KEY_NAMES = {
    "linear": _LINEAR_KEYS,
    "collinear": _LINEAR_KEYS,
    "housing": "num-clients test-fraction local-steps learning-rate init-radius init-jitter seed data-file",
    "gmm": "num-clients noise-std samples-per-client test-samples-per-client local-steps learning-rate init-radius "
           "init-jitter entrance seed",
    "characters": _CHARACTERS_KEYS,
    "femnist": f"{_CHARACTERS_KEYS} dataset data-file first-writer num-classes image-size",
    "boundaries": "num-clients num-groups samples-per-client test-samples-per-client label-sharpness hidden-units "
                  "local-steps learning-rate seed",
    "digit-rotations": "num-clients num-groups test-fraction hidden-units local-steps learning-rate weight-decay seed",
    "dataset": "dataset num-clients partitioner dirichlet-alpha partition-by classes-per-client num-groups "
               "group-transform label-column test-fraction model local-epochs batch-size learning-rate client-device "
               "batched-losses routing-loss-rows routing-early-stop seed",
}
"""Every task's run-config keys (the hand-made tables the registry derives now)."""


@pytest.mark.parametrize("name", sorted(TASK_KEY_NAMES))
def test_task_keys_are_its_fields_with_dashes_but_the_listed_exceptions(name: str) -> None:
    from fedroute.tasks.registry import NOT_KEYS, TASK_NOT_KEYS, TASKS, task_class, task_keys

    assert set(TASKS) == set(TASK_KEY_NAMES)
    keys = task_keys(name)
    assert set(keys) == set(TASK_KEY_NAMES[name].split())
    names = {field.name for field in fields(task_class(name))}
    assert {field for field, _ in keys.values()} == names - set(NOT_KEYS) - set(TASK_NOT_KEYS.get(name, ()))
    assert set(TASK_NOT_KEYS.get(name, ())) <= names
    assert all(key == field.replace("_", "-") and kind in (int, float, str) for key, (field, kind) in keys.items())


@pytest.mark.parametrize("name", sorted(TASK_KEY_NAMES))
def test_every_task_key_is_a_key_of_the_apps_config(defaults: dict, name: str) -> None:
    """``flwr run --run-config`` overrides only keys the app declares: each task key is in ``[tool.flwr.app.config]``."""
    from fedroute.tasks.registry import task_keys

    assert sorted(set(task_keys(name)) - set(defaults)) == []


def test_the_gmm_entrance_key_reaches_the_task(defaults: dict) -> None:
    from fedroute.tasks.registry import task_from_config

    assert task_from_config({**defaults, "task": "gmm"}).entrance == "collapsed"
    assert task_from_config({**defaults, "task": "gmm", "entrance": "any"}).entrance == "any"


def test_a_field_that_is_no_key_keeps_the_tasks_default() -> None:
    from fedroute.tasks.registry import task_from_config

    gmm = task_from_config({"task": "gmm", "dimension": 3, "num-groups": 4, "num-classes": 7})
    assert (gmm.dimension, gmm.num_groups, gmm.num_classes) == (10, 3, 5)  # the linear/boundaries/femnist keys
    assert task_from_config({"task": "housing", "entrance": "any"}).entrance == "collapsed"  # the GMM key
