"""``fedroute monitor``: a running or finished run's routing, live in the terminal."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedroute.cli.help import add_command

__all__ = ["add_monitor"]


def _monitor(args: argparse.Namespace) -> int:
    from fedroute.monitoring.monitor import run_monitor

    return run_monitor(Path(args.run_dir), refresh=args.refresh, once=args.once, until_finished=args.until_finished,
                       method=args.method, plot=None if args.plot is None else Path(args.plot),
                       timeout=args.timeout)


def add_monitor(commands: Any) -> None:
    """``fedroute monitor`` and its options."""
    monitor = add_command(commands, "monitor", "watch a running or finished run (masses, starvation, arms, alarms)",
                          "Live terminal view of results/<run-id>/ (or a simulate --out directory): per-cluster mass "
                          "bars, rounds since each cluster was last routed, the EXP3 arm mix, the routed loss and the "
                          "alarms, refreshed as rounds land.")
    monitor.add_argument("run_dir", help="the run's results directory (results/<run-id>)")
    monitor.add_argument("--refresh", type=float, default=1.0, help="seconds between refreshes")
    monitor.add_argument("--once", action="store_true", help="print one view and exit")
    monitor.add_argument("--until-finished", action="store_true",
                         help="exit when the run has finished (status.json), instead of on Ctrl-C")
    monitor.add_argument("--method", default=None, help="show only this method (default: all)")
    monitor.add_argument("--plot", default=None, metavar="FILE",
                         help="write masses and routed loss over rounds to FILE (.png, .pdf; no suffix: both) "
                         "and exit")
    monitor.add_argument("--timeout", type=float, default=None, help="stop following after this many seconds")
    monitor.set_defaults(handler=_monitor)
