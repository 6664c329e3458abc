"""Native deployment on loopback: a real SuperLink and N SuperNodes on 127.0.0.1.

:class:`LocalFederation` starts ``flower-superlink`` and ``flower-supernode``
processes (each SuperNode with ``--node-config "partition-id=i
num-partitions=N [state-dir=...]"`` and its own Runtime API port), writes the
SuperLink connection into ``$FLWR_HOME/config.toml``, runs the app with
``flwr run <app> <connection> --stream`` and checks the run's status as
``flwr ls`` lists it.  Every process it started (and everything they started: SuperExec,
ServerApp and ClientApp processes, which all carry this federation's
``FLWR_HOME``) is stopped on exit, also after an error.  Its runs and listings
through ``flwr`` are :mod:`fedroute.deployment.control`'s, taking its nodes and
server away :mod:`fedroute.deployment.faults`'s.

Deployment is slow per round (docs/deployment.md, "Native deployment"): every
message starts a fresh ClientApp process, and the SuperNode and the ServerApp's
grid poll every 3 s (hard-coded in Flower 1.42).  The only polling interval
settable from outside is the SuperExec's (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``,
1 s by default; ``superexec_poll_interval``); lowering it gave no measurable
gain and costs idle CPU, so Flower's default is kept.

Example::

    from fedroute.core.methods import EXP3

    with LocalFederation(".", num_supernodes=3, state_dir="state") as federation:
        result = federation.run({"method": EXP3, "num-clients": 3, "num-server-rounds": 5,
                                 "results-dir": "/abs/results"}, timeout=900)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

from fedroute.deployment.certificates import CertificateFiles, make_certificates
from fedroute.deployment.control import CONNECTION, DeploymentRun, FederationControl
from fedroute.deployment.faults import FederationFaults
from fedroute.deployment.flwr_config import format_run_config
from fedroute.deployment.processes import (
    copy_stamped,
    flwr_executable,
    free_port,
    quiet_environment,
    stamp,
    stop_processes,
    wait_port,
)
from fedroute.core.validation import invalid

__all__ = ["LocalFederation", "DeploymentRun", "CONNECTION"]


class LocalFederation(FederationControl, FederationFaults):
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
            raise invalid("num_supernodes", num_supernodes, "an integer ≥ 1")
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
        self._flwr = flwr_executable(self.environment_bin)

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
        self.port = free_port()
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
        log.write(f"\n{stamp()} $ {' '.join(command)}\n")
        process = subprocess.Popen(command, env=self.environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=self.flwr_home, text=True, errors="replace")
        copier = threading.Thread(target=copy_stamped, args=(process.stdout, log), daemon=True,
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
        wait_port(self.port, self.startup_timeout, self._superlink, "flower-superlink", self.log_dir / "superlink.log")

    def _start_supernode(self, index: int) -> None:
        command = [self._script("flower-supernode"), "--superlink", f"127.0.0.1:{self.port}",
                   "--node-config", format_run_config(self.node_config(index)),
                   "--host", "127.0.0.1", "--port", str(free_port())]
        command += ["--root-certificates", str(self.certificates.ca)] if self.certificates else ["--insecure"]
        self._supernodes[index] = self._spawn(command, f"supernode-{index}")
