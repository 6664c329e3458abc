"""``fedroute flower``: the Flower app (``flwr run``) in a local Ray simulation, hermetically."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Optional

from fedroute.cli.help import add_command
from fedroute.cli.run_config import DEFAULT_SUPERNODES, checked_overrides, failure, reachable_ray_address

__all__ = ["add_flower", "checked_num_gpus"]


def checked_num_gpus(value: float, gpu_count: Optional[Callable[[], int]] = None) -> Optional[str]:
    """Why ``--num-gpus value`` cannot work here (``None``: it can).

    Ray never starts a client that asks for a GPU share on a machine without one (the run would wait
    forever), so a share > 0 needs a GPU torch can see; ``gpu_count`` (default: torch's) counts them.
    """
    if not 0 <= value <= 64 or value != value:
        return f"--num-gpus {value:g} is invalid; allowed: a number in [0, 64] (GPUs per client, e.g. 0.25)"
    if value == 0:
        return None
    if gpu_count is None:
        def gpu_count() -> int:
            import torch

            return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpu_count() == 0:
        return (f"--num-gpus {value:g} asks Ray for a GPU share per client, but torch sees no GPU on this machine "
                "(Ray would never start the clients); leave --num-gpus at 0 (client-device auto runs on the CPU)")
    return None


def _flower(args: argparse.Namespace) -> int:
    from fedroute.deployment.launcher import run_flower_app

    if (overrides := checked_overrides(args)) is None or not reachable_ray_address(args):
        return 2
    if (problem := checked_num_gpus(args.num_gpus)) is not None:
        print(f"fedroute: {problem}", file=sys.stderr)
        return 2
    result = run_flower_app(args.app_dir, overrides, num_supernodes=args.supernodes, timeout=args.timeout, stream=True,
                            ray_address=args.ray_address, gpus_per_client=args.num_gpus)
    return 0 if result.completed else failure("Flower", result)


def add_flower(commands: Any) -> None:
    """``fedroute flower`` and its options."""
    flower = add_command(commands, "flower", "run the Flower app in a local Ray simulation (flwr run, hermetic)",
                         "Runs flwr run APP-DIR with its own FLWR_HOME and ports, no per-run dependency install, one "
                         "client per simulated SuperNode (num-clients defaults to --supernodes), and checks the run's "
                         "real status with flwr ls (flwr run itself exits 0 when the ServerApp fails); the local "
                         "SuperLink is stopped afterwards. Exit code 0 iff the run completed.\n\nExamples:\n"
                         "  fedroute flower --run-config method=exp3 num-server-rounds=50\n"
                         "  fedroute flower --supernodes 80 --run-config conf/linear.toml")
    flower.add_argument("--app-dir", default=".", help="the Flower app (a directory with pyproject.toml)")
    flower.add_argument("--supernodes", type=int, default=None,
                        help="simulated SuperNodes, one client each (default: run-config num-clients if given, "
                             f"else {DEFAULT_SUPERNODES})")
    flower.add_argument("--num-gpus", type=float, default=0.0, metavar="SHARE",
                        help="GPUs per simulated client (Ray's client-resources-num-gpus; 0.25 = four clients per "
                             "GPU; needs a GPU torch can see); with run-config client-device = auto or cuda the "
                             "clients then compute on it (docs/datasets.md#gpus)")
    flower.add_argument("--results-dir", default="results", help="where <run-id>/ is written")
    flower.add_argument("--timeout", type=float, default=1800.0, help="seconds before the run is stopped")
    flower.add_argument("--run-config", nargs="*", default=[], metavar="KEY=VALUE|FILE.toml",
                        help="run-config overrides (keys of [tool.flwr.app.config]) and run-config files such as "
                             "conf/linear.toml; later items override earlier ones")
    flower.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                        help="run the simulation on this existing Ray cluster (its head's address, as ray start "
                             "--head prints it) instead of a private local Ray (docs/performance.md)")
    flower.set_defaults(handler=_flower)
