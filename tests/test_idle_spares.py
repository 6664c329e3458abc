"""Idle spares restart (``restart_idle_spares``): a spare cluster every client that trained it has left returns to
its start model, in the core step and in both runtimes."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from numpy.typing import ArrayLike

from fedroute.core.federation import FederationState
from fedroute.core.controllers import consolidating_greedy_routes
from fedroute.core.health import ClusterHealth, duplicate_twins, idle_spares
from fedroute.core.influence import InfluenceBounds
from fedroute.core.methods import PRESETS, method_settings
from fedroute.core.participation import Participation
from fedroute.core.server_step import RoundReplies, ServerState, server_init, server_step
from fedroute.simulation.simulator import simulate
from support.builtin_runs import boundaries_in_both_runtimes

pytestmark = pytest.mark.usefixtures("task_identity")


# --------------------------------------------------------------------------- #
# idle_spares
# --------------------------------------------------------------------------- #
def test_a_spare_no_clients_latest_route_lies_on_is_idle() -> None:
    spare = np.array([[False, True, True]])
    idle = idle_spares(spare, np.array([0, 0, 2, -1]), np.zeros(4, dtype=np.int64), 1)
    assert idle.tolist() == [[False, True, False]]          # cluster 2 still carries a client's latest route


def test_a_stale_clients_latest_route_keeps_its_cluster_however_old() -> None:
    """Partial participation: a group absent from the recent rounds still holds its cluster (the latest route
    counts, not whether the report is within the estimate's window)."""
    federation = FederationState.of_clients(np.arange(4), 3).record(np.array([3]), 0, np.array([2]), np.array([2]),
                                                                   np.ones(1))
    federation = federation.record(np.arange(3), 500, np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64),
                                   np.ones(3))
    assert not federation.counted(500, 10)[3]                            # client 3's report is long out of the window
    idle = idle_spares(np.array([[False, True, True]]), federation.route, federation.run_index, 1)
    assert idle.tolist() == [[False, True, False]]


def test_clients_that_never_reported_and_other_runs_do_not_count() -> None:
    spare = np.array([[True, True], [True, True]])
    idle = idle_spares(spare, np.array([-1, 1, 0]), np.array([0, 0, 1]), 2)
    assert idle.tolist() == [[True, False], [False, True]]


def test_a_cluster_that_is_not_spare_is_never_idle() -> None:
    assert not idle_spares(np.zeros((1, 3), dtype=bool), np.full(5, -1), np.zeros(5, dtype=np.int64), 1).any()


# --------------------------------------------------------------------------- #
# server_step
# --------------------------------------------------------------------------- #
SETTINGS = method_settings("exp3", num_clusters=3)


def _spare_state(num_clients: int, spare: list[bool], routes: ArrayLike) -> ServerState:
    federation = FederationState.of_clients(np.arange(num_clients), 3).record(
        np.arange(num_clients), 0, np.asarray(routes), np.asarray(routes), np.ones(num_clients),
        np.full((num_clients, 3), 0.5))
    state = server_init(federation, 1, 3, SETTINGS)
    health = replace(ClusterHealth.initial(1, 3), spare=np.array([spare]), settled=np.ones(1, dtype=bool),
                     known_clients=np.array([num_clients]))
    return replace(state, health=health)


def _round(state: ServerState, models: np.ndarray, start: np.ndarray, settings=SETTINGS, t: int = 1):
    routes = np.array([0, 0, 0, 1, 1, 1])
    losses = np.where(routes[:, None] == np.arange(3), 0.1, 3.0)
    replies = RoundReplies(rows=np.arange(6), routes=routes, preferred=routes, num_examples=np.ones(6), losses=losses,
                           trained_models=models[routes] + 0.5)
    return server_step(models, state, replies, t, settings, Participation(), InfluenceBounds(), start_models=start)


def test_the_server_step_returns_an_idle_spare_to_its_start_model() -> None:
    """Cluster 2 was trained by clients who all moved to clusters 0 and 1; it is spare: it restarts."""
    start = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    models = np.array([[0.3, 0.1], [1.2, 0.8], [7.0, -3.0]])        # cluster 2 trained away from its start
    state = _spare_state(6, [False, False, True], [0, 0, 0, 1, 1, 2])
    outcome, after = _round(state, models, start)
    assert after.health.spare[0, 2]
    np.testing.assert_array_equal(outcome.models[2], start[2])
    np.testing.assert_allclose(outcome.models[:2], models[:2] + 0.5)  # the clusters in use train as before
    assert outcome.restarted.tolist() == [False, False, True]
    again, _ = _round(after, outcome.models, start, t=2)               # already at its start: nothing to say
    assert again.restarted is None
    np.testing.assert_array_equal(again.models[2], start[2])


def test_without_the_option_or_in_the_presets_the_spare_keeps_its_model() -> None:
    start = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    models = np.array([[0.3, 0.1], [1.2, 0.8], [7.0, -3.0]])
    state = _spare_state(6, [False, False, True], [0, 0, 0, 1, 1, 2])
    outcome, _ = _round(state, models, start, replace(SETTINGS, restart_idle_spares=False))
    np.testing.assert_array_equal(outcome.models[2], models[2])
    assert outcome.restarted is None
    assert not any(method_settings("exp3", preset=preset).restart_idle_spares for preset in PRESETS)
    assert method_settings("exp3").restart_idle_spares and not method_settings("greedy").restart_idle_spares


def test_a_spare_that_a_clients_latest_route_still_lies_on_keeps_its_model() -> None:
    start = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    models = np.array([[0.3, 0.1], [1.2, 0.8], [7.0, -3.0]])
    federation = FederationState.of_clients(np.arange(7), 3).record(
        np.arange(7), 0, np.array([0, 0, 0, 1, 1, 1, 2]), np.array([0, 0, 0, 1, 1, 1, 2]), np.ones(7),
        np.full((7, 3), 0.5))
    state = replace(_spare_state(6, [False, False, True], [0, 0, 0, 1, 1, 1]), federation=federation)
    state = replace(state, health=replace(state.health, known_clients=federation.known_clients()))
    outcome, after = _round(state, models, start)                      # client 6 does not play: its route stays
    assert after.health.spare[0, 2]
    np.testing.assert_array_equal(outcome.models[2], models[2])


def test_the_server_step_needs_the_start_models_with_the_option() -> None:
    state = _spare_state(6, [False, False, True], [0, 0, 0, 1, 1, 2])
    models = np.zeros((3, 2))
    with pytest.raises(ValueError, match="restart_idle_spares needs start_models"):
        _round(state, models, None)
    with pytest.raises(ValueError, match=r"got \(2, 2\)"):
        _round(state, models, np.zeros((2, 2)))


def test_batched_runs_restart_only_their_own_idle_spares() -> None:
    start = np.arange(12, dtype=np.float64).reshape(2, 3, 2)
    models = start + 5.0
    federation = FederationState.of_clients(np.tile(np.arange(3), 2), 3, np.repeat([0, 1], 3)).record(
        np.arange(6), 0, np.array([0, 0, 1, 0, 0, 2]), np.array([0, 0, 1, 0, 0, 2]), np.ones(6),
        np.full((6, 3), 0.5))
    state = server_init(federation, 2, 3, SETTINGS)
    state = replace(state, health=replace(ClusterHealth.initial(2, 3), spare=np.array([[False, False, True]] * 2),
                                          settled=np.ones(2, dtype=bool), known_clients=np.array([3, 3])))
    replies = RoundReplies(rows=np.array([0, 3]), routes=np.array([0, 0]), preferred=np.array([0, 0]),
                           num_examples=np.ones(2), losses=np.full((2, 3), 0.5),
                           trained_models=np.stack([models[0, 0], models[1, 0]]), run_index=np.array([0, 1]))
    outcome, _ = server_step(models, state, replies, 1, SETTINGS, Participation(), InfluenceBounds(), num_runs=2,
                             start_models=start)
    np.testing.assert_array_equal(outcome.models[0, 2], start[0, 2])  # run 0: nobody's latest route on cluster 2
    np.testing.assert_array_equal(outcome.models[1, 2], models[1, 2])  # run 1: client 5's latest route is there
    assert outcome.restarted.tolist() == [[False, False, True], [False, False, False]]


# --------------------------------------------------------------------------- #
# A spare is not the duplicate test's third cluster
# --------------------------------------------------------------------------- #
# Clusters 0 and 1 hold two halves of one group (each half's clients find the other half 4x their own loss),
# cluster 2 is a spare at a warm start's model (5x: not twice as far as the other half), cluster 3 is another
# group's (50x).
HALVES = np.array([[0.1, 0.4, 0.5, 5.0]] * 3 + [[0.4, 0.1, 0.5, 5.0]] * 3 + [[5.0, 5.0, 3.0, 0.1]] * 3)
HALVES_PREFERRED = np.array([0, 0, 0, 1, 1, 1, 3, 3, 3])
HALVES_MASSES = np.array([[1 / 3, 1 / 3, 0.0, 1 / 3]])


def test_a_spare_near_a_split_group_does_not_hide_the_duplicates() -> None:
    run_index = np.zeros(9, dtype=np.int64)
    plain = duplicate_twins(HALVES, HALVES_PREFERRED, run_index, HALVES_MASSES, 1, 2.0)
    assert plain.tolist() == [[-1, -1, -1, -1]]                          # the spare is the nearest third
    skipped = duplicate_twins(HALVES, HALVES_PREFERRED, run_index, HALVES_MASSES, 1, 2.0,
                              np.array([[False, False, True, False]]))
    assert skipped.tolist() == [[-1, 0, -1, -1]]                         # against another group's model: twins
    another_group = duplicate_twins(HALVES, HALVES_PREFERRED, run_index, HALVES_MASSES, 1, 2.0,
                                    np.array([[False, False, False, True]]))
    assert another_group.tolist() == [[-1, -1, -1, -1]]                  # only spares are skipped


def test_the_only_third_cluster_counts_even_when_it_is_spare() -> None:
    losses, run_index = HALVES[:6, :3], np.zeros(6, dtype=np.int64)
    masses = np.array([[0.5, 0.5, 0.0]])
    assert duplicate_twins(losses, HALVES_PREFERRED[:6], run_index, masses, 1, 2.0,
                           np.array([[False, False, True]])).tolist() == [[-1, -1, -1]]


def test_a_clients_consolidation_skips_a_spare_as_its_third_cluster_too() -> None:
    merged = np.array([False, True, False, False])                      # cluster 1 merged into cluster 0
    clients = HALVES[3:6]                                                # the merged half's clients
    stays = consolidating_greedy_routes(clients, merged, None, 2.0, relative=True)
    assert stays.tolist() == [1, 1, 1]                                   # the spare near third keeps them
    moves = consolidating_greedy_routes(clients, merged, None, 2.0, relative=True,
                                        not_third=np.array([[False, False, True, False]]))
    assert moves.tolist() == [0, 0, 0]


# --------------------------------------------------------------------------- #
# Flower ≡ simulator
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("fraction, seed, num_clusters", [(1.0, 4, 5), (0.5, 6, 4)])
def test_flower_equals_the_simulator_through_a_restart(fraction: float, seed: int, num_clusters: int,
                                                       caplog: Any) -> None:
    rounds = 12
    with caplog.at_level(logging.INFO, logger="fedroute"):
        settings, strategy, history = boundaries_in_both_runtimes(seed, fraction, num_clusters, rounds)
    assert settings.routing["exp3"].restart_idle_spares                  # the generic default's
    participation = Participation(fraction, 2)
    for t in range(rounds):
        played = np.flatnonzero(history.played[t])
        assert [strategy.client_routes[t][c] for c in played] == history.routes[t, played].tolist(), t
    final = np.stack([m["weights"] for m in strategy.cluster_models])
    np.testing.assert_allclose(final, history.cluster_models[-1], rtol=0, atol=1e-9)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("spare restarted")]
    assert logged and "returns to its start model" in logged[0]          # a restart happened, and was said
    restarted = int(logged[0].split("cluster ")[1].split()[0])
    without = simulate(settings.task, replace(settings.routing["exp3"], restart_idle_spares=False), rounds, seed,
                       participation=participation)
    assert not np.allclose(without.cluster_models[-1][restarted], history.cluster_models[-1][restarted])
    np.testing.assert_array_equal(history.cluster_models[-1][restarted], history.cluster_models[0][restarted])


def test_a_strategy_driven_without_start_takes_its_first_models_as_the_start() -> None:
    """A user's own loop may call the strategy's step without ``start()``: the first models it aggregates from are
    the start an idle spare returns to (not a refused step), and a later step keeps them."""
    from fedroute.strategies.algorithms import StepRules, routing_step
    from fedroute.strategies.state import RunState

    routing = method_settings("exp3", num_clusters=3)
    state = RunState.new(routing, Participation())
    first = [{"w": np.full(2, float(k))} for k in range(3)]
    state.cluster_models = first
    rules = StepRules(routing, Participation(), InfluenceBounds())
    routing_step(state, 0, [], rules)
    np.testing.assert_array_equal(state.start_models, np.stack([m["w"] for m in first]))
    state.cluster_models = [{"w": np.full(2, 9.0)} for _ in range(3)]
    routing_step(state, 1, [], rules)
    np.testing.assert_array_equal(state.start_models, np.stack([m["w"] for m in first]))
