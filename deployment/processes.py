"""The processes of a hermetic Flower run: its environment, ports, logs, and stopping all of them.

Every process a run starts (SuperLink, SuperNodes, SuperExecs, ServerApp and ClientApp processes, Ray
workers) inherits the run's own ``FLWR_HOME``; :func:`stop_processes` finds them by it in ``/proc``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from fedroute.deployment.control_api import ControlAddress

__all__ = ["QUIET_ENVIRONMENT", "flwr_executable", "free_port", "quiet_environment", "stop_processes",
           "run_status", "descendants", "carries_home", "wait_port", "stamp", "copy_stamped", "tail"]

QUIET_ENVIRONMENT = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_LOG_LEVEL": "WARNING",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
}


def flwr_executable(environment_bin: Optional[Path] = None) -> str:
    """The ``flwr`` of ``environment_bin`` (default: this interpreter's ``bin/``), else the one on ``PATH``."""
    candidate = (environment_bin or Path(sys.executable).parent) / "flwr"
    return str(candidate) if candidate.exists() else (shutil.which("flwr") or "flwr")


LISTEN_PORTS = (10000, 32768)
"""Where :func:`free_port` looks: below Linux's default ephemeral range (32768–60999)."""

_HANDED_OUT: set[int] = set()
_HANDING_OUT = threading.Lock()


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now, for a process that will listen on it a few seconds later.

    Not one of the kernel's ephemeral ports (``bind(("127.0.0.1", 0))`` hands those out): any outgoing
    connection may take an ephemeral port as its local port before the process meant to listen on it
    binds it — seen as a SuperNode's "address already in use" while the other SuperNodes were connecting.
    The port is drawn at random from :data:`LISTEN_PORTS` minus the machine's ephemeral range
    (``/proc/sys/net/ipv4/ip_local_port_range``), never twice in one process (also when threads ask at the
    same time: a test runs a simulation and a deployment at once), and must bind now.  Where that leaves no
    room, the kernel's choice.
    """
    with _HANDING_OUT:
        return _draw_port()


def _draw_port() -> int:
    """:func:`free_port`'s draw (the caller holds ``_HANDING_OUT``)."""
    low, high = LISTEN_PORTS
    ephemeral = _ephemeral_range()
    candidates = [port for port in range(low, high)
                  if port not in _HANDED_OUT and not (ephemeral[0] <= port <= ephemeral[1])]
    draw = random.SystemRandom()
    for _ in range(200):
        if not candidates:
            break
        port = candidates.pop(draw.randrange(len(candidates)))
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux; ``(32768, 60999)`` where it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def quiet_environment(flwr_home: Path, ray_address: Optional[str] = None,
                      environment_bin: Optional[Path] = None) -> dict[str, str]:
    """The environment of a hermetic run: own FLWR_HOME and ports, quiet and offline.

    ``environment_bin``: the ``bin/`` of another Python environment whose Flower executables run the
    processes (first on ``PATH``, no inherited ``PYTHONPATH``); this interpreter's by default.

    Without ``ray_address`` the simulation starts a private local Ray (its own
    ``RAY_TMPDIR``; an inherited ``RAY_ADDRESS`` is dropped).  With it, Flower's
    Ray backend joins that existing cluster: it calls ``ray.init()`` only while
    Ray is not initialised, and ``ray.init()`` reads ``RAY_ADDRESS``.
    """
    environment = dict(os.environ)
    environment.update(QUIET_ENVIRONMENT)
    environment["FLWR_HOME"] = str(flwr_home)
    # flwr starts `flower-superlink` by name: make this interpreter's scripts findable.
    environment["PATH"] = os.pathsep.join([str(environment_bin or Path(sys.executable).parent),
                                           environment.get("PATH", "")])
    if environment_bin is not None:
        environment.pop("PYTHONPATH", None)
        environment["VIRTUAL_ENV"] = str(Path(environment_bin).parent)
    environment["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(free_port())
    environment["FLWR_LOCAL_CONTROL_API_PORT"] = str(free_port())
    if ray_address:
        environment["RAY_ADDRESS"] = ray_address
        return environment
    # Ray would otherwise join /tmp/ray's current cluster (another run's); keep the path short
    # (Ray's unix sockets have a length limit).
    environment.pop("RAY_ADDRESS", None)
    environment["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="fr-ray-")
    return environment


def carries_home(pid: int, flwr_home: Path) -> bool:
    """Whether process ``pid``'s environment holds this FLWR_HOME."""
    try:
        return f"FLWR_HOME={flwr_home}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _processes_with_home(flwr_home: Path) -> list[int]:
    """PIDs of every process (but this one) whose environment holds this FLWR_HOME."""
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and int(entry.name) != os.getpid() and carries_home(int(entry.name), flwr_home)]


def stop_processes(flwr_home: Path, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds, every process of this FLWR_HOME."""
    pids = _processes_with_home(flwr_home)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _processes_with_home(flwr_home):
        time.sleep(0.2)
    for pid in _processes_with_home(flwr_home):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run_status(flwr: str, run_id: int, environment: dict[str, str],
               control: Optional["ControlAddress"] = None) -> str:
    """``finished:completed`` etc., as ``flwr ls --run-id X --format json`` gives it (``unknown`` if there is none).

    With ``control`` (the SuperLink's Control API) the query runs in this process
    (:mod:`fedroute.deployment.control_api`), else through the ``flwr`` command.
    """
    def listed() -> str:
        listing = subprocess.run([flwr, "ls", "--run-id", str(run_id), "--format", "json"], env=environment,
                                 capture_output=True, text=True, timeout=60)
        try:
            runs = json.loads(listing.stdout).get("runs", [])
            return str(runs[0].get("status", "unknown")) if runs else "unknown"
        except (json.JSONDecodeError, AttributeError):
            return "unknown"

    if control is None:
        return listed()
    from fedroute.deployment.control_api import ask_control, run_statuses

    return ask_control(control, lambda client: run_statuses(client, run_id).get(run_id, "unknown"), listed)


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (children first)."""
    found, queue = [], [pid]
    while queue:
        children = _children(queue.pop())
        found.extend(children)
        queue.extend(children)
    return found


def wait_port(port: int, timeout: float, process: subprocess.Popen, name: str, log: Path) -> None:
    """Wait until 127.0.0.1:port accepts connections (or the process died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with code {process.returncode}; log {log}:\n{tail(log)}")
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within {timeout} s; log {log}:\n{tail(log)}")


def stamp() -> str:
    """The wall-clock time now, ``HH:MM:SS.mmm``."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"


def copy_stamped(source: IO[str], log: IO[str]) -> None:
    """Copy a process's output to its log, each line prefixed with the time it arrived."""
    with log:
        for line in source:
            log.write(f"{stamp()} {line}")
        source.close()


def tail(path: Path, characters: int = 3000) -> str:
    """The last ``characters`` of a log file (empty if it cannot be read)."""
    try:
        return path.read_text(errors="replace")[-characters:]
    except OSError:
        return ""
