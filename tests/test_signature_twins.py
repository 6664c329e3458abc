"""Duplicates by signature (core/signature_twins.py): a group split over two clusters is held on the larger piece."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from fedroute.core.federation import FederationState
from fedroute.core.methods import PRESETS, method_settings
from fedroute.core.participation import Participation
from fedroute.core.server_step import ServerState, server_init
from fedroute.core.settings import RoutingSettings
from fedroute.core.signature_start import SignatureState, held_routes
from fedroute.core.health import ClusterHealth, update_health
from fedroute.simulation.simulator import simulate
from support.builtin_runs import boundaries_in_both_runtimes
from fedroute.core.signature_twins import MIN_TWIN_CLIENTS, signature_twins, twin_holds, twin_report, twin_sources

pytestmark = pytest.mark.usefixtures("task_identity")

NUM_CLUSTERS = 4


def _signatures(groups: np.ndarray, seed: int = 0, noise: float = 0.05) -> SignatureState:
    """Every client signed: classes look alike within a group, each client with its own label mix."""
    rng = np.random.default_rng(seed)
    num_classes, dim = 4, 8
    looks = rng.normal(size=(groups.max() + 1, num_classes, dim))
    state = SignatureState.initial(len(groups), 1)
    counts = rng.integers(5, 30, size=(len(groups), num_classes)).astype(float)
    return state.recorded(np.arange(len(groups)), looks[groups] + noise * rng.normal(size=(len(groups), num_classes,
                                                                                             dim)), counts)


def _federation(preferred: np.ndarray) -> FederationState:
    state = FederationState.of_clients(np.arange(len(preferred)), NUM_CLUSTERS)
    return state.record(np.arange(len(preferred)), 0, preferred, preferred, np.ones(len(preferred)))


def _masses(preferred: np.ndarray) -> np.ndarray:
    return (np.bincount(preferred, minlength=NUM_CLUSTERS) / len(preferred))[None]


def _twins(groups: np.ndarray, preferred: np.ndarray, seed: int = 0) -> np.ndarray:
    federation = _federation(preferred)
    return signature_twins(_signatures(groups, seed), federation, np.ones(len(groups), dtype=bool),
                           _masses(preferred), 0.25)[0]


def test_a_piece_of_a_group_on_a_spare_cluster_is_the_twin_of_the_groups_cluster() -> None:
    # Three groups of 6; group 2 split 4 + 2 over clusters 2 and 3.
    groups = np.repeat([0, 1, 2], 6)
    preferred = np.array([0] * 6 + [1] * 6 + [2, 2, 3, 2, 3, 2])
    assert _twins(groups, preferred).tolist() == [-1, -1, -1, 2]
    # Split 3 + 2 + 1 over three clusters (K = 6 for three groups): one twin per round, into the largest piece.
    federation_preferred = np.array([0] * 6 + [1] * 6 + [2, 2, 3, 2, 3, 4])
    twins = signature_twins(_signatures(groups), FederationState.of_clients(np.arange(18), 6).record(
        np.arange(18), 0, federation_preferred, federation_preferred, np.ones(18)), np.ones(18, dtype=bool),
        (np.bincount(federation_preferred, minlength=6) / 18)[None], 0.25)[0]
    assert twins[0] == twins[1] == -1 and sorted(twins[twins >= 0].tolist()) == [2] and twins[2] == -1


@pytest.mark.parametrize("seed", range(20))
def test_clusters_that_serve_different_groups_are_never_twins(seed: int) -> None:
    rng = np.random.default_rng(seed)
    groups = np.repeat([0, 1, 2, 3], rng.integers(1, 8, size=4))
    assert (_twins(groups, groups, seed) < 0).all()


def test_a_cluster_two_groups_share_is_not_the_twin_of_either_groups_piece() -> None:
    # Cluster 0 holds group 0 and half of group 1; cluster 1 the other half of group 1: the union is two groups.
    groups = np.array([0] * 6 + [1] * 6 + [2] * 6)
    preferred = np.array([0] * 6 + [0, 0, 0, 1, 1, 1] + [2] * 6)
    assert (_twins(groups, preferred) < 0).all()


def test_fewer_than_three_signed_clients_between_two_clusters_are_no_evidence() -> None:
    assert MIN_TWIN_CLIENTS == 3
    groups = np.array([0, 0, 1, 1, 1, 1])
    preferred = np.array([0, 3, 1, 1, 1, 1])                              # group 0: one client on 0, one on 3
    assert (_twins(groups, preferred) < 0).all()
    signed = _signatures(np.array([0, 0, 0, 1, 1, 1]))
    unsigned = replace(signed, known=np.array([True, True, False, True, True, True]))   # client 2 sent none
    preferred = np.array([0, 3, 0, 1, 1, 1])
    federation = _federation(preferred)
    everyone = np.ones(6, dtype=bool)
    assert signature_twins(signed, federation, everyone, _masses(preferred), 0.25)[0, 3] == 0
    assert (signature_twins(unsigned, federation, everyone, _masses(preferred), 0.25) < 0).all()
    stale = everyone.copy(); stale[2] = False                             # its report no longer counts
    assert (signature_twins(signed, federation, stale, _masses(preferred), 0.25) < 0).all()


def test_the_pieces_clients_are_held_on_the_twin_after_the_patience_and_freed_when_it_ends() -> None:
    groups = np.repeat([0, 1, 2], 6)
    preferred = np.array([0] * 6 + [1] * 6 + [2, 2, 3, 2, 3, 2])
    federation, counted = _federation(preferred), np.ones(18, dtype=bool)
    settings = replace(RoutingSettings(num_clusters=NUM_CLUSTERS, controllers=("gr",), signature_hold_rounds=3),
                       merge_by_signature=True, collapse_patience=3)
    state = _signatures(groups)
    rows, runs = np.arange(18), np.zeros(18, dtype=np.int64)
    for t in range(3):
        assert held_routes(state, rows, runs, t + 1, settings, Participation()) is None, t
        before, state = state, twin_holds(state, federation, counted, _masses(preferred), 0.25)
    routes = held_routes(state, rows, runs, 4, settings, Participation())
    assert routes.tolist() == [-1] * 14 + [2, -1, 2, -1]                # cluster 3's two clients, on cluster 2
    report = twin_report(before, state, 3, federation)
    assert "cluster(s) [3]" in report and "2 signed client(s) held on cluster 2" in report
    assert twin_report(state, state, 3, federation) is None
    # Without the option nobody is held; once the pieces' clients prefer the group's cluster, the hold ends.
    assert held_routes(state, rows, runs, 4, replace(settings, merge_by_signature=False), Participation()) is None
    joined = np.array([0] * 6 + [1] * 6 + [2] * 6)
    after = twin_holds(state, _federation(joined), counted, _masses(joined), 0.25)
    assert held_routes(after, rows, runs, 5, settings, Participation()) is None
    assert "ended" in twin_report(state, after, 3, _federation(joined))


def test_the_twin_state_survives_a_checkpoint_and_an_older_checkpoint_loads_without_it() -> None:
    settings = method_settings("exp3", num_clusters=2)
    assert settings.merge_by_signature
    state = server_init(FederationState.of_clients(np.arange(4), 2), 1, 2, settings)
    signatures = replace(state.signatures.grown(4), twin_target=np.array([-1, 1, -1, 1]),
                         twin_streak=np.array([0, 12, 0, 3]))
    restored = ServerState.from_json(replace(state, signatures=signatures).to_json()).signatures
    np.testing.assert_array_equal(restored.twin_target, [-1, 1, -1, 1])
    np.testing.assert_array_equal(restored.twin_streak, [0, 12, 0, 3])
    stored = replace(state, signatures=signatures).to_json()
    del stored["signatures"]["twin_target"], stored["signatures"]["twin_streak"]
    older = ServerState.from_json(stored).signatures
    assert older.twin_target.tolist() == [-1] * 4 and older.twin_streak.tolist() == [0] * 4


def test_the_presets_do_not_merge_by_signature() -> None:
    assert PRESETS
    for preset in PRESETS:
        assert not method_settings("exp3", num_clusters=3, preset=preset).merge_by_signature


def test_a_cluster_whose_clients_are_held_on_a_twin_is_spare_and_triggers_no_exploration() -> None:
    settings = method_settings("exp3", num_clusters=3, collapse_patience=3)
    health, view = ClusterHealth.initial(1, 3), None
    masses = np.array([[0.55, 0.4, 0.05]])                                 # cluster 2: a group's stragglers
    reach = np.ones((1, 3), dtype=bool)                                     # ... within the crowd's reach
    for _ in range(4):
        health, view = update_health(health, masses, np.full((1, 3), -1), np.array([20]), settings, reach=reach)
    assert view.explore[0] and not view.spare.any()                         # a collapse sign: exploring
    merged = np.array([[False, False, True]])
    health, view = update_health(health, masses, np.full((1, 3), -1), np.array([20]), settings, reach=reach,
                                 merged_by_signature=merged)
    assert view.spare.tolist() == [[False, False, True]] and not view.explore[0]
    sources = twin_sources(replace(_signatures(np.repeat([0, 1, 2], 6)), twin_streak=np.array([0] * 14 + [3, 0, 2, 0]),
                                   twin_target=np.array([-1] * 14 + [2, -1, 2, -1])),
                           _federation(np.array([0] * 6 + [1] * 6 + [2, 2, 3, 2, 3, 2])), np.ones(18, dtype=bool),
                           1, NUM_CLUSTERS, 3)
    assert sources.tolist() == [[False, False, False, False]]              # cluster 3's other client is not held
    sources = twin_sources(replace(_signatures(np.repeat([0, 1, 2], 6)), twin_streak=np.array([0] * 14 + [3, 0, 4, 0]),
                                   twin_target=np.array([-1] * 14 + [2, -1, 2, -1])),
                           _federation(np.array([0] * 6 + [1] * 6 + [2, 2, 3, 2, 3, 2])), np.ones(18, dtype=bool),
                           1, NUM_CLUSTERS, 3)
    assert sources.tolist() == [[False, False, False, True]]               # both held: a piece of group 2


# --------------------------------------------------------------------------- #
# Flower ≡ simulator
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("fraction, seed, num_clusters", [(1.0, 4, 5), (0.5, 4, 6)])
def test_flower_equals_the_simulator_through_a_merge_by_signature(fraction: float, seed: int, num_clusters: int,
                                                                    caplog: Any) -> None:
    with caplog.at_level(logging.INFO, logger="fedroute"):
        settings, strategy, history = boundaries_in_both_runtimes(seed, fraction, num_clusters, 12)
    assert settings.routing["exp3"].merge_by_signature                   # the generic default's
    for t in range(12):
        played = np.flatnonzero(history.played[t])
        assert [strategy.client_routes[t][c] for c in played] == history.routes[t, played].tolist(), t
    np.testing.assert_allclose(np.stack([m["weights"] for m in strategy.cluster_models]),
                               history.cluster_models[-1], rtol=0, atol=1e-9)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("merge by signature")]
    assert logged and "held on cluster" in logged[0]                     # a hold happened, and was said
    without = simulate(settings.task, replace(settings.routing["exp3"], merge_by_signature=False), 12, seed,
                       participation=Participation(fraction, 2))
    assert not np.array_equal(history.routes, without.routes)            # and it changed the routes
