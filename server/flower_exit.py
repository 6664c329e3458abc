"""A Flower 1.42 exit-order fix: report the run's outcome before deleting its runtime environment.

With per-run dependency installation (Flower's default for ``flwr run .``),
the process that runs the ServerApp (``flwr-simulation``, ``flwr-serverapp``)
registers the deletion of the run's fresh environment as an exit handler
*after* the handler that pushes the run's outcome to the SuperLink.  Exit
handlers run last-registered first, and ``flwr_exit`` kills the process 5 s
after it starts them.  Deleting fedroute's environment (33,000 files, the CUDA
torch among them) took 7.7 s at load 14 on the reference machine: the process
died before the push, and the SuperLink marked the finished run
``finished:failed`` ("No heartbeat received from the task") a minute later,
although the ServerApp had written every result.  (Measured: 3 of 3 runs at
load 11–14; with the install disabled, 3 of 3 completed.)

:func:`report_before_cleanup` moves those deletions to the end of the queue,
so the outcome is pushed first, and makes each one start a detached process
that deletes the directory, so the deletion finishes after the 5 s (Flower's
own, cut at 5 s, left most of the 33,000 files under
``$FLWR_HOME/runtime-envs/<run-id>``).  It touches nothing else and does
nothing where Flower registered no such handler (install disabled, other
versions).
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["report_before_cleanup", "delete_detached", "RUNTIME_CLEANUP"]

RUNTIME_CLEANUP = ("flwr.supercore.superexec.dependency_installer", "_register_runtime_env_cleanup.<locals>._clean")
"""(module, qualified name) of Flower 1.42's runtime-environment deletion handler."""

logger = logging.getLogger("fedroute")


def _is_cleanup(registered: Any) -> bool:
    handler = getattr(registered, "exit_handler", None)
    return (getattr(handler, "__module__", None), getattr(handler, "__qualname__", None)) == RUNTIME_CLEANUP


def _runtime_env_dir(handler: Callable[[], None]) -> Optional[Path]:
    """The directory Flower's deletion handler closes over (``None`` if it holds no path)."""
    for cell in getattr(handler, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, Path):
            return value
    return None


def delete_detached(directory: Path) -> Callable[[], None]:
    """An exit handler that starts a process of its own session deleting ``directory`` and returns at once."""

    def delete() -> None:
        subprocess.Popen([sys.executable, "-c", "import shutil, sys; shutil.rmtree(sys.argv[1], ignore_errors=True)",
                          str(directory)], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    return delete


def _detached(registered: Any) -> Any:
    """Flower's registered deletion, made a detached one where its directory is known."""
    directory = _runtime_env_dir(registered.exit_handler)
    if directory is None or not dataclasses.is_dataclass(registered):
        return registered
    return dataclasses.replace(registered, exit_handler=delete_detached(directory))


def report_before_cleanup() -> int:
    """Run Flower's runtime-environment deletions after every other exit handler, each in a detached process;
    return how many were moved."""
    try:
        from flwr.supercore.exit import exit_handler as flower_exit
    except ImportError:  # another Flower: nothing to fix
        return 0
    handlers = getattr(flower_exit, "registered_exit_handlers", None)
    lock = getattr(flower_exit, "_lock_handlers", None)
    if not isinstance(handlers, list) or lock is None:
        return 0
    with lock:
        cleanups = [registered for registered in handlers if _is_cleanup(registered)]
        # Last registered runs first: the front of the list runs last.
        handlers[:] = [_detached(registered) for registered in cleanups] + \
            [registered for registered in handlers if not _is_cleanup(registered)]
    if cleanups:
        logger.debug("the run's outcome is pushed before its runtime environment is deleted")
    return len(cleanups)
