"""Run the Flower app with ``flwr run`` in a local Ray simulation, hermetically.

``flwr run`` starts a detached local SuperLink that outlives the command and
keeps the environment it started with (docs/deployment.md).  :func:`run_flower_app`
gives each run its own ``FLWR_HOME`` and ports, disables per-run dependency
installation and telemetry, checks the run's final status as ``flwr ls`` lists it
(``flwr run --stream`` exits 0 even when the ServerApp crashed; queried from this process through the
local SuperLink's Control API, :mod:`~fedroute.deployment.control_api`), and always
stops every process that carries its ``FLWR_HOME`` (SuperLink, simulation,
Ray workers) afterwards.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from fedroute.deployment.control_api import ControlAddress
from fedroute.deployment.flwr_config import format_run_config, load_run_config_file, resolve_run_config
from fedroute.deployment.processes import flwr_executable, quiet_environment, run_status, stop_processes

__all__ = ["FlowerRun", "run_flower_app", "flwr_run_command", "check_ray_address", "echo_line", "relay_line"]

# Lines of `flwr run` that carry no information for a fedroute user (each hermetic run makes a fresh
# FLWR_HOME and installs the app into it; Flower 1.42 warns about its default federation size even when
# `num-supernodes` is given).
_NOISE = (
    re.compile(r"Flower configuration not found\. Created default configuration"),
    re.compile(r"^Successfully installed \S+ to "),
    re.compile(r"Since flwr 1\.32, default simulated SuperNodes changed"),
)


@dataclass(frozen=True)
class FlowerRun:
    """Outcome of one ``flwr run``."""

    returncode: int
    stdout: str
    stderr: str
    run_id: Optional[int]
    status: str
    wall_seconds: float

    @property
    def completed(self) -> bool:
        """The ServerApp ran to the end (``finished:completed``)."""
        return self.status == "finished:completed"


def echo_line(line: str) -> bool:
    """Whether a line of ``flwr run --stream`` output is worth showing (see ``_NOISE``)."""
    return not any(pattern.search(line) for pattern in _NOISE)


def relay_line(line: str, stream: bool) -> None:
    """With ``stream``, show a line of ``flwr run --stream`` output on this process's stdout (unless noise)."""
    if stream and echo_line(line):
        sys.stdout.write(line)
        sys.stdout.flush()


def check_ray_address(address: str, timeout: float = 10.0) -> str:
    """``address`` (``HOST:PORT`` of a Ray head, as ``ray start --head`` prints it) once something listens there.

    Raises
    ------
    ValueError
        Naming ``--ray-address``: for another form, a port outside 1–65535, or
        nothing accepting connections at that address within ``timeout`` seconds
        (checked before a run starts, rather than failing inside the simulation).
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--ray-address {address!r} is invalid; allowed: HOST:PORT of a running Ray head "
                         "(as `ray start --head` prints it; port 1–65535)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise ValueError(f"--ray-address {address!r}: no Ray head accepts connections there ({error}); start one "
                         "with `ray start --head --port PORT` or give its address") from None
    return address


def flwr_run_command(flwr: str, app_dir: str | Path, run_config: Mapping[str, Any], num_supernodes: Optional[int],
                     cpus_per_client: float = 1.0, run_config_file: Optional[Path] = None,
                     gpus_per_client: float = 0.0) -> list[str]:
    """``flwr run APP --stream`` with the federation size (none: Flower's default federation), Ray's resources
    per client (``gpus_per_client > 0``: ``client-resources-num-gpus``) and the run config (a file, or key=value
    overrides)."""
    command = [flwr, "run", str(app_dir), "--stream"]
    if num_supernodes is not None:
        resources = f"num-supernodes={num_supernodes} client-resources-num-cpus={cpus_per_client:g}"
        if gpus_per_client > 0:
            resources += f" client-resources-num-gpus={gpus_per_client:g}"
        command += ["--federation-config", resources]
    if run_config_file is not None:
        command += ["--run-config", str(run_config_file)]
    elif run_config:
        command += ["--run-config", format_run_config(run_config)]
    return command


def _follow(process: subprocess.Popen, lines: list[str], started: float, timeout: float, stream: bool) -> None:
    """Collect (and with ``stream`` echo) ``flwr run``'s output until it ends, or kill it ``timeout`` s after
    ``started``."""
    assert process.stdout is not None
    deadline = started + timeout
    for line in process.stdout:
        lines.append(line)
        relay_line(line, stream)
        if time.monotonic() > deadline:
            process.kill()
            lines.append(f"fedroute: run stopped after {timeout} s\n")
            break
    process.wait(timeout=30)


def _checked_run_config_file(app_dir: str | Path, run_config: Mapping[str, Any],
                             run_config_file: Optional[str | Path]) -> Optional[Path]:
    """The run-config file as an absolute path (or ``None``), once the run config is valid (``ValueError``)."""
    if run_config_file is not None and run_config:
        raise ValueError("flwr run takes a run-config file or key=value overrides, not both; merge them "
                         "(`fedroute flower --run-config FILE KEY=VALUE` does)")
    file = Path(run_config_file).resolve() if run_config_file is not None else None
    resolve_run_config(app_dir, load_run_config_file(file) if file is not None else run_config)
    return file


def _watched_run(command: list[str], environment: dict[str, str], started: float, timeout: float,
                 stream: bool) -> tuple[int, str, Optional[int], str]:
    """Run ``flwr run`` to its end (or ``timeout``); its exit code, output, run id and final status."""
    process, lines = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, bufsize=1), []
    run_id: Optional[int] = None
    status = "unknown"
    try:
        _follow(process, lines, started, timeout, stream)
        match = re.search(r"Successfully started run (\d+)", "".join(lines))
        if match:
            run_id = int(match.group(1))
            status = run_status(command[0], run_id, environment, local_superlink(environment))
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, "".join(lines), run_id, status


def local_superlink(environment: dict[str, str]) -> ControlAddress:
    """The Control API of the local SuperLink ``flwr run`` starts in ``environment`` (plain HTTP on 127.0.0.1,
    the port :func:`~fedroute.deployment.processes.quiet_environment` chose)."""
    return ControlAddress(f"127.0.0.1:{environment['FLWR_LOCAL_SUPERLINK_HTTP_API_PORT']}")


def _clean_up(home: Path, environment: dict[str, str], remove_home: bool) -> None:
    """Stop every process of the run's FLWR_HOME; remove its private Ray directory (and the home)."""
    stop_processes(home)
    if "RAY_TMPDIR" in environment:
        shutil.rmtree(environment["RAY_TMPDIR"], ignore_errors=True)
    if remove_home:
        shutil.rmtree(home, ignore_errors=True)


def run_flower_app(app_dir: str | Path, run_config: Mapping[str, Any], num_supernodes: Optional[int],
                   timeout: float = 1800.0, flwr_home: Optional[Path] = None, stream: bool = False,
                   cpus_per_client: float = 1.0, ray_address: Optional[str] = None,
                   run_config_file: Optional[str | Path] = None, environment_bin: Optional[str | Path] = None,
                   gpus_per_client: float = 0.0) -> FlowerRun:
    """``flwr run <app_dir> --stream`` in a local Ray simulation, then clean up.

    Parameters
    ----------
    app_dir, run_config
        The Flower app (a directory with ``pyproject.toml``) and run-config overrides (keys of its
        ``[tool.flwr.app.config]``), or ``run_config_file`` (``conf/<experiment>.toml``; ``run_config`` empty).
    num_supernodes : int or None
        Simulated SuperNodes (one client each); ``None``: Flower's default federation (2).
    timeout, stream
        Seconds before the run is stopped; echo the run's output while it runs.
    flwr_home : Path, optional
        Flower's home for this run; a fresh temporary directory (removed afterwards) by default.
    cpus_per_client, gpus_per_client : float
        Ray's resources per simulated client (``gpus_per_client = 0.25``: four clients share a GPU; needs
        ``num_supernodes``).
    ray_address : str, optional
        Run on this existing Ray cluster (``host:port`` of its head; every node needs the same Python
        environment) instead of a private local Ray.
    environment_bin : path, optional
        Run ``flwr`` and what it starts from this Python environment's ``bin/`` (:func:`quiet_environment`).

    Raises
    ------
    ValueError
        If the run config is invalid (:func:`resolve_run_config`): nothing is started.
    """
    file = _checked_run_config_file(app_dir, run_config, run_config_file)
    home = Path(flwr_home) if flwr_home else Path(tempfile.mkdtemp(prefix="fedroute-flwr-home-"))
    home.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(environment_bin).resolve() if environment_bin is not None else None
    environment = quiet_environment(home, ray_address, bin_dir)
    command = flwr_run_command(flwr_executable(bin_dir), app_dir, run_config, num_supernodes, cpus_per_client,
                               file, gpus_per_client)
    started = time.monotonic()
    try:
        returncode, output, run_id, status = _watched_run(command, environment, started, timeout, stream)
    finally:
        _clean_up(home, environment, remove_home=flwr_home is None)
    return FlowerRun(returncode=returncode, stdout=output, stderr="", run_id=run_id, status=status,
                     wall_seconds=time.monotonic() - started)
