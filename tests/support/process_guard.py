"""The ``process`` marker kept honest: a test that starts Flower or Ray processes must carry it.

``pytest -m "not process"`` is the fast loop (docs/testing.md); it stays fast only if
every test that starts real Flower processes is marked.  :class:`ProcessGuard` is a
``sys.audit`` hook on ``subprocess.Popen``: while a test without the marker runs
(its setup, module fixtures included, call and teardown), starting one of
:data:`FLOWER_EXECUTABLES` is refused and recorded, and the test fails naming the
command.  Other subprocesses (``python -c`` probes, ``bash`` scripts, builds) are allowed.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, Optional

MARKER = "process"

FLOWER_EXECUTABLES = frozenset({
    "flwr", "flower-superlink", "flower-supernode", "flower-superexec", "flwr-simulation", "flwr-serverapp",
    "flwr-clientapp", "ray",
})
"""Executables (by file name) that start a Flower runtime or a Ray cluster."""


class UnmarkedProcessError(RuntimeError):
    """A test without the ``process`` marker started a Flower or Ray process."""


def program_name(args: Any) -> str:
    """The file name of the program a ``Popen`` call runs (``args`` as ``Popen`` takes it)."""
    if isinstance(args, (str, bytes, os.PathLike)):
        words = os.fsdecode(args).split()
        first = words[0] if words else ""
    elif isinstance(args, Sequence) and args:
        first = os.fsdecode(args[0])
    else:
        return ""
    return os.path.basename(first)


class ProcessGuard:
    """Refuses Flower/Ray executables while :attr:`test` (a node id) is set and does not allow them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.test: Optional[str] = None
        self.allowed = True
        self.refused: list[str] = []

    def install(self) -> None:
        """Add the audit hook (for the life of the process; it does nothing while no test runs)."""
        sys.addaudithook(self._audit)

    def enter(self, nodeid: str, allowed: bool) -> None:
        with self._lock:
            self.test, self.allowed, self.refused = nodeid, allowed, []

    def leave(self) -> list[str]:
        """End the test; return the commands it was refused."""
        with self._lock:
            refused, self.test, self.allowed, self.refused = self.refused, None, True, []
        return refused

    def _audit(self, event: str, arguments: tuple[Any, ...]) -> None:
        if event != "subprocess.Popen" or self.allowed:
            return
        executable, args = arguments[0], arguments[1]
        name = program_name(args) or (program_name([executable]) if executable else "")
        if name not in FLOWER_EXECUTABLES:
            return
        with self._lock:
            self.refused.append(name)
            test = self.test
        raise UnmarkedProcessError(
            f"{test} starts `{name}` but is not marked `{MARKER}`: add `@pytest.mark.{MARKER}` "
            f"(or `pytestmark = pytest.mark.{MARKER}`); see docs/testing.md")
