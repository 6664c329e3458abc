"""Faults with real processes: SuperNodes lost mid-round, the server side killed mid-run and resumed.

Real ``flower-superlink`` / ``flower-supernode`` processes on 127.0.0.1
(:class:`~fedroute.deployment.local.LocalFederation`), 3 SuperNodes and 4–5 rounds:
deployment rounds take 10–30 s on a loaded 2-core machine (a ClientApp process
per message, Flower's 3 s polls), so the waits are generous.  The configuration
is :mod:`support.deployment`'s: client 2 routes alone to cluster 1 in round
index 2, client 1 shares cluster 0 with client 0.

One test per scenario: each runs one federation and checks every kind of
fault of its scenario in that run (both ways a SuperNode goes away in one
round; the SuperLink killed while the SuperNodes stay up, then a SuperNode
restarted without its in-memory state, before the resumed run).
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fedroute.deployment.local import LocalFederation
from support.app_config import app_run_config
from support.deployment import (
    CONFIG,
    KILL_ROUND_INDEX,
    NUM_NODES,
    VICTIM,
    checkpoint_round,
    home_processes,
    last_round,
    log_tails,
    results_dir,
    simulated_routes,
    state_rounds,
    wait_for,
)
from support.grid import SERVER_RUN_ID, builtin_grid, server_main

pytestmark = pytest.mark.process

DEREGISTERED = 1
"""Client 1's SuperNode is stopped with SIGTERM (it deregisters: the SuperLink answers its message at once);
client 2's (:data:`VICTIM`) with SIGKILL (Flower notices only when its heartbeat expires, ≤ 60 s)."""
SIGNALS = {DEREGISTERED: signal.SIGTERM, VICTIM: signal.SIGKILL}


def _kill_both_mid_round(federation: LocalFederation, state_dir: Path, logs: Path) -> dict[int, int]:
    """Once both victims stored their state of the round before the kill round, kill each SuperNode (with its
    ClientApp) as soon as it starts the ClientApp of the kill round; return victim → SuperNode exit code."""
    wait_for(lambda: all(last_round(state_dir, c) >= KILL_ROUND_INDEX - 1 for c in SIGNALS), 300,
             "the victims' states", logs)
    assert all(last_round(state_dir, c) == KILL_ROUND_INDEX - 1 for c in SIGNALS)
    previous = {c: set(federation.clientapp_pids(c)) for c in SIGNALS}
    codes: dict[int, int] = {}
    killers = []
    pending = set(SIGNALS)
    # A ClientApp needs more than a second to import before it can even fetch its message; the two SuperNodes
    # poll on their own 3 s clocks, so each is killed in its own thread the moment its ClientApp appears.
    wait_for(lambda: not pending or _start_due_kills(federation, previous, pending, codes, killers), 90,
             "the victims' next ClientApps", logs)
    for killer in killers:
        killer.join()
    return codes


def _start_due_kills(federation: LocalFederation, previous: dict[int, set[int]], pending: set[int],
                     codes: dict[int, int], killers: list[threading.Thread]) -> bool:
    for client in sorted(pending):
        if set(federation.clientapp_pids(client)) - previous[client]:
            pending.discard(client)
            killer = threading.Thread(target=lambda c=client: codes.update({c: federation.kill_supernode(c, SIGNALS[c])}))
            killer.start()
            killers.append(killer)
    return not pending


def test_supernodes_lost_mid_round_are_left_out_and_rejoin_with_their_state(flower_app: Path, tmp_path: Path) -> None:
    """In one round, one SuperNode is stopped with SIGTERM and another SIGKILLed, each with its ClientApp.
    The round ends without both, their clusters' updates hold only the third client's reply; both restarted
    nodes (same partition and state-dir, new node ids) rejoin and continue their controller state."""
    rounds = 5
    expected = simulated_routes(rounds)
    # Premise (undisturbed run): in the round of the kill, client 2 is alone in cluster 1, client 1 in cluster 0.
    assert expected[KILL_ROUND_INDEX].tolist() == [0, 0, 1]
    state_dir, logs, results_root = tmp_path / "state", tmp_path / "logs", tmp_path / "results"
    config = {**CONFIG, "num-server-rounds": rounds, "round-timeout": 45.0, "min-train-nodes": 2,
              "results-dir": str(results_root)}
    outcome: dict[str, Any] = {}
    with LocalFederation(flower_app, NUM_NODES, state_dir=state_dir, log_dir=logs) as federation:
        runner = threading.Thread(target=lambda: outcome.update(result=federation.run(config, timeout=600)))
        runner.start()
        try:
            codes = _kill_both_mid_round(federation, state_dir, logs)
            assert codes == {DEREGISTERED: 0, VICTIM: -signal.SIGKILL}  # SIGTERM: a graceful exit
            assert federation.supernode_pid(DEREGISTERED) is None and federation.supernode_pid(VICTIM) is None
            assert last_round(state_dir, VICTIM) == KILL_ROUND_INDEX - 1  # it never finished the round
            federation.restart_supernode(VICTIM)  # at once: Flower still lists the dead node for a while
            # The third client finishes the round without them.
            wait_for(lambda: last_round(state_dir, 0) >= KILL_ROUND_INDEX, 60, "the round without the victims", logs)
            assert last_round(state_dir, DEREGISTERED) == KILL_ROUND_INDEX - 1
            federation.restart_supernode(DEREGISTERED)
        finally:
            runner.join()
        home = federation.flwr_home
    assert not home_processes(home), "a process of the deployment outlived the federation"
    directory = results_dir(outcome["result"], results_root, logs)
    _check_lost_round_and_rejoins(directory, expected, state_dir, logs, rounds)


def _check_lost_round_and_rejoins(directory: Path, expected: np.ndarray, state_dir: Path, logs: Path,
                                  rounds: int) -> None:
    table = pd.read_csv(directory / "rounds.csv").set_index("round_index")
    routes = pd.read_csv(directory / "routes.csv").pivot(index="round_index", columns="client_id", values="cluster")
    clients = pd.read_csv(directory / "clients.csv")
    clients = clients[(clients.phase == "train") & clients.accepted].set_index(["round_index", "client_id"])
    # Before the loss the deployment follows the undisturbed run exactly.
    np.testing.assert_array_equal(routes.loc[: KILL_ROUND_INDEX - 1].to_numpy(), expected[:KILL_ROUND_INDEX])
    # The round of the loss: only client 0's reply; the SIGTERM node's lost message is answered with an error
    # and rejected (the SIGKILLed node's too, if its heartbeat expires before the round timeout); cluster 1
    # (the SIGKILLed client's, nobody else routed there) is untouched, cluster 0 holds client 0's update alone.
    lost = table.loc[KILL_ROUND_INDEX]
    assert lost.num_replies == NUM_NODES - 2 and 1 <= lost.rejected <= 2
    assert np.isnan(routes.loc[KILL_ROUND_INDEX, VICTIM]) and np.isnan(routes.loc[KILL_ROUND_INDEX, DEREGISTERED])
    assert routes.loc[KILL_ROUND_INDEX, 0] == expected[KILL_ROUND_INDEX][0]
    assert (lost.routed_0, lost.routed_1, bool(lost.changed_0), bool(lost.changed_1)) == (1, 0, True, False)
    # Back after the restart: each continues its controller state from its state file (rounds played before
    # the loss + 1, where a fresh start would report 1).  The SIGKILLed client's new node is accepted only
    # once Flower no longer lists the dead one.
    back = {c: [t for t in routes.index if t > KILL_ROUND_INDEX and not np.isnan(routes.loc[t, c])] for c in SIGNALS}
    assert back[DEREGISTERED] and back[VICTIM], f"a restarted SuperNode never took part again: {back}\n{log_tails(logs)}"
    first = back[DEREGISTERED][0]
    assert clients.loc[(first, DEREGISTERED), "rounds_played"] == KILL_ROUND_INDEX + 1
    assert table.loc[first].min_rounds_played == KILL_ROUND_INDEX + 1
    assert table.loc[first].max_rounds_played == first + 1  # client 0 played every round
    assert clients.loc[(back[VICTIM][0], VICTIM), "rounds_played"] >= KILL_ROUND_INDEX + 1
    assert table.loc[back[VICTIM][0]].min_rounds_played >= KILL_ROUND_INDEX + 1
    assert table.loc[max(first, back[VICTIM][0])].num_replies == NUM_NODES
    # Each played every round it was connected for (the server does not wait for a lost node, so it may miss
    # more than the round of the loss), and no other.
    for client in SIGNALS:
        final_state = state_rounds(state_dir, client)
        assert max(final_state) == rounds - 1
        played = int(routes[client].notna().sum())
        assert int(final_state[rounds - 1]["rounds_played"][0]) == played and played < rounds, client
    summary = json.loads((directory / "summary.json").read_text())["exp3"]
    assert summary["evaluated_clients"] == NUM_NODES and summary["evaluation"] == "complete"
    assert summary["rejected_replies"] >= table.rejected.sum() >= lost.rejected


def test_server_side_killed_mid_run_and_restarted_gives_the_uninterrupted_result(
        flower_app: Path, tmp_path: Path, task_identity: None) -> None:
    """The SuperLink (with its SuperExec and the ServerApp) is SIGKILLed after a checkpoint; the SuperNodes
    stay up.  The SuperLink is restarted (same database); then SuperNode 0 is restarted too, so that its
    client's state comes from its state file (run config ``client-state-dir``, as in a simulation, whose
    clients all lose their in-memory state), while the others keep theirs in memory.  Started again with
    the same checkpoint and state directories, the run resumes from the checkpoint, and its ``routes.csv``,
    ``rounds.csv`` (but for timings) and final models equal an uninterrupted run's."""
    rounds = 4
    logs, checkpoints = tmp_path / "logs", tmp_path / "checkpoints"
    config = {**CONFIG, "num-server-rounds": rounds, "checkpoint-dir": str(checkpoints),
              "client-state-dir": str(tmp_path / "state")}
    first: dict[str, Any] = {}
    with LocalFederation(flower_app, NUM_NODES, log_dir=logs) as federation:
        runner = threading.Thread(target=lambda: first.update(result=federation.run(
            {**config, "results-dir": str(tmp_path / "killed")}, timeout=600)), daemon=True)
        runner.start()
        wait_for(lambda: (checkpoint_round(checkpoints) or 0) >= 2, 400, "the checkpoint of round 2", logs)
        assert federation.kill_superlink(signal.SIGKILL) == -signal.SIGKILL
        killed_at = checkpoint_round(checkpoints)
        assert killed_at is not None and 2 <= killed_at < rounds
        assert all(federation.supernode_pid(i) is not None for i in range(NUM_NODES))  # the nodes stay up
        stopped = federation.restart_superlink(wait=True)  # the killed run is stopped, the nodes are back
        assert len(stopped) == 1
        assert federation.kill_supernode(0, signal.SIGTERM) == 0  # deregistered: no stale node to wait for
        federation.restart_supernode(0, wait=True)
        resumed = federation.run({**config, "results-dir": str(tmp_path / "resumed")}, timeout=600)
        runner.join(timeout=120)
        assert not first["result"].completed
    directory = results_dir(resumed, tmp_path / "resumed", logs)
    assert json.loads((directory / "summary.json").read_text())["exp3"]["resumed_from_round"] == killed_at

    # The uninterrupted run, in this process: the same ServerApp and ClientApp code on an in-process grid.
    whole_config = app_run_config(config, **{"checkpoint-dir": "", "client-state-dir": "",
                                             "results-dir": str(tmp_path / "whole")})
    server_main(builtin_grid(NUM_NODES, whole_config), whole_config)
    whole = tmp_path / "whole" / str(SERVER_RUN_ID)
    # Routes and models exactly: the same functions on the same inputs, and a checkpoint is lossless (float64
    # .npz); a difference is a resume bug, not rounding.  The round table's means over replies may add them
    # in arrival order: equal to float64 rounding (1e-12, the runtimes' contract).
    pd.testing.assert_frame_equal(pd.read_csv(directory / "routes.csv"), pd.read_csv(whole / "routes.csv"))
    pd.testing.assert_frame_equal(pd.read_csv(directory / "rounds.csv").drop(columns="seconds"),
                                  pd.read_csv(whole / "rounds.csv").drop(columns="seconds"),
                                  check_exact=False, rtol=1e-12, atol=1e-12)
    expected, actual = np.load(whole / "cluster_models.npz"), np.load(directory / "cluster_models.npz")
    assert sorted(actual.files) == sorted(expected.files)
    for name in expected.files:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)
