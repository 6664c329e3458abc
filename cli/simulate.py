"""``fedroute simulate``: one linear-task configuration in the batched simulator."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fedroute.cli.help import add_command
from fedroute.cli.run_config import run_config_items
from fedroute.core.methods import METHODS, REGISTRY

__all__ = ["add_simulate"]

ALL = "all"
"""``--method all``: every routing method in turn (run-config ``method = "all"``, which is
:data:`fedroute.server.run_config.EVERY_METHOD`: a test checks it; not imported here, where
``fedroute --help`` would pay for it)."""


def _simulate(args: argparse.Namespace) -> int:
    from fedroute.server.run_config import parse_run_config
    from fedroute.simulation.recorded import check_simulable, simulate_run

    config = {"method": args.method, "task": "linear", "num-clients": args.num_clients, "init": args.init,
              "init-spread": args.init_spread, "seed": args.seed, "num-server-rounds": args.rounds}
    try:
        settings = parse_run_config({**config, **run_config_items(args.run_config)})
        check_simulable(settings)
    except ValueError as error:
        print(f"fedroute: {error}", file=sys.stderr)
        return 2
    import logging

    from fedroute.monitoring.progress import ensure_console_handler

    ensure_console_handler(logging.getLogger("fedroute"))
    summaries = simulate_run(settings, Path(args.out) if args.out else None, progress=True)
    print(json.dumps(summaries, indent=2))
    return 0


def add_simulate(commands: Any) -> None:
    """``fedroute simulate`` and its options."""
    sim = add_command(commands, "simulate", "one linear-task configuration in the batched simulator",
                      "Runs the same dynamics as the Flower app (the same random draws: identical routes) in one "
                      "process, in well under a second, and prints every method's summary as JSON.")
    *others, last = (REGISTRY[method].label for method in METHODS)
    sim.add_argument("--method", default=ALL, choices=(ALL, *METHODS),
                     help=f"the routing method; {ALL} runs {', '.join(others)} and {last} in turn")
    sim.add_argument("--rounds", type=int, default=100, help="training rounds T (run-config num-server-rounds)")
    sim.add_argument("--num-clients", type=int, default=80, help="clients of the two-group linear task")
    sim.add_argument("--init", default="collapsed", choices=("collapsed", "spread", "copies"),
                     help="the cluster models' start: collapsed (in the starvation basin), spread (theta_bar + "
                          "rho z) or copies (K identical copies)")
    sim.add_argument("--init-spread", type=float, default=3.0, help="rho of the spread start")
    sim.add_argument("--seed", type=int, default=0, help="data, start and routing seed")
    sim.add_argument("--run-config", nargs="*", default=[], metavar="KEY=VALUE|FILE.toml",
                     help="further run-config keys, as for fedroute flower (e.g. starvation-rounds=5)")
    sim.add_argument("--out", default=None, help="write a run directory here (telemetry, alarms, summary.json) "
                     "that fedroute monitor reads")
    sim.set_defaults(handler=_simulate)
