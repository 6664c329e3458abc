"""The ``fedroute`` parser: the top-level help and ``--version``, one sub-command group per module."""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from fedroute.cli.certificates import add_certificates
from fedroute.cli.deploy import add_deploy
from fedroute.cli.flower import add_flower
from fedroute.cli.help import HelpFormatter
from fedroute.cli.monitor import add_monitor
from fedroute.cli.reproduce import add_reproduce
from fedroute.cli.simulate import add_simulate

__all__ = ["DESCRIPTION", "build_parser", "main", "version_text"]

DESCRIPTION = """\
fedroute: clustered federated learning on Flower that recovers from cluster collapse
(The Dynamics of Collapse and Recovery in Clustered Federated Learning).

  fedroute flower        run the Flower app (flwr run .) hermetically in a local Ray simulation
  fedroute deploy local  run it on a real SuperLink and SuperNodes on 127.0.0.1
  fedroute simulate      run one linear-task configuration in the batched simulator
  fedroute reproduce     run a paper experiment (tables, figures, claims)
  fedroute monitor       watch a run's routing (masses, starving clusters, arm mix, alarms) live
  fedroute certificates  make the TLS certificates and SuperNode keys of a deployment

Plain Flower works too: flwr run . (docs/quickstart.md)."""


def version_text() -> str:
    """``fedroute --version``: fedroute's version, and Flower's and Python's."""
    import importlib.metadata
    import platform

    import fedroute

    try:
        flower = importlib.metadata.version("flwr")
    except importlib.metadata.PackageNotFoundError:
        flower = "not installed"
    return f"fedroute {fedroute.__version__} (Flower {flower}, Python {platform.python_version()})"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fedroute``."""
    parser = argparse.ArgumentParser(prog="fedroute", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=version_text(),
                        help="print fedroute's version (and Flower's and Python's) and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (add_flower, add_deploy, add_certificates, add_simulate, add_monitor, add_reproduce):
        add(commands)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``fedroute`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)
