"""Faults with real processes: a SuperNode SIGKILLed mid-round, the server side killed mid-run.

Real ``flower-superlink`` / ``flower-supernode`` processes on 127.0.0.1
(:class:`~fedroute.server.deploy.LocalFederation`), 3 SuperNodes and 4–5 rounds:
deployment rounds take 10–30 s on a loaded 2-core machine (a ClientApp process
per message, Flower's 3 s polls), so the waits are generous.  The configuration
is that of ``tests/test_deployment.py``: client 2 routes alone to cluster 1 in
round index 2.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedroute.server.deploy import LocalFederation
from fedroute.strategies.checkpoint import load_checkpoint
from test_deployment import (
    CONFIG,
    KILL_ROUND_INDEX,
    NUM_NODES,
    VICTIM,
    _home_processes,
    _last_round,
    _log_tails,
    _results,
    _simulated_routes,
    _wait,
)
from test_security import InProcessGrid, _server_main, server_identity  # noqa: F401 (fixture)


def test_supernode_sigkilled_mid_round_the_run_completes_and_it_rejoins_with_its_state(
        repository: Path, tmp_path: Path) -> None:
    """SIGKILL: no deregistration, Flower notices only when the node's heartbeat expires (≤ 60 s)."""
    rounds = 5
    expected = _simulated_routes(repository, rounds)
    assert expected[KILL_ROUND_INDEX].tolist() == [0, 0, 1]  # the victim is alone in cluster 1 then
    state_dir, logs, results_root = tmp_path / "state", tmp_path / "logs", tmp_path / "results"
    config = {**CONFIG, "num-server-rounds": rounds, "round-timeout": 45.0, "min-train-nodes": 2,
              "results-dir": str(results_root)}
    outcome: dict[str, Any] = {}
    with LocalFederation(repository, NUM_NODES, state_dir=state_dir, log_dir=logs) as federation:
        runner = threading.Thread(target=lambda: outcome.update(result=federation.run(config, timeout=600)))
        runner.start()
        try:
            _wait(lambda: _last_round(state_dir, VICTIM) >= KILL_ROUND_INDEX - 1, 300, "the victim's state", logs)
            previous = set(federation.clientapp_pids(VICTIM))
            # The victim's SuperNode has started the ClientApp of the kill round: take the whole node away.
            _wait(lambda: bool(set(federation.clientapp_pids(VICTIM)) - previous), 90, "the next ClientApp", logs)
            assert federation.kill_supernode(VICTIM, signal.SIGKILL) == -signal.SIGKILL
            assert _last_round(state_dir, VICTIM) == KILL_ROUND_INDEX - 1  # it never finished the round
            federation.restart_supernode(VICTIM)  # at once: Flower still lists the dead node for a while
        finally:
            runner.join()
        home = federation.flwr_home
    assert not _home_processes(home), "a process of the deployment outlived the federation"
    directory = _results(outcome["result"], results_root, logs)

    table = pd.read_csv(directory / "rounds.csv").set_index("round_index")
    routes = pd.read_csv(directory / "routes.csv").pivot(index="round_index", columns="client_id", values="cluster")
    np.testing.assert_array_equal(routes.loc[: KILL_ROUND_INDEX - 1].to_numpy(), expected[:KILL_ROUND_INDEX])
    # The round of the kill ends without the victim; its cluster is untouched.
    lost = table.loc[KILL_ROUND_INDEX]
    assert np.isnan(routes.loc[KILL_ROUND_INDEX, VICTIM]) and lost.num_replies == NUM_NODES - 1
    assert (lost.routed_1, bool(lost.changed_1)) == (0, False)
    # It comes back (as a new node, once the old one is no longer listed) and continues its state:
    # rounds played before the kill + at least the round it is back in (a fresh start reports 1).
    back = [t for t in routes.index if t > KILL_ROUND_INDEX and not np.isnan(routes.loc[t, VICTIM])]
    assert back, f"the restarted SuperNode never took part again\n{_log_tails(logs)}"
    assert table.loc[back[0]].min_rounds_played >= KILL_ROUND_INDEX + 1
    summary = json.loads((directory / "summary.json").read_text())["exp3"]
    assert summary["evaluated_clients"] == NUM_NODES and summary["evaluation"] == "complete"


def test_server_side_killed_mid_run_and_restarted_gives_the_uninterrupted_result(
        repository: Path, tmp_path: Path, server_identity: Any) -> None:  # noqa: F811
    """The SuperLink (with its SuperExec and the ServerApp) is SIGKILLed after a checkpoint; the
    SuperNodes stay up.  Restarted with the same checkpoint and state directories, the run's
    ``routes.csv``, ``rounds.csv`` (but for timings) and final models equal an uninterrupted run's."""
    rounds = 4
    state_dir, logs = tmp_path / "state", tmp_path / "logs"
    checkpoints = tmp_path / "checkpoints"
    config = {**CONFIG, "num-server-rounds": rounds, "checkpoint-dir": str(checkpoints)}
    first: dict[str, Any] = {}
    with LocalFederation(repository, NUM_NODES, state_dir=state_dir, log_dir=logs) as federation:
        runner = threading.Thread(target=lambda: first.update(result=federation.run(
            {**config, "results-dir": str(tmp_path / "killed")}, timeout=600)), daemon=True)
        runner.start()
        _wait(lambda: (_checkpoint_round(checkpoints) or 0) >= 2, 400, "the checkpoint of round 2", logs)
        assert federation.kill_superlink(signal.SIGKILL) == -signal.SIGKILL
        killed_at = _checkpoint_round(checkpoints)
        assert 2 <= killed_at < rounds
        assert all(federation.supernode_pid(i) is not None for i in range(NUM_NODES))  # the nodes stay up
        stopped = federation.restart_superlink(wait=True)  # the killed run is stopped, the nodes are back
        assert len(stopped) == 1
        resumed = federation.run({**config, "results-dir": str(tmp_path / "resumed")}, timeout=600)
        runner.join(timeout=120)
        assert not first["result"].completed
    directory = _results(resumed, tmp_path / "resumed", logs)
    assert json.loads((directory / "summary.json").read_text())["exp3"]["resumed_from_round"] == killed_at

    # The uninterrupted run, in this process: the same ServerApp and ClientApp code on an in-process grid.
    whole_config = {**_defaults(repository), **config, "checkpoint-dir": "", "results-dir": str(tmp_path / "whole")}
    _server_main(InProcessGrid(NUM_NODES, whole_config), whole_config)
    whole = tmp_path / "whole" / "77"
    pd.testing.assert_frame_equal(pd.read_csv(directory / "routes.csv"), pd.read_csv(whole / "routes.csv"))
    pd.testing.assert_frame_equal(pd.read_csv(directory / "rounds.csv").drop(columns="seconds"),
                                  pd.read_csv(whole / "rounds.csv").drop(columns="seconds"))
    expected, actual = np.load(whole / "cluster_models.npz"), np.load(directory / "cluster_models.npz")
    assert sorted(actual.files) == sorted(expected.files)
    for name in expected.files:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def _checkpoint_round(directory: Path) -> int | None:
    try:
        stored = load_checkpoint(directory / "exp3")
    except Exception:  # being replaced at this moment
        return None
    return None if stored is None else int(stored[1]["server_round"])


def _defaults(repository: Path) -> dict[str, Any]:
    import tomllib

    with open(repository / "pyproject.toml", "rb") as stream:
        return tomllib.load(stream)["tool"]["flwr"]["app"]["config"]
