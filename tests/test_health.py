"""The evidence of collapse: the start, unwanted clusters, budgets, spares, duplicates, re-seeding (fedroute.core.health)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fedroute.core.agent import AgentState, agent_step
from fedroute.core.federation import FederationState
from fedroute.core.health import (MAX_RESEEDS, ClusterHealth, RoutingView, duplicate_twins, reseeding, routing_view,
                                  update_health)
from fedroute.core.influence import InfluenceBounds
from fedroute.core.methods import method_settings
from fedroute.core.participation import Participation
from fedroute.core.server_step import RoundReplies, ServerState, server_init, server_step

SETTINGS = method_settings("exp3", num_clusters=3, collapse_patience=3, spare_patience=4, duplicate_patience=2,
                           explore_at_start=True)  # the start's rules (an option; off in the generic default)
NO_TWINS = [-1, -1, -1]


def _step(health: ClusterHealth, preferred_masses: list[float], known: int = 10,
          twins: list[int] = NO_TWINS, settings=SETTINGS) -> tuple[ClusterHealth, RoutingView]:
    return update_health(health, np.array([preferred_masses]), np.array([twins], dtype=np.int64), np.array([known]),
                         settings)


def _settled(masses: list[float] = (0.4, 0.3, 0.3)) -> ClusterHealth:
    health = ClusterHealth.initial(1, 3)
    for _ in range(3):
        health, view = _step(health, list(masses))
    assert not view.explore[0] and health.settled[0]
    return health


def test_the_start_explores_until_the_federation_is_calm_for_the_patience() -> None:
    health, explore = ClusterHealth.initial(1, 3), []
    assert routing_view(health, SETTINGS).explore[0]                      # nothing known yet: explore
    for masses in ([0.6, 0.4, 0.0], [0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.5, 0.3, 0.2]):
        health, view = _step(health, masses)
        explore.append(bool(view.explore[0]))
    assert explore == [True, True, True, False, False]                   # calm for 3 rounds: the start is over


def test_a_cluster_nobody_prefers_is_a_collapse_sign_then_spare_when_its_budget_is_spent() -> None:
    health, explore = _settled(), []
    for _ in range(9):
        health, view = _step(health, [0.6, 0.4, 0.0])
        explore.append(bool(view.explore[0]))
    # A collapse sign from its 3rd unwanted round; it explores on its account until 4 exploring rounds are spent.
    assert explore == [False, False, True, True, True, True, False, False, False]
    assert view.spare.tolist() == [[False, False, True]]
    # Wanted for the patience: no longer spare, and a fresh budget for a later collapse.
    for _ in range(3):
        health, view = _step(health, [0.5, 0.3, 0.2])
    assert not view.spare.any() and health.exploring_rounds[0, 2] == 0
    for _ in range(3):
        health, view = _step(health, [0.6, 0.4, 0.0])
    assert view.explore[0]


def test_clients_joining_reconsider_the_spares() -> None:
    health = _settled()
    for _ in range(8):
        health, view = _step(health, [0.6, 0.4, 0.0], known=10)
    assert view.spare[0, 2] and not view.explore[0]
    health, view = _step(health, [0.6, 0.4, 0.0], known=12)              # two clients joined: new evidence
    assert not view.spare[0, 2] and view.explore[0]


def test_a_small_real_group_above_the_threshold_is_no_collapse_sign() -> None:
    health = _settled()
    for _ in range(10):                                                   # 0.2 > 0.4 / 3: wanted
        health, view = _step(health, [0.5, 0.3, 0.2])
    assert not view.explore[0] and not view.spare.any()


def test_duplicates_are_merged_after_their_patience_and_at_once_when_spare() -> None:
    health, merged = _settled(), []
    for _ in range(3):
        health, view = _step(health, [0.5, 0.3, 0.2], twins=[-1, -1, 1])
        merged.append(int(view.merged_into[0, 2]))
    assert merged == [-1, 1, 1]                                           # twins for 2 rounds in a row: merged
    health, view = _step(health, [0.5, 0.3, 0.2], twins=NO_TWINS)
    assert view.merged_into[0, 2] == -1                                   # no longer twins: not merged
    spare = ClusterHealth(**{**vars(health), "spare": np.array([[False, False, True]])})
    _, view = _step(spare, [0.5, 0.3, 0.2], twins=[-1, -1, 1])
    assert view.merged_into[0, 2] == 1                                    # a spare duplicate: at once


def _group_losses(own: float, twin: float, cross: float, groups: list[int], models: list[int]) -> np.ndarray:
    return np.array([[own if models[k] == g else cross for k in range(len(models))] for g in groups])


def test_duplicate_twins_are_two_halves_of_a_group_not_a_noisy_minority_nor_warm_copies() -> None:
    # Group 0 split over clusters 0 and 1; each half's model fits its own clients 5x better than the other half's
    # (an over-parameterised model memorises its clients), other groups' models are 150x worse.
    groups = [0] * 6 + [1] * 6
    losses = np.array([[0.02, 0.1, 3.0]] * 3 + [[0.1, 0.02, 3.0]] * 3 + [[4.0, 4.0, 0.05]] * 6)
    preferred = losses.argmin(axis=1)
    masses = np.bincount(preferred, minlength=3)[None] / len(groups)
    twins = duplicate_twins(losses, preferred, np.zeros(12, np.int64), masses, 1, 2.0)
    assert twins.tolist() in ([[-1, 0, -1]], [[1, -1, -1]])
    # A noisy minority on cluster 2 finds the majority's cluster 0 only 1.5x worse, but the majority finds the
    # minority's model as far as any other: no twins.
    losses = np.array([[0.3, 3.0, 4.0]] * 8 + [[1.5, 3.0, 1.0]] * 2)
    preferred = losses.argmin(axis=1)
    masses = np.bincount(preferred, minlength=3)[None] / 10
    assert (duplicate_twins(losses, preferred, np.zeros(10, np.int64), masses, 1, 2.0) == -1).all()
    # Identical copies (a warm start): no third cluster is far.
    assert (duplicate_twins(np.full((9, 3), 1.0), np.arange(9) % 3, np.zeros(9, np.int64), np.full((1, 3), 1 / 3),
                            1, 2.0) == -1).all()


def test_an_empty_collapse_sign_is_reseeded_from_a_cluster_holding_two_fair_shares() -> None:
    settings = method_settings("exp3", num_clusters=4)
    signs = np.array([[False, False, False, True]])
    np.testing.assert_array_equal(reseeding(np.array([[0.5, 0.25, 0.25, 0.0]]), signs, settings), [[-1, -1, -1, 0]])
    # One group per cluster but for a spare (K > G): no cluster holds two fair shares, nothing is copied.
    np.testing.assert_array_equal(reseeding(np.array([[0.34, 0.33, 0.33, 0.0]]), signs, settings), [[-1] * 4])
    # Lowest-index ties (the paper presets) would give the copy nobody: no re-seeding.
    lowest = method_settings("exp3", num_clusters=4, tie_breaking="lowest")
    np.testing.assert_array_equal(reseeding(np.array([[0.5, 0.25, 0.25, 0.0]]), signs, lowest), [[-1] * 4])


def test_reseeding_is_bounded_per_cluster() -> None:
    settings = method_settings("exp3", num_clusters=3, collapse_patience=1, spare_patience=100)
    health, seeded = _settled([0.4, 0.3, 0.3]), 0
    for _ in range(12):
        health, _ = _step(health, [0.7, 0.3, 0.0], settings=settings)
        seeded += int(health.reseeded_from[0, 2] == 0)
    assert seeded == MAX_RESEEDS


def test_the_server_step_copies_the_crowded_model_into_the_reseeded_cluster() -> None:
    settings = method_settings("exp3", num_clusters=3, collapse_patience=1)
    state = server_init(FederationState.of_clients(np.arange(4), 3), 1, 3)
    state = ServerState(federation=state.federation, estimate=None, health=_settled(), view=None)
    models = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    replies = RoundReplies(rows=np.arange(4), routes=np.array([0, 0, 0, 1]), preferred=np.array([0, 0, 0, 1]),
                           num_examples=np.ones(4), losses=np.tile([0.1, 0.5, 2.0], (4, 1)),
                           trained_models=np.array([[1.5, 1.5]] * 3 + [[2.5, 2.5]]))
    outcome, state = server_step(models, state, replies, 5, settings, Participation(), InfluenceBounds(),
                                 start_models=models)
    np.testing.assert_array_equal(outcome.models, [[1.5, 1.5], [2.5, 2.5], [1.5, 1.5]])   # cluster 2 := cluster 0
    assert state.health.reseeded_from[0].tolist() == [-1, -1, 0]


def test_without_evidence_of_collapse_clients_are_greedy_and_with_it_they_run_exp3() -> None:
    settings = method_settings("exp3", num_clusters=2, explore_at_start=True)
    state = AgentState.initial(4, settings)
    losses = np.array([[1.0, 2.0]] * 4)
    ids = np.arange(4)

    def view(explore: list[bool]) -> RoutingView:
        return RoutingView(explore=np.array(explore), merged_into=np.full((4, 2), -1), spare=np.zeros((4, 2), bool))

    _, decision = agent_step(state, settings, losses, np.array([1.0, 0.0]), 0, ids, 0, view=view([False] * 4))
    assert (decision.routes == 0).all() and (decision.arm == -1).all()
    _, decision = agent_step(state, settings, losses, np.array([1.0, 0.0]), 0, ids, 0, view=None)
    assert (decision.arm >= 0).all()                                # no report yet: the start explores
    _, decision = agent_step(state, settings, losses, np.array([1.0, 0.0]), 0, ids, 0, view=view([True] * 4))
    assert (decision.arm >= 0).all()                                # block start: every client draws an arm
    # One run exploring, one calm (batched runs): each client follows its own run's view.
    _, decision = agent_step(state, settings, losses, np.array([1.0, 0.0]), 0, ids, 0,
                             view=view([True, True, False, False]))
    assert (decision.arm[:2] >= 0).all() and (decision.arm[2:] == -1).all()


def test_a_merged_duplicate_is_skipped_by_greedy_unless_the_twin_is_far_for_that_client() -> None:
    settings = method_settings("exp3", num_clusters=3)
    state = AgentState.initial(2, settings)
    losses = np.array([[0.5, 0.4, 3.0],                             # cluster 1 best, its twin 0 within 2x: skips 1
                       [2.0, 0.4, 3.0]])                            # twin 0 is 5x worse for this client: stays
    view = RoutingView(explore=np.zeros(2, bool), merged_into=np.array([[-1, 0, -1]] * 2),
                       spare=np.array([[False, True, False]] * 2))
    _, decision = agent_step(state, settings, losses, None, 3, np.arange(2), 0, view=view)
    assert decision.routes.tolist() == [0, 1] and decision.preferred.tolist() == [1, 1]


def test_the_server_state_survives_json() -> None:
    state = server_init(FederationState.of_clients(np.zeros(0, dtype=np.int64), 3), 1, 3)
    again = ServerState.from_json(state.to_json())
    assert again.federation.losses.shape == (0, 3) and again.view is None
    health, view = _step(ClusterHealth.initial(1, 3), [0.6, 0.4, 0.0])
    stored = ServerState(federation=state.federation, estimate=None, health=health, view=view)
    restored = ServerState.from_json(stored.to_json())
    for name in ClusterHealth.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(restored.health, name), getattr(health, name), err_msg=name)
    assert routing_view(restored.health, SETTINGS).explore.tolist() == view.explore.tolist()


def test_the_start_explores_only_with_every_client_in_every_round() -> None:
    """Round 0's view is the server's: the start explores under full participation, not under partial
    participation (where collapse signs and re-seeding recover), and never with ``explore_at_start`` off."""
    federation = FederationState.of_clients(np.arange(8), 3)
    full = server_init(federation, 1, 3, SETTINGS, Participation())
    partial = server_init(federation, 1, 3, SETTINGS, Participation(0.25))
    off = server_init(federation, 1, 3, method_settings("exp3", num_clusters=3))   # the generic default: off
    assert full.view.explore.tolist() == [True] and not full.health.settled[0]
    assert partial.view.explore.tolist() == [False] and partial.health.settled[0]
    assert off.view.explore.tolist() == [False]
    assert server_init(federation, 1, 3, method_settings("exp3", preset="linear")).view is None  # presets: no health
    # Under partial participation exploration still returns on a collapse sign.
    health, view = partial.health, partial.view
    for _ in range(SETTINGS.collapse_patience):
        health, view = _step(health, [0.9, 0.1, 0.0])
    assert view.explore[0]


def test_a_small_groups_own_model_is_not_a_collapse_sign() -> None:
    """``within_reach``: a cluster 1 of 12 clients prefers, far worse (≥ ρ) for all others, serves a small group
    and is never unwanted; the same share on a model that the crowded group finds close is a collapse sign."""
    from fedroute.core.health import within_reach

    crowded = np.tile([[0.1, 5.0, 0.15]], (11, 1))                  # 11 clients on cluster 0, cluster 2 close
    minority = np.array([[4.0, 0.3, 3.0]])                          # 1 client whose own model is cluster 1
    losses, preferred = np.vstack([crowded, minority]), np.array([0] * 11 + [1])
    reach = within_reach(losses, preferred, np.zeros(12, np.int64), 1, 3, ratio=2.0)
    assert reach.tolist() == [[False, False, True]]                 # 1 is > 2x for all 11 others; 2 is close
    masses = [11 / 12, 1 / 12, 0.0]
    health, view = ClusterHealth.initial(1, 3), None
    for _ in range(SETTINGS.collapse_patience):
        health, view = update_health(health, np.array([masses]), np.array([NO_TWINS]), np.array([12]), SETTINGS,
                                     reach=reach)
    assert health.unwanted_rounds[0, 1] == 0                        # the small group's model: wanted
    assert health.reseeded_from[0, 2] == 0                          # the empty cluster: re-seeded from the crowded one
    without = ClusterHealth.initial(1, 3)
    for _ in range(SETTINGS.collapse_patience):
        without, _ = update_health(without, np.array([masses]), np.array([NO_TWINS]), np.array([12]), SETTINGS)
    assert without.unwanted_rounds[0, 1] == SETTINGS.collapse_patience  # mass alone: it looked starving


def test_stable_healthy_routes_end_the_start_while_a_small_groups_model_flickers_in_reach() -> None:
    """``calm_when_stable``: a 10 % group's model (share 0.1 ≤ 0.4/3) drifts in and out of the majority's reach
    while the start explores, so it is unwanted every other round; its clients' choices do not change, and that
    ends the start.  A stable route with a cluster nobody prefers is a collapse, not calm."""
    masses = np.array([[0.45, 0.45, 0.1]])

    def explores(settings, masses, rounds: int = 8) -> list[bool]:
        health, flags = ClusterHealth.initial(1, 3), []
        for t in range(rounds):
            reach = np.array([[False, False, t % 2 == 0]])
            health, view = update_health(health, masses, np.array([NO_TWINS]), np.array([20]), settings, reach=reach,
                                         previous_preferred=None if t == 0 else masses)
            flags.append(bool(view.explore[0]))
        return flags

    assert SETTINGS.calm_when_stable and method_settings("exp3").calm_when_stable    # the generic default
    # Round 0 has no earlier routes; rounds 1-3 stable and healthy: calm for the patience (3).
    assert explores(SETTINGS, masses) == [True, True, True, False, False, False, False, False]
    without = replace(SETTINGS, calm_when_stable=False)
    assert all(explores(without, masses))                                   # calm never lasts 3 rounds
    patient = replace(SETTINGS, spare_patience=100)
    assert all(explores(patient, np.array([[0.6, 0.4, 0.0]])))              # stable, but cluster 2 is nobody's best


def test_duplicates_wait_for_the_clients_reports_under_partial_participation() -> None:
    """``evidence_settings``: ``duplicate_patience`` counts reports; at ``f = 0.5`` a client reports every other
    round, so a pair merges after ``⌈2 / 0.5⌉ = 4`` rounds instead of 2."""
    from fedroute.core.server_step import evidence_settings

    assert Participation(0.25).evidence_rounds(20) == 80 and Participation(0.1).evidence_rounds(20) == 200
    assert evidence_settings(SETTINGS, Participation()) is SETTINGS
    assert evidence_settings(SETTINGS, Participation(0.5)).duplicate_patience == 4
    # Group 0 split over the duplicates 0 and 1, group 1 on cluster 2 (as in the duplicate test above).
    losses = np.array([[0.02, 0.1, 3.0]] * 3 + [[0.1, 0.02, 3.0]] * 3 + [[4.0, 4.0, 0.05]] * 6)
    replies = RoundReplies(rows=np.arange(12), routes=losses.argmin(axis=1), preferred=losses.argmin(axis=1),
                           num_examples=np.ones(12), losses=losses, trained_models=np.zeros((12, 2)))

    def merged_after(participation: Participation) -> int:
        state = server_init(FederationState.of_clients(np.arange(12), 3), 1, 3, SETTINGS, participation)
        state = ServerState(federation=state.federation, estimate=None, health=_settled(), view=None)
        for t in range(10):
            _, state = server_step(np.zeros((3, 2)), state, replies, t, SETTINGS, participation, InfluenceBounds(),
                                   start_models=np.zeros((3, 2)))
            if (state.view.merged_into >= 0).any():
                return t + 1
        return -1

    assert merged_after(Participation()) == 2
    assert merged_after(Participation(0.5)) == 4
