"""The targets table that ``bench/run_all.py`` writes into docs/performance.md: each verdict, at its boundary."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import run_all  # noqa: E402  (bench/ is a folder of scripts, not a package)


def _row(label: str, seconds_per_run: list[float], cpu: float | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"label": label, "seconds": sum(seconds_per_run) / len(seconds_per_run),
                           "seconds_per_run": seconds_per_run}
    if cpu is not None:
        row["phases"] = {"cpu": cpu}
    return row


def _line(table: str, start: str) -> str:
    (line,) = [line for line in table.splitlines() if line.startswith(start)]
    return line


def test_simulation_ratios_are_judged_against_their_limits_at_the_boundary() -> None:
    rows = [_row("FedAvg", [1.0, 1.0]), _row("ClusteredRouting K=2", [1.10, 1.10]),
            _row("ClusteredRouting K=4", [1.30, 1.42]), _row("ClusteredRouting K=8", [1.9, 1.7])]
    table = run_all.targets_table({"simulation-12-1": rows}, None, clients=12, large_clients=1000)
    assert _line(table, "| simulation, 12 clients, 1 epoch, `K = 2`").endswith("| met |")  # 1.10 ≤ 1.10
    four = _line(table, "| simulation, 12 clients, 1 epoch, `K = 4`")
    assert "1.36×" in four and four.endswith("| **not met** |")                              # 1.36 > 1.35
    eight = _line(table, "| simulation, 12 clients, 1 epoch, `K = 8`")
    assert "1.80×" in eight and "per pair 1.80×" in eight and eight.endswith("| met |")


def test_per_pair_ratio_is_the_median_of_run_i_over_fedavg_run_i() -> None:
    rows = [_row("FedAvg", [1.0, 2.0, 4.0]), _row("ClusteredRouting K=2", [1.5, 2.0, 4.4])]
    line = _line(run_all.targets_table({"simulation-12-1": rows}, None, 12, 1000), "| simulation")
    assert "per pair 1.10×" in line  # ratios 1.5, 1.0, 1.1 → median 1.1 (the ratio of means is 1.13)
    assert "1.13×" in line


def test_large_population_and_deployments_have_their_own_targets() -> None:
    rows_of = {
        "simulation-1000-1": [_row("FedAvg", [1.0]), _row("ClusteredRouting K=2", [3.0]),
                              _row("ClusteredRouting K=8", [2.6])],
        "deployment-10": [_row("FedAvg", [20.0], cpu=4.0), _row("ClusteredRouting K=2", [23.2], cpu=4.2)],
        "deployment-3": [_row("FedAvg", [20.0], cpu=4.0), _row("ClusteredRouting K=2", [22.0], cpu=4.0)],
    }
    table = run_all.targets_table(rows_of, None, clients=12, large_clients=1000)
    assert "K = 2`" not in _line(table, "| simulation, 1000")  # no target for K = 2 with 1,000 clients
    assert _line(table, "| simulation, 1000 clients, 5 % per round, `K = 8`").endswith("| **not met** |")
    three, ten = _line(table, "| deployment, 3 SuperNodes"), _line(table, "| deployment, 10 SuperNodes")
    assert table.index(three) < table.index(ten)                # ordered by the number of SuperNodes
    assert three.endswith("| met |") and "ClientApp CPU per message 1.00×" in three
    assert ten.endswith("| **not met** |") and "ClientApp CPU per message 1.05×" in ten


@pytest.mark.parametrize("gmm_seconds, e4_seconds, verdicts", [(80.0, 300.0, ("met", "met")),
                                                               (80.1, 300.5, ("**not met**", "**not met**"))])
def test_reproduction_targets(gmm_seconds: float, e4_seconds: float, verdicts: tuple[str, str]) -> None:
    reproduced = {"walls": {"linear": [50.0, 30.0, 40.0], "gmm": [gmm_seconds], "characters": [e4_seconds]},
                  "cpus": {"linear": [20.0], "gmm": [30.0], "characters": [290.0]}, "loads": [3.0]}
    table = run_all.targets_table({}, reproduced, clients=12, large_clients=1000)
    e5 = _line(table, "| E5 wall time over E2's")
    assert "vs 40.0 s" in e5 and "CPU 1.50×" in e5 and e5.endswith(f"| {verdicts[0]} |")  # E2: median of 3 runs
    e4 = _line(table, "| E4 full grid")
    assert "290 s CPU" in e4 and e4.endswith(f"| {verdicts[1]} |")


def test_diagnostics_are_reported_after_the_targets_and_never_judged() -> None:
    rows = [_row("FedAvg", [1.0, 1.0]), _row("ClusteredRouting K=2", [1.25, 1.15]),
            _row("FedAvg + 2 loss_fn passes per client (diagnostic)", [1.12, 1.12]),
            _row("ClusteredRouting K=2, loss_fn not run (diagnostic)", [1.06, 1.04])]
    table = run_all.targets_table({"simulation-12-1": rows}, None, clients=12, large_clients=1000)
    target = _line(table, "| simulation, 12 clients, 1 epoch, `K = 2`")
    assert "1.20×" in target and target.endswith("| **not met** |")  # the real K = 2 row, not a diagnostic
    floor = _line(table, "| (diagnostic, not a target) FedAvg + 2 loss_fn passes per client")
    assert "| 1.12× (1.120 s per round; per pair 1.12×) | the floor at this `K`" in floor
    no_loss = _line(table, "| (diagnostic, not a target) ClusteredRouting K=2, loss_fn not run")
    assert "1.05×" in no_loss and "per pair 1.05×" in no_loss and "apart from the `K` loss passes" in no_loss
    assert "met" not in floor + no_loss  # no verdict: they are not targets
    assert table.index(target) < table.index(floor) < table.index(no_loss)


def test_a_configuration_with_fewer_runs_is_judged_against_the_fedavg_runs_made_next_to_it() -> None:
    # K = 4 ran only in the first two round-robins (beside FedAvg's 1.0 s runs); FedAvg's later headline runs
    # (0.5 s, on a quieter machine) must not make K = 4 look slower than it was.
    rows = [_row("FedAvg", [1.0, 1.0, 0.5, 0.5, 0.5, 0.5]), _row("ClusteredRouting K=2", [1.1] * 2 + [0.55] * 4),
            _row("ClusteredRouting K=4", [1.3, 1.3])]
    table = run_all.targets_table({"simulation-12-1": rows}, None, clients=12, large_clients=1000)
    four = _line(table, "| simulation, 12 clients, 1 epoch, `K = 4`")
    assert "1.30×" in four and four.endswith("| met |")  # of all FedAvg runs' mean (0.667 s) it would be 1.95×
    assert _line(table, "| simulation, 12 clients, 1 epoch, `K = 2`").endswith("| met |")
