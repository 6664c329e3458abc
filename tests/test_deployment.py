"""Native deployment: real ``flower-superlink`` / ``flower-supernode`` processes on 127.0.0.1.

Deployment rounds are slow (≈ 9 s with 3 SuperNodes on 2 cores: a fresh
ClientApp process per message and Flower's 3 s polls), so these tests use 3
SuperNodes and 3–5 rounds.  The configuration (linear task, EXP3, seed 0,
block length 3) routes client 2 alone to cluster 1 in round index 2 — the
round in which the node-loss test takes client 2's SuperNode away.
"""

from __future__ import annotations

import glob
import json
import signal
import threading
import time
import tomllib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pytest

from fedroute.server.deploy import CONNECTION, LocalFederation
from fedroute.server.launcher import run_flower_app
from fedroute.server.run_config import parse_run_config
from fedroute.simulation.simulator import simulate

NUM_NODES = 3
CONFIG = {"method": "exp3", "num-clients": NUM_NODES, "seed": 0, "block-length": 3}
VICTIM, KILL_ROUND_INDEX = 2, 2


def _results(result: Any, root: Path, logs: Path) -> Path:
    assert result.completed, f"status {result.status!r}\n{result.stdout[-3000:]}\n{_log_tails(logs)}"
    (directory,) = [path for path in root.iterdir() if path.is_dir()]
    return directory


def _log_tails(logs: Path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}" for path in sorted(logs.glob("*.log")))


def _home_processes(home: Path) -> list[int]:
    marker = f"FLWR_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _simulated_routes(repository: Path, rounds: int) -> np.ndarray:
    with open(repository / "pyproject.toml", "rb") as stream:
        defaults = tomllib.load(stream)["tool"]["flwr"]["app"]["config"]
    settings = parse_run_config({**defaults, **CONFIG, "num-server-rounds": rounds})
    return simulate(settings.task, settings.routing["exp3"], rounds, settings.seed).routes


def _wait(condition: Callable[[], bool], timeout: float, what: str, logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{_log_tails(logs)}")
        time.sleep(0.05)


def _state_rounds(state_dir: Path, client: int) -> dict[int, dict[str, np.ndarray]]:
    """Round index → stored controller state, from the client's state file (``{}`` if none yet)."""
    files = glob.glob(str(state_dir / f"supernode-{client}" / "*" / f"client-{client}.npz"))
    if not files:
        return {}
    try:
        with np.load(files[0]) as stored:
            states: dict[int, dict[str, np.ndarray]] = {}
            for name in stored.files:
                round_text, _, field = name.partition("/")
                states.setdefault(int(round_text), {})[field] = stored[name]
            return states
    except (OSError, ValueError, EOFError):  # replaced while being read
        return {}


def _last_round(state_dir: Path, client: int) -> int:
    return max(_state_rounds(state_dir, client), default=-1)


def test_deployment_with_tls_equals_the_ray_simulation(repository: Path, tmp_path: Path,
                                                       no_fedroute_bin: Path) -> None:
    """Both runtimes from an environment where `import fedroute` fails (the FAB carries the app), with
    num-clients = "auto" (the SuperNodes' num-partitions)."""
    config = {**CONFIG, "num-clients": "auto", "num-server-rounds": 3}
    simulated = _results(run_flower_app(repository, {**config, "results-dir": str(tmp_path / "sim")},
                                        num_supernodes=NUM_NODES, timeout=300, environment_bin=no_fedroute_bin),
                         tmp_path / "sim", tmp_path)
    logs = tmp_path / "logs"
    with LocalFederation(repository, NUM_NODES, tls=True, log_dir=logs,
                         environment_bin=no_fedroute_bin) as federation:
        connection = (federation.flwr_home / "config.toml").read_text()
        assert f"[superlink.{CONNECTION}]" in connection and "root-certificates" in connection
        assert "insecure" not in connection
        result = federation.run({**config, "results-dir": str(tmp_path / "deploy")}, timeout=400)
        home = federation.flwr_home
    deployed = _results(result, tmp_path / "deploy", logs)
    assert result.results_dir == deployed
    assert not _home_processes(home), "a process of the deployment outlived the federation"

    sim_models, dep_models = np.load(simulated / "cluster_models.npz"), np.load(deployed / "cluster_models.npz")
    assert sorted(sim_models.files) == sorted(dep_models.files) == ["exp3/cluster-0", "exp3/cluster-1"]
    for name in sim_models.files:
        np.testing.assert_array_equal(dep_models[name], sim_models[name], err_msg=name)
    pd.testing.assert_frame_equal(pd.read_csv(deployed / "routes.csv"), pd.read_csv(simulated / "routes.csv"))
    sim_rounds = pd.read_csv(simulated / "rounds.csv").drop(columns="seconds")
    dep_rounds = pd.read_csv(deployed / "rounds.csv").drop(columns="seconds")
    pd.testing.assert_frame_equal(dep_rounds, sim_rounds)
    # The configuration is not trivial: both clusters are used and EXP3 updates at the block end.
    assert dep_rounds.routed_1.sum() > 0 and dep_rounds.exp3_weight_spread.iloc[-1] > 0
    summary = json.loads((deployed / "summary.json").read_text())["exp3"]
    assert summary["evaluated_clients"] == NUM_NODES and summary["rejected_replies"] == 0
    _ran_the_fab_without_an_installed_fedroute(repository, tmp_path, home, no_fedroute_bin, simulated, deployed, logs)


def _ran_the_fab_without_an_installed_fedroute(repository: Path, tmp_path: Path, home: Path, bin_dir: Path,
                                               simulated: Path, deployed: Path, logs: Path) -> None:
    """Both runs ran the FAB `flwr build` makes (its files, by its hash) in the environment without fedroute."""
    import hashlib

    from test_fab import _built_fab

    fab_hash = hashlib.sha256(_built_fab(repository, tmp_path / "fab").read_bytes()).hexdigest()
    for directory in (simulated, deployed):
        config = json.loads((directory / "config.json").read_text())
        assert config["python"] == str(bin_dir / "python"), config["python"]
        assert Path(config["app_files"]).name == f"fedroute.fedroute.0.1.0.{fab_hash[:8]}", config["app_files"]
        assert config["federation"] == {"num_clients": NUM_NODES, "num_nodes": NUM_NODES, "source": "num-partitions"}
    assert config["app_files"].startswith(str(home / "apps"))
    for log in ("superlink", *(f"supernode-{index}" for index in range(NUM_NODES))):
        assert f"$ {bin_dir}/flower-" in (logs / f"{log}.log").read_text(), log


def test_lost_supernode_is_left_out_and_resumes_its_state_after_restart(repository: Path, tmp_path: Path) -> None:
    rounds = 5
    expected = _simulated_routes(repository, rounds)
    # Premise (undisturbed run): in the round of the kill, the victim is alone in cluster 1.
    assert expected[KILL_ROUND_INDEX].tolist() == [0, 0, 1]
    state_dir, logs, results_root = tmp_path / "state", tmp_path / "logs", tmp_path / "results"
    config = {**CONFIG, "num-server-rounds": rounds, "round-timeout": 60.0, "min-train-nodes": 2,
              "results-dir": str(results_root)}
    outcome: dict[str, Any] = {}
    with LocalFederation(repository, NUM_NODES, state_dir=state_dir, log_dir=logs) as federation:
        runner = threading.Thread(target=lambda: outcome.update(result=federation.run(config, timeout=420)))
        runner.start()
        try:
            # Between rounds: the victim has stored its state of the round before the kill ...
            _wait(lambda: _last_round(state_dir, VICTIM) >= KILL_ROUND_INDEX - 1, 240, "the victim's state", logs)
            assert _last_round(state_dir, VICTIM) == KILL_ROUND_INDEX - 1
            previous = set(federation.clientapp_pids(VICTIM))
            # ... and its SuperNode has just started the ClientApp of the next round (which needs
            # more than a second to import before it can even fetch its message): take it away.
            _wait(lambda: bool(set(federation.clientapp_pids(VICTIM)) - previous), 60, "the next ClientApp", logs)
            assert federation.kill_supernode(VICTIM, signal.SIGTERM) == 0  # graceful: deregistered
            assert federation.supernode_pid(VICTIM) is None
            # The others finish the round without it (the SuperLink answers the lost message with an error).
            _wait(lambda: all(_last_round(state_dir, c) >= KILL_ROUND_INDEX for c in range(NUM_NODES) if c != VICTIM),
                  60, "the round without the victim", logs)
            assert _last_round(state_dir, VICTIM) == KILL_ROUND_INDEX - 1
            federation.restart_supernode(VICTIM)  # same partition and state-dir, a new node ID
        finally:
            runner.join()
        home = federation.flwr_home
    assert not _home_processes(home), "a process of the deployment outlived the federation"
    directory = _results(outcome["result"], results_root, logs)

    table = pd.read_csv(directory / "rounds.csv").set_index("round_index")
    routes = pd.read_csv(directory / "routes.csv").pivot(index="round_index", columns="client_id", values="cluster")
    # Before the loss the deployment follows the undisturbed run exactly.
    np.testing.assert_array_equal(routes.loc[: KILL_ROUND_INDEX - 1].to_numpy(), expected[:KILL_ROUND_INDEX])
    # The round of the loss: only the others' replies, the victim's lost message is rejected,
    # and the victim's cluster (cluster 1, nobody else routed there) is untouched.
    lost = table.loc[KILL_ROUND_INDEX]
    assert lost.num_replies == NUM_NODES - 1 and lost.rejected == 1
    assert np.isnan(routes.loc[KILL_ROUND_INDEX, VICTIM])
    assert routes.loc[KILL_ROUND_INDEX].drop(VICTIM).tolist() == expected[KILL_ROUND_INDEX][:VICTIM].tolist()
    assert (lost.routed_0, lost.routed_1, bool(lost.changed_0), bool(lost.changed_1)) == (2, 0, True, False)
    # Back after the restart: its controller state continued from the state file (rounds played
    # before the loss + 1, where a fresh start would report 1).
    back = [t for t in routes.index if t > KILL_ROUND_INDEX and not np.isnan(routes.loc[t, VICTIM])]
    assert back, "the restarted SuperNode never took part again"
    assert table.loc[back[0]].num_replies == NUM_NODES
    assert table.loc[back[0]].min_rounds_played == KILL_ROUND_INDEX + 1
    assert table.loc[back[0]].max_rounds_played == back[0] + 1
    final_state = _state_rounds(state_dir, VICTIM)
    assert max(final_state) == rounds - 1
    # It played every round it was connected for (the server does not wait for a lost node, so it
    # may miss more than the round of the loss), and no other.
    played = int(routes[VICTIM].notna().sum())
    assert int(final_state[rounds - 1]["rounds_played"][0]) == played and played < rounds
    summary = json.loads((directory / "summary.json").read_text())["exp3"]
    assert summary["evaluated_clients"] == NUM_NODES and summary["rejected_replies"] == 1


def test_every_process_stops_when_the_body_fails(repository: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with LocalFederation(repository, 1, log_dir=tmp_path / "logs") as federation:
            home = federation.flwr_home
            assert federation.online_supernodes() == 1 and len(_home_processes(home)) >= 3  # link, node, exec
            raise RuntimeError("boom")
    assert not _home_processes(home)
    assert not home.exists()  # its own temporary FLWR_HOME is removed
