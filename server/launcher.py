"""Run the Flower app with ``flwr run`` in a local Ray simulation, hermetically.

``flwr run`` starts a detached local SuperLink that outlives the command and
keeps the environment it started with (docs/deployment.md).  :func:`run_flower_app`
gives each run its own ``FLWR_HOME`` and ports, disables per-run dependency
installation and telemetry, checks the run's final status with ``flwr ls``
(``flwr run --stream`` exits 0 even when the ServerApp crashed), and always
stops every process that carries its ``FLWR_HOME`` (SuperLink, simulation,
Ray workers) afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

__all__ = ["FlowerRun", "run_flower_app", "flwr_run_command", "load_run_config_file",
           "format_run_config", "parse_config_value", "quiet_environment",
           "resolve_run_config", "app_config_defaults", "check_ray_address", "echo_line", "FEDROUTE_SERVERAPP",
           "FEDROUTE_SERVERAPPS"]

FEDROUTE_SERVERAPP = "fedroute.server.app:app"
"""fedroute's ServerApp as an installed package's component (plugin apps, tests)."""
FEDROUTE_SERVERAPPS = (FEDROUTE_SERVERAPP, "fedroute_app:serverapp")
"""The ServerApp components whose run config :func:`resolve_run_config` validates in full (the second is
this repository's own, run from the app's files: ``fedroute_app.py``)."""

# Lines of `flwr run` that carry no information for a fedroute user (each hermetic run makes a fresh
# FLWR_HOME and installs the app into it; Flower 1.42 warns about its default federation size even when
# `num-supernodes` is given).
_NOISE = (
    re.compile(r"Flower configuration not found\. Created default configuration"),
    re.compile(r"^Successfully installed \S+ to "),
    re.compile(r"Since flwr 1\.32, default simulated SuperNodes changed"),
)

QUIET_ENVIRONMENT = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_LOG_LEVEL": "WARNING",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
}


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


def _flwr_executable(environment_bin: Optional[Path] = None) -> str:
    candidate = (environment_bin or Path(sys.executable).parent) / "flwr"
    return str(candidate) if candidate.exists() else (shutil.which("flwr") or "flwr")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def parse_config_value(text: str) -> Any:
    """A command-line run-config value: int, float, bool, else string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip('"').strip("'")


def format_run_config(values: Mapping[str, Any]) -> str:
    """``--run-config`` text: strings double-quoted, booleans ``true``/``false``."""
    parts = []
    for key, value in values.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = str(value)
            if "\n" in text or ('"' in text and "'" in text):
                raise ValueError(f"run-config '{key}' = {text!r}: a string may not hold a newline or both quote kinds")
            # flwr accepts "..." or '...' without escapes: single quotes keep backslashes literal.
            text = f'"{text}"' if "'" in text else f"'{text}'"
        parts.append(f"{key}={text}")
    return " ".join(parts)


def echo_line(line: str) -> bool:
    """Whether a line of ``flwr run --stream`` output is worth showing (see ``_NOISE``)."""
    return not any(pattern.search(line) for pattern in _NOISE)


def _flower_app_table(app_dir: str | Path) -> dict[str, Any]:
    """``[tool.flwr.app]`` of the app's ``pyproject.toml`` (``ValueError`` if there is none)."""
    import tomllib

    pyproject = Path(app_dir) / "pyproject.toml"
    if not pyproject.is_file():
        raise ValueError(f"{Path(app_dir).resolve()} is not a Flower app: it has no pyproject.toml")
    with open(pyproject, "rb") as stream:
        return dict(tomllib.load(stream).get("tool", {}).get("flwr", {}).get("app", {}))


def app_config_defaults(app_dir: str | Path) -> dict[str, Any]:
    """The app's run-config keys and defaults (``[tool.flwr.app.config]``, flattened as Flower does)."""
    from flwr.common.config import flatten_dict

    return dict(flatten_dict(_flower_app_table(app_dir).get("config", {})))


def resolve_run_config(app_dir: str | Path, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The run config the ServerApp will see, checked before anything starts.

    The overrides go through Flower's own parsing (``--run-config`` text →
    values) and are fused with the app's ``[tool.flwr.app.config]``, as
    ``flwr run`` does.  For fedroute's ServerApp the result is validated with
    :func:`~fedroute.server.run_config.parse_run_config`.

    Raises
    ------
    ValueError
        For a key the app does not define (naming the allowed keys), or a value
        ``parse_run_config`` rejects (naming the key and the allowed values).
    """
    from flwr.common.config import fuse_dicts, parse_config_args

    pyproject = Path(app_dir) / "pyproject.toml"
    app = _flower_app_table(app_dir)
    defaults = app_config_defaults(app_dir)
    unknown = sorted(set(run_config) - set(defaults))
    if unknown:
        raise ValueError(f"run-config key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                         f"{'are' if len(unknown) > 1 else 'is'} not defined by the app in {pyproject}; "
                         f"allowed keys: {', '.join(sorted(defaults))}")
    overrides = parse_config_args([format_run_config(run_config)]) if run_config else {}
    resolved = fuse_dicts(defaults, overrides)
    if app.get("components", {}).get("serverapp") in FEDROUTE_SERVERAPPS:
        from fedroute.server.run_config import parse_run_config

        parse_run_config(resolved)
    return resolved


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
    environment["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(_free_port())
    environment["FLWR_LOCAL_CONTROL_API_PORT"] = str(_free_port())
    if ray_address:
        environment["RAY_ADDRESS"] = ray_address
        return environment
    # Ray would otherwise join /tmp/ray's current cluster (another run's); keep the path short
    # (Ray's unix sockets have a length limit).
    environment.pop("RAY_ADDRESS", None)
    environment["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="fr-ray-")
    return environment


def _processes_with_home(flwr_home: Path) -> list[int]:
    """PIDs of every process whose environment holds this FLWR_HOME."""
    marker = f"FLWR_HOME={flwr_home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


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


def _run_status(flwr: str, run_id: int, environment: dict[str, str]) -> str:
    """``finished:completed`` etc., from ``flwr ls --run-id X --format json``."""
    listing = subprocess.run([flwr, "ls", "--run-id", str(run_id), "--format", "json"], env=environment,
                             capture_output=True, text=True, timeout=60)
    try:
        runs = json.loads(listing.stdout).get("runs", [])
        return str(runs[0].get("status", "unknown")) if runs else "unknown"
    except (json.JSONDecodeError, AttributeError):
        return "unknown"


def load_run_config_file(path: str | Path) -> dict[str, Any]:
    """The overrides of a run-config file (``conf/<experiment>.toml``), read as ``flwr run --run-config FILE`` does.

    Raises
    ------
    ValueError
        For a path that is not an existing ``.toml`` file, or TOML that does not parse (naming the file).
    """
    from flwr.common.config import parse_config_args

    path = Path(path)
    if path.suffix != ".toml" or not path.is_file():
        raise ValueError(f"run-config file {str(path)!r} is not an existing .toml file")
    try:
        return parse_config_args([str(path)])
    except Exception as error:  # tomli.TOMLDecodeError, UnicodeDecodeError
        raise ValueError(f"run-config file {str(path)!r} does not parse: {error}") from None


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
        if stream and echo_line(line):
            sys.stdout.write(line)
            sys.stdout.flush()
        if time.monotonic() > deadline:
            process.kill()
            lines.append(f"fedroute: run stopped after {timeout} s\n")
            break
    process.wait(timeout=30)


def run_flower_app(
    app_dir: str | Path,
    run_config: Mapping[str, Any],
    num_supernodes: Optional[int],
    timeout: float = 1800.0,
    flwr_home: Optional[Path] = None,
    stream: bool = False,
    cpus_per_client: float = 1.0,
    ray_address: Optional[str] = None,
    run_config_file: Optional[str | Path] = None,
    environment_bin: Optional[str | Path] = None,
    gpus_per_client: float = 0.0,
) -> FlowerRun:
    """``flwr run <app_dir> --stream`` in a local Ray simulation, then clean up.

    Parameters
    ----------
    app_dir : path
        The Flower app (a directory with ``pyproject.toml``).
    run_config : mapping
        Run-config overrides (keys must exist in ``[tool.flwr.app.config]``).
    num_supernodes : int or None
        Simulated SuperNodes (one client each); ``None``: Flower's default federation (2).
    run_config_file : path, optional
        ``--run-config FILE`` (``conf/<experiment>.toml``) instead of ``run_config`` (then empty).
    environment_bin : path, optional
        Run ``flwr`` and what it starts from this Python environment's ``bin/`` (:func:`quiet_environment`).
    timeout : float
        Seconds before the run is stopped.
    flwr_home : Path, optional
        Flower's home for this run; a fresh temporary directory by default.
    stream : bool
        Echo the run's output while it runs.
    cpus_per_client : float
        Ray CPUs per simulated client.
    gpus_per_client : float
        Ray GPUs per simulated client (``client-resources-num-gpus``; 0 = none, ``0.25`` = four clients
        share a GPU).  Needs ``num_supernodes``.
    ray_address : str, optional
        Run the simulation on this existing Ray cluster (``host:port`` of its head) instead of a
        private local Ray; every node of it needs the same Python environment.

    Returns
    -------
    FlowerRun

    Raises
    ------
    ValueError
        If the run config is invalid (:func:`resolve_run_config`): nothing is started.
    """
    if run_config_file is not None and run_config:
        raise ValueError("flwr run takes a run-config file or key=value overrides, not both; merge them "
                         "(`fedroute flower --run-config FILE KEY=VALUE` does)")
    file = Path(run_config_file).resolve() if run_config_file is not None else None
    resolve_run_config(app_dir, load_run_config_file(file) if file is not None else run_config)
    home = Path(flwr_home) if flwr_home else Path(tempfile.mkdtemp(prefix="fedroute-flwr-home-"))
    home.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(environment_bin).resolve() if environment_bin is not None else None
    environment = quiet_environment(home, ray_address, bin_dir)
    command = flwr_run_command(_flwr_executable(bin_dir), app_dir, run_config, num_supernodes, cpus_per_client,
                               file, gpus_per_client)
    started = time.monotonic()
    process, lines = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, bufsize=1), []
    run_id: Optional[int] = None
    status = "unknown"
    try:
        _follow(process, lines, started, timeout, stream)
        match = re.search(r"Successfully started run (\d+)", "".join(lines))
        if match:
            run_id = int(match.group(1))
            status = _run_status(command[0], run_id, environment)
    finally:
        if process.poll() is None:
            process.kill()
        stop_processes(home)
        if "RAY_TMPDIR" in environment:
            shutil.rmtree(environment["RAY_TMPDIR"], ignore_errors=True)
        if flwr_home is None:
            shutil.rmtree(home, ignore_errors=True)
    return FlowerRun(returncode=process.returncode, stdout="".join(lines), stderr="", run_id=run_id,
                     status=status, wall_seconds=time.monotonic() - started)
