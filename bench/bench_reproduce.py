"""Wall time of whole ``fedroute reproduce`` commands, side by side, against the issue's targets.

Run: ``python bench/bench_reproduce.py [--repeats N] [--characters] [--keep DIR]`` (``bench/run_all.py``
runs it with the other measurements of ``docs/performance.md``).

Targets (issue 13, 2-core reference machine): E5 (``reproduce gmm``) at most twice E2
(``reproduce linear``), and the full E4 grid (``reproduce characters``) at most 5 minutes.
Each command runs as its own process (imports, sweep, tables, figures: what a user waits
for), the E2 and E5 commands alternating ``--repeats`` times so that both see the same
machine load; the ratio of the medians is the result, for wall time and for CPU time
(user + system of the command's process tree: on a shared machine the wall time of a
one-process command moves with the other jobs, its CPU time much less).  The load
average is printed with every measurement.

E5 against E2 compares like with like, **one process each** (``--workers 1``): the target
is about the simulator's vectorisation (GMM's updates batched as the linear task's).  The
default command is timed too (``--workers auto``: E2 in a pool of one process per CPU;
E5 stays in one process, its chunks share cached fits), and E4 runs with the default.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

E5_OVER_E2_TARGET = 2.0
LINEAR_DEFAULT = "linear-default"
"""The key of ``reproduce linear`` run with the default ``--workers auto``."""
COMMANDS = {"linear": ("linear", "--workers", "1"), "gmm": ("gmm", "--workers", "1"), LINEAR_DEFAULT: ("linear",),
            "characters": ("characters",)}
"""Measurement key → ``fedroute reproduce`` arguments (before ``--out``)."""
E4_TARGET_SECONDS = 300.0


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def timed_reproduce(experiment: str, out: Path, *extra: str) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of ``fedroute reproduce <experiment> --out <out>`` in a fresh process."""
    command = [sys.executable, "-m", "fedroute", "reproduce", experiment, "--out", str(out), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(repeats: int = 2, characters: bool = False, out: Optional[Path] = None) -> dict[str, Any]:
    """E2 and E5 alternating ``repeats`` times and, with ``characters``, the full E4 grid once.

    Returns ``{"walls": {experiment: [s, ...]}, "cpus": {...}, "loads": [1-minute load before each run]}``.
    """
    walls: dict[str, list[float]] = {"linear": [], "gmm": [], LINEAR_DEFAULT: []}
    cpus: dict[str, list[float]] = {"linear": [], "gmm": [], LINEAR_DEFAULT: []}
    loads: list[float] = []
    plan = [experiment for _ in range(repeats) for experiment in ("linear", "gmm")] + [LINEAR_DEFAULT] * (repeats > 0)
    plan += ["characters"] * characters
    with tempfile.TemporaryDirectory() as scratch:
        for index, experiment in enumerate(plan, 1):
            before = _load()
            loads.append(os.getloadavg()[0])
            name, *extra = COMMANDS[experiment]
            wall, cpu = timed_reproduce(name, Path(out or scratch), *extra)
            walls.setdefault(experiment, []).append(wall)
            cpus.setdefault(experiment, []).append(cpu)
            print(f"[{index}/{len(plan)}] reproduce {experiment:<10} wall {wall:7.1f} s  cpu {cpu:6.1f} s  "
                  f"(load before {before}, after {_load()})", file=sys.stderr, flush=True)
    return {"walls": walls, "cpus": cpus, "loads": loads}


def reproduce_table(measured: dict[str, Any]) -> str:
    """Markdown: each ``fedroute reproduce`` command's wall and CPU seconds (median over its runs)."""
    labels = {"linear": "E2 + E3 (`reproduce linear --workers 1`)", "gmm": "E5 (`reproduce gmm --workers 1`)",
              LINEAR_DEFAULT: "E2 + E3 (`reproduce linear`: default, one process per CPU)",
              "characters": "E4 full grid (`reproduce characters`: default, one process per CPU)"}
    loads = measured["loads"]
    lines = [f"**Paper reproductions, each command in a fresh process (median of its runs; E2 and E5 "
             f"alternating; 1-minute load average {min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} CPUs)**",
             "", "| command | runs | wall s | CPU s (process tree) |", "|---|---:|---:|---:|"]
    for experiment, walls in measured["walls"].items():
        if walls:
            lines.append(f"| {labels[experiment]} | {len(walls)} | {statistics.median(walls):.1f} "
                         f"| {statistics.median(measured['cpus'][experiment]):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="alternating E2/E5 pairs (default 2)")
    parser.add_argument("--characters", action="store_true", help="also time the full E4 grid once (≈ 5 min)")
    parser.add_argument("--keep", default=None, help="write the outputs here instead of a temporary directory")
    args = parser.parse_args()
    measured = measure(args.repeats, args.characters, Path(args.keep) if args.keep else None)
    print(reproduce_table(measured))
    walls, cpus = measured["walls"], measured["cpus"]
    for label, times in (("wall", walls), ("cpu", cpus)):
        e2, e5 = statistics.median(times["linear"]), statistics.median(times["gmm"])
        print(f"{label}: E5 / E2 = {e5 / e2:.2f}  (target <= {E5_OVER_E2_TARGET:g})")
    if args.characters:
        print(f"E4 full grid wall {walls['characters'][0]:.1f} s (target <= {E4_TARGET_SECONDS:g} s)")


if __name__ == "__main__":
    main()
