"""``fedroute reproduce NAME|all``: paper experiments in the batched simulator (tables, figures, claims)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Optional

from fedroute.cli.help import add_command
from fedroute.cli.run_config import reachable_ray_address
from fedroute.simulation.workers import AUTO, resolve_workers

__all__ = ["add_reproduce"]


def _jobs(args: argparse.Namespace, variant: str) -> Optional[list[tuple[Any, str]]]:
    """The (experiment, configuration name) pairs to run (``None``: ``--config`` is invalid, reported)."""
    from fedroute.simulation.experiments import EXPERIMENTS, PAPER

    if args.experiment == "all":
        if variant != PAPER:
            print("fedroute reproduce all: --config is invalid here; allowed: paper (all runs every variant)",
                  file=sys.stderr)
            return None
        return [(experiment, name) for experiment in EXPERIMENTS.values()
                for name in (PAPER, *(n for n, v in experiment.variants.items() if v.in_all))]
    experiment = EXPERIMENTS[args.experiment]
    if variant != PAPER and variant not in experiment.variants:
        print(f"fedroute reproduce {experiment.name}: --config {variant!r} is invalid; allowed: "
              f"{', '.join([PAPER, *experiment.variants])}", file=sys.stderr)
        return None
    return [(experiment, variant)]


def _run_job(args: argparse.Namespace, experiment: Any, name: str, config: Any, asked: int) -> int:
    """Run one experiment configuration, print its tables and claims (exit code: 0, or 1 for bad input)."""
    import pandas as pd

    from fedroute.simulation.experiments.kit import InputError, peak_memory_mb, run_experiment

    label = experiment.output_name(name)
    if not experiment.parallel and ((args.workers != AUTO and asked > 1) or args.ray_address):
        print(f"{experiment.name} is one vectorised process: --workers and --ray-address are ignored",
              file=sys.stderr)
    print(f"reproduce {label}: {experiment.title}", flush=True)
    started, out = time.perf_counter(), Path(args.out) / label
    try:
        workers = resolve_workers(args.workers, bool(args.quick), experiment.auto_workers)
        results, claims = run_experiment(experiment, config, out, workers, args.ray_address, True)
    except InputError as error:
        print(f"fedroute reproduce {experiment.name}: {error}", file=sys.stderr)
        return 1
    with pd.option_context("display.width", 200, "display.max_columns", 40):
        for table in experiment.show(results):
            print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    for record in claims:
        print(f"[{ {True: 'holds', False: 'FAILS', None: 'untestable'}[record['holds']]}] {record['claim']}")
    print(f"{label}: {time.perf_counter() - started:.1f} s, peak memory {peak_memory_mb():.0f} MB; wrote {out}")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    """``fedroute reproduce NAME|all``: run experiments (:mod:`fedroute.simulation.experiments.kit`); a claim that
    does not hold is a result (``claims.json``), not a failure: exit code 0."""
    from fedroute.simulation.experiments import EXPERIMENTS, PAPER
    from fedroute.simulation.results_doc import update_results_doc

    if (jobs := _jobs(args, getattr(args, "config", None) or PAPER)) is None:
        return 2
    try:
        configs = [experiment.configure(name, bool(args.quick), **experiment.arguments(args))
                   for experiment, name in jobs]
    except ValueError as error:
        print(f"fedroute reproduce {args.experiment}: {error}", file=sys.stderr)
        return 2
    try:
        asked = resolve_workers(args.workers, bool(args.quick))  # checked before anything runs
    except ValueError as error:
        print(f"fedroute reproduce: --{error}", file=sys.stderr)
        return 2
    if not reachable_ray_address(args):
        return 2
    for (experiment, name), config in zip(jobs, configs):
        if (code := _run_job(args, experiment, name, config, asked)) != 0:
            return code
    docs = getattr(args, "docs", None) or (None if getattr(args, "quick", False) else _repository_results_doc())
    if args.experiment == "all" and docs is not None:
        updated = update_results_doc(Path(args.out), Path(docs), {e.name: e.show for e in EXPERIMENTS.values()})
        print(f"updated {len(updated)} marked tables of {docs}: {', '.join(updated)}")
    return 0


def _repository_results_doc() -> Optional[Path]:
    path = Path(__file__).resolve().parents[1] / "docs" / "results.md"
    return path if path.is_file() else None


def add_reproduce(commands: Any) -> None:
    """``fedroute reproduce`` and its options (the experiments and their named configurations)."""
    from fedroute.simulation.experiments import EXPERIMENTS, PAPER

    reproduce = add_command(commands, "reproduce", "a paper experiment: tables, figures, claims",
                            "Runs an experiment (docs/experiments.md) in the batched simulator and writes its tables, "
                            "figures, claims.json and config.json into OUT/<experiment>[-<config>]; all runs every "
                            "experiment and named configuration and rewrites the marked tables of docs/results.md. "
                            "The Flower path of each experiment is conf/<experiment>.toml (flwr run . --run-config "
                            "conf/<experiment>.toml).")
    reproduce.add_argument("experiment", choices=[*sorted(EXPERIMENTS), "all"], help="the experiment, or all")
    reproduce.add_argument("--out", default="results/reproduce", help="output directory")
    reproduce.add_argument("--quick", action="store_true", help="a small version (for tests)")
    named = "; ".join(f"{name}: " + ", ".join(f"{key} ({variant.description})" for key, variant in e.variants.items())
                      for name, e in sorted(EXPERIMENTS.items()) if e.variants)
    reproduce.add_argument("--config", default=PAPER, metavar="NAME",
                           help=f"a named configuration ({PAPER}: the paper's; others are written to "
                                f"OUT/<experiment>-<name>)" + (f"; {named}" if named else ""))
    reproduce.add_argument("--workers", default=AUTO, metavar="N", help="processes running chunks of runs (results "
                           "do not depend on it); auto: the CPUs this process may use (1 with --quick, "
                           "and for gmm, whose chunks share cached fits)")
    reproduce.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                           help="run the chunks as tasks of this existing Ray cluster")
    reproduce.add_argument("--data-file", default=None, help="housing: local copy of the California Housing table "
                           "(csv, csv.gz, parquet); default $FEDROUTE_HOUSING_FILE, else the real download, "
                           "else (offline) the copy shipped with fedroute")
    reproduce.add_argument("--docs", default=None, metavar="FILE", help="all: the results document whose marked "
                           "tables are rewritten (default: the repository's docs/results.md, not with --quick)")
    reproduce.set_defaults(handler=_reproduce)
