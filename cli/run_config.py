"""What the commands that run the app share: ``--run-config`` items, their checks, a failed run's report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

__all__ = ["DEFAULT_SUPERNODES", "run_config_items", "checked_overrides", "reachable_ray_address", "failure"]

DEFAULT_SUPERNODES = 80
"""``fedroute flower``'s SuperNodes when neither ``--supernodes`` nor run-config ``num-clients`` says."""


def run_config_items(items: list[str]) -> dict:
    """``KEY=VALUE`` items and run-config files (``conf/<experiment>.toml``) → run-config values, later items
    overriding earlier ones (``ValueError`` for an item that is neither)."""
    from fedroute.deployment.flwr_config import load_run_config_file, parse_config_value

    values = {}
    for item in items:
        if "=" not in item and item.endswith(".toml"):
            values.update(load_run_config_file(item))
            continue
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise ValueError(f"--run-config item {item!r} is not KEY=VALUE or a .toml file")
        values[key] = parse_config_value(value)
    return values


def checked_overrides(args: argparse.Namespace) -> Optional[dict]:
    """The run-config overrides of ``flower`` / ``deploy local``, checked before anything starts (None: invalid,
    reported)."""
    from fedroute.deployment.flwr_config import app_config_defaults, resolve_run_config

    try:
        overrides = run_config_items(args.run_config)
        keys = app_config_defaults(args.app_dir)
        # fedroute's app (or one with the same keys): one client per SuperNode, results where asked.
        if getattr(args, "supernodes", None) is None:  # fedroute flower: as many SuperNodes as clients
            explicit = overrides.get("num-clients")
            args.supernodes = explicit if isinstance(explicit, int) and not isinstance(explicit, bool) \
                and explicit > 0 else DEFAULT_SUPERNODES
        if "num-clients" in keys:
            overrides.setdefault("num-clients", args.supernodes)
        if "results-dir" in keys:
            overrides.setdefault("results-dir", str(Path(args.results_dir).resolve()))
        resolve_run_config(args.app_dir, overrides)
    except ValueError as error:
        print(f"fedroute: {error}", file=sys.stderr)
        return None
    return overrides


def failure(kind: str, result) -> int:
    """Say why a run failed (the ServerApp's own error line if it logged one) and return exit code 1."""
    reasons = [line.split("fedroute: ", 1)[1].strip() for line in result.stdout.splitlines()
               if line.startswith("ERROR fedroute: ")]
    why = reasons[-1] if reasons else "see the ServerApp's traceback above"
    print(f"fedroute: the {kind} run failed (Flower status {result.status!r}): {why}", file=sys.stderr)
    return 1


def reachable_ray_address(args: argparse.Namespace) -> bool:
    """``--ray-address`` absent, or a Ray head listens there (else the reason is printed)."""
    from fedroute.deployment.launcher import check_ray_address

    try:
        if args.ray_address is not None:
            check_ray_address(args.ray_address)
    except ValueError as error:
        print(f"fedroute: {error}", file=sys.stderr)
        return False
    return True
