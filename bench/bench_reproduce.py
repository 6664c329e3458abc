"""Wall time of whole ``fedroute reproduce`` commands, side by side, against the issue's targets.

Run: ``python bench/bench_reproduce.py [--repeats N] [--characters] [--keep DIR]``.

Targets (issue 13, 2-core reference machine): E5 (``reproduce gmm``) at most twice E2
(``reproduce linear``), and the full E4 grid (``reproduce characters``) at most 5 minutes.
Each command runs as its own process (imports, sweep, tables, figures: what a user waits
for), the E2 and E5 commands alternating ``--repeats`` times so that both see the same
machine load; the ratio of the medians is the result, for wall time and for CPU time
(user + system of the command's process tree: on a shared machine the wall time of a
one-process command moves with the other jobs, its CPU time much less).  The load
average is printed with every measurement.
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

E5_OVER_E2_TARGET = 2.0
E4_TARGET_SECONDS = 300.0


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def timed_reproduce(experiment: str, out: Path, *extra: str) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of ``fedroute reproduce <experiment> --out <out>`` in a fresh process."""
    command = [sys.executable, "-m", "fedroute.simulation.cli", "reproduce", experiment, "--out", str(out), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="alternating E2/E5 pairs (default 2)")
    parser.add_argument("--characters", action="store_true", help="also time the full E4 grid once (≈ 5 min)")
    parser.add_argument("--keep", default=None, help="write the outputs here instead of a temporary directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(args.keep or scratch)
        walls: dict[str, list[float]] = {"linear": [], "gmm": []}
        cpus: dict[str, list[float]] = {"linear": [], "gmm": []}
        for repeat in range(args.repeats):
            for experiment in ("linear", "gmm"):
                before = _load()
                wall, cpu = timed_reproduce(experiment, out)
                walls[experiment].append(wall)
                cpus[experiment].append(cpu)
                print(f"[{repeat + 1}/{args.repeats}] reproduce {experiment:<6} wall {wall:7.1f} s  cpu {cpu:6.1f} s  "
                      f"(load before {before}, after {_load()})", flush=True)
        for label, times in (("wall", walls), ("cpu", cpus)):
            e2, e5 = statistics.median(times["linear"]), statistics.median(times["gmm"])
            print(f"{label}: E2 (reproduce linear) median {e2:.1f} s; E5 (reproduce gmm) median {e5:.1f} s; "
                  f"E5 / E2 = {e5 / e2:.2f}  (target <= {E5_OVER_E2_TARGET:g})")
        if args.characters:
            before = _load()
            wall, cpu = timed_reproduce("characters", out)
            print(f"E4 (reproduce characters, full grid) wall {wall:.1f} s, cpu {cpu:.1f} s  (target <= "
                  f"{E4_TARGET_SECONDS:g} s; load before {before}, after {_load()})")


if __name__ == "__main__":
    main()
