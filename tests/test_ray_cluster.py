"""Scale-out: ``fedroute flower`` (our app and a plugin app) and a sweep on an existing Ray cluster.

A local cluster is started the way docs/performance.md ("Running on a Ray
cluster") tells a user to (``ray start --head``, here with ``--block``, free
ports and its own temporary directory so that it never meets another Ray on
the machine) and stopped by its process id.  Each command gets the cluster's
address; the cluster's job table (GCS) shows which drivers ran on it, so a
command that quietly started a private Ray instead fails the test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import pandas as pd
import pytest

from fedroute.cli import main as fedroute_main
from fedroute.simulation.simulator import simulate
from support.app_config import app_settings

NUM_NODES = 4
CONFIG = {"method": "exp3", "num-server-rounds": 3, "seed": 0, "block-length": 3}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_listening(port: int, process: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ray start exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the Ray head did not listen on port {port} within {timeout} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """``host:port`` of a running Ray head (2 CPUs) started with ``ray start --head --block``."""
    port = _free_port()
    temp_dir = Path(tempfile.mkdtemp(prefix="fr-rc-"))  # short: Ray's unix socket paths have a length limit
    log = temp_dir / "head.log"
    command = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--port", str(port),
               "--num-cpus", "2", "--temp-dir", str(temp_dir / "ray"), "--include-dashboard=false",
               "--disable-usage-stats", "--ray-client-server-port", str(_free_port()),
               "--dashboard-agent-listen-port", str(_free_port()), "--dashboard-port", str(_free_port())]
    environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    environment.pop("RAY_ADDRESS", None)
    with open(log, "w") as stream:
        head = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT, env=environment,
                                start_new_session=True)
    try:
        _wait_listening(port, head, log)
        yield f"127.0.0.1:{port}"
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops every process of its node on SIGTERM
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=10)
        try:  # anything of its session still alive (its own process group) goes too
            os.killpg(head.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)


_LISTING = "# fedroute-test: list the cluster's jobs"


def _driver_entrypoints(address: str) -> list[str]:
    """The entry points of every driver (job) that has run on the cluster, from its GCS job table
    (except these listings, which are drivers too)."""
    script = (f"{_LISTING}\nimport json, ray\n"
              "from ray._private import state\n"
              f"ray.init(address={address!r}, log_to_driver=False, configure_logging=False)\n"
              "print(json.dumps([job['Entrypoint'] for job in state.jobs()]))\n"
              "ray.shutdown()\n")
    environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    listing = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                             env=environment, check=True)
    return [entry for entry in json.loads(listing.stdout.strip().splitlines()[-1]) if _LISTING not in entry]


class DriverLog:
    """The drivers that joined the cluster during a test.  A listing is a Ray driver of its own (seconds): the
    listing that ended one test is where the next one starts, unless that test ended without one."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.seen: Optional[int] = None
        """How many drivers the last listing showed (``None``: list again before the next test)."""
        self.listings = 0
        """How many times :meth:`new` listed."""

    def start(self) -> None:
        """Before a test: know how many drivers ran so far."""
        if self.seen is None:
            self.seen = len(_driver_entrypoints(self.address))

    def new(self) -> list[str]:
        """The entry points of the drivers that joined since the last listing."""
        listing = _driver_entrypoints(self.address)
        joined, self.seen = listing[self.seen or 0:], len(listing)
        self.listings += 1
        return joined


@pytest.fixture(scope="module")
def driver_log(ray_cluster: str) -> DriverLog:
    return DriverLog(ray_cluster)


@pytest.fixture()
def cluster_drivers(driver_log: DriverLog) -> Iterator[DriverLog]:
    """:class:`DriverLog` for one test: its start is listed (or known from the test before)."""
    driver_log.start()
    listings = driver_log.listings
    yield driver_log
    if driver_log.listings == listings:  # the test ended before its listing: the next one lists its start
        driver_log.seen = None


@pytest.mark.process
def test_fedroute_flower_runs_on_an_existing_ray_cluster(ray_cluster: str, cluster_drivers: DriverLog,
                                                         flower_app: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    overrides = [f"{key}={value}" for key, value in CONFIG.items()]
    code = fedroute_main(["flower", "--app-dir", str(flower_app), "--supernodes", str(NUM_NODES),
                          "--results-dir", str(tmp_path), "--timeout", "600", "--ray-address", ray_cluster,
                          "--run-config", *overrides])
    output = capsys.readouterr().out
    assert code == 0, output[-3000:]
    new_drivers = cluster_drivers.new()
    assert any("flwr-simulation" in entry for entry in new_drivers), new_drivers
    # The results are those of the routing rules (the batched simulator of the same configuration).
    (directory,) = [path for path in tmp_path.iterdir() if path.is_dir()]
    settings = app_settings(CONFIG, **{"num-clients": NUM_NODES})
    expected = simulate(settings.task, settings.routing["exp3"], CONFIG["num-server-rounds"], settings.seed).routes
    routes = pd.read_csv(directory / "routes.csv").pivot(index="round_index", columns="client_id", values="cluster")
    np.testing.assert_array_equal(routes.to_numpy(), expected)
    assert json.loads((directory / "summary.json").read_text())["exp3"]["evaluated_clients"] == NUM_NODES


@pytest.mark.process
def test_a_plugin_app_runs_on_an_existing_ray_cluster(ray_cluster: str, cluster_drivers: DriverLog, repository: Path,
                                                      tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    summary_path = tmp_path / "summary.json"
    code = fedroute_main(["flower", "--app-dir", str(repository / "examples" / "digits_cnn"),
                          "--supernodes", str(NUM_NODES), "--timeout", "600", "--ray-address", ray_cluster,
                          "--run-config", "num-server-rounds=2", f"min-nodes={NUM_NODES}", "num-clusters=2",
                          f"results-path={summary_path}"])
    output = capsys.readouterr().out
    assert code == 0, output[-3000:]
    assert any("flwr-simulation" in entry for entry in cluster_drivers.new())
    summary = json.loads(summary_path.read_text())
    assert [row["num_replies"] for row in summary["history"]] == [NUM_NODES, NUM_NODES]


@pytest.mark.process
def test_a_quick_sweep_on_the_cluster_equals_the_sweep_in_process(ray_cluster: str, cluster_drivers: DriverLog,
                                                                  tmp_path: Path) -> None:
    assert fedroute_main(["reproduce", "linear", "--quick", "--out", str(tmp_path / "cluster"),
                          "--ray-address", ray_cluster]) == 0
    assert len(cluster_drivers.new()) == 1  # the sweep's driver (this process) joined
    assert fedroute_main(["reproduce", "linear", "--quick", "--out", str(tmp_path / "local")]) == 0
    tables = sorted((tmp_path / "cluster" / "linear").glob("*.parquet"))
    assert {path.name for path in tables} >= {"runs.parquet", "summary.parquet"}
    for table in tables:
        pd.testing.assert_frame_equal(pd.read_parquet(table), pd.read_parquet(tmp_path / "local" / "linear" / table.name))


@pytest.mark.parametrize("address", ["6379", "head-node", "127.0.0.1:0", "127.0.0.1:70000", ":6379"])
def test_a_malformed_ray_address_is_rejected_before_anything_starts(address: str, repository: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    for command in (["flower", "--app-dir", str(repository), "--supernodes", "2"], ["reproduce", "linear", "--quick"]):
        assert fedroute_main([*command, "--ray-address", address]) == 2
        error = capsys.readouterr().err
        assert f"--ray-address {address!r} is invalid" in error and "HOST:PORT" in error and "1–65535" in error


def test_a_ray_address_where_nothing_listens_is_rejected_before_anything_starts(
        repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    address = f"127.0.0.1:{_free_port()}"  # free: nothing listens there
    started = time.monotonic()
    assert fedroute_main(["flower", "--app-dir", str(repository), "--supernodes", "2", "--results-dir",
                          str(tmp_path), "--ray-address", address]) == 2
    assert "no Ray head accepts connections there" in capsys.readouterr().err
    assert fedroute_main(["reproduce", "linear", "--quick", "--out", str(tmp_path), "--ray-address", address]) == 2
    assert "no Ray head accepts connections there" in capsys.readouterr().err
    assert time.monotonic() - started < 20  # no Flower run, no sweep
    assert list(tmp_path.iterdir()) == []
