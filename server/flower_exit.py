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
load 11–14; the same run with the install disabled completed.)

:func:`report_before_cleanup` takes those deletions out of the exit queue, so
the outcome is pushed at once, and hands each directory to a detached process
that deletes it once this process has exited (Flower's own deletion, cut at
5 s, also left most of the 33,000 files under
``$FLWR_HOME/runtime-envs/<run-id>``).  It touches nothing else and does
nothing where Flower registered no such handler (install disabled, other
versions); a handler whose directory it cannot find is kept, moved to run last.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["report_before_cleanup", "delete_after_exit", "RUNTIME_CLEANUP"]

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


_DELETE_AFTER_EXIT = """
import os, shutil, sys, time
directory, pid = sys.argv[1], int(sys.argv[2])

def alive():
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rpartition(")")[2].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False

while alive():
    time.sleep(0.5)
shutil.rmtree(directory, ignore_errors=True)
"""


def delete_after_exit(directory: Path, pid: int) -> subprocess.Popen:
    """Start a process of its own session that deletes ``directory`` once process ``pid`` has exited."""
    return subprocess.Popen([sys.executable, "-c", _DELETE_AFTER_EXIT, str(directory), str(pid)],
                            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def report_before_cleanup() -> int:
    """Take Flower's runtime-environment deletions out of the exit queue, deleting each directory after this
    process exits (:func:`delete_after_exit`); return how many there were."""
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
        directories = [_runtime_env_dir(registered.exit_handler) for registered in cleanups]
        kept = [registered for registered, directory in zip(cleanups, directories) if directory is None]
        # Last registered runs first: a deletion kept goes to the front of the list, to run last.
        handlers[:] = kept + [registered for registered in handlers if not _is_cleanup(registered)]
    for directory in directories:
        if directory is not None:
            delete_after_exit(directory, os.getpid())
    if cleanups:
        logger.debug("the run's outcome is pushed before its runtime environment is deleted")
    return len(cleanups)
