"""The evidence of collapse: unwanted clusters, exploration budgets, spares and duplicates (fedroute.core.health)."""

from __future__ import annotations

import numpy as np

from fedroute.core.agent import AgentState, agent_step
from fedroute.core.health import ClusterHealth, RoutingView, duplicate_twins, routing_view, update_health
from fedroute.core.methods import method_settings
from fedroute.core.server_step import ServerState, server_init
from fedroute.core.federation import FederationState

SETTINGS = method_settings("exp3", num_clusters=3, collapse_patience=3, spare_patience=4)


def _step(health: ClusterHealth, preferred_masses: list[float], known: int = 10,
          twins: list[int] | None = None) -> tuple[ClusterHealth, RoutingView]:
    twin = np.array([twins if twins is not None else [-1, -1, -1]], dtype=np.int64)
    return update_health(health, np.array([preferred_masses]), twin, np.array([known]), SETTINGS)


def test_a_cluster_nobody_prefers_turns_exploration_on_after_the_patience_then_becomes_spare() -> None:
    health = ClusterHealth.initial(1, 3)
    explore = []
    for _ in range(10):
        health, view = _step(health, [0.6, 0.4, 0.0])
        explore.append(bool(view.explore[0]))
    # Unwanted from round 1: a collapse sign from round 3; its 4th round as a sign exhausts the budget: spare.
    assert explore == [False, False, True, True, True, False, False, False, False, False]
    assert view.spare.tolist() == [[False, False, True]]
    # Wanted again: no longer spare (and no exploration); unwanted again later: a fresh budget.
    health, view = _step(health, [0.5, 0.3, 0.2])
    assert not view.spare.any() and not view.explore[0]
    for _ in range(3):
        health, view = _step(health, [0.6, 0.4, 0.0])
    assert view.explore[0]


def test_clients_joining_reconsider_the_spares() -> None:
    health = ClusterHealth.initial(1, 3)
    for _ in range(8):
        health, view = _step(health, [0.6, 0.4, 0.0], known=10)
    assert view.spare[0, 2] and not view.explore[0]
    health, view = _step(health, [0.6, 0.4, 0.0], known=12)       # two clients joined: new evidence
    assert not view.spare[0, 2]
    for _ in range(3):
        health, view = _step(health, [0.6, 0.4, 0.0], known=12)
    assert view.explore[0]


def test_a_small_real_group_is_no_collapse_sign_unless_it_is_below_the_threshold() -> None:
    health = ClusterHealth.initial(1, 3)
    for _ in range(10):                                             # 0.2 > 0.4 / 3: wanted
        health, view = _step(health, [0.5, 0.3, 0.2])
    assert not view.explore[0] and not view.spare.any()


def test_duplicates_are_merged_only_after_the_patience_or_once_spare() -> None:
    health = ClusterHealth.initial(1, 3)
    merged = []
    for _ in range(5):
        health, view = _step(health, [0.5, 0.3, 0.2], twins=[-1, -1, 1])
        merged.append(int(view.merged_into[0, 2]))
    assert merged == [-1, -1, -1, 1, 1] and view.spare[0, 2]
    # A new twin restarts the count; a twin that disappears is no longer merged.
    health, view = _step(health, [0.5, 0.3, 0.2], twins=[-1, -1, -1])
    assert view.merged_into[0, 2] == -1


def _losses_of_groups(own: float, cross: float, groups: list[int], models: list[int]) -> np.ndarray:
    """Clients of group ``g`` have loss ``own`` on the models of their group, ``cross`` on the others."""
    return np.array([[own if models[k] == g else cross for k in range(len(models))] for g in groups])


def test_a_group_split_over_two_clusters_is_a_duplicate_pair_and_a_noisy_minority_is_not() -> None:
    # Clusters 0 and 1 both serve group 0 (a split), cluster 2 serves group 1.
    groups = [0] * 6 + [1] * 6
    losses = _losses_of_groups(0.3, 3.0, groups, models=[0, 0, 1])
    losses[3:6, 1] = 0.25                                          # half of group 0 prefers cluster 1
    preferred = losses.argmin(axis=1)
    masses = np.bincount(preferred, minlength=3)[None] / len(groups)
    twins = duplicate_twins(losses, preferred, np.zeros(12, np.int64), masses, 1, 2.0)
    assert twins.tolist() == [[-1, 0, -1]] or twins.tolist() == [[1, -1, -1]]
    # A noisy minority on cluster 2 finds the majority's cluster 0 only 1.5× worse, but the majority finds the
    # minority's model far worse: no duplicate.
    losses = np.array([[0.3, 3.0, 4.0]] * 8 + [[1.5, 3.0, 1.0]] * 2)
    preferred = losses.argmin(axis=1)
    masses = np.bincount(preferred, minlength=3)[None] / 10
    assert (duplicate_twins(losses, preferred, np.zeros(10, np.int64), masses, 1, 2.0) == -1).all()
    # Identical copies (a warm start): every cluster is as good for everyone, so no third cluster is far.
    losses = np.full((9, 3), 1.0)
    preferred = np.arange(9) % 3
    masses = np.full((1, 3), 1 / 3)
    assert (duplicate_twins(losses, preferred, np.zeros(9, np.int64), masses, 1, 2.0) == -1).all()


def test_without_evidence_of_collapse_clients_are_greedy_and_with_it_they_run_exp3() -> None:
    settings = method_settings("exp3", num_clusters=2)
    state = AgentState.initial(4, settings)
    losses = np.array([[1.0, 2.0]] * 4)
    ids = np.arange(4)
    calm = RoutingView(explore=np.zeros(4, bool), merged_into=np.full((4, 2), -1), spare=np.zeros((4, 2), bool))
    _, decision = agent_step(state, settings, losses, np.array([1.0, 0.0]), 0, ids, 0, view=calm)
    assert (decision.routes == 0).all() and (decision.arm == -1).all()
    _, decision = agent_step(state, settings, losses, np.array([1.0, 0.0]), 0, ids, 0, view=None)
    assert (decision.arm == -1).all()                               # no report yet: no exploration
    alarmed = RoutingView(explore=np.ones(4, bool), merged_into=np.full((4, 2), -1), spare=np.zeros((4, 2), bool))
    _, decision = agent_step(state, settings, losses, np.array([1.0, 0.0]), 0, ids, 0, view=alarmed)
    assert (decision.arm >= 0).all()                                # block start: every client draws an arm
    # One run exploring, one calm (batched runs): each client follows its own run's view.
    mixed = RoutingView(explore=np.array([True, True, False, False]), merged_into=np.full((4, 2), -1),
                        spare=np.zeros((4, 2), bool))
    _, decision = agent_step(state, settings, losses, np.array([1.0, 0.0]), 0, ids, 0, view=mixed)
    assert (decision.arm[:2] >= 0).all() and (decision.arm[2:] == -1).all()


def test_a_merged_duplicate_is_skipped_by_greedy_unless_the_twin_is_far_for_that_client() -> None:
    settings = method_settings("exp3", num_clusters=3)
    state = AgentState.initial(2, settings)
    losses = np.array([[0.5, 0.4, 3.0],                             # cluster 1 best, its twin 0 within 2×: skips 1
                       [2.0, 0.4, 3.0]])                            # twin 0 is 5× worse for this client: stays
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
    np.testing.assert_array_equal(restored.health.unwanted_rounds, health.unwanted_rounds)
    assert routing_view(restored.health, SETTINGS).explore.tolist() == view.explore.tolist()
