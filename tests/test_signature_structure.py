"""Two groups on one cluster read from the class signatures (core/signature_structure.py), and the re-seed it
sources (core/server_step.py): a minority sharing a majority group's model gets the empty cluster."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fedroute.core.federation import FederationState
from fedroute.core.health import ClusterHealth, update_health
from fedroute.core.influence import InfluenceBounds
from fedroute.core.methods import method_settings
from fedroute.core.participation import Participation
from fedroute.core.server_step import RoundReplies, crowded_reseeds, server_init, server_step
from fedroute.core.signature_start import SignatureState
from fedroute.core.signature_structure import MIN_SIGNED_CLIENTS, SignatureStructure, either_structure

NUM_CLUSTERS = 4


def _signatures(groups: np.ndarray, seed: int = 0, noise: float = 0.05) -> SignatureState:
    """Every client signed: classes look alike within a group, each client with its own label mix."""
    rng = np.random.default_rng(seed)
    num_classes, dim = 4, 8
    looks = rng.normal(size=(groups.max() + 1, num_classes, dim))
    counts = rng.integers(5, 30, size=(len(groups), num_classes)).astype(float)
    return SignatureState.initial(len(groups), 1).recorded(
        np.arange(len(groups)), looks[groups] + noise * rng.normal(size=(len(groups), num_classes, dim)), counts)


def _federation(preferred: np.ndarray) -> FederationState:
    state = FederationState.of_clients(np.arange(len(preferred)), NUM_CLUSTERS)
    return state.record(np.arange(len(preferred)), 0, preferred, preferred, np.ones(len(preferred)))


def _read(groups: np.ndarray, preferred: np.ndarray, seed: int = 0, signatures=None) -> tuple[list, list]:
    structure = SignatureStructure(_signatures(groups, seed) if signatures is None else signatures,
                                   _federation(preferred), np.ones(len(groups), dtype=bool), NUM_CLUSTERS, 0.25)
    read, parted = structure(0)
    return read.tolist(), parted.tolist()


def test_a_minority_sharing_a_majority_groups_cluster_parts_it() -> None:
    # Groups of 9, 9, 9 and 3; the minority (group 3) on group 0's cluster 1, cluster 0 empty.
    groups = np.repeat([0, 1, 2, 3], [9, 9, 9, 3])
    preferred = np.repeat([1, 2, 3, 1], [9, 9, 9, 3])
    read, parted = _read(groups, preferred)
    assert read == [False, True, True, True]                       # 12, 9, 9 signed own clients
    assert parted == [False, True, False, False]


@pytest.mark.parametrize("seed", range(20))
def test_a_cluster_that_serves_one_group_never_parts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(MIN_SIGNED_CLIENTS, 16, size=NUM_CLUSTERS)
    groups = np.repeat(np.arange(NUM_CLUSTERS), sizes)
    assert _read(groups, groups, seed, _signatures(groups, seed, noise=0.3))[1] == [False] * NUM_CLUSTERS


def test_too_few_signed_clients_or_a_lone_client_are_no_evidence() -> None:
    # Seven own clients (one short of MIN_SIGNED_CLIENTS): not read, whatever they show.
    groups = np.repeat([0, 1], [4, 3])
    assert MIN_SIGNED_CLIENTS == 8 and _read(groups, np.zeros(7, dtype=np.int64)) == ([False] * 4, [False] * 4)
    # One client of another group among nine: a side of one is not a group.
    groups = np.repeat([0, 1], [9, 1])
    read, parted = _read(groups, np.zeros(10, dtype=np.int64))
    assert read[0] and not parted[0]
    # Unsigned clients and stale reports do not count.
    groups = np.repeat([0, 1], [6, 4])
    signed = _signatures(groups)
    assert _read(groups, np.zeros(10, dtype=np.int64), signatures=signed)[1][0]
    unsigned = replace(signed, known=np.arange(10) < 7)
    assert _read(groups, np.zeros(10, dtype=np.int64), signatures=unsigned) == ([False] * 4, [False] * 4)
    stale = SignatureStructure(signed, _federation(np.zeros(10, dtype=np.int64)), np.arange(10) < 7, NUM_CLUSTERS,
                               0.25)
    assert stale(0)[0].tolist() == [False] * 4


def test_the_signatures_add_evidence_of_two_groups_only() -> None:
    directions = lambda run: (np.array([True, True, False, False]), np.array([False, True, False, False]))
    groups = np.repeat([0, 1, 2, 3], [9, 9, 9, 3])
    signatures = SignatureStructure(_signatures(groups), _federation(np.repeat([1, 2, 3, 1], [9, 9, 9, 3])),
                                    np.ones(30, dtype=bool), NUM_CLUSTERS, 0.25)
    read, parted = either_structure(directions, signatures)(0)
    assert parted.tolist() == [False, True, False, False]
    assert read.tolist() == [True, True, False, False]   # clusters 2 and 3 read whole by signature: not counted
    assert either_structure(None, None) is None and either_structure(directions, None) is directions
    read, parted = either_structure(None, signatures)(0)
    assert read.tolist() == parted.tolist() == [False, True, False, False]


def test_an_empty_cluster_is_reseeded_from_the_cluster_the_signatures_part_and_not_declared_spare() -> None:
    settings = method_settings("exp3", num_clusters=NUM_CLUSTERS, collapse_patience=3)
    groups = np.repeat([0, 1, 2, 3], [9, 9, 9, 3])
    preferred = np.repeat([1, 2, 3, 1], [9, 9, 9, 3])
    masses = (np.bincount(preferred, minlength=NUM_CLUSTERS) / 30.0)[None]
    signatures = SignatureStructure(_signatures(groups), _federation(preferred), np.ones(30, dtype=bool),
                                    NUM_CLUSTERS, 0.25)
    whole = lambda run: (np.array([False, True, True, True]), np.zeros(NUM_CLUSTERS, dtype=bool))

    def run(structured) -> tuple[ClusterHealth, np.ndarray]:
        health, sources = ClusterHealth.initial(1, NUM_CLUSTERS), []
        for _ in range(6):
            health, view = update_health(health, masses, np.full((1, NUM_CLUSTERS), -1), np.array([30]), settings,
                                         structured=structured)
            sources.append(health.reseeded_from[0].tolist())
        return health, sources

    # The update directions read every cluster whole: the empty cluster is spare and never re-seeded.
    health, sources = run(whole)
    assert health.spare[0, 0] and all(s == [-1] * NUM_CLUSTERS for s in sources)
    # With the signatures, cluster 1 parts: the empty cluster 0 is re-seeded from it once it is a collapse sign.
    health, sources = run(either_structure(whole, signatures))
    assert [-1, -1, -1, -1] in sources and [1, -1, -1, -1] in sources and not health.spare[0, 0]
    # ... and the re-seed holds the two groups apart (crowded_reseeds counts the parted source as crowded).
    reseeded = np.array([[1, -1, -1, -1]])
    not_crowded = np.zeros((1, NUM_CLUSTERS), dtype=bool)
    assert crowded_reseeds(reseeded, not_crowded).tolist() == [[-1] * NUM_CLUSTERS]
    assert crowded_reseeds(reseeded, not_crowded, signatures).tolist() == [[1, -1, -1, -1]]


def test_the_server_step_reseeds_the_empty_cluster_from_a_minoritys_shared_cluster_and_holds_it_apart() -> None:
    # Groups of 9, 9 and 3; the minority (group 2) on group 0's cluster 1 — not crowded (12 clients against 9, under
    # 1.5× the median cluster's), one update direction — and cluster 0 empty.
    groups = np.repeat([0, 1, 2], [9, 9, 3])
    routes = np.repeat([1, 2, 1], [9, 9, 3])
    signatures = _signatures(groups)
    models = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    losses = np.where(routes[:, None] == np.arange(3), 0.1, 2.0)

    def run(settings) -> tuple:
        federation = FederationState.of_clients(np.arange(21), 3)
        server = replace(server_init(federation, 1, 3, settings),
                         signatures=replace(signatures, active=np.array([False])))   # a declined run's signatures
        for t in range(8):
            replies = RoundReplies(rows=np.arange(21), routes=routes, preferred=routes, num_examples=np.ones(21),
                                   losses=losses, trained_models=models[routes] + 0.1)
            _, server = server_step(models, server, replies, t, settings, Participation(), InfluenceBounds(),
                                    start_models=models)
            if server.health.reseeded_from[0, 0] >= 0:
                return t, server
        return None, server

    settings = method_settings("exp3", num_clusters=3, collapse_patience=2, signature_hold_rounds=2)
    t, server = run(settings)
    assert t is not None and server.health.reseeded_from[0].tolist() == [1, -1, -1]
    assert server.signatures.regroup_round.tolist() == [t]
    held = server.signatures.regrouped
    assert sorted(set(zip(groups[routes == 1].tolist(), held[routes == 1].tolist()))) == [(0, 1), (2, 0)]
    # Without the re-seed by signature the empty cluster is declared spare and nobody moves.
    t, server = run(replace(settings, reseed_by_signature=False))
    assert t is None and server.health.spare[0, 0]
