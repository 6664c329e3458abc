"""Taking a :class:`~fedroute.deployment.local.LocalFederation`'s nodes and server away, and bringing them back.

The fault tests (``tests/test_faults.py``) kill a SuperNode or the SuperLink the way a lost machine or
container goes away (the process and everything it started, at once) and restart it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

from fedroute.deployment.processes import carries_home, descendants

__all__ = ["FederationFaults"]


class FederationFaults:
    """Node loss and server loss of a running federation (mixed into ``LocalFederation``, whose state it uses)."""

    flwr_home: Path
    num_supernodes: int
    persistent_superlink: bool
    _superlink: Optional[subprocess.Popen]
    _supernodes: list[Optional[subprocess.Popen]]
    _killed: set[int]
    _start_superlink: Callable[[], None]
    _start_supernode: Callable[[int], None]
    _stop_run: Callable[[int], None]
    runs: Callable[[], dict[int, str]]
    wait_for_supernodes: Callable[..., None]

    # ------------------------------------------------------------ node loss
    def supernode_pid(self, index: int) -> Optional[int]:
        """PID of SuperNode ``index`` if it is running."""
        process = self._supernodes[index]
        return process.pid if process is not None and process.poll() is None else None

    def clientapp_pids(self, index: int) -> list[int]:
        """PIDs of the ClientApp processes SuperNode ``index`` is running now."""
        pid = self.supernode_pid(index)
        if pid is None:
            return []
        found = []
        for child in descendants(pid):
            try:
                if b"flwr-clientapp" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(child)
            except OSError:
                continue
        return found

    def kill_supernode(self, index: int, sig: int = signal.SIGTERM, include_children: bool = True,
                       grace: float = 30.0) -> int:
        """Send ``sig`` to SuperNode ``index`` (and, with ``include_children``, at the same time to its
        SuperExec and running ClientApp, as when the node's machine or container goes away); wait
        until all of them are gone (SIGKILL after ``grace`` s); return the SuperNode's exit code.

        With SIGTERM the SuperNode deregisters, so the SuperLink answers its
        pending message with an error at once; with SIGKILL the SuperLink only
        notices when the node's heartbeat expires.  Without ``include_children``
        a ClientApp that already holds its message may still finish it (and
        write its state file) although its reply can no longer be delivered.
        """
        process = self._supernodes[index]
        if process is None or process.poll() is not None:
            raise RuntimeError(f"SuperNode {index} is not running")
        self._killed.add(index)
        return self._kill_family(process, sig, include_children, grace)

    def _kill_family(self, process: subprocess.Popen, sig: int, include_children: bool, grace: float) -> int:
        """Signal ``process`` (and, with ``include_children``, its descendants at the same time); wait
        until all of them are gone, SIGKILL after ``grace`` s; return the process's exit code."""
        family = descendants(process.pid)
        process.send_signal(sig)
        for pid in family if include_children else ():
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        # Executors and app processes watch their parent and exit; make sure they are gone.
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(carries_home(pid, self.flwr_home) for pid in family):
            time.sleep(0.2)
        for pid in family:
            if carries_home(pid, self.flwr_home):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        return int(process.returncode)

    def restart_supernode(self, index: int, wait: bool = False) -> None:
        """Start SuperNode ``index`` again (same partition and state-dir; a new node ID)."""
        if self.supernode_pid(index) is not None:
            raise RuntimeError(f"SuperNode {index} is still running; kill it first")
        self._start_supernode(index)
        self._killed.discard(index)
        if wait:
            self.wait_for_supernodes(self._running_supernodes())

    def _running_supernodes(self) -> int:
        return sum(self.supernode_pid(i) is not None for i in range(self.num_supernodes))

    # ------------------------------------------------------------ server loss
    def superlink_pid(self) -> Optional[int]:
        """PID of the SuperLink if it is running."""
        process = self._superlink
        return process.pid if process is not None and process.poll() is None else None

    def kill_superlink(self, sig: int = signal.SIGKILL, grace: float = 30.0) -> int:
        """Send ``sig`` to the SuperLink and at the same time to everything it started (its SuperExec
        and the running ServerApp), as when the server's machine goes away; wait until all of them
        are gone (SIGKILL after ``grace`` s); return the SuperLink's exit code.

        The SuperNodes keep running: they retry the connection until
        :meth:`restart_superlink` brings the SuperLink back.
        """
        process = self._superlink
        if process is None or process.poll() is not None:
            raise RuntimeError("the SuperLink is not running")
        return self._kill_family(process, sig, True, grace)

    def restart_superlink(self, wait: bool = True, timeout: float = 300.0) -> list[int]:
        """Start the SuperLink again (same port, certificates and database); stop the runs the old
        one left unfinished (their ServerApp died with it); with ``wait``, wait until every running
        SuperNode is online again (they reconnect with back-off, up to ≈ 20 s apart).

        Returns
        -------
        list of int
            The run ids that were stopped.
        """
        if self.superlink_pid() is not None:
            raise RuntimeError("the SuperLink is still running; kill it first")
        if not self.persistent_superlink:
            raise RuntimeError("this federation's SuperLink keeps its state in memory (persistent_superlink=False): "
                               "a restarted one would not know its SuperNodes")
        self._start_superlink()
        stopped = []
        for run_id, status in self.runs().items():
            if not status.startswith("finished"):
                self._stop_run(run_id)
                stopped.append(run_id)
        if wait:
            self.wait_for_supernodes(self._running_supernodes(), timeout=timeout)
        return stopped
