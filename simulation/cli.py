"""The ``fedroute`` command line.

``fedroute flower``     run the Flower app (``flwr run .``) hermetically in a Ray simulation
``fedroute deploy local``  run it on a real SuperLink and SuperNodes on 127.0.0.1
``fedroute simulate``   run one configuration in the batched simulator and print its summary
``fedroute reproduce``  run a paper experiment (tables, figures, claims)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

__all__ = ["main", "REPRODUCE_COMMANDS"]

REPRODUCE_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}
"""Experiment name → function(args) returning an exit code; experiments register here."""


def _simulate(args: argparse.Namespace) -> int:
    import numpy as np

    from fedroute.simulation.fedcam import simulate_fedcam_batch
    from fedroute.simulation.simulator import simulate
    from fedroute.simulation.summary import run_summary
    from fedroute.strategies.methods import METHODS, method_settings
    from fedroute.tasks.linear import LinearTask

    task = LinearTask(num_clients=args.num_clients, init=args.init, init_spread=args.init_spread, seed=args.seed)
    clients = task.clients(np.arange(task.num_clients))
    summaries = {}
    for method in (METHODS if args.method == "all" else (args.method,)):
        settings = method_settings(method, task.name)
        if method == "fedcam":
            batch = simulate_fedcam_batch([task], settings, args.rounds, [args.seed])
            final, routes = batch.cluster_models[-1, 0], batch.routes[:, 0].astype(np.int64)
        else:
            history = simulate(task, settings, args.rounds, args.seed)
            final, routes = history.cluster_models[-1], history.routes
        counts = np.stack([np.bincount(r, minlength=final.shape[0]) for r in routes])
        summaries[method] = run_summary(final, clients.losses(final, "train"), clients.losses(final, "test"),
                                        clients.groups, counts, task.group_parameters)
    print(json.dumps(summaries, indent=2))
    return 0


def _flower(args: argparse.Namespace) -> int:
    from fedroute.server.launcher import parse_config_value, run_flower_app

    overrides = {key: parse_config_value(value) for key, value in (item.split("=", 1) for item in args.run_config)}
    overrides.setdefault("num-clients", args.supernodes)
    overrides.setdefault("results-dir", str(Path(args.results_dir).resolve()))
    result = run_flower_app(args.app_dir, overrides, num_supernodes=args.supernodes, timeout=args.timeout, stream=True)
    if not result.completed:
        print(f"fedroute: the Flower run ended with status {result.status!r} (exit {result.returncode})",
              file=sys.stderr)
        return 1
    return 0


def _deploy(args: argparse.Namespace) -> int:
    from fedroute.server.deploy import LocalFederation
    from fedroute.server.launcher import parse_config_value
    from fedroute.server.results import summary_table

    overrides = {key: parse_config_value(value) for key, value in (item.split("=", 1) for item in args.run_config)}
    overrides.setdefault("num-clients", args.supernodes)
    overrides.setdefault("results-dir", str(Path(args.results_dir).resolve()))
    with LocalFederation(args.app_dir, args.supernodes, tls=args.tls, state_dir=args.state_dir) as federation:
        result = federation.run(overrides, timeout=args.timeout, stream=True)
    if not result.completed:
        print(f"fedroute: the deployed run ended with status {result.status!r} (exit {result.returncode})",
              file=sys.stderr)
        return 1
    if "results:" not in result.stdout and result.results_dir and (result.results_dir / "summary.json").is_file():
        print(summary_table(json.loads((result.results_dir / "summary.json").read_text())))  # stream lost it
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    return REPRODUCE_COMMANDS[args.experiment](args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fedroute``."""
    from fedroute.simulation import experiments  # noqa: F401  (registers the reproduce commands)

    parser = argparse.ArgumentParser(prog="fedroute", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    flower = commands.add_parser("flower", help="run the Flower app in a local Ray simulation")
    flower.add_argument("--app-dir", default=".", help="the Flower app (this repository)")
    flower.add_argument("--supernodes", type=int, default=80, help="simulated SuperNodes (= num-clients)")
    flower.add_argument("--results-dir", default="results", help="where results/<run-id>/ is written")
    flower.add_argument("--timeout", type=float, default=1800.0, help="seconds before the run is stopped")
    flower.add_argument("--run-config", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config overrides, e.g. method=exp3 num-server-rounds=50")
    flower.set_defaults(handler=_flower)

    deploy = commands.add_parser("deploy", help="run the Flower app on real SuperLink/SuperNode processes")
    local = deploy.add_subparsers(dest="action", required=True).add_parser(
        "local", help="a SuperLink and N SuperNodes on 127.0.0.1 (docs/deployment.md)")
    local.add_argument("--supernodes", type=int, required=True, help="SuperNodes to start (= num-clients)")
    local.add_argument("--tls", action="store_true", help="TLS with a private CA made for this deployment")
    local.add_argument("--run-config", nargs="*", default=[], metavar="KEY=VALUE", help="run-config overrides")
    local.add_argument("--results-dir", default="results", help="where results/<run-id>/ is written")
    local.add_argument("--state-dir", default=None, help="persistent client state (node config state-dir)")
    local.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run is stopped")
    local.add_argument("--app-dir", default=".", help="the Flower app (this repository)")
    local.set_defaults(handler=_deploy)

    sim = commands.add_parser("simulate", help="one linear-task configuration in the batched simulator")
    sim.add_argument("--method", default="all", choices=("all", "greedy", "exp3", "sync-entry", "fedcam"))
    sim.add_argument("--rounds", type=int, default=100)
    sim.add_argument("--num-clients", type=int, default=80)
    sim.add_argument("--init", default="collapsed", choices=("collapsed", "spread"))
    sim.add_argument("--init-spread", type=float, default=3.0)
    sim.add_argument("--seed", type=int, default=0)
    sim.set_defaults(handler=_simulate)

    reproduce = commands.add_parser("reproduce", help="a paper experiment: tables, figures, claims")
    reproduce.add_argument("experiment", choices=sorted(REPRODUCE_COMMANDS) or ["none"])
    reproduce.add_argument("--out", default="results/reproduce", help="output directory")
    reproduce.add_argument("--quick", action="store_true", help="a small version (for tests)")
    reproduce.add_argument("--workers", type=int, default=1, help="parallel workers (results do not depend on it)")
    reproduce.add_argument("--ray-address", default=None, help="an existing Ray cluster")
    reproduce.add_argument("--data-file", default=None, help="housing: local copy of the California Housing table "
                           "(csv, csv.gz, parquet); default $FEDROUTE_HOUSING_FILE, else the real download")
    reproduce.set_defaults(handler=_reproduce)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``fedroute`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    # Under ``python -m`` this file runs as ``__main__``; use the registry of the real module.
    from fedroute.simulation.cli import main as package_main

    sys.exit(package_main())
