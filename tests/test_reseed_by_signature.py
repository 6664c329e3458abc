"""Crowded by clients, and the re-seed by signature: a crowded cluster's clients parted in two on their classes,
each part held on one of the two copies (both runtimes)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from fedroute.core.federation import FederationState
from fedroute.core.health import crowded, reseeding
from fedroute.core.influence import InfluenceBounds
from fedroute.core.methods import method_settings
from fedroute.core.participation import Participation
from fedroute.core.server_step import (RoundReplies, ServerState, crowded_reseeds, preferred_counts, server_init,
                                       server_step)
from fedroute.core.settings import RoutingSettings
from fedroute.core.signature_start import (Signatures, SignatureState, held_routes, hold_rounds, regrouped_state,
                                           signature_step, two_groups)
from fedroute.core.signatures import refined_parts, shared_class_similarity, spectral_parts
from fedroute.server.run_config import parse_run_config
from fedroute.simulation.simulator import simulate
from support.app_config import app_run_config
from support.builtin_runs import builtin_nodes, builtin_run

pytestmark = pytest.mark.usefixtures("task_identity")


def _group_signatures(groups: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Signatures of clients whose classes look alike within a group (each client with its own noise)."""
    rng = np.random.default_rng(seed)
    looks = rng.normal(size=(groups.max() + 1, 4, 8))
    means = looks[groups] + 0.3 * rng.normal(size=(len(groups), 4, 8))
    return means, np.full((len(groups), 4), 10.0)


# --------------------------------------------------------------------------- #
# Crowded by clients
# --------------------------------------------------------------------------- #
def test_a_cluster_with_twice_the_typical_clients_is_crowded_whatever_their_sample_counts() -> None:
    # Two groups of 6 clients on cluster 0, whose samples weigh less than the others' (log-normal counts):
    # 0.39 < 2/K = 0.5 of the mass, but twice the clients of the median cluster in use.
    masses, counts = np.array([0.39, 0.31, 0.30, 0.0]), np.array([12, 6, 6, 0])
    assert crowded(masses).tolist() == [False] * 4
    assert crowded(masses, counts).tolist() == [True, False, False, False]
    signs = np.array([[False, False, False, True]])
    settings = method_settings("exp3", num_clusters=4)
    assert reseeding(masses[None], signs, settings).tolist() == [[-1] * 4]
    assert reseeding(masses[None], signs, settings, None, crowded(masses, counts)[None]).tolist() == [[-1, -1, -1, 0]]


@pytest.mark.parametrize("masses, counts", [
    ([0.25, 0.25, 0.25, 0.25, 0.0, 0.0], [10, 10, 10, 10, 0, 0]),    # K > G: one group per cluster, two spares
    ([0.31, 0.31, 0.31, 0.07], [13, 13, 13, 4]),                     # a minority group's own cluster
    ([0.4, 0.35, 0.25, 0.0], [7, 6, 5, 0]),                          # unequal groups, none 1.5 x the typical
    ([0.3, 0.3, 0.2, 0.2, 0.0, 0.0], [1, 1, 1, 1, 0, 0]),            # one client each
])
def test_one_group_per_cluster_is_not_crowded_by_clients(masses: list[float], counts: list[int]) -> None:
    assert crowded(np.array(masses), np.array(counts)).tolist() == [False] * len(masses)


def test_the_two_fair_shares_rule_still_holds_with_counts() -> None:
    # Two pairs of groups on two clusters, two empty: no cluster stands out among those in use, but each holds
    # two fair shares of the mass.
    assert crowded(np.array([0.5, 0.5, 0.0, 0.0]), np.array([20, 20, 0, 0])).tolist() == [True, True, False, False]
    assert crowded(np.array([[0.5, 0.5, 0.0, 0.0], [0.39, 0.31, 0.3, 0.0]]),
                   np.array([[20, 20, 0, 0], [12, 6, 6, 0]])).tolist() == [[True, True, False, False],
                                                                           [True, False, False, False]]


def test_a_pair_of_duplicates_counts_as_one_cluster_in_the_typical_count() -> None:
    # Group 0 split 3 + 3 over the duplicates 0 and 1 (twins[0] = 1), group 1 alone on cluster 2: the pair serves
    # one group of 6, so cluster 2's 6 clients are typical, not crowded.
    masses, counts = np.array([0.25, 0.25, 0.5]), np.array([3, 3, 6])
    assert crowded(masses, counts).tolist() == [False, False, True]
    assert crowded(masses, counts, np.array([1, -1, -1])).tolist() == [False, False, False]
    settings = method_settings("exp3", num_clusters=3)
    merged = np.array([[True, False, False]])                       # the merged duplicate is a re-seed target
    busy = crowded(masses, counts, np.array([1, -1, -1]))[None]
    assert reseeding(masses[None], merged, settings, None, busy).tolist() == [[-1, -1, -1]]


def test_preferred_counts_count_each_counted_clients_latest_greedy_choice_per_run() -> None:
    federation = FederationState.of_clients(np.arange(6), 3, run_index=np.array([0, 0, 0, 1, 1, 1]))
    federation = federation.record(np.arange(6), 0, np.array([0, 0, 1, 2, 2, 2]), np.array([0, 1, 1, 2, 2, 0]),
                                   np.ones(6))
    counted = np.array([True, True, True, True, True, False])
    assert preferred_counts(federation, counted, 2, 3).tolist() == [[1, 2, 0], [0, 0, 2]]


def test_only_a_reseed_from_a_crowded_source_is_parted_by_signature() -> None:
    sources = np.array([[-1, -1, -1, 0], [-1, -1, -1, 0]])
    masses = np.array([[0.39, 0.31, 0.3, 0.0], [0.34, 0.33, 0.33, 0.0]])
    counts = np.array([[12, 6, 6, 0], [8, 8, 8, 0]])     # run 1's source came from structure, not crowding
    assert crowded_reseeds(sources, crowded(masses, counts)).tolist() == [[-1, -1, -1, 0], [-1, -1, -1, -1]]


# --------------------------------------------------------------------------- #
# Two groups in one cluster's signatures
# --------------------------------------------------------------------------- #
def test_two_groups_part_on_their_signatures_and_one_group_does_not() -> None:
    groups = np.array([0, 1] * 5)
    means, counts = _group_signatures(groups)
    similarity = shared_class_similarity(means, counts)
    labels = refined_parts(similarity, spectral_parts(similarity, 2))
    assert len(set(zip(labels.tolist(), groups.tolist()))) == 2            # the parts are the groups
    assert two_groups(similarity, labels, 0.25)
    for seed in range(50):                                                # one group: its halves are noise
        one = _group_signatures(np.zeros(12, dtype=np.int64), seed)
        similarity = shared_class_similarity(*one)
        assert not two_groups(similarity, refined_parts(similarity, spectral_parts(similarity, 2)), 0.25), seed
    assert not two_groups(np.eye(3), np.zeros(3, dtype=np.int64), 0.25)     # a single part


SETTINGS = RoutingSettings(num_clusters=3, controllers=("gr",), signature_hold_rounds=3, reseed_by_signature=True)


def _signed_state(groups: np.ndarray, routes: np.ndarray) -> tuple[SignatureState, FederationState]:
    federation = FederationState.of_clients(np.arange(len(groups)), 3)
    federation = federation.record(np.arange(len(groups)), 0, routes, routes, np.ones(len(groups)))
    means, counts = _group_signatures(groups)
    state = SignatureState.initial(len(groups), 1).recorded(np.arange(len(groups)), means, counts)
    return replace(state, active=np.array([False])), federation          # a declined run keeps its signatures


def test_a_reseed_holds_each_of_the_sources_two_groups_on_one_copy_then_frees_them() -> None:
    groups = np.array([0, 1, 0, 1, 0, 1, 0, 2, 2])
    routes = np.where(groups == 2, 1, 0)                                 # groups 0 and 1 share cluster 0
    state, federation = _signed_state(groups, routes)
    reseeded = np.array([[-1, -1, 0]])                                   # cluster 2 re-seeded from cluster 0
    state = signature_step(state, federation, np.arange(0), None, 5, np.zeros((3, 2)), 1, SETTINGS, Participation(),
                           reseeded)
    assert state.regroup_round.tolist() == [5]
    assert state.regrouped.tolist() == [0, 2, 0, 2, 0, 2, 0, -1, -1]     # the heavier part (group 0) stays
    for t, expected in ((5, None), (6, state.regrouped), (8, state.regrouped), (9, None)):
        held = held_routes(state, np.arange(9), np.zeros(9, np.int64), t, SETTINGS, Participation())
        assert (held is None) if expected is None else held.tolist() == expected.tolist(), t
    # Under partial participation the hold lasts ⌈h/f⌉ rounds.
    half = Participation(0.5, 2)
    assert hold_rounds(SETTINGS, half) == 6
    assert held_routes(state, np.arange(9), np.zeros(9, np.int64), 11, SETTINGS, half) is not None
    assert held_routes(state, np.arange(9), np.zeros(9, np.int64), 12, SETTINGS, half) is None


def test_a_reseed_from_one_group_or_with_the_option_off_holds_nobody() -> None:
    groups = np.zeros(8, dtype=np.int64)
    state, federation = _signed_state(groups, np.zeros(8, dtype=np.int64))
    assert regrouped_state(state, federation, 0, 0, 2, 5, 0.25) is state
    groups = np.array([0, 1] * 4)
    state, federation = _signed_state(groups, np.zeros(8, dtype=np.int64))
    off = replace(SETTINGS, reseed_by_signature=False)
    after = signature_step(state, federation, np.arange(0), None, 5, np.zeros((3, 2)), 1, off, Participation(),
                           np.array([[-1, -1, 0]]))
    assert after.regroup_round.tolist() == [-1] and (after.regrouped < 0).all()
    # Fewer than two signed clients on the source: nothing to part.
    assert regrouped_state(state, federation, 0, 1, 2, 5, 0.25) is state


def test_a_checkpoint_keeps_the_regroup_and_an_older_one_loads_without_it() -> None:
    groups = np.array([0, 1] * 4)
    state, federation = _signed_state(groups, np.zeros(8, dtype=np.int64))
    state = regrouped_state(state, federation, 0, 0, 2, 5, 0.25)
    server = replace(server_init(federation, 1, 3), signatures=state)
    loaded = ServerState.from_json(server.to_json()).signatures
    assert loaded.regrouped.tolist() == state.regrouped.tolist() and loaded.regroup_round.tolist() == [5]
    stored = server.to_json()
    del stored["signatures"]["regrouped"], stored["signatures"]["regroup_round"]
    older = ServerState.from_json(stored).signatures
    assert (older.regrouped < 0).all() and older.regroup_round.tolist() == [-1]


def test_the_server_step_parts_a_crowded_source_on_its_signatures() -> None:
    settings = method_settings("exp3", num_clusters=3, collapse_patience=1, signature_hold_rounds=2,
                               crowded_by_clients=True, reseed_by_signature=True)
    groups = np.array([0, 1, 0, 1, 0, 1, 2, 2])
    federation = FederationState.of_clients(np.arange(8), 3)
    state, _ = _signed_state(groups, np.zeros(8, dtype=np.int64))
    server = replace(server_init(federation, 1, 3, settings), signatures=state)
    models = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    routes = np.where(groups == 2, 1, 0)
    losses = np.where(routes[:, None] == np.arange(3), 0.1, 2.0)
    for t in range(3):
        replies = RoundReplies(rows=np.arange(8), routes=routes, preferred=routes, num_examples=np.ones(8),
                               losses=losses, trained_models=models[routes] + 0.1)
        outcome, server = server_step(models, server, replies, t, settings, Participation(), InfluenceBounds(),
                                      start_models=models)
        if server.health.reseeded_from[0, 2] >= 0:
            break
    assert server.health.reseeded_from[0].tolist() == [-1, -1, 0]
    assert server.signatures.regroup_round.tolist() == [t]
    assert sorted(set(zip(groups[:6].tolist(), server.signatures.regrouped[:6].tolist()))) == [(0, 0), (1, 2)]


# --------------------------------------------------------------------------- #
# Flower ≡ simulator
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("fraction, seed", [(1.0, 0), (0.5, 14)])
def test_flower_equals_the_simulator_through_a_reseed_by_signature(fraction: float, seed: int, caplog: Any) -> None:
    run_config = app_run_config({"task": "boundaries", "num-clients": 15, "num-server-rounds": 10, "seed": seed,
                                 "fraction-train": fraction, "preset": "generic", "init": "random",
                                 "num-clusters": 3, "method": "exp3", "signature-hold-rounds": 3,
                                 "collapse-patience": 2, "crowded-by-clients": True, "reseed-by-signature": True})
    settings = parse_run_config(run_config)
    grid = builtin_nodes(run_config, 15, node_seed=3)
    with caplog.at_level(logging.INFO, logger="fedroute"):
        strategy = builtin_run(run_config, "exp3", grid, fraction, num_models=3)
    history = simulate(settings.task, settings.routing["exp3"], 10, seed, participation=Participation(fraction, 2))
    signatures = strategy.state.server.signatures
    assert signatures.regroup_round[0] >= 0                              # a re-seed was parted by signature
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("re-seed by signature:")]
    assert len(logged) == 1 and f"after round {signatures.regroup_round[0]} " in logged[0]
    for t in range(10):
        played = np.flatnonzero(history.played[t])
        assert [strategy.client_routes[t][c] for c in played] == history.routes[t, played].tolist(), t
    np.testing.assert_allclose(np.stack([m["weights"] for m in strategy.cluster_models]),
                               history.cluster_models[-1], rtol=0, atol=1e-9)
    # The held clients trained their copy in the hold's rounds.
    held = dict(zip(strategy.state.server.federation.client_ids.tolist(), signatures.regrouped.tolist()))
    start = int(signatures.regroup_round[0]) + 1
    end = min(9, start - 1 + hold_rounds(settings.routing["exp3"], Participation(fraction, 2)))
    assert any(held[c] >= 0 for t in range(start, end + 1) for c in strategy.client_routes[t])
    for t in range(start, end + 1):
        for client, route in strategy.client_routes[t].items():
            assert held[client] < 0 or route == held[client], (t, client)
