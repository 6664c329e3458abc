"""Checkpoints and client state: atomic files, replayed rounds, and a resumed Flower run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedroute.client.agent import AgentState
from fedroute.client.round import client_round
from fedroute.client.state_store import load_agent_state, save_agent_state
from fedroute.server.launcher import run_flower_app
from fedroute.strategies.checkpoint import load_checkpoint, save_checkpoint
from fedroute.strategies.methods import method_settings
from fedroute.tasks.linear import LinearTask


def test_checkpoint_round_trip_is_atomic(tmp_path: Path) -> None:
    arrays = {"cluster-0/weights": np.arange(3.0), "cluster-1/weights": np.ones(3)}
    save_checkpoint(tmp_path, arrays, {"server_round": 4, "history": [{"a": 1}]})
    save_checkpoint(tmp_path, {**arrays, "cluster-1/weights": np.zeros(3)}, {"server_round": 5, "history": []})
    loaded, meta = load_checkpoint(tmp_path)
    assert meta["server_round"] == 5
    np.testing.assert_array_equal(loaded["cluster-1/weights"], np.zeros(3))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint.npz"]  # no temporary left over
    assert load_checkpoint(tmp_path / "none") is None


def _context() -> Context:
    return Context(run_id=1, node_id=1, node_config={"partition-id": 3}, state=RecordDict(), run_config={})


def test_a_replayed_round_starts_from_the_same_state(tmp_path: Path) -> None:
    task = LinearTask(num_clients=4, init="collapsed")
    settings = method_settings("exp3", "linear", block_length=2)
    client = task.clients(np.array([3]))
    models = task.initial_models(2)
    context = _context()
    results = []
    for round_index in (0, 1, 2, 2):  # the server sends round 2 again
        state = load_agent_state(context, "key", settings, round_index, 3, tmp_path)
        result = client_round(client, state, settings, models, np.array([1.0, 0.0]), round_index, seed=0)
        save_agent_state(context, "key", result.state, round_index, 3, tmp_path)
        results.append(result)
    np.testing.assert_array_equal(results[2].state.exp3_log_weights, results[3].state.exp3_log_weights)
    assert results[2].state.rounds_played[0] == results[3].state.rounds_played[0] == 3
    assert not np.array_equal(results[1].state.exp3_log_weights, np.zeros((1, 2)))  # block end after t = 1
    # Only the newest two rounds stay in Context.state; a fresh context (restarted node) reads the file.
    assert sorted(key for key in context.state.keys()) == ["fedroute-state:key@1", "fedroute-state:key@2"]
    restarted = load_agent_state(_context(), "key", settings, 3, 3, tmp_path)
    np.testing.assert_array_equal(restarted.exp3_log_weights, results[3].state.exp3_log_weights)
    fresh = load_agent_state(_context(), "key", settings, 3, 3, None)
    np.testing.assert_array_equal(fresh.exp3_log_weights, AgentState.initial(1, settings).exp3_log_weights)


def test_resumed_flower_run_equals_an_uninterrupted_one(repository: Path, tmp_path: Path) -> None:
    base = {"method": "exp3", "num-clients": 10, "seed": 2, "block-length": 3}

    def run(rounds: int, name: str, checkpoint: Path | None) -> Path:
        results = tmp_path / name
        config = {**base, "num-server-rounds": rounds, "results-dir": str(results)}
        if checkpoint is not None:
            config.update({"checkpoint-dir": str(checkpoint / "server"), "client-state-dir": str(checkpoint / "clients")})
        outcome = run_flower_app(repository, config, num_supernodes=10, timeout=600)
        assert outcome.completed, outcome.stdout[-3000:]
        (directory,) = list(results.iterdir())
        return directory

    whole = run(9, "whole", None)
    run(4, "first-part", tmp_path / "state")  # the server side stops after round 4 ...
    resumed = run(9, "resumed", tmp_path / "state")  # ... and a new run resumes from its checkpoint
    summary = json.loads((resumed / "summary.json").read_text())["exp3"]
    assert summary["resumed_from_round"] == 4
    expected, actual = np.load(whole / "cluster_models.npz"), np.load(resumed / "cluster_models.npz")
    for key in expected.files:
        np.testing.assert_allclose(actual[key], expected[key], atol=1e-12, rtol=0)
    assert (json.loads((whole / "summary.json").read_text())["exp3"]["recovery_error"]
            == pytest.approx(summary["recovery_error"], abs=1e-12))
