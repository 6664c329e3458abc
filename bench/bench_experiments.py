"""Wall time of the full E1 and E2 sweeps (no file writing), against the issue's targets.

Run: ``python bench/bench_experiments.py``.  Targets on the 2-core reference machine:
full E1 ≤ 5 s, full E2 ≤ 60 s.  E2 is timed per method so the cost of each is visible.
"""

from __future__ import annotations

import time
from dataclasses import replace

from fedroute.core.methods import GREEDY
from fedroute.simulation.experiments.fig1 import Fig1Config, run_fig1
from fedroute.simulation.experiments.kit import Sweep
from fedroute.simulation.experiments.linear import EXPERIMENT as LINEAR, LinearExperimentConfig


def main() -> None:
    started = time.perf_counter()
    run_fig1(Fig1Config(), progress=True)
    fig1_seconds = time.perf_counter() - started
    print(f"E1 full (20,000 pairs x 10 rho x 200 rounds): {fig1_seconds:6.1f} s  (target <= 5 s)")
    full = LinearExperimentConfig()
    total = 0.0
    for method in full.methods:
        config = replace(full, methods=(GREEDY,) if method == GREEDY else (GREEDY, method))
        started = time.perf_counter()
        LINEAR.run(config, Sweep(progress=True))
        seconds = time.perf_counter() - started
        if method != GREEDY:
            seconds -= greedy_seconds  # the sweep needs Greedy for the failure cells
        else:
            greedy_seconds = seconds
        total += seconds
        print(f"E2 full, {method:<7}: {seconds:6.1f} s")
    print(f"E2 full, all methods: {total:6.1f} s  (target <= 60 s)")


if __name__ == "__main__":
    main()
