"""A :class:`~fedroute.deployment.local.LocalFederation` driven through the ``flwr`` CLI: runs and listings.

``flwr run <app> fedroute-local --stream`` runs the app on the federation; ``flwr stop`` ends a run.  A run's
real status (``flwr run --stream`` exits 0 even when the ServerApp failed) and the nodes online are what
``flwr ls`` and ``flwr supernode list`` list, queried from this process through the SuperLink's Control API
(:mod:`~fedroute.deployment.control_api`: milliseconds instead of a ``flwr`` process per look, which took
1.3 s on a quiet machine and up to 20 s on a loaded one while :meth:`~FederationControl.wait_for_supernodes`
polled); the ``flwr`` commands where Flower's client cannot be imported.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from fedroute.deployment.control_api import ControlAddress, ask_control, online_nodes, run_statuses
from fedroute.deployment.flwr_config import app_config_defaults, format_run_config, resolve_run_config
from fedroute.deployment.launcher import FlowerRun, relay_line
from fedroute.deployment.processes import run_status, tail

if TYPE_CHECKING:
    from fedroute.deployment.certificates import CertificateFiles

__all__ = ["CONNECTION", "DeploymentRun", "FederationControl"]

CONNECTION = "fedroute-local"
"""Name of the SuperLink connection written to ``$FLWR_HOME/config.toml``."""


@dataclass(frozen=True)
class DeploymentRun(FlowerRun):
    """Outcome of one ``flwr run`` against a :class:`~fedroute.deployment.local.LocalFederation`."""

    results_dir: Optional[Path] = None
    """``<results-dir>/<run-id>/`` if the run wrote it (``results-dir`` given as an absolute path)."""


def _follow_with_watchdog(process: subprocess.Popen, timeout: float,
                          stream: bool) -> tuple[list[str], Optional[int], bool]:
    """``flwr run``'s output lines until it ends or ``timeout`` s have passed (then it is killed), the run id
    it started, and whether the timeout expired."""
    lines: list[str] = []
    run_id: Optional[int] = None
    # A stalled run may print nothing for minutes: a timer, not the output loop, enforces the timeout.
    expired = threading.Event()
    watchdog = threading.Timer(timeout, lambda: (expired.set(), process.kill()))
    watchdog.daemon = True
    watchdog.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            relay_line(line, stream)
            if run_id is None and "Successfully started run" in line:
                run_id = int(line.rsplit("run", 1)[1].split()[0])
        process.wait(timeout=30)
    finally:
        watchdog.cancel()
    if expired.is_set():
        lines.append(f"fedroute: run stopped after {timeout} s\n")
    return lines, run_id, expired.is_set()


class FederationControl:
    """Runs and listings of a started federation (mixed into ``LocalFederation``, whose state it uses)."""

    app_dir: Path
    num_supernodes: int
    flwr_home: Path
    log_dir: Path
    startup_timeout: float
    environment: dict[str, str]
    _flwr: str
    port: Optional[int]
    certificates: Optional["CertificateFiles"]
    _superlink: Optional[subprocess.Popen]
    _supernodes: list[Optional[subprocess.Popen]]
    _killed: set[int]

    def _flwr_command(self, *arguments: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run([self._flwr, *arguments], env=self.environment, capture_output=True, text=True,
                              timeout=timeout, cwd=self.flwr_home)

    @property
    def control_address(self) -> ControlAddress:
        """The SuperLink's Control API (its port; the CA certificate with TLS)."""
        return ControlAddress(f"127.0.0.1:{self.port}", self.certificates.ca if self.certificates else None)

    def online_supernodes(self) -> int:
        """SuperNodes the SuperLink lists as online (as ``flwr supernode list`` lists them)."""
        return ask_control(self.control_address, online_nodes, self._online_supernodes_listed)

    def _online_supernodes_listed(self) -> int:
        """:meth:`online_supernodes` through ``flwr supernode list``."""
        listing = self._flwr_command("supernode", "list", CONNECTION, "--format", "json")
        try:
            nodes = json.loads(listing.stdout).get("nodes", [])
        except (json.JSONDecodeError, AttributeError):
            return 0
        return sum(1 for node in nodes if str(node.get("status", "")).lower() == "online")

    def wait_for_supernodes(self, count: int, timeout: Optional[float] = None) -> None:
        """Wait until ``count`` SuperNodes are online."""
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        while (online := self.online_supernodes()) < count:
            for index, process in enumerate(self._supernodes):
                if process is not None and index not in self._killed and process.poll() is not None:
                    log = self.log_dir / f"supernode-{index}.log"
                    raise RuntimeError(f"SuperNode {index} exited with code {process.returncode}:\n{tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {online} of {count} SuperNodes online after the start-up timeout")
            time.sleep(0.5)

    def runs(self) -> dict[int, str]:
        """Run id → status (as ``flwr ls`` lists them)."""
        return ask_control(self.control_address, run_statuses, self._runs_listed)

    def _runs_listed(self) -> dict[int, str]:
        """:meth:`runs` through ``flwr ls``."""
        listing = self._flwr_command("ls", CONNECTION, "--format", "json")
        try:
            return {int(run["run-id"]): str(run.get("status", "unknown"))
                    for run in json.loads(listing.stdout).get("runs", [])}
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
            return {}

    def _stop_run(self, run_id: int) -> None:
        self._flwr_command("stop", str(run_id), CONNECTION)

    def run(self, run_config: Mapping[str, Any], timeout: float = 1800.0, stream: bool = False) -> DeploymentRun:
        """``flwr run <app> fedroute-local --stream --run-config ...``; the status ``flwr ls`` lists.

        ``num-clients`` defaults to the number of SuperNodes (for an app that has that key).  A run still going
        after ``timeout`` seconds is stopped (``flwr stop``).  An invalid run
        config raises ``ValueError`` before ``flwr run`` starts
        (:func:`~fedroute.deployment.flwr_config.resolve_run_config`).
        """
        if self._superlink is None:
            raise RuntimeError("the federation is not started (use it as a context manager)")
        values = dict(run_config)
        if "num-clients" in app_config_defaults(self.app_dir):  # fedroute's app: one client per SuperNode
            values.setdefault("num-clients", self.num_supernodes)
        resolve_run_config(self.app_dir, values)
        command = [self._flwr, "run", str(self.app_dir), CONNECTION, "--stream"]
        if values:
            command += ["--run-config", format_run_config(values)]
        started = time.monotonic()
        process = subprocess.Popen(command, env=self.environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, bufsize=1, cwd=self.flwr_home)
        try:
            lines, run_id, expired = _follow_with_watchdog(process, timeout, stream)
            status = "unknown" if run_id is None else self._settled_status(run_id, expired)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
        results = values.get("results-dir")
        directory = Path(str(results)) / str(run_id) if results and run_id is not None else None
        return DeploymentRun(returncode=process.returncode, stdout="".join(lines), stderr="", run_id=run_id,
                             status=status, wall_seconds=time.monotonic() - started,
                             results_dir=directory if directory is not None and directory.is_dir() else None)

    def _settled_status(self, run_id: int, expired: bool) -> str:
        """The run's final status; a run not finished (timed out, or still going) is stopped first."""
        status = self._final_status(run_id, 0.0 if expired else 60.0)
        if not status.startswith("finished"):
            self._stop_run(run_id)
            status = run_status(self._flwr, run_id, self.environment, self.control_address)
        return status

    def _final_status(self, run_id: int, patience: float) -> str:
        """The run's status once it is finished (``flwr run --stream`` may end a little earlier)."""
        deadline = time.monotonic() + patience
        while True:
            status = run_status(self._flwr, run_id, self.environment, self.control_address)
            if status.startswith("finished") or time.monotonic() > deadline:
                return status
            time.sleep(1.0)
