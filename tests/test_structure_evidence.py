"""Structure evidence: which replies show groups inside a cluster, when a parting counts, spares by evidence.

fedroute.core.server_step._RoundStructure reads a cluster's *own* replies (clients that prefer it); a
parting needs two clients on each side and, to re-seed, two readings in a row
(fedroute.core.health.read_structure); a cluster nobody prefers is spare once every cluster's clients
have been read as one group for the patience.
"""

from __future__ import annotations

import numpy as np

from fedroute.core.federation import FederationState
from fedroute.core.health import ClusterHealth, update_health
from fedroute.core.influence import InfluenceBounds
from fedroute.core.methods import method_settings
from fedroute.core.participation import Participation
from fedroute.core.server_step import RoundReplies, ServerState, _RoundStructure, server_init, server_step

K = 3
NO_TWINS = np.full((1, K), -1)
SETTINGS = method_settings("exp3", num_clusters=K, collapse_patience=2, spare_patience=100)


def _structure(routes, preferred, trained, start=None) -> _RoundStructure:
    models = np.zeros((K, 2)) if start is None else start
    replies = RoundReplies(rows=np.arange(len(routes)), routes=np.asarray(routes), preferred=np.asarray(preferred),
                           num_examples=np.ones(len(routes)), losses=np.ones((len(routes), K)),
                           trained_models=np.asarray(trained, dtype=np.float64))
    return _RoundStructure(models, replies, np.ones(len(routes), dtype=bool), InfluenceBounds(), SETTINGS)


def test_explorers_routed_to_a_cluster_do_not_show_groups_inside_it() -> None:
    """Cluster 0's own clients move it one way; two explorers of another group, routed there by Rank Hedge,
    move it the other way: all its replies part in two, its own replies do not."""
    own = [[1.0, 0.1], [1.0, -0.1], [1.0, 0.0]]
    explorers = [[-0.1, 1.0], [0.1, 1.0]]
    structure = _structure([0] * 5, [0, 0, 0, 1, 1], own + explorers)
    evaluated, parted = structure.structure(0)
    assert evaluated.tolist() == [True, False, False] and parted.tolist() == [False, False, False]
    mixed = _structure([0] * 5, [0] * 5, own + explorers)                 # the same replies, all its own: two groups
    assert mixed.structure(0)[1].tolist() == [True, False, False]


def test_one_client_pointing_elsewhere_is_not_a_group() -> None:
    structure = _structure([0] * 5, [0] * 5, [[1.0, 0.1], [1.0, -0.1], [1.0, 0.0], [1.0, 0.05], [-0.2, 1.0]])
    assert structure.structure(0)[1].tolist() == [False, False, False]
    assert structure.structure(0)[0].tolist() == [True, False, False]


def _reading(evaluated, parted):
    return lambda run: (np.array(evaluated), np.array(parted))


def _settled() -> ClusterHealth:
    health = ClusterHealth.initial(1, K)
    for _ in range(3):
        health, _ = update_health(health, np.array([[0.4, 0.3, 0.3]]), NO_TWINS, np.array([10]), SETTINGS)
    return health


def test_a_parting_re_seeds_only_when_seen_in_two_readings_in_a_row() -> None:
    """Cluster 2 is empty (a collapse sign after the patience); cluster 1 (not crowded: p̂ = 0.5 < 2/3)
    parts once, is read whole, then parts twice: only the second parting in a row re-seeds from it."""
    masses = np.array([[0.5, 0.5, 0.0]])
    health, sources = _settled(), []
    for parted in ([False, True, False], [False, False, False], [False, True, False], [False, True, False]):
        health, _ = update_health(health, masses, NO_TWINS, np.array([10]), SETTINGS,
                                  structured=_reading([True, True, False], parted))
        sources.append(int(health.reseeded_from[0, 2]))
    assert sources == [-1, -1, -1, 1]
    assert not health.parted_before[0, 1] and not health.parted_before[0, 2]   # both renewed by the re-seed


def test_an_empty_cluster_is_spare_once_every_cluster_serves_one_group_and_not_after_groups_show_up() -> None:
    masses = np.array([[0.5, 0.5, 0.0]])                                  # two groups on their own models, K = 3
    health, spare = _settled(), []
    for _ in range(4):
        health, view = update_health(health, masses, NO_TWINS, np.array([10]), SETTINGS,
                                     structured=_reading([True, True, False], [False, False, False]))
        spare.append(bool(health.spare[0, 2]))
    assert spare == [False, False, True, True]                              # sign at round 2, then read apart twice
    assert not view.explore[0]                                              # a spare triggers no exploration
    assert health.reseeded_from[0].tolist() == [-1, -1, -1]
    for _ in range(2):                                                      # cluster 0's clients now part twice
        health, _ = update_health(health, masses, NO_TWINS, np.array([10]), SETTINGS,
                                  structured=_reading([True, True, False], [True, False, False]))
    assert not health.spare[0, 2] and health.reseeded_from[0].tolist() == [-1, -1, 0]


def test_without_structure_evidence_or_with_a_crowded_cluster_the_spare_waits_for_its_budget() -> None:
    for masses, structured in (([0.5, 0.5, 0.0], None),
                               ([0.7, 0.3, 0.0], _reading([True, True, False], [False, False, False]))):
        health = _settled()
        for _ in range(6):
            health, _ = update_health(health, np.array([masses]), NO_TWINS, np.array([10]),
                                      method_settings("exp3", num_clusters=K, collapse_patience=2, spare_patience=100,
                                                      reseed_empty=False), structured=structured)
        assert not health.spare[0, 2]


def test_the_server_step_reads_structure_only_from_a_clusters_own_replies() -> None:
    """End to end: an empty cluster 2 and cluster 0 trained by its own group plus two explorers of group 1;
    the server neither re-seeds nor keeps cluster 2 from becoming spare."""
    settings = method_settings("exp3", num_clusters=K, collapse_patience=1)
    state = server_init(FederationState.of_clients(np.arange(9), K), 1, K)
    state = ServerState(federation=state.federation, estimate=None, health=ClusterHealth.initial(1, K), view=None)
    models = np.array([[0.0, 0.0], [0.0, 0.0], [50.0, 50.0]])
    models[1] += 10.0                                                     # three distinct models, not copies
    trained = [[1.0, 0.0]] * 4 + [[0.0, 1.0]] * 2 + [[10.0, 11.0]] * 3   # one direction per group
    replies = RoundReplies(rows=np.arange(9), routes=np.array([0, 0, 0, 0, 0, 0, 1, 1, 1]),
                           preferred=np.array([0, 0, 0, 0, 1, 1, 1, 1, 1]), num_examples=np.ones(9),
                           losses=np.tile([0.1, 0.1, 2.0], (9, 1)), trained_models=np.array(trained))
    for round_index in range(3):
        _, state = server_step(models, state, replies, round_index, settings, Participation(), InfluenceBounds(),
                                start_models=models)
        assert state.health.reseeded_from[0].tolist() == [-1, -1, -1]
    assert state.health.spare[0].tolist() == [False, False, True]


def test_a_server_state_saved_before_the_structure_evidence_loads_without_it() -> None:
    state = server_init(FederationState.of_clients(np.arange(4), K), 1, K)
    stored = state.to_json()
    del stored["health"]["parted_before"], stored["health"]["read_whole"], stored["health"]["apart_rounds"]
    loaded = ServerState.from_json(stored)
    assert loaded.health.parted_before.tolist() == [[False] * K] and loaded.health.apart_rounds.tolist() == [0]


def test_a_preferred_cluster_not_yet_read_whole_blocks_the_spare_evidence() -> None:
    """Under partial participation cluster 1 (p̂ = 0.5) is never read (too few of its clients a round): nothing is
    known of it, so the empty cluster 2 waits for its budget however often cluster 0 is read whole."""
    masses = np.array([[0.5, 0.5, 0.0]])
    health = _settled()
    for _ in range(6):
        health, _ = update_health(health, masses, NO_TWINS, np.array([10]), SETTINGS,
                                  structured=_reading([True, False, False], [False, False, False]))
    assert not health.spare[0, 2] and health.apart_rounds[0] == 0
    health, _ = update_health(health, masses, NO_TWINS, np.array([10]), SETTINGS,
                              structured=_reading([False, True, False], [False, False, False]))
    health, _ = update_health(health, masses, NO_TWINS, np.array([10]), SETTINGS,
                              structured=_reading([True, False, False], [False, False, False]))
    assert health.apart_rounds[0] == 2 and health.spare[0, 2]            # both read whole: two rounds apart
