"""``fedroute monitor``: renders a finished run, follows a running one, plots; TensorBoard's reader loads the scalars."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from fedroute.monitoring.monitor import load_run, run_monitor
from fedroute.monitoring.recorder import RunRecorder
from fedroute.server.results import write_status
from fedroute.server.run_config import parse_run_config
from fedroute.cli import main
from fedroute.simulation.recorded import simulate_run
from fedroute.simulation.simulator import recording, simulate
from fedroute.core.methods import method_settings
from fedroute.tasks.linear import LinearTask

TASK = LinearTask(num_clients=10, init="collapsed", seed=0)
RUN_CONFIG = {"method": "all", "num-clients": 80, "init": "collapsed", "num-server-rounds": 30, "seed": 0,
              "starvation-rounds": 5}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("run")
    simulate_run(parse_run_config({**RUN_CONFIG, "tensorboard": True}), directory)
    return directory


def _text(directory: Path, **options) -> tuple[int, str]:
    stream = io.StringIO()
    code = run_monitor(directory, console=Console(file=stream, width=120, color_system=None), **options)
    return code, stream.getvalue()


def test_renders_a_finished_run(finished_run: Path) -> None:
    code, text = _text(finished_run)  # a finished run is shown once, without --once
    assert code == 0
    assert "finished" in text and text.count("round 30/30") == 4
    greedy, exp3 = text.split("╭─ greedy")[1].split("╭─ exp3")
    assert "⚠ collapsed-entrance (since t=0)" in greedy and "⚠ starvation (since t=4)" in greedy
    assert "never" in greedy  # cluster 1 was never routed
    assert "✓" not in greedy
    assert "⚠" not in exp3.split("╭─ sync-entry")[0] and "✓ t=1: recovery" in exp3
    assert "EXP3 arms  gr" in exp3 and "rh" in exp3
    code, only = _text(finished_run, method="exp3")
    assert "╭─ greedy" not in only and "╭─ exp3" in only


def test_follows_a_running_run_until_it_finishes(tmp_path: Path) -> None:
    """A writer thread lands a round every 20 ms; the monitor (refresh 10 ms) shows them and exits at the end."""
    routing = method_settings("exp3", preset="linear")
    num_rounds = 25
    write_status(tmp_path, "running", methods=["exp3"], num_rounds=num_rounds, current_method="exp3", completed=[])
    recorder = RunRecorder("exp3", 2, routing.controllers, num_rounds, telemetry_dir=tmp_path, progress_interval=None)
    recorder.start()
    observe = recording(recorder)
    writer_started = threading.Event()

    def slowly(simulated) -> None:
        writer_started.set()
        observe(simulated)
        time.sleep(0.02)

    def write_run() -> None:
        simulate(TASK, routing, num_rounds, 0, on_round=slowly)
        recorder.close()
        write_status(tmp_path, "finished", methods=["exp3"], num_rounds=num_rounds, current_method=None,
                     completed=["exp3"])

    writer = threading.Thread(target=write_run)
    writer.start()
    writer_started.wait(10)
    code, text = _text(tmp_path, refresh=0.01, until_finished=True, timeout=60)
    writer.join(30)
    assert code == 0
    shown = [int(part.split("/")[0]) for part in text.split("round ")[1:] if part.split("/")[0].isdigit()]
    assert shown[-1] == num_rounds and len(set(shown)) >= 3  # it followed intermediate rounds
    assert shown == sorted(shown)
    headers = [line for line in text.splitlines() if line.startswith("fedroute monitor")]
    assert "running" in headers[0] and "finished" in headers[-1]


def test_plot_writes_png_and_pdf(finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", str(finished_run), "--plot", str(tmp_path / "routing")]) == 0
    for suffix in (".png", ".pdf"):
        path = tmp_path / f"routing{suffix}"
        assert path.is_file() and path.stat().st_size > 1000
    assert (tmp_path / "routing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["monitor", str(finished_run), "--plot", str(tmp_path / "one.pdf")]) == 0
    assert not (tmp_path / "one.png").exists() and (tmp_path / "one.pdf").read_bytes()[:4] == b"%PDF"
    assert main(["monitor", str(tmp_path / "missing")]) == 2


def test_tensorboard_reader_loads_the_scalars(finished_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedroute.monitoring.telemetry import read_table

    rounds = read_table(finished_run / "rounds.csv")
    for method in ("greedy", "exp3"):
        accumulator = EventAccumulator(str(finished_run / "tensorboard" / method))
        accumulator.Reload()
        table = rounds[rounds.method == method]
        for tag, column in (("mass/cluster_0", "mass_0"), ("mass/cluster_1", "mass_1"),
                            ("routed_train_loss", "routed_train_loss"), ("arm/gr", "arm_gr")):
            events = accumulator.Scalars(tag)
            assert [event.step for event in events] == table.round_index.tolist(), tag
            np.testing.assert_allclose([event.value for event in events], table[column], rtol=1e-6, err_msg=tag)
        active = [event.value for event in accumulator.Scalars("alarms/active")]
        texts = [event.tensor_proto.string_val[0].decode() for event in accumulator.Tensors("alarms")]
        if method == "greedy":
            assert active[0] == 1 and active[-1] == 2  # collapsed entrance, then starvation; never cleared
            assert any("starvation raised" in text for text in texts)
        else:
            assert active[0] == 1 and active[-1] == 0
            assert any("recovery" in text for text in texts)
    assert "arm/rh" in EventAccumulator(str(finished_run / "tensorboard" / "exp3")).Reload().Tags()["scalars"]


def test_simulate_writes_a_run_directory_the_monitor_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--method", "greedy", "--rounds", "12", "--num-clients", "6", "--out", str(tmp_path),
                 "--run-config", "starvation-rounds=3"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())["greedy"]
    assert [alarm["kind"] for alarm in summary["alarms"]] == ["collapsed-entrance", "starvation"]
    assert summary["alarms"][1]["raised_round"] == 2
    view = load_run(tmp_path)
    assert view.finished and view.methods == ["greedy"] and len(view.rounds) == 12
    assert main(["simulate", "--run-config", "starvation-rounds=0"]) == 2
    assert "'starvation-rounds'" in capsys.readouterr().err


def test_the_serverapp_turns_tensorboard_and_alarm_settings_on_from_the_run_config(repository: Path,
                                                                                  tmp_path: Path) -> None:
    from fedroute.server.app import make_strategy
    from fedroute.deployment.flwr_config import resolve_run_config

    config = resolve_run_config(repository, {"tensorboard": True, "starvation-rounds": 7, "progress-interval": 0})
    settings = parse_run_config(config)
    strategy = make_strategy(settings, "exp3", tmp_path)
    assert strategy.tensorboard_dir == tmp_path / "tensorboard" / "exp3" and strategy.telemetry_dir == tmp_path
    assert strategy.label == "exp3" and strategy.alarm_settings.starvation_rounds == 7
    assert strategy.progress_interval == 0 and strategy.starvation_basin is True  # the main job's collapsed start
    assert make_strategy(parse_run_config(resolve_run_config(repository, {})), "exp3", tmp_path).tensorboard_dir \
        is None
