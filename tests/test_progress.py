"""Progress lines (round counter, method, ETA) and the run config checked before Flower starts."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fedroute.monitoring.progress import RoundProgress, format_duration, progress_line
from fedroute.monitoring.recorder import RunRecorder
from fedroute.deployment.flwr_config import resolve_run_config
from fedroute.deployment.launcher import echo_line
from fedroute.cli import main
from fedroute.simulation.simulator import recording, simulate
from fedroute.core.methods import method_settings
from fedroute.tasks.linear import LinearTask


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_are_throttled_and_the_pace_leaves_out_start_up() -> None:
    clock = FakeClock()
    progress = RoundProgress(num_rounds=10, interval=5.0, clock=clock)
    due = []
    for server_round in range(1, 11):
        clock.now += 20.0 if server_round == 1 else 2.0  # a slow first round (start-up), then 2 s per round
        due.append(progress.round_done(server_round))
    assert [r for r, is_due in zip(range(1, 11), due) if is_due] == [1, 4, 7, 10]  # first, every ≥ 5 s, last
    assert progress.seconds_per_round == pytest.approx(2.0)
    line = progress_line("exp3", 4, 10, 2.0, [0.55, 0.45], 0.61234)
    assert line == "[exp3] round 4/10 · 2.00 s/round · ETA 12 s · masses 0.55 0.45 · routed loss 0.6123"
    assert [format_duration(s) for s in (42, 185, 3720, float("nan"))] == ["42 s", "3 min 05 s", "1 h 02 min", "?"]
    first = RoundProgress(num_rounds=10, clock=clock)
    clock.now += 30.0  # Ray start-up inside the first round: no ETA from it
    first.round_done(1)
    assert progress_line("exp3", 1, 10, first.seconds_per_round, [1.0, 0.0]) == \
        "[exp3] round 1/10 · ETA after the next round · masses 1.00 0.00"


def test_a_run_logs_its_method_round_eta_and_alarms(caplog: pytest.LogCaptureFixture) -> None:
    routing = method_settings("greedy", preset="linear")
    recorder = RunRecorder("greedy", 2, routing.controllers, 15, progress_interval=0.0)
    recorder.start()
    with caplog.at_level(logging.INFO, logger="fedroute"):
        simulate(LinearTask(num_clients=6, init="collapsed"), routing, 15, 0, on_round=recording(recorder))
    lines = [record.message for record in caplog.records if "round " in record.message and "ETA" in record.message]
    assert len(lines) == 15 and lines[-1].startswith("[greedy] round 15/15 · ")
    assert "alarms: collapsed-entrance(1), starvation(1)" in lines[-1]


def test_flower_output_noise_is_not_echoed() -> None:
    assert not echo_line("Flower configuration not found. Created default configuration at /tmp/x/config.toml\n")
    assert not echo_line("Successfully installed fedroute to /tmp/x/apps/fedroute.fedroute.0.1.0.1234.\n")
    assert not echo_line("\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.")
    assert echo_line("Successfully started run 123\n") and echo_line("INFO fedroute: [exp3] round 1/100 · …\n")


def test_run_config_is_resolved_as_flower_does_and_checked(repository: Path) -> None:
    resolved = resolve_run_config(repository, {"method": "exp3", "num-server-rounds": 7, "results-dir": "/tmp/x"})
    assert resolved["method"] == "exp3" and resolved["num-server-rounds"] == 7 and resolved["init"] == "collapsed"
    with pytest.raises(ValueError, match=r"'num-rounds' is not defined .* allowed keys: .*num-server-rounds"):
        resolve_run_config(repository, {"num-rounds": 7})
    with pytest.raises(ValueError, match="'exp3-exploration' = 1.5 is invalid; allowed"):
        resolve_run_config(repository, {"exp3-exploration": 1.5})
    with pytest.raises(ValueError, match="'tensorboard'"):
        resolve_run_config(repository, {"tensorboard": "yes"})


@pytest.mark.parametrize("item", ["exp3-exploration=1.5", "num-rounds=3", "no-equals-sign"])
def test_bad_run_config_stops_before_flower_starts(repository: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], item: str) -> None:
    def no_process(*args, **kwargs):
        raise AssertionError("a process was started for an invalid run config")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    for command in (["flower"], ["deploy", "local", "--supernodes", "2"]):
        assert main([*command, "--app-dir", str(repository), "--run-config", item]) == 2
        error = capsys.readouterr().err
        assert error.startswith("fedroute: ") and item.split("=")[0] in error


def test_alarm_keys_are_validated_with_their_names(repository: Path) -> None:
    from fedroute.server.run_config import parse_run_config

    defaults = resolve_run_config(repository, {})
    settings = parse_run_config({**defaults, "starvation-rounds": 4, "duplication-tolerance": 0.01,
                                 "dead-rounds": 2, "tensorboard": True, "progress-interval": 0})
    assert (settings.alarm_settings.starvation_rounds, settings.alarm_settings.duplication_tolerance,
            settings.alarm_settings.dead_rounds, settings.tensorboard, settings.progress_interval) == \
        (4, 0.01, 2, True, 0.0)
    for key, value in (("starvation-rounds", 0), ("dead-rounds", 2.5), ("duplication-tolerance", 1.0)):
        with pytest.raises(ValueError, match=f"'{key}'"):
            parse_run_config({**defaults, key: value})
    # observability keys do not change the dynamics: a resumed run keeps its client-state namespace
    assert settings.run_digest == parse_run_config(defaults).run_digest
    np.testing.assert_equal(settings.routing["exp3"].to_dict(), parse_run_config(defaults).routing["exp3"].to_dict())
