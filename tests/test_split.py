"""Re-seeding by splitting the crowded cluster's round in two (fedroute.core.split, server_step, health)."""

from __future__ import annotations

import numpy as np
import pytest

from fedroute.core.federation import FederationState
from fedroute.core.health import ClusterHealth, update_health
from fedroute.core.influence import InfluenceBounds
from fedroute.core.methods import method_settings
from fedroute.core.participation import Participation
from fedroute.core.server_step import RoundReplies, ServerState, server_init, server_step
from fedroute.core.split import bipartition, split_models


def _two_groups(rng: np.random.Generator, sizes: tuple[int, int], dim: int = 20, noise: float = 0.3) -> np.ndarray:
    """Updates of two groups: each a shared direction plus noise, rows shuffled."""
    directions = rng.standard_normal((2, dim))
    return np.vstack([directions[g] + noise * rng.standard_normal((n, dim)) for g, n in enumerate(sizes)])


@pytest.mark.parametrize("seed", range(5))
def test_bipartition_separates_two_groups_by_the_direction_of_their_updates(seed: int) -> None:
    rng = np.random.default_rng(seed)
    updates = _two_groups(rng, (6, 3))
    order = rng.permutation(9)
    side = bipartition(updates[order])
    group = (order >= 6)
    assert np.array_equal(side, group) or np.array_equal(side, ~group)
    np.testing.assert_array_equal(bipartition(updates[order]), side)            # deterministic


def test_bipartition_reads_direction_not_length() -> None:
    """Two groups moving the model along orthogonal axes, with lengths that vary tenfold inside each group."""
    lengths = np.array([1.0, 10.0, 3.0, 0.5, 8.0, 2.0])
    updates = np.zeros((6, 3))
    updates[:3, 0], updates[3:, 1] = lengths[:3], lengths[3:]
    side = bipartition(updates)
    assert side.tolist() in ([False] * 3 + [True] * 3, [True] * 3 + [False] * 3)


def test_bipartition_keeps_both_sides_non_empty_and_rejects_fewer_than_two_updates() -> None:
    same = np.tile([1.0, 2.0], (4, 1))                                          # no direction separates them
    side = bipartition(same)
    assert side.any() and not side.all()
    assert bipartition(np.array([[1.0, 0.0], [0.0, 0.0]])).tolist() == [False, True]   # a zero update: a side too
    with pytest.raises(ValueError, match="at least 2 updates"):
        bipartition(np.ones((1, 3)))


def test_split_models_aggregates_each_side_and_keeps_the_heavier_half_on_the_crowded_cluster() -> None:
    start = np.zeros(2)
    replies = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 3.0], [2.0, 0.0], [0.0, 2.0]])
    num_examples = np.array([1.0, 1.0, 1.0, 3.0, 1.0])
    kept, seeded = split_models(start, replies, num_examples, InfluenceBounds())
    # Side y (3 replies, weight 3) vs side x (2 replies, weight 4): x is heavier and stays.
    np.testing.assert_allclose(kept, [(1.0 + 6.0) / 4, 0.0])
    np.testing.assert_allclose(seeded, [0.0, 2.0])
    assert split_models(start, replies[:1], num_examples[:1], InfluenceBounds()) is None   # one reply: copy


def test_split_models_applies_the_influence_bounds_to_each_half() -> None:
    start = np.zeros(2)
    replies = np.array([[0.0, 1.0], [0.0, 100.0], [1.0, 0.0], [1.0, 0.0]])
    kept, seeded = split_models(start, replies, np.ones(4), InfluenceBounds(max_update_norm=1.0))
    halves = sorted([kept.tolist(), seeded.tolist()])
    np.testing.assert_allclose(halves, [[0.0, 1.0], [1.0, 0.0]])                 # the 100-long update clipped to 1


def _crowded_round(settings):
    state = server_init(FederationState.of_clients(np.arange(5), 3), 1, 3)
    health = ClusterHealth.initial(1, 3)
    for _ in range(3):                                                           # settled, calm
        health, _ = update_health(health, np.array([[0.4, 0.3, 0.3]]), np.full((1, 3), -1), np.array([5]), settings)
    state = ServerState(federation=state.federation, estimate=None, health=health, view=None)
    models = np.array([[0.0, 0.0], [5.0, 5.0], [9.0, 9.0]])
    # Cluster 0 is crowded: two groups train it in orthogonal directions; cluster 2 is empty.
    replies = RoundReplies(rows=np.arange(5), routes=np.array([0, 0, 0, 0, 1]), preferred=np.array([0, 0, 0, 0, 1]),
                           num_examples=np.array([2.0, 2.0, 1.0, 1.0, 1.0]),
                           losses=np.tile([0.1, 0.5, 2.0], (5, 1)),
                           trained_models=np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [5.5, 5.5]]))
    return server_step(models, state, replies, 5, settings, Participation(), InfluenceBounds(), start_models=models)


def test_the_server_step_splits_the_crowded_cluster_between_itself_and_the_reseeded_one() -> None:
    assert not method_settings("exp3").reseed_split                            # an option (docs/algorithm.md)
    split = method_settings("exp3", num_clusters=3, collapse_patience=1, reseed_split=True)
    outcome, state = _crowded_round(split)
    assert state.health.reseeded_from[0].tolist() == [-1, -1, 0]
    np.testing.assert_allclose(outcome.models, [[1.0, 0.0], [5.5, 5.5], [0.0, 1.0]])   # halves, not copies
    copied, _ = _crowded_round(method_settings("exp3", num_clusters=3, collapse_patience=1, reseed_by_structure=False))
    np.testing.assert_allclose(copied.models, [[2 / 3, 1 / 3], [5.5, 5.5], [2 / 3, 1 / 3]])


def test_reseed_unwanted_reseeds_a_collapse_sign_held_by_a_straggler() -> None:
    """A cluster only a straggler prefers (p̂ = 0.02, within the crowd's reach) is re-seeded with
    ``reseed_unwanted``; with re-seeding of empty clusters only, the straggler blocks it."""
    masses = np.array([[0.78, 0.2, 0.02]])
    sources = {}
    for unwanted in (True, False):
        settings = method_settings("exp3", num_clusters=3, collapse_patience=3, reseed_unwanted=unwanted)
        health = ClusterHealth.initial(1, 3)
        seeded = []
        for _ in range(3):
            health, _ = update_health(health, masses, np.full((1, 3), -1), np.array([50]), settings)
            seeded.append(int(health.reseeded_from[0, 2]))
        sources[unwanted] = seeded
    assert sources[True] == [-1, -1, 0]                                         # after the patience: from the crowd
    assert sources[False] == [-1, -1, -1]


def test_a_batch_of_runs_splits_each_run_as_it_would_alone() -> None:
    """The simulator's path (``R`` runs, ``run_index``) gives each run the halves it gets alone."""
    settings = method_settings("exp3", num_clusters=3, collapse_patience=1, reseed_split=True)
    alone, _ = _crowded_round(settings)
    health = ClusterHealth.initial(2, 3)
    for _ in range(3):
        health, _ = update_health(health, np.tile([0.4, 0.3, 0.3], (2, 1)), np.full((2, 3), -1), np.array([5, 5]),
                                  settings)
    federation = FederationState.of_clients(np.tile(np.arange(5), 2), 3, np.repeat([0, 1], 5))
    state = ServerState(federation=federation, estimate=None, health=health, view=None)
    models = np.stack([np.array([[0.0, 0.0], [5.0, 5.0], [9.0, 9.0]]),
                       np.array([[0.0, 0.0], [5.0, 5.0], [9.0, 9.0]]) + 1.0])
    trained = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [5.5, 5.5]])
    replies = RoundReplies(rows=np.arange(10), routes=np.tile([0, 0, 0, 0, 1], 2),
                           preferred=np.tile([0, 0, 0, 0, 1], 2), num_examples=np.tile([2.0, 2.0, 1.0, 1.0, 1.0], 2),
                           losses=np.tile([0.1, 0.5, 2.0], (10, 1)), trained_models=np.vstack([trained, trained + 1.0]),
                           run_index=np.repeat([0, 1], 5))
    batched, state = server_step(models, state, replies, 5, settings, Participation(), InfluenceBounds(), num_runs=2,
                                 start_models=models)
    assert state.health.reseeded_from.tolist() == [[-1, -1, 0], [-1, -1, 0]]
    np.testing.assert_allclose(batched.models[0], alone.models)
    np.testing.assert_allclose(batched.models[1], alone.models + 1.0)
