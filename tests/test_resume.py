"""Checkpoints and client state: atomic files, replayed rounds, where a client keeps its state.

A real server side killed mid-run and resumed is ``tests/test_faults.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedroute.core.agent import AgentState
from fedroute.core.client_step import client_round
from fedroute.client.state_store import load_agent_state, save_agent_state, state_directory
from fedroute.strategies.checkpoint import load_checkpoint, save_checkpoint
from fedroute.core.methods import method_settings
from fedroute.tasks.linear import LinearTask
from support.grid import node_context


def test_checkpoint_round_trip_is_atomic(tmp_path: Path) -> None:
    arrays = {"cluster-0/weights": np.arange(3.0), "cluster-1/weights": np.ones(3)}
    save_checkpoint(tmp_path, arrays, {"server_round": 4, "history": [{"a": 1}]})
    save_checkpoint(tmp_path, {**arrays, "cluster-1/weights": np.zeros(3)}, {"server_round": 5, "history": []})
    loaded, meta = load_checkpoint(tmp_path)
    assert meta["server_round"] == 5
    np.testing.assert_array_equal(loaded["cluster-1/weights"], np.zeros(3))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint.npz"]  # no temporary left over
    assert load_checkpoint(tmp_path / "none") is None


def test_a_replayed_round_starts_from_the_same_state(tmp_path: Path) -> None:
    task = LinearTask(num_clients=4, init="collapsed")
    settings = method_settings("exp3", preset="linear", block_length=2)
    client = task.clients(np.array([3]))
    models = task.initial_models(2)
    context = node_context()
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
    restarted = load_agent_state(node_context(), "key", settings, 3, 3, tmp_path)
    np.testing.assert_array_equal(restarted.exp3_log_weights, results[3].state.exp3_log_weights)
    fresh = load_agent_state(node_context(), "key", settings, 3, 3, None)
    np.testing.assert_array_equal(fresh.exp3_log_weights, AgentState.initial(1, settings).exp3_log_weights)


def test_state_in_context_keeps_every_field_and_dtype_and_a_foreign_one_starts_afresh() -> None:
    settings = method_settings("exp3", preset="characters", num_clusters=3)
    state = AgentState.initial(1, settings)
    state.exp3_log_weights[:] = [[0.1, -2.5 / 3]]
    for name, value in (("arm", 1), ("arm_probability", 0.3), ("feedback_sum", 1.25), ("feedback_rounds", 4),
                        ("hysteresis_target", 2), ("hysteresis_count", 3), ("forced_episode", True),
                        ("previous_route", 2), ("rounds_played", 9)):
        getattr(state, name)[:] = value
    context = node_context()
    save_agent_state(context, "key", state, 4, 3)
    loaded = load_agent_state(context, "key", settings, 5, 3)
    for name, value in state.to_arrays().items():
        stored = loaded.to_arrays()[name]
        assert stored.dtype == value.dtype and stored.shape == value.shape, name
        np.testing.assert_array_equal(stored, value, err_msg=name)
    # Another controller set (three arms instead of two): the stored state is not misread.
    other = method_settings("exp3", preset="characters", num_clusters=3)
    other = type(other).from_dict({**other.to_dict(), "controllers": ("gr", "rh", "hys")})
    fresh = load_agent_state(context, "key", other, 5, 3)
    np.testing.assert_array_equal(fresh.exp3_log_weights, np.zeros((1, 3)))
    assert fresh.rounds_played[0] == 0


def test_the_state_directory_is_the_node_configs_else_the_run_configs() -> None:
    """A SuperNode's ``state-dir`` (deployment) wins over the run config's ``client-state-dir`` (simulation,
    where every client shares one), which the real-process resume test uses; neither: no file."""
    context = node_context()
    assert state_directory(context) is None
    context.run_config = {"client-state-dir": "/run/shared"}
    assert state_directory(context) == Path("/run/shared")
    context.node_config = {**context.node_config, "state-dir": "/node/own"}
    assert state_directory(context) == Path("/node/own")
    context.node_config = {**context.node_config, "state-dir": ""}
    assert state_directory(context) == Path("/run/shared")
