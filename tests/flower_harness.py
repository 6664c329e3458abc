"""Run a Flower app with ``flwr run <app> --stream`` hermetically (tests and CI).

Facts this relies on (measured with flwr 1.42.0, ray 2.55):

* ``flwr run`` starts a *detached* local SuperLink (``flower-superlink``, own
  session) on ``127.0.0.1:$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` (default
  39091) with its state under ``$FLWR_HOME/local-superlink/``. It is reused by
  later runs with the same port, keeps the environment and the working
  directory it was started with (the ServerApp inherits both), and no pid file
  is written.
* Its ``flower-superexec`` child starts ``flwr-simulation`` (+ Ray) in a
  *separate* session; killing only the SuperLink orphans them. All of these
  processes inherit ``FLWR_HOME`` and/or ``RAY_TMPDIR``; Ray's agents keep
  only ``RAY_TMPDIR``. Cleanup therefore kills every process whose
  environment holds this run's ``FLWR_HOME`` or ``RAY_TMPDIR`` (Linux
  ``/proc``).
* ``flwr run --stream`` exits 0 even if the ServerApp crashed; the truth is
  ``flwr ls local --run-id ID --format json`` -> ``runs[0]["status"]``
  (``finished:completed`` / ``finished:failed`` / ``finished:stopped``) and
  ``runs[0]["status-details"]`` (the exception message).
* ServerApp ``print``/``logging``/stderr output and its traceback reach the
  ``flwr run --stream`` *stdout*.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FlowerRunError",
    "FlowerRunResult",
    "format_run_config",
    "run_flower_app",
    "stop_flower_processes",
]

COMPLETED = "finished:completed"

_QUIET_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # no per-run `uv sync`
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "PYTHONUNBUFFERED": "1",
}
# Only a local `:local:` connection: nothing can reach the hosted SuperGrid.
_CONFIG_TOML = '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'
_RUN_ID_RE = re.compile(r"Successfully started run (\d+)")


@dataclass
class FlowerRunResult:
    """Outcome of one ``flwr run``.

    Attributes
    ----------
    returncode : int
        Exit code of ``flwr run`` (``-9`` if it was killed on timeout).
    stdout, stderr : str
        Captured output; the ServerApp's prints, logs and traceback are in
        ``stdout``.
    run_id : int or None
        Run ID parsed from ``Successfully started run <ID>``.
    status : str
        Run status from ``flwr ls`` (e.g. ``finished:completed``), ``timeout``
        or ``unknown``.
    wall_seconds : float
        Wall time of ``flwr run`` including SuperLink and Ray start-up.
    status_details : str
        ``status-details`` from ``flwr ls`` (exception message on failure).
    flwr_home : Path
        The ``FLWR_HOME`` used (deleted afterwards if it was a temp dir).
    superlink_log : str
        Tail of ``$FLWR_HOME/local-superlink/superlink.log``.
    """

    returncode: int
    stdout: str
    stderr: str
    run_id: int | None
    status: str
    wall_seconds: float
    status_details: str = ""
    flwr_home: Path | None = None
    superlink_log: str = ""

    @property
    def ok(self) -> bool:
        """Whether ``flwr run`` exited 0 and the run finished completed."""
        return self.returncode == 0 and self.status == COMPLETED


class FlowerRunError(RuntimeError):
    """Raised when a Flower run did not complete; ``.result`` has the details."""

    def __init__(self, result: FlowerRunResult, tail_lines: int = 60) -> None:
        self.result = result

        def tail(text: str, n: int = tail_lines) -> str:
            return "\n".join(text.splitlines()[-n:])

        super().__init__(
            f"Flower run did not complete: returncode={result.returncode} "
            f"run_id={result.run_id} status={result.status!r} "
            f"details={result.status_details!r} ({result.wall_seconds:.1f}s)\n"
            f"--- stdout (tail) ---\n{tail(result.stdout)}\n"
            f"--- stderr (tail) ---\n{tail(result.stderr)}\n"
            f"--- superlink.log (tail) ---\n{tail(result.superlink_log, 20)}"
        )


def format_run_config(run_config: Mapping[str, object]) -> str:
    """Format a dict as a ``flwr run --run-config`` string.

    Parameters
    ----------
    run_config : Mapping[str, object]
        Keys must exist in ``[tool.flwr.app.config]`` (flwr exits 1 otherwise).
        Values: ``bool`` -> ``true``/``false``, ``int``/``float`` as TOML
        numbers, ``str``/``Path`` as TOML literal strings ``'...'`` (no escape
        processing, so Windows paths survive) or basic strings ``"..."`` if the
        value contains ``'``.

    Returns
    -------
    str
        E.g. ``num-server-rounds=3 results-dir='/tmp/x' use-gpu=false``.

    Raises
    ------
    ValueError
        For unsupported types, keys with spaces/``=``, non-finite floats,
        strings holding both quote kinds or newlines (flwr's parser splits on
        ``"[^"]*"`` / ``'[^']*'``).
    """
    parts = []
    for key, value in run_config.items():
        if not key or re.search(r"[\s=]", key):
            raise ValueError(f"invalid run-config key {key!r}")
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = str(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"non-finite float for {key!r}")
            text = repr(value)
        elif isinstance(value, (str, Path)):
            s = str(value)
            if "\n" in s or "\r" in s:
                raise ValueError(f"newline in run-config value {key!r}")
            if "'" not in s:
                text = f"'{s}'"
            elif '"' not in s and "\\" not in s:
                text = f'"{s}"'
            else:
                raise ValueError(f"cannot quote run-config value {key!r}: {s!r}")
        else:
            raise ValueError(f"unsupported type {type(value).__name__} for {key!r}")
        parts.append(f"{key}={text}")
    return " ".join(parts)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _flwr_executable() -> str:
    found = shutil.which("flwr")
    if found:
        return found
    candidate = Path(sys.executable).parent / ("flwr.exe" if os.name == "nt" else "flwr")
    if candidate.exists():
        return str(candidate)
    raise FileNotFoundError("`flwr` not found on PATH nor next to sys.executable")


def _pids_with_env(markers: list[bytes]) -> list[int]:
    """PIDs (not ours) whose environment contains any of ``markers`` exactly."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:  # gone, zombie or not ours
            continue
        if any(m in env for m in markers):
            pids.append(int(entry))
    return pids


def stop_flower_processes(flwr_home: Path, ray_tmpdir: Path | None = None,
                          grace: float = 5.0) -> list[int]:
    """Stop the local SuperLink, SuperExec, flwr-simulation and Ray of a home.

    Parameters
    ----------
    flwr_home : Path
        The ``FLWR_HOME`` the processes were started with.
    ray_tmpdir : Path, optional
        The ``RAY_TMPDIR`` they were started with (catches Ray agents, which
        drop ``FLWR_HOME`` from their environment).
    grace : float
        Seconds between SIGTERM and SIGKILL.

    Returns
    -------
    list of int
        The PIDs that were signalled (Linux only; empty elsewhere).
    """
    if not os.path.isdir("/proc"):
        return []
    markers = [f"FLWR_HOME={flwr_home}".encode()]
    if ray_tmpdir is not None:
        markers.append(f"RAY_TMPDIR={ray_tmpdir}".encode())
    signalled: list[int] = []
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        pids = _pids_with_env(markers)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
                signalled.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _pids_with_env(markers):
            time.sleep(0.1)
    return sorted(set(signalled))


def _run_status(flwr: str, run_id: int, env: dict[str, str], cwd: str,
                wait: float = 10.0) -> tuple[str, str]:
    """Return ``(status, status-details)`` of a run via ``flwr ls``."""
    deadline = time.monotonic() + wait
    status, details = "unknown", ""
    while True:
        proc = subprocess.run(
            [flwr, "ls", "local", "--run-id", str(run_id), "--format", "json"],
            env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
        )
        try:
            run = json.loads(proc.stdout)["runs"][0]
            status, details = run["status"], run.get("status-details", "")
        except (ValueError, KeyError, IndexError):
            details = (proc.stdout + proc.stderr).strip()[-500:]
        if status.startswith("finished") or time.monotonic() > deadline:
            return status, details
        time.sleep(0.5)


def run_flower_app(
    app_dir: str | os.PathLike[str],
    run_config: Mapping[str, object],
    num_supernodes: int,
    timeout: float,
    flwr_home: Path | None = None,
    *,
    client_cpus: float = 1,
    extra_env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    log_level: str = "WARNING",
    check: bool = True,
) -> FlowerRunResult:
    """Run ``flwr run <app_dir> --stream`` in a Ray simulation, hermetically.

    A fresh local SuperLink is started on a free port with a private
    ``FLWR_HOME`` and ``RAY_TMPDIR``, so the ServerApp/ClientApps see *this*
    call's environment and ``cwd``; it and everything it spawned are always
    stopped afterwards.

    Parameters
    ----------
    app_dir : path-like
        Directory holding the app's ``pyproject.toml`` (not pip-installed; flwr
        copies ``*.py *.toml *.md *.json *.yaml`` to ``$FLWR_HOME/apps/``, so
        results must go to an absolute path passed in ``run_config``).
    run_config : Mapping[str, object]
        Overrides for ``[tool.flwr.app.config]``; see :func:`format_run_config`.
    num_supernodes : int
        Number of simulated SuperNodes. NB: the ServerApp starts before they
        are all registered; it must wait until ``grid.get_node_ids()`` has the
        expected count.
    timeout : float
        Seconds before ``flwr run`` is killed (status ``timeout``).
    flwr_home : Path, optional
        ``FLWR_HOME`` to use (kept). Default: a temp dir, deleted afterwards.
    client_cpus : float
        ``client-resources-num-cpus`` (Ray CPUs per ClientApp; flwr default 2).
    extra_env : Mapping[str, str], optional
        Extra environment for the SuperLink, ServerApp and ClientApps.
    cwd : path-like, optional
        Working directory of ``flwr run``, hence of the SuperLink and ServerApp.
    log_level : str
        ``FLWR_LOG_LEVEL``; ``WARNING`` hides flwr's INFO lines (and INFO logs
        the app sends through flwr's logger). ``print`` output is always shown.
    check : bool
        Raise :class:`FlowerRunError` unless the run finished completed.

    Returns
    -------
    FlowerRunResult
    """
    flwr = _flwr_executable()
    own_home = flwr_home is None
    home = Path(tempfile.mkdtemp(prefix="flwr-home-")) if own_home else Path(flwr_home)
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "config.toml").exists():
        (home / "config.toml").write_text(_CONFIG_TOML)
    # Short path: Ray's unix sockets live under it (107-byte limit).
    ray_tmp = Path(tempfile.mkdtemp(prefix="fr-ray-", dir="/tmp" if os.path.isdir("/tmp") else None))
    work_dir = str(Path(cwd).resolve()) if cwd is not None else str(home)

    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # never attach to an existing Ray cluster
    env.update(_QUIET_ENV)
    env.update(
        FLWR_HOME=str(home),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(_free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(_free_port()),
        FLWR_LOG_LEVEL=log_level,
        RAY_TMPDIR=str(ray_tmp),
    )
    # `flwr` launches `flower-superlink` via PATH: put flwr's bin dir first.
    env["PATH"] = str(Path(flwr).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra_env or {})

    cmd = [
        flwr, "run", str(Path(app_dir).resolve()), "local", "--stream",
        "--federation-config",
        f"num-supernodes={int(num_supernodes)} client-resources-num-cpus={client_cpus}",
    ]
    if run_config:
        cmd += ["--run-config", format_run_config(run_config)]

    t0 = time.monotonic()
    try:
        try:
            proc = subprocess.run(cmd, env=env, cwd=work_dir, capture_output=True,
                                  text=True, timeout=timeout, check=False)
            returncode, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            returncode = -9
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        wall = time.monotonic() - t0
        match = _RUN_ID_RE.search(out)
        run_id = int(match.group(1)) if match else None
        status, details = "unknown", ""
        if returncode == -9:
            status = "timeout"
        elif run_id is not None:
            status, details = _run_status(flwr, run_id, env, work_dir)
    finally:
        stop_flower_processes(home, ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        log_file = home / "local-superlink" / "superlink.log"
        log_tail = log_file.read_text(errors="replace")[-4000:] if log_file.exists() else ""
        if own_home:
            shutil.rmtree(home, ignore_errors=True)

    result = FlowerRunResult(returncode, out, err, run_id, status, wall, details,
                             home, log_tail)
    if check and not result.ok:
        raise FlowerRunError(result)
    return result


def _main(argv: list[str] | None = None) -> int:
    """CLI for CI: ``python flower_harness.py APP -n 12 -t 900 -c '{"k": 1}'``."""
    import argparse  # pylint: disable=import-outside-toplevel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("app_dir")
    parser.add_argument("-n", "--num-supernodes", type=int, default=2)
    parser.add_argument("-t", "--timeout", type=float, default=900.0)
    parser.add_argument("-c", "--run-config", default="{}", help="JSON object")
    parser.add_argument("--client-cpus", type=float, default=1)
    args = parser.parse_args(argv)
    try:
        res = run_flower_app(args.app_dir, json.loads(args.run_config),
                             args.num_supernodes, args.timeout,
                             client_cpus=args.client_cpus)
    except FlowerRunError as err:
        print(err, file=sys.stderr)
        return 1
    print(res.stdout)
    print(f"run {res.run_id}: {res.status} in {res.wall_seconds:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
