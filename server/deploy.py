"""Native deployment on loopback: a real SuperLink and N SuperNodes on 127.0.0.1.

:class:`LocalFederation` starts ``flower-superlink`` and ``flower-supernode``
processes (each SuperNode with ``--node-config "partition-id=i
num-partitions=N [state-dir=...]"`` and its own Runtime API port), writes the
SuperLink connection into ``$FLWR_HOME/config.toml``, runs the app with
``flwr run <app> <connection> --stream`` and checks the run's status with
``flwr ls``.  Every process it started (and everything they started: SuperExec,
ServerApp and ClientApp processes, which all carry this federation's
``FLWR_HOME``) is stopped on exit, also after an error.

Deployment is slow per round (docs/deployment.md, "Native deployment"): every
message starts a fresh ClientApp process, and the SuperNode and the ServerApp's
grid poll every 3 s (hard-coded in Flower 1.42).  The only polling interval
settable from outside is the SuperExec's (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``,
1 s by default; ``superexec_poll_interval``); lowering it gave no measurable
gain and costs idle CPU, so Flower's default is kept.

Example::

    with LocalFederation(".", num_supernodes=3, state_dir="state") as federation:
        result = federation.run({"method": "exp3", "num-clients": 3, "num-server-rounds": 5,
                                 "results-dir": "/abs/results"}, timeout=900)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping, Optional

from fedroute.server.certificates import CertificateFiles, make_certificates
from fedroute.server.launcher import (
    FlowerRun,
    _flwr_executable,
    _free_port,
    _run_status,
    app_config_defaults,
    echo_line,
    format_run_config,
    quiet_environment,
    resolve_run_config,
    stop_processes,
)

__all__ = ["LocalFederation", "DeploymentRun", "CONNECTION"]

CONNECTION = "fedroute-local"
"""Name of the SuperLink connection written to ``$FLWR_HOME/config.toml``."""


@dataclass(frozen=True)
class DeploymentRun(FlowerRun):
    """Outcome of one ``flwr run`` against a :class:`LocalFederation`."""

    results_dir: Optional[Path] = None
    """``<results-dir>/<run-id>/`` if the run wrote it (``results-dir`` given as an absolute path)."""


# ---------------------------------------------------------------- processes
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


def _descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (children first)."""
    found, queue = [], [pid]
    while queue:
        children = _children(queue.pop())
        found.extend(children)
        queue.extend(children)
    return found


def _carries_home(pid: int, flwr_home: Path) -> bool:
    try:
        return f"FLWR_HOME={flwr_home}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _wait_port(port: int, timeout: float, process: subprocess.Popen, name: str, log: Path) -> None:
    """Wait until 127.0.0.1:port accepts connections (or the process died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with code {process.returncode}; log {log}:\n{_tail(log)}")
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within {timeout} s; log {log}:\n{_tail(log)}")


def _stamp() -> str:
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"


def _copy_stamped(source: IO[str], log: IO[str]) -> None:
    """Copy a process's output to its log, each line prefixed with the time it arrived."""
    with log:
        for line in source:
            log.write(f"{_stamp()} {line}")
        source.close()


def _tail(path: Path, characters: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-characters:]
    except OSError:
        return ""


class LocalFederation:
    """A SuperLink and ``num_supernodes`` SuperNodes on 127.0.0.1, as a context manager.

    Parameters
    ----------
    app_dir : path
        The Flower app (a directory with ``pyproject.toml``).
    num_supernodes : int
        SuperNodes to start; SuperNode ``i`` gets ``partition-id=i num-partitions=N``.
    tls : bool
        Serve the SuperLink with TLS (a private CA made by :func:`make_certificates`);
        SuperNodes and ``flwr`` verify it with the CA certificate.
    state_dir : path, optional
        Persistent client state: SuperNode ``i`` gets ``state-dir=<state_dir>/supernode-<i>``
        in its node config, so a restarted SuperNode continues its controller state.

    The SuperLink keeps its state (registered nodes, runs) in
    ``<flwr_home>/superlink.db`` (``--database``), so that after
    :meth:`kill_superlink` and :meth:`restart_superlink` the SuperNodes, which
    keep running and retry, are recognised again (with Flower's in-memory
    state a restarted SuperLink answers them 401 and they exit).
    flwr_home : path, optional
        This federation's ``FLWR_HOME`` (a fresh temporary directory by default,
        removed on exit).
    certificates_dir : path, optional
        Where the TLS material is made (``<flwr_home>/certificates`` by default).
    log_dir : path, optional
        Where ``superlink.log`` and ``supernode-<i>.log`` go (``<flwr_home>/logs`` by
        default); each line starts with the wall-clock time it was written.
    log_level : str
        ``FLWR_LOG_LEVEL`` of every process.
    superexec_poll_interval : float, optional
        Seconds between the SuperExecs' task polls (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``,
        0.01–60); ``None`` keeps Flower's default (1 s).  0.1 saves ≤ 0.9 s per message
        before its ClientApp starts but costs ≈ 0.05 CPU cores per SuperNode while idle.
    startup_timeout : float
        Seconds to wait for the SuperLink and the SuperNodes to come up.
    persistent_superlink : bool, default True
        ``False``: the SuperLink keeps its state in memory (Flower's default; no
        :meth:`restart_superlink`).  Under heavy load with many SuperNodes the
        SQLite database can answer a SuperNode's push with "database is locked",
        and the lost reply stalls its round until the round timeout (seen with
        10 SuperNodes on 2 CPUs at load ≈ 20); the benchmark uses ``False``.
    environment_bin : path, optional
        The ``bin/`` directory of the Python environment whose ``flower-superlink``,
        ``flower-supernode``, ``flwr`` (and, first on ``PATH``, the executors they
        start) run the federation; this interpreter's by default.  A FAB test uses an
        environment where ``import fedroute`` fails (``tests/test_fab.py``).
    """

    def __init__(
        self,
        app_dir: str | Path,
        num_supernodes: int,
        tls: bool = False,
        state_dir: Optional[str | Path] = None,
        *,
        flwr_home: Optional[str | Path] = None,
        certificates_dir: Optional[str | Path] = None,
        log_dir: Optional[str | Path] = None,
        log_level: str = "INFO",
        superexec_poll_interval: Optional[float] = None,
        startup_timeout: float = 60.0,
        persistent_superlink: bool = True,
        environment_bin: Optional[str | Path] = None,
    ) -> None:
        if int(num_supernodes) != num_supernodes or num_supernodes < 1:
            raise ValueError(f"num_supernodes = {num_supernodes} is invalid; allowed: an integer ≥ 1")
        self.app_dir = Path(app_dir).resolve()
        self.num_supernodes = int(num_supernodes)
        self.tls = tls
        self.state_dir = Path(state_dir).resolve() if state_dir is not None else None
        self._own_home = flwr_home is None
        self.flwr_home = Path(flwr_home).resolve() if flwr_home else Path(tempfile.mkdtemp(prefix="fedroute-deploy-"))
        self.certificates_dir = Path(certificates_dir) if certificates_dir else self.flwr_home / "certificates"
        self.log_dir = Path(log_dir).resolve() if log_dir else self.flwr_home / "logs"
        self.log_level = log_level
        self.superexec_poll_interval = superexec_poll_interval
        self.persistent_superlink = persistent_superlink
        self.startup_timeout = startup_timeout
        self.port: Optional[int] = None
        self.certificates: Optional[CertificateFiles] = None
        self.environment: dict[str, str] = {}
        self._superlink: Optional[subprocess.Popen] = None
        self._supernodes: list[Optional[subprocess.Popen]] = [None] * self.num_supernodes
        self._killed: set[int] = set()
        self._copiers: list[threading.Thread] = []
        self.environment_bin = Path(environment_bin).resolve() if environment_bin is not None else None
        self._flwr = _flwr_executable(self.environment_bin)

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "LocalFederation":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Start the SuperLink, write the connection, start the SuperNodes."""
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.environment = quiet_environment(self.flwr_home, environment_bin=self.environment_bin)
        self.environment["FLWR_LOG_LEVEL"] = self.log_level
        if self.superexec_poll_interval is not None:
            self.environment["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = f"{self.superexec_poll_interval:g}"
        if self.tls:
            self.certificates = make_certificates(self.certificates_dir)
        self.port = _free_port()
        self._start_superlink()
        self._write_connection()
        for index in range(self.num_supernodes):
            self._start_supernode(index)
        self.wait_for_supernodes(self.num_supernodes)

    def stop(self) -> None:
        """Stop every process of this federation (SIGTERM, then SIGKILL), even after errors."""
        processes = [p for p in [self._superlink, *self._supernodes] if p is not None]
        try:
            stop_processes(self.flwr_home)
            for process in processes:
                if process.poll() is None:
                    process.kill()
                process.wait(timeout=10)
        finally:
            for copier in self._copiers:
                copier.join(timeout=5)  # ends at EOF: every writer of that pipe has exited
            self._copiers.clear()
            ray_tmp = self.environment.get("RAY_TMPDIR")
            if ray_tmp:
                shutil.rmtree(ray_tmp, ignore_errors=True)
            if self._own_home:
                shutil.rmtree(self.flwr_home, ignore_errors=True)

    # ------------------------------------------------------------ pieces
    def _script(self, name: str) -> str:
        candidate = (self.environment_bin or Path(sys.executable).parent) / name
        return str(candidate) if candidate.exists() else (shutil.which(name) or name)

    def _spawn(self, command: list[str], name: str) -> subprocess.Popen:
        """Start a process; its output goes to ``logs/<name>.log``, each line with a wall-clock time."""
        log = open(self.log_dir / f"{name}.log", "a", buffering=1)  # noqa: SIM115 (closed by its copier)
        log.write(f"\n{_stamp()} $ {' '.join(command)}\n")
        process = subprocess.Popen(command, env=self.environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=self.flwr_home, text=True, errors="replace")
        copier = threading.Thread(target=_copy_stamped, args=(process.stdout, log), daemon=True,
                                  name=f"fedroute-log-{name}")
        copier.start()
        self._copiers.append(copier)
        return process

    def _write_connection(self) -> None:
        """``[superlink.fedroute-local]`` in ``$FLWR_HOME/config.toml``, and make it the default."""
        lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]",
                 f'address = "127.0.0.1:{self.port}"']
        lines += [f'root-certificates = "{self.certificates.ca}"'] if self.certificates else ["insecure = true"]
        (self.flwr_home / "config.toml").write_text("\n".join(lines) + "\n")

    def node_config(self, index: int) -> dict[str, Any]:
        """SuperNode ``index``'s node config."""
        config: dict[str, Any] = {"partition-id": index, "num-partitions": self.num_supernodes}
        if self.state_dir is not None:
            config["state-dir"] = str(self.state_dir / f"supernode-{index}")
        return config

    @property
    def superlink_database(self) -> Path:
        """The SuperLink's state file (``--database``)."""
        return self.flwr_home / "superlink.db"

    def _start_superlink(self) -> None:
        command = [self._script("flower-superlink"), "--disable-runtime-dependency-installation",
                   "--host", "127.0.0.1", "--port", str(self.port)]
        if self.persistent_superlink:
            command += ["--database", str(self.superlink_database)]
        if self.certificates is not None:
            command += ["--ssl-certfile", str(self.certificates.cert), "--ssl-keyfile",
                        str(self.certificates.key), "--ssl-ca-certfile", str(self.certificates.ca)]
        else:
            command += ["--insecure"]
        self._superlink = self._spawn(command, "superlink")
        _wait_port(self.port, self.startup_timeout, self._superlink, "flower-superlink", self.log_dir / "superlink.log")

    def _start_supernode(self, index: int) -> None:
        command = [self._script("flower-supernode"), "--superlink", f"127.0.0.1:{self.port}",
                   "--node-config", format_run_config(self.node_config(index)),
                   "--host", "127.0.0.1", "--port", str(_free_port())]
        command += ["--root-certificates", str(self.certificates.ca)] if self.certificates else ["--insecure"]
        self._supernodes[index] = self._spawn(command, f"supernode-{index}")

    def _flwr_command(self, *arguments: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run([self._flwr, *arguments], env=self.environment, capture_output=True, text=True,
                              timeout=timeout, cwd=self.flwr_home)

    def online_supernodes(self) -> int:
        """SuperNodes the SuperLink lists as online (``flwr supernode list``)."""
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
                    raise RuntimeError(f"SuperNode {index} exited with code {process.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {online} of {count} SuperNodes online after the start-up timeout")
            time.sleep(0.5)

    # ------------------------------------------------------------ runs
    def run(self, run_config: Mapping[str, Any], timeout: float = 1800.0, stream: bool = False) -> DeploymentRun:
        """``flwr run <app> fedroute-local --stream --run-config ...``; status from ``flwr ls``.

        ``num-clients`` defaults to the number of SuperNodes (for an app that has that key).  A run still going
        after ``timeout`` seconds is stopped (``flwr stop``).  An invalid run
        config raises ``ValueError`` before ``flwr run`` starts
        (:func:`~fedroute.server.launcher.resolve_run_config`).
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
        lines: list[str] = []
        run_id: Optional[int] = None
        status = "unknown"
        process = subprocess.Popen(command, env=self.environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, bufsize=1, cwd=self.flwr_home)
        # A stalled run may print nothing for minutes: a timer, not the output loop, enforces the timeout.
        expired = threading.Event()
        watchdog = threading.Timer(timeout, lambda: (expired.set(), process.kill()))
        watchdog.daemon = True
        watchdog.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                if stream and echo_line(line):
                    sys.stdout.write(line)
                    sys.stdout.flush()
                if run_id is None and "Successfully started run" in line:
                    run_id = int(line.rsplit("run", 1)[1].split()[0])
            process.wait(timeout=30)
            if expired.is_set():
                lines.append(f"fedroute: run stopped after {timeout} s\n")
            if run_id is not None:
                status = self._final_status(run_id, 0.0 if expired.is_set() else 60.0)
                if not status.startswith("finished"):
                    self._flwr_command("stop", str(run_id), CONNECTION)
                    status = _run_status(self._flwr, run_id, self.environment)
        finally:
            watchdog.cancel()
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
        results = values.get("results-dir")
        directory = Path(str(results)) / str(run_id) if results and run_id is not None else None
        return DeploymentRun(returncode=process.returncode, stdout="".join(lines), stderr="", run_id=run_id,
                             status=status, wall_seconds=time.monotonic() - started,
                             results_dir=directory if directory is not None and directory.is_dir() else None)

    def _final_status(self, run_id: int, patience: float) -> str:
        """The run's status once it is finished (``flwr run --stream`` may end a little earlier)."""
        deadline = time.monotonic() + patience
        while True:
            status = _run_status(self._flwr, run_id, self.environment)
            if status.startswith("finished") or time.monotonic() > deadline:
                return status
            time.sleep(1.0)

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
        for child in _descendants(pid):
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
        family = _descendants(process.pid)
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
        while time.monotonic() < deadline and any(_carries_home(pid, self.flwr_home) for pid in family):
            time.sleep(0.2)
        for pid in family:
            if _carries_home(pid, self.flwr_home):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        return int(process.returncode)

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
                self._flwr_command("stop", str(run_id), CONNECTION)
                stopped.append(run_id)
        if wait:
            self.wait_for_supernodes(sum(self.supernode_pid(i) is not None for i in range(self.num_supernodes)),
                                     timeout=timeout)
        return stopped

    def runs(self) -> dict[int, str]:
        """Run id → status (``flwr ls``)."""
        listing = self._flwr_command("ls", CONNECTION, "--format", "json")
        try:
            return {int(run["run-id"]): str(run.get("status", "unknown"))
                    for run in json.loads(listing.stdout).get("runs", [])}
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
            return {}

    def restart_supernode(self, index: int, wait: bool = False) -> None:
        """Start SuperNode ``index`` again (same partition and state-dir; a new node ID)."""
        if self.supernode_pid(index) is not None:
            raise RuntimeError(f"SuperNode {index} is still running; kill it first")
        self._start_supernode(index)
        self._killed.discard(index)
        if wait:
            self.wait_for_supernodes(sum(self.supernode_pid(i) is not None for i in range(self.num_supernodes)))
