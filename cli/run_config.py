"""What the commands that run the app share: ``--run-config`` items, their checks, a failed run's report."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import Optional

from fedroute.core.validation import invalid

__all__ = ["DEFAULT_SUPERNODES", "run_config_items", "checked_overrides", "reachable_ray_address", "failure"]

DEFAULT_SUPERNODES = 80
"""``fedroute flower``'s SuperNodes when neither ``--supernodes`` nor run-config ``num-clients`` says."""


_QUOTED_KEY = re.compile(r"""(?:^|\s)([^\s=]+)=["']""")
"""A key whose value is written in quotes (``name="x y"``): a string, as ``flwr run`` reads it."""


def _tokens(item: str) -> list[str]:
    """One ``--run-config`` argument split as a shell would (``"a=1 b=2"``: two items, ``name="x y"``: one)."""
    try:
        return shlex.split(item)
    except ValueError as error:  # "No closing quotation"
        raise invalid("--run-config item", item, "KEY=VALUE items separated by spaces, a quoted value closed by "
                      f"its quote ({str(error).lower()})", "e.g. --run-config 'task=linear name=\"x y\"'") from None


def run_config_items(items: list[str]) -> dict:
    """``KEY=VALUE`` items and run-config files (``conf/<experiment>.toml``) → run-config values, later items
    overriding earlier ones (``ValueError`` for an item that is neither).

    Each argument is split with :func:`shlex.split`, as ``flwr run --run-config`` reads its text:
    ``--run-config a=1 b=2``, ``--run-config "a=1 b=2"`` and ``--run-config 'name="x y"'`` all work; a quoted
    value stays a string (``seed="5"``: ``"5"``), an unquoted one becomes an int, float or bool if it reads as one.
    """
    from fedroute.deployment.flwr_config import load_run_config_file, parse_config_value

    values = {}
    for argument in items:
        quoted = set(_QUOTED_KEY.findall(argument))
        for item in _tokens(argument):
            if "=" not in item and item.endswith(".toml"):
                values.update(load_run_config_file(item))
                continue
            key, separator, value = item.partition("=")
            if not separator or not key:
                raise ValueError(f"--run-config item {item!r} is not KEY=VALUE or a .toml file")
            values[key] = value if key in quoted else parse_config_value(value)
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
