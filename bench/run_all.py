"""Regenerate the measured part of ``docs/performance.md`` with one command.

Run: ``python bench/run_all.py --write docs/performance.md`` (the defaults measure
everything, ≈ 1.5–2 h on 2 loaded cores; ``--help`` lists the sizes and repeats, e.g.
``--repeat 1 --headline-repeat 2 --deployment-repeat 2 --deployment-rounds 2
--reproduce-repeats 1`` for ≈ 45 min).

It runs, one after the other in this process:

1. ``bench/bench_fedavg.py``'s measurements: Flower's FedAvg against
   ``ClusteredRouting`` side by side in the Flower simulation (12 clients;
   1,000 clients at 5 %), in native deployments (3 and 10 SuperNodes), in
   process (CPU time), the server-side breakdown and the ClientApp's imports;
2. ``bench/bench_reproduce.py``'s: ``fedroute reproduce linear`` (E2) and
   ``gmm`` (E5) alternating, and the full E4 grid (``reproduce characters``);

and writes, between the ``bench-table`` markers of the file given to
``--write``: a header (command line, date, commit, the machine's CPUs and
load), the table of the performance targets (each measured value, met or
not), then every measurement table.  Without ``--write`` it prints the same
markdown.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import bench_reproduce
from ratios import pair_median, paired_ratio

REPOSITORY = Path(__file__).resolve().parents[1]

SIMULATION_TARGETS = {2: 1.10, 4: 1.35, 8: 1.8}
"""``K`` → the largest allowed round-time ratio to FedAvg (12 clients, 1 local epoch)."""
LARGE_TARGETS = {8: 2.5}
"""``K`` → the same with 1,000 clients, 5 % per round."""
DEPLOYMENT_TARGETS = {2: 1.15}
"""``K`` → the same in a native deployment (3 and 10 SuperNodes)."""


def _commit() -> str:
    try:
        done = subprocess.run(["git", "-C", str(REPOSITORY), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(REPOSITORY), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return done.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _verdict(value: float, limit: float) -> str:
    return "met" if value <= limit else "**not met**"


def _ratio_rows(rows: list[dict[str, Any]], targets: dict[int, float], what: str) -> list[str]:
    """One target row per ``K`` of ``targets`` present in ``rows`` (FedAvg first): ratio of the mean round times
    (judged), the median per-pair ratio and, for a deployment, the ClientApp process's CPU per message."""
    baseline, lines = rows[0], []
    for k, limit in targets.items():
        row = next((r for r in rows if r["label"] == f"ClusteredRouting K={k}"), None)
        if row is None:
            continue
        ratio = paired_ratio(row, baseline)
        cpu = (f"; ClientApp CPU per message {row['phases']['cpu'] / baseline['phases']['cpu']:.2f}×"
               if "phases" in row else "")
        lines.append(f"| {what}, `K = {k}` | ≤ {limit:.2f}× | {ratio:.2f}× ({row['seconds']:.3f} s vs "
                     f"{baseline['seconds']:.3f} s per round; per pair {pair_median(row, baseline):.2f}×{cpu}) "
                     f"| {_verdict(ratio, limit)} |")
    return lines


DIAGNOSTICS = {
    "loss_fn passes per client": "the floor at this `K`: FedAvg plus the `K` loss passes routing needs, "
                                 "nothing of fedroute",
    "loss_fn not run": "routing's cost apart from the `K` loss passes",
}
"""Words in a diagnostic configuration's label → what its ratio shows."""


def _diagnostic_rows(rows: list[dict[str, Any]]) -> list[str]:
    """A row per diagnostic configuration (label ending in ``(diagnostic)``): its ratio, no verdict."""
    baseline, lines = rows[0], []
    for row in rows:
        if not row["label"].endswith("(diagnostic)"):
            continue
        meaning = next((text for words, text in DIAGNOSTICS.items() if words in row["label"]), "")
        lines.append(f"| (diagnostic, not a target) {row['label'].removesuffix(' (diagnostic)')} | — "
                     f"| {paired_ratio(row, baseline):.2f}× ({row['seconds']:.3f} s per round; per pair "
                     f"{pair_median(row, baseline):.2f}×) | {meaning} |")
    return lines


def targets_table(rows_of: dict[str, list[dict[str, Any]]], reproduced: Optional[dict[str, Any]],
                  clients: int, large_clients: int) -> str:
    """The performance targets, each with its measured value and whether it is met."""
    lines = ["**Targets** (wall-time ratios of the mean round times, side by side in this run: each configuration's "
             "runs against the FedAvg runs made next to them; per pair: median of run `i` over FedAvg's run `i`)", "",
             "| target | allowed | measured | |", "|---|---:|---|---|"]
    if f"simulation-{clients}-1" in rows_of:
        lines += _ratio_rows(rows_of[f"simulation-{clients}-1"], SIMULATION_TARGETS,
                             f"simulation, {clients} clients, 1 epoch")
        lines += _diagnostic_rows(rows_of[f"simulation-{clients}-1"])
    if f"simulation-{large_clients}-1" in rows_of:
        lines += _ratio_rows(rows_of[f"simulation-{large_clients}-1"], LARGE_TARGETS,
                             f"simulation, {large_clients} clients, 5 % per round")
    for key in sorted((k for k in rows_of if k.startswith("deployment-")), key=lambda k: int(k.split("-")[1])):
        lines += _ratio_rows(rows_of[key], DEPLOYMENT_TARGETS, f"deployment, {key.split('-')[1]} SuperNodes")
    if reproduced:
        walls, cpus = reproduced["walls"], reproduced["cpus"]
        if walls.get("linear") and walls.get("gmm"):
            e2, e5 = statistics.median(walls["linear"]), statistics.median(walls["gmm"])
            ratio = e5 / e2
            cpu_ratio = statistics.median(cpus["gmm"]) / statistics.median(cpus["linear"])
            lines.append(f"| E5 wall time over E2's (one process each) | ≤ {bench_reproduce.E5_OVER_E2_TARGET:.2f}× | {ratio:.2f}× "
                         f"({e5:.1f} s vs {e2:.1f} s; CPU {cpu_ratio:.2f}×) "
                         f"| {_verdict(ratio, bench_reproduce.E5_OVER_E2_TARGET)} |")
        if walls.get("characters"):
            wall, cpu = walls["characters"][0], cpus["characters"][0]
            lines.append(f"| E4 full grid | ≤ {bench_reproduce.E4_TARGET_SECONDS:.0f} s | {wall:.0f} s wall, "
                         f"{cpu:.0f} s CPU | {_verdict(wall, bench_reproduce.E4_TARGET_SECONDS)} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    import bench_fedavg  # Flower, fedroute and the example's ServerApp: only when measuring

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_fedavg.build_parser(parser)
    parser.add_argument("--reproduce-repeats", type=int, default=2,
                        help="alternating runs of reproduce linear and gmm (0: skip them)")
    parser.add_argument("--skip-characters", action="store_true", help="do not time the full E4 grid")
    parser.add_argument("--write", type=Path, metavar="MARKDOWN",
                        help="rewrite the bench-table section of this file (docs/performance.md)")
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    import bench_fedavg

    arguments = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(arguments)
    if args.write is not None and not args.write.is_file():
        raise SystemExit(f"--write {args.write}: no such file")
    started = datetime.datetime.now(datetime.timezone.utc)
    load_at_start = os.getloadavg()[0]
    sections, rows_of = bench_fedavg.measure(args)
    reproduced = None
    if args.reproduce_repeats > 0 or not args.skip_characters:
        reproduced = bench_reproduce.measure(args.reproduce_repeats, characters=not args.skip_characters)
        sections.append(bench_reproduce.reproduce_table(reproduced))
    finished = datetime.datetime.now(datetime.timezone.utc)
    header = (f"*Generated by `python bench/run_all.py {shlex.join(arguments)}` at commit {_commit()}, "
              f"{started:%Y-%m-%d %H:%M}–{finished:%H:%M} UTC, on {os.cpu_count()} CPUs shared with other jobs "
              f"(1-minute load average {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end).*")
    text = "\n\n".join([header, targets_table(rows_of, reproduced, args.clients, args.large_clients), *sections])
    print(text)
    if args.write is not None:
        bench_fedavg.write_docs(args.write, text)
        print(f"wrote {args.write}", file=sys.stderr)


if __name__ == "__main__":
    main()
