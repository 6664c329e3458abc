"""``fedroute deploy local``: the Flower app on a real SuperLink and SuperNodes on 127.0.0.1."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fedroute.cli.help import add_command
from fedroute.cli.run_config import checked_overrides, failure

__all__ = ["add_deploy"]


def _deploy(args: argparse.Namespace) -> int:
    from fedroute.deployment.local import LocalFederation
    from fedroute.server.results import summary_table

    if (overrides := checked_overrides(args)) is None:
        return 2
    with LocalFederation(args.app_dir, args.supernodes, tls=args.tls, state_dir=args.state_dir) as federation:
        result = federation.run(overrides, timeout=args.timeout, stream=True)
    if not result.completed:
        return failure("deployed", result)
    if "results:" not in result.stdout and result.results_dir and (result.results_dir / "summary.json").is_file():
        print(summary_table(json.loads((result.results_dir / "summary.json").read_text())))  # stream lost it
    return 0


def add_deploy(commands: Any) -> None:
    """``fedroute deploy`` (``local``) and its options."""
    deploy = add_command(commands, "deploy", "run the Flower app on real SuperLink and SuperNode processes",
                         "docs/deployment.md has the commands for other machines and Docker Compose.")
    local = add_command(deploy.add_subparsers(dest="action", required=True, metavar="{local}"), "local",
                        "a SuperLink and N SuperNodes on 127.0.0.1",
                        "Starts flower-superlink and N flower-supernode processes (SuperNode i with node config "
                        "partition-id=i num-partitions=N), runs the app on them with flwr run, checks its status with "
                        "flwr ls and stops every process it started. Exit code 0 iff the run completed.")
    local.add_argument("--supernodes", type=int, required=True, help="SuperNodes to start, one client each")
    local.add_argument("--tls", action="store_true", help="TLS with a private CA made for this deployment")
    local.add_argument("--run-config", nargs="*", default=[], metavar="KEY=VALUE|FILE.toml",
                       help="run-config overrides and run-config files, as for fedroute flower")
    local.add_argument("--results-dir", default="results", help="where <run-id>/ is written")
    local.add_argument("--state-dir", default=None,
                       help="persistent client state: SuperNode i gets node config state-dir=STATE_DIR/supernode-i")
    local.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run is stopped")
    local.add_argument("--app-dir", default=".", help="the Flower app (a directory with pyproject.toml)")
    local.set_defaults(handler=_deploy)
