"""Round-time ratios of a configuration to the FedAvg baseline, over the runs made side by side.

Imported by ``bench_fedavg.py`` (its tables) and ``run_all.py`` (the targets
table); free of Flower and fedroute, so the targets can be tested alone.
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["paired_ratio", "pair_ratios_of", "pair_median"]


def paired_ratio(row: dict[str, Any], baseline: dict[str, Any]) -> float:
    """Mean round time of ``row`` over the baseline's, both over the runs that ran side by side.

    Run ``i`` of a configuration ran next to run ``i`` of the baseline; a
    configuration with fewer runs than the baseline (``K = 4`` and ``K = 8`` run
    ``--repeat`` times, FedAvg and ``K = 2`` also in the headline repeats) is
    compared with the baseline's first runs only, not with runs made at another
    time under another load.
    """
    runs = row["seconds_per_run"]
    return statistics.fmean(runs) / statistics.fmean(baseline["seconds_per_run"][:len(runs)])


def pair_ratios_of(row: dict[str, Any], baseline: dict[str, Any]) -> list[float]:
    """The per-pair ratios: run ``i`` of ``row`` over run ``i`` of the baseline (the runs made next to it)."""
    return [a / b for a, b in zip(row["seconds_per_run"], baseline["seconds_per_run"])]


def pair_median(row: dict[str, Any], baseline: dict[str, Any]) -> float:
    """Median of :func:`pair_ratios_of`."""
    return statistics.median(pair_ratios_of(row, baseline))
