"""Identical clusters share their replies, parted by update direction (fedroute.core.split.partition,
fedroute.core.server_step.copy_routes; the generic default's ``split_copies``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fedroute.core.federation import FederationState
from fedroute.core.influence import InfluenceBounds
from fedroute.core.methods import method_settings
from fedroute.core.participation import Participation
from fedroute.core.server_step import RoundReplies, copy_routes, identical_pools, server_init, server_step
from fedroute.core.split import partition, silhouette, spherical_kmeans


def _groups(rng: np.random.Generator, sizes: tuple[int, ...], dim: int = 30, noise: float = 0.3) -> np.ndarray:
    """Updates of several groups: each a shared direction plus noise, in group order."""
    directions = rng.standard_normal((len(sizes), dim))
    return np.vstack([directions[g] + noise * rng.standard_normal((n, dim)) for g, n in enumerate(sizes)])


def _slow_silhouette(directions: np.ndarray, labels: np.ndarray) -> float:
    """Kaufman and Rousseeuw's definition, written out point by point."""
    distance = 1.0 - directions @ directions.T
    values = []
    for i, label in enumerate(labels):
        own = [j for j in range(len(labels)) if labels[j] == label and j != i]
        if not own:
            values.append(0.0)
            continue
        a = np.mean(distance[i, own])
        b = min(np.mean(distance[i, labels == other]) for other in set(labels) - {label})
        values.append((b - a) / max(a, b))
    return float(np.mean(values))


def test_silhouette_is_kaufman_and_rousseeuws_mean() -> None:
    rng = np.random.default_rng(0)
    updates = _groups(rng, (4, 3, 1, 5), noise=1.0)
    directions = updates / np.linalg.norm(updates, axis=1, keepdims=True)
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 0])
    similarity = directions @ directions.T
    assert silhouette(similarity, labels) == pytest.approx(_slow_silhouette(directions, labels), abs=1e-12)
    assert silhouette(similarity, np.zeros(13, dtype=np.int64)) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_partition_finds_as_many_parts_as_there_are_groups(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = (5, 3, 4)
    updates = _groups(rng, sizes)
    order = rng.permutation(len(updates))
    labels = partition(updates[order], max_parts=5, min_silhouette=0.25)
    groups = np.repeat(np.arange(3), sizes)[order]
    assert labels.max() == 2                                                  # three parts, though five were allowed
    for group in range(3):
        assert len(set(labels[groups == group])) == 1                         # each group whole, in one part
    assert labels[0] == 0 and np.array_equal(partition(updates[order], 5, 0.25), labels)   # numbered, deterministic


def test_partition_keeps_noise_and_too_few_updates_whole_and_respects_the_number_of_parts() -> None:
    rng = np.random.default_rng(1)
    assert not partition(rng.standard_normal((12, 200)), 4, 0.25).any()       # no structure: one part
    assert not partition(_groups(rng, (1, 1)), 4, 0.25).any()                 # two updates: no evidence
    labels = partition(_groups(rng, (4, 4, 4, 4)), max_parts=2, min_silhouette=0.0)
    assert labels.max() == 1                                                  # at most two parts
    assert not partition(_groups(rng, (6, 6)), 1, 0.0).any()
    separated = _groups(rng, (5, 5))
    assert partition(separated, 2, 0.25).max() == 1 and not partition(separated, 2, 0.999).any()


def test_spherical_kmeans_is_deterministic_and_leaves_no_part_empty() -> None:
    rng = np.random.default_rng(2)
    updates = _groups(rng, (3, 3, 3))
    directions = updates / np.linalg.norm(updates, axis=1, keepdims=True)
    labels = spherical_kmeans(directions @ directions.T, 4)
    assert sorted(set(labels.tolist())) == [0, 1, 2, 3]
    np.testing.assert_array_equal(spherical_kmeans(directions @ directions.T, 4), labels)
    # The centres' cosines from the cosines alone equal those of the centres formed explicitly.
    three = spherical_kmeans(directions @ directions.T, 3)
    centres = np.stack([directions[three == p].sum(axis=0) for p in range(3)])
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    np.testing.assert_array_equal(np.argmax(directions @ centres.T, axis=1), three)


def test_identical_pools_group_exactly_equal_models() -> None:
    models = np.array([[1.0, 2.0], [0.0, 1.0], [1.0, 2.0], [0.0, 1.0], [5.0, 5.0], [1.0, 2.0 + 1e-12]])
    assert identical_pools(models) == [[0, 2], [1, 3]]
    # Closer than a step: near copies join (single linkage: 0 ~ 5 ~ 2), far models stay apart.
    assert identical_pools(models, within=1e-6) == [[0, 2, 5], [1, 3]]
    assert identical_pools(models, within=1.5) == [[0, 1, 2, 3, 5]]


def test_near_copies_closer_than_a_step_share_their_replies() -> None:
    rng = np.random.default_rng(6)
    updates = _groups(rng, (4, 4))
    start = np.zeros(updates.shape[1])
    step = float(np.median(np.linalg.norm(updates, axis=1)))
    noise = 0.1 * step * rng.standard_normal((2, len(start))) / np.sqrt(len(start))
    models = start + noise                                                    # a warm start with a little noise
    routes = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    settings = method_settings("exp3", num_clusters=2, split_copies=True, split_near_copies=True)
    replies = RoundReplies(rows=np.arange(8), routes=routes, preferred=routes.copy(), num_examples=np.ones(8),
                           losses=np.zeros((8, 2)), trained_models=models[routes] + updates)
    # The generic default pools equal models only: near copies keep their routes (Greedy's, where they part).
    assert not method_settings("exp3").split_near_copies
    np.testing.assert_array_equal(copy_routes(models, replies, replace(settings, split_near_copies=False)).routes,
                                  routes)
    parted = copy_routes(models, replies, settings)
    assert len(set(parted.routes[:4])) == 1 and len(set(parted.routes[4:])) == 1 and parted.routes[0] != parted.routes[4]
    far = np.stack([start, start + 3 * step / np.sqrt(len(start)) * np.ones(len(start))])  # three steps apart
    far_replies = RoundReplies(rows=np.arange(8), routes=routes, preferred=routes.copy(), num_examples=np.ones(8),
                               losses=np.zeros((8, 2)), trained_models=far[routes] + updates)
    np.testing.assert_array_equal(copy_routes(far, far_replies, settings).routes, routes)


def _replies(start: np.ndarray, updates: np.ndarray, routes: np.ndarray, num_clusters: int = 3) -> RoundReplies:
    m = len(updates)
    return RoundReplies(rows=np.arange(m), routes=routes, preferred=routes.copy(), num_examples=np.ones(m),
                        losses=np.zeros((m, num_clusters)), trained_models=start + updates)


def test_copies_share_their_replies_and_each_group_trains_one_copy() -> None:
    rng = np.random.default_rng(3)
    sizes = (4, 4, 4)
    updates = _groups(rng, sizes)
    groups = np.repeat(np.arange(3), sizes)
    start = rng.standard_normal(updates.shape[1])
    models = np.tile(start, (3, 1))                                           # K = 3 copies of a warm start
    routes = rng.integers(0, 3, len(updates))                                 # random ties: mixed copies
    settings = method_settings("exp3", num_clusters=3, split_copies=True)
    parted = copy_routes(models, _replies(start, updates, routes), settings)
    for group in range(3):
        assert len(set(parted.routes[groups == group])) == 1
    assert len(set(parted.routes.tolist())) == 3
    np.testing.assert_array_equal(parted.preferred, parted.routes)            # a tie among copies: its part's copy
    # On in the generic default, off when asked, and nothing to share when the models differ.
    assert method_settings("exp3").split_copies and not method_settings("greedy").split_copies
    unchanged = copy_routes(models, _replies(start, updates, routes),
                            method_settings("exp3", num_clusters=3, split_copies=False))
    np.testing.assert_array_equal(unchanged.routes, routes)
    distinct = models + 10.0 * np.arange(3)[:, None]                         # models many steps apart
    moved = RoundReplies(rows=np.arange(12), routes=routes, preferred=routes.copy(), num_examples=np.ones(12),
                         losses=np.zeros((12, 3)), trained_models=distinct[routes] + updates)
    np.testing.assert_array_equal(copy_routes(distinct, moved, settings).routes, routes)


def test_a_part_goes_to_the_copy_its_clients_routed_to_and_other_clusters_are_untouched() -> None:
    rng = np.random.default_rng(4)
    updates = _groups(rng, (4, 4))
    start = np.zeros(updates.shape[1])
    models = np.stack([start, start, start + 10.0])                           # clusters 0 and 1 copies; 2 is far
    routes = np.array([1, 1, 1, 0, 0, 0, 0, 2])                               # group 0 mostly on 1, group 1 on 0
    settings = method_settings("exp3", num_clusters=3, split_copies=True)
    parted = copy_routes(models, _replies(start, updates, routes), settings)
    assert parted.routes.tolist() == [1, 1, 1, 1, 0, 0, 0, 2]                 # the reply on cluster 2 stays


def test_the_server_step_trains_each_copy_on_one_group_and_batches_equal_single_runs() -> None:
    rng = np.random.default_rng(5)
    sizes = (3, 3)
    settings = method_settings("exp3", num_clusters=2, split_copies=True)
    runs = []
    for run in range(2):
        updates = _groups(rng, sizes)
        start = rng.standard_normal(updates.shape[1])
        routes = np.array([0, 1, 0, 1, 0, 1])
        runs.append((start, updates, routes))
    singles = []
    for start, updates, routes in runs:
        state = server_init(FederationState.of_clients(np.arange(6), 2), 1, 2, settings)
        outcome, _ = server_step(np.tile(start, (2, 1)), state, _replies(start, updates, routes, 2), 0,
                                 settings, Participation(), InfluenceBounds(), start_models=np.tile(start, (2, 1)))
        means = [start + updates[:3].mean(axis=0), start + updates[3:].mean(axis=0)]
        assert any(np.allclose(outcome.models, np.stack(order)) for order in (means, means[::-1]))
        singles.append(outcome.models)
    state = server_init(FederationState.of_clients(np.tile(np.arange(6), 2), 2, np.repeat([0, 1], 6)), 2, 2,
                        settings)
    starts = np.stack([np.tile(start, (2, 1)) for start, _, _ in runs])
    batch = RoundReplies(
        rows=np.arange(12), routes=np.concatenate([r for _, _, r in runs]),
        preferred=np.concatenate([r for _, _, r in runs]), num_examples=np.ones(12), losses=np.zeros((12, 2)),
        trained_models=np.concatenate([s + u for s, u, _ in runs]), run_index=np.repeat([0, 1], 6))
    outcome, _ = server_step(starts, state, batch, 0, settings, Participation(), InfluenceBounds(), num_runs=2,
                             start_models=starts)
    np.testing.assert_allclose(outcome.models, np.stack(singles), rtol=0, atol=1e-12)
