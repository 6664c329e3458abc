"""A real deployment on loopback (``LocalFederation``): its configuration, waits, logs and stored state.

Deployment rounds are slow (≈ 9 s with 3 SuperNodes on 2 cores, 10–30 s on a
loaded machine: a fresh ClientApp process per message and Flower's 3 s polls),
so the tests use 3 SuperNodes and a few rounds.  The configuration (linear
task, EXP3, seed 0, block length 3) routes client 2 alone to cluster 1 in round
index 2 — the round in which the fault tests take client 2's SuperNode away.
"""

from __future__ import annotations

import glob
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from fedroute.simulation.simulator import simulate
from fedroute.strategies.checkpoint import load_checkpoint
from support.app_config import app_settings

NUM_NODES = 3
CONFIG = {"method": "exp3", "num-clients": NUM_NODES, "seed": 0, "block-length": 3}
VICTIM, KILL_ROUND_INDEX = 2, 2


def results_dir(result: Any, root: Path, logs: Path) -> Path:
    """The one run directory under ``root`` of a completed run (else fail, with the run's output and logs)."""
    assert result.completed, f"status {result.status!r}\n{result.stdout[-3000:]}\n{log_tails(logs)}"
    (directory,) = [path for path in root.iterdir() if path.is_dir()]
    return directory


def log_tails(logs: Path) -> str:
    """The last 1500 characters of every ``*.log`` file in ``logs``."""
    return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}" for path in sorted(logs.glob("*.log")))


def home_processes(home: Path) -> list[int]:
    """The ids of the running processes whose environment has ``FLWR_HOME=home``."""
    marker = f"FLWR_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def simulated_routes(rounds: int) -> np.ndarray:
    """The routes (round × client) of :data:`CONFIG` for ``rounds`` rounds, from the batched simulator."""
    settings = app_settings(CONFIG, **{"num-server-rounds": rounds})
    return simulate(settings.task, settings.routing["exp3"], rounds, settings.seed).routes


def wait_for(condition: Callable[[], bool], timeout: float, what: str, logs: Path) -> None:
    """Poll ``condition`` every 50 ms; fail naming ``what`` (with the logs' tails) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{log_tails(logs)}")
        time.sleep(0.05)


def state_rounds(state_dir: Path, client: int) -> dict[int, dict[str, np.ndarray]]:
    """Round index → stored controller state, from the client's state file (``{}`` if none yet)."""
    files = glob.glob(str(state_dir / f"supernode-{client}" / "*" / f"client-{client}.npz"))
    if not files:
        return {}
    try:
        with np.load(files[0]) as stored:
            states: dict[int, dict[str, np.ndarray]] = {}
            for name in stored.files:
                round_text, _, field = name.partition("/")
                states.setdefault(int(round_text), {})[field] = stored[name]
            return states
    except (OSError, ValueError, EOFError):  # replaced while being read
        return {}


def last_round(state_dir: Path, client: int) -> int:
    """The newest round index in the client's state file (-1 if none)."""
    return max(state_rounds(state_dir, client), default=-1)


def checkpoint_round(directory: Path, method: str = "exp3") -> Optional[int]:
    """The server round of ``method``'s checkpoint in ``directory`` (None if none, or while it is replaced)."""
    try:
        stored = load_checkpoint(directory / method)
    except Exception:  # being replaced at this moment
        return None
    return None if stored is None else int(stored[1]["server_round"])
