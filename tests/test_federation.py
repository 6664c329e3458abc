"""The number of clients follows the federation (``num-clients = "auto"``) or the run config, checked early.

The rule (:func:`federation_size`) on hand-made reports; the discovery over a grid whose nodes run
fedroute's real ClientApp handlers in this process (nodes may appear over time: an injected clock);
and the ServerApp end to end on such a grid, against the simulator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd
import pytest
from flwr.app import Context, RecordDict

from fedroute import protocol
from fedroute.client.app import task_config
from fedroute.server.federation import (
    FederationError,
    NodeReport,
    discover_federation,
    federation_size,
)
from fedroute.server.run_config import parse_run_config
from fedroute.simulation.simulator import simulate
from fedroute.tasks.housing import EMBEDDED_TABLE
from support.app_config import app_run_config
from support.grid import InProcessGrid, builtin_handlers, server_main as _server_main

pytestmark = pytest.mark.usefixtures("task_identity")


def _reports(*pairs: tuple[Optional[int], Optional[int]]) -> list[NodeReport]:
    return [NodeReport(100 + index, partition, partitions) for index, (partition, partitions) in enumerate(pairs)]


# ------------------------------------------------------------------ the rule
def test_auto_takes_the_nodes_num_partitions() -> None:
    assert federation_size(None, _reports((0, 2), (1, 2))) == 2
    assert federation_size(None, _reports((3, 5))) == 5  # one node of five so far: the run has five clients


def test_an_explicit_num_clients_wins_when_the_nodes_agree_or_say_nothing() -> None:
    assert federation_size(3, _reports((0, 3), (2, 3))) == 3
    assert federation_size(3, _reports((0, None), (1, None))) == 3


@pytest.mark.parametrize("explicit, pairs, message", [
    (None, [(0, 2), (1, 3)], r"disagree on num-partitions \(\[2, 3\]\)"),
    (None, [(0, 2), (0, 2)], r"SuperNodes \[100, 101\] share partition-id 0"),
    (None, [(None, 2)], r"SuperNode 100 has no integer 'partition-id'"),
    (None, [(0, 2), (2, 2)], r"SuperNode 101 has partition-id 2, outside 0 … 1 for 2 clients"),
    (None, [(0, None)], r"num-clients' = \"auto\" .* no connected SuperNode's node config has one"),
    (80, [(0, 2), (1, 2)], r"'num-clients' = 80, but the connected SuperNodes were started for num-partitions = 2: "
                           r"start 80 SuperNodes \(simulation: flwr run \. --federation-config \"num-supernodes=80\""),
    (4, [(0, None), (5, None)], r"partition-id 5, outside 0 … 3 for 4 clients"),
])
def test_contradictions_are_named(explicit: Optional[int], pairs: list, message: str) -> None:
    with pytest.raises(FederationError, match=message):
        federation_size(explicit, _reports(*pairs))


# ------------------------------------------------------------------ discovery over a grid
class GrowingGrid(InProcessGrid):
    """Nodes that connect one by one as the (fake) clock advances; counts the node-config queries."""

    def __init__(self, num_nodes: int, run_config: dict[str, Any], connected_at: list[float],
                 drop_num_partitions: bool = False) -> None:
        super().__init__(builtin_handlers(), num_nodes, run_config)
        if drop_num_partitions:  # a deployment whose SuperNodes got only --node-config "partition-id=<i>"
            for context in self.contexts.values():
                context.node_config = {"partition-id": context.node_config["partition-id"]}
        self.connected_at = dict(zip(self.contexts, connected_at))
        self.now = 0.0
        self.queried: list[int] = []

    def get_node_ids(self) -> list[int]:
        return [node for node, moment in self.connected_at.items() if moment <= self.now]

    def send_and_receive(self, messages: Any, timeout: Optional[float] = None) -> list:
        messages = list(messages)
        self.queried += [message.metadata.dst_node_id for message in messages
                         if message.content[protocol.CONFIG].get(protocol.PHASE) == protocol.PHASE_NODE_CONFIG]
        return super().send_and_receive(messages, timeout)

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _discover(grid: GrowingGrid, explicit: Optional[int], wait: float = 10.0):
    return discover_federation(grid, explicit, wait_timeout=wait, reply_timeout=5.0, clock=lambda: grid.now,
                               sleep=grid.sleep)


def test_auto_waits_for_late_nodes_and_asks_each_node_once() -> None:
    grid = GrowingGrid(3, {}, connected_at=[0.0, 2.0, 4.0])
    federation = _discover(grid, None)
    assert (federation.num_clients, federation.source, len(federation.node_ids)) == (3, "num-partitions", 3)
    assert sorted(grid.queried) == sorted(grid.contexts) and 4.0 <= grid.now < 5.0


def test_enough_nodes_for_an_explicit_num_clients_need_no_query() -> None:
    grid = GrowingGrid(3, {}, connected_at=[0.0, 0.0, 0.0])
    federation = _discover(grid, 3)
    assert (federation.num_clients, federation.source, grid.queried) == (3, "num-clients", [])


def test_a_federation_started_for_fewer_nodes_fails_at_once() -> None:
    """Before: plain `flwr run .` (2 simulated SuperNodes) waited 120 s for the 80 of num-clients."""
    grid = GrowingGrid(2, {}, connected_at=[0.0, 0.0])
    with pytest.raises(FederationError, match="started for num-partitions = 2"):
        _discover(grid, 80, wait=120.0)
    assert grid.now == 0.0  # no waiting


def test_missing_nodes_are_named_after_the_wait() -> None:
    grid = GrowingGrid(3, {}, connected_at=[0.0, 1.0, 1e9])
    with pytest.raises(FederationError, match=r"only 2 of the run's 3 SuperNodes connected within 10 s \(missing "
                                              r"partition-ids: \[2\]\)"):
        _discover(grid, None)
    assert 10.0 < grid.now < 11.0


def test_no_node_at_all() -> None:
    grid = GrowingGrid(1, {}, connected_at=[1e9])
    with pytest.raises(FederationError, match="no SuperNode connected within 3 s .*'node-wait-timeout'"):
        _discover(grid, None, wait=3.0)


def test_a_node_config_without_num_partitions_needs_an_explicit_num_clients() -> None:
    grid = GrowingGrid(2, {}, connected_at=[0.0, 0.0], drop_num_partitions=True)
    with pytest.raises(FederationError, match="no connected SuperNode's node config has one"):
        _discover(grid, None)


# ------------------------------------------------------------------ the client side
def test_clients_build_their_data_with_the_servers_number_and_their_own_data_file() -> None:
    context = Context(run_id=1, node_id=5, state=RecordDict(), run_config={"task": "housing", "num-clients": "auto",
                                                                            "data-file": ""},
                      node_config={"partition-id": 1, "data-file": "/data/housing.csv.gz"})
    settings = task_config(context, {protocol.TASK_NUM_CLIENTS: 4})
    assert settings["num-clients"] == 4 and settings["data-file"] == "/data/housing.csv.gz"
    assert task_config(context, {})["num-clients"] == "auto"  # nothing from the server: the run config's value


# ------------------------------------------------------------------ the ServerApp end to end
def test_auto_runs_with_the_nodes_it_has_and_equals_the_simulator(tmp_path: Path) -> None:
    """Housing's client data depend on the number of clients (the rows are cut into ``n`` chunks): the clients,
    whose run config says "auto" (the task's 20), must build them for the federation's 4."""
    config = _run_config(tmp_path, **{"task": "housing", "method": "greedy", "num-clients": "auto",
                                      "data-file": str(EMBEDDED_TABLE), "num-server-rounds": 3})
    _server_main(InProcessGrid(builtin_handlers(), 4, config), config)
    directory = tmp_path / "results" / "77"
    written = json.loads((directory / "config.json").read_text())
    assert written["federation"] == {"num_clients": 4, "num_nodes": 4, "source": "num-partitions"}
    assert written["task"]["num_clients"] == 4
    settings = parse_run_config({**config, "num-clients": 4})
    history = simulate(settings.task, settings.routing["greedy"], settings.num_rounds, settings.seed)
    routes = pd.read_csv(directory / "routes.csv").pivot(index="round_index", columns="client_id", values="cluster")
    np.testing.assert_array_equal(routes.to_numpy(), history.routes)
    models = np.load(directory / "cluster_models.npz")
    np.testing.assert_allclose(np.stack([models[f"greedy/cluster-{k}"] for k in range(2)]),
                               history.cluster_models[-1], rtol=0, atol=1e-12)


def test_a_task_needing_more_nodes_fails_before_round_one_naming_what_to_start(tmp_path: Path) -> None:
    config = _run_config(tmp_path, **{"task": "housing", "num-clients": "auto", "data-file": str(EMBEDDED_TABLE)})
    with pytest.raises(FederationError, match=r"the federation has 2 SuperNodes, .*allowed: an integer ≥ 4 .*"
                                              r"start at least 4 SuperNodes \(simulation: flwr run \. "
                                              r"--federation-config \"num-supernodes=4\""):
        _server_main(InProcessGrid(builtin_handlers(), 2, config), config)
    status = json.loads((tmp_path / "results" / "77" / "status.json").read_text())
    assert status["state"] == "failed" and "start at least 4 SuperNodes" in status["error"]


def test_a_clientapp_running_other_fedroute_files_is_named(                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The stale-SuperLink trap: the Ray workers import an old folder's fedroute; the run stops before round 1."""
    from fedroute.client import app as client

    monkeypatch.setattr(client, "app_fingerprint", lambda: "0123456789abcdef")
    monkeypatch.setattr(client, "app_files", lambda: Path("/elsewhere/old-checkout"))
    grid = GrowingGrid(2, {}, connected_at=[0.0, 0.0])
    with pytest.raises(FederationError, match=r"runs the fedroute files in /elsewhere/old-checkout \(code "
                                              r"0123456789abcdef\), not this run's app .*Stop that SuperLink"):
        _discover(grid, None)


def test_the_outcome_is_pushed_before_the_runtime_environment_is_deleted(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """Flower 1.42 runs exit handlers last-registered first and kills the process 5 s in: its runtime-environment
    deletion (registered last) ran before the push of the run's outcome and could eat the 5 s.  Now nothing is
    deleted on exit, and a detached process deletes the directory once the process that ran the ServerApp is gone
    (here: a stand-in process)."""
    import subprocess
    import sys
    import time

    from flwr.supercore.exit import exit_handler as flower_exit
    from flwr.supercore.superexec import dependency_installer

    from fedroute.server import flower_exit as fix

    environment = tmp_path / "runtime-envs" / "123"
    (environment / "lib").mkdir(parents=True)
    for index in range(50):
        (environment / "lib" / f"module_{index}.py").write_text("x = 1\n")
    ran: list[str] = []
    monkeypatch.setattr(flower_exit, "registered_exit_handlers", [])
    monkeypatch.setattr(dependency_installer, "cleanup_app_runtime_environment", lambda path: ran.append("inline"))
    flower_exit.add_exit_handler(lambda: ran.append("stop"))       # as register_signal_handlers does
    flower_exit.add_exit_handler(lambda: ran.append("push outcome"))
    dependency_installer._register_runtime_env_cleanup(environment)  # the install, registered later
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])  # the ServerApp's process
    monkeypatch.setattr(fix.os, "getpid", lambda: server.pid)
    assert fix.report_before_cleanup() == 1
    flower_exit.trigger_exit_handlers(run_before_force_exit=False)
    assert ran == ["push outcome", "stop"]  # nothing deleted on exit
    time.sleep(1.0)
    assert environment.exists()  # not while the process runs
    server.wait()
    deadline = time.monotonic() + 30
    while environment.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not environment.exists()
    assert fix.report_before_cleanup() == 0  # nothing left to take out


def _run_config(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    return app_run_config({"num-clients": 3, "num-server-rounds": 2, "results-dir": str(tmp_path / "results"),
                           "round-timeout": 5.0}, **changes)
