"""Tests of fedroute.core.metrics on hand-made cases (expected values by hand)."""

import numpy as np
import pytest

from fedroute.core import metrics

# Two groups in the plane: theta_0 = (0, 0), theta_1 = (2, 0).
THETA = np.array([[0.0, 0.0], [2.0, 0.0]])
# w_0 = (1, 0) is at distance 1 from both groups, so both prefer cluster 0;
# the starved w_1 = (2, 1.5) is at distance 2.5 from theta_0 and 1.5 from theta_1.
COMMON_PAIR = np.array([[1.0, 0.0], [2.0, 1.5]])


# ----------------------------------------------------------- greedy choices --
def test_greedy_choices_break_ties_towards_lowest_index():
    losses = np.array([[1.0, 1.0, 2.0], [3.0, 0.5, 0.5], [2.0, 2.0, 2.0], [0.3, 0.2, 0.1]])
    np.testing.assert_array_equal(metrics.greedy_choices(losses), [0, 1, 0, 2])


def test_greedy_choices_supports_batch_axes():
    losses = np.array([[[1.0, 0.0], [0.0, 1.0]], [[5.0, 5.0], [2.0, 1.0]]])
    np.testing.assert_array_equal(metrics.greedy_choices(losses), [[1, 0], [0, 1]])


def test_round_zero_attraction_three_clusters_with_ties():
    losses = np.array([
        [0.1, 0.5, 0.9],  # group 0 -> 0
        [0.2, 0.2, 0.9],  # group 0 -> 0 (tie)
        [0.9, 0.1, 0.5],  # group 0 -> 1
        [0.3, 0.4, 0.1],  # group 1 -> 2
        [0.7, 0.7, 0.7],  # group 1 -> 0 (three-way tie)
    ])
    attraction = metrics.round_zero_attraction(losses, [0, 0, 0, 1, 1])
    np.testing.assert_allclose(attraction, [[2 / 3, 1 / 3, 0.0], [0.5, 0.0, 0.5]])


def test_round_zero_attraction_empty_group_row_is_nan():
    attraction = metrics.round_zero_attraction([[0.0, 1.0], [1.0, 0.0]], [0, 0], num_groups=2)
    np.testing.assert_allclose(attraction[0], [0.5, 0.5])
    assert np.all(np.isnan(attraction[1]))


def test_usable_models_counts_distinct_argmins():
    losses = np.array([[0.1, 0.5, 0.9], [0.2, 0.2, 0.9], [0.9, 0.9, 0.1]])  # choices 0, 0, 2
    assert metrics.usable_models(losses) == 2
    assert metrics.usable_models(np.ones((4, 3))) == 1  # all ties go to cluster 0
    # Rows [0,0,1], [0,1,0], [1,0,0] choose 0, 0 (tie), 1.
    batch = np.stack([losses, np.eye(3)[::-1]])
    np.testing.assert_array_equal(metrics.usable_models(batch), [2, 2])


# ------------------------------------------------------- two-group linear case --
def test_common_preferred_cluster_and_ties():
    assert metrics.common_preferred_cluster(COMMON_PAIR, THETA) == 0
    assert metrics.common_preferred_cluster(COMMON_PAIR[::-1], THETA) == 1
    assert metrics.common_preferred_cluster(THETA, THETA) == -1  # each group has its own model
    # Both models are equidistant from both groups: ties go to cluster 0.
    assert metrics.common_preferred_cluster([[1.0, 1.0], [1.0, -1.0]], THETA) == 0


def test_basin_true_when_starved_model_is_farther_than_theta_bar():
    # alpha = 0.5: theta_bar = (1, 0), at distance 1 from both groups; w_s is at 2.5 and 1.5.
    assert metrics.certified_starvation_basin(COMMON_PAIR, THETA, 0.5) is True
    # Relabelling the clusters does not change membership (j = 1, s = 0).
    assert metrics.certified_starvation_basin(COMMON_PAIR[::-1], THETA, 0.5) is True


def test_basin_false_with_common_preference_when_theta_bar_is_far():
    # alpha = 0.9: theta_bar = (0.2, 0) is at distance 1.8 from theta_1 > 1.5 = ||w_s - theta_1||.
    assert metrics.common_preferred_cluster(COMMON_PAIR, THETA) == 0
    assert metrics.certified_starvation_basin(COMMON_PAIR, THETA, 0.9) is False


def test_basin_false_without_common_preference():
    # w_s would be far from both groups, but the groups prefer different clusters.
    models = np.array([[0.0, 0.1], [2.0, 0.1]])
    assert metrics.certified_starvation_basin(models, THETA, 0.5) is False
    # Both models are farther than theta_bar (distance 1) from both groups, but group 0
    # prefers (-5, 0) (5 < 7) and group 1 prefers (7, 0): no common preference.
    far = np.array([[-5.0, 0.0], [7.0, 0.0]])
    assert metrics.common_preferred_cluster(far, THETA) == -1
    assert metrics.certified_starvation_basin(far, THETA, 0.5) is False


def test_basin_is_vectorised_over_batch_axes():
    pairs = np.stack([COMMON_PAIR, COMMON_PAIR[::-1], THETA, [[1.0, 0.0], [1.0, 0.5]]])
    # Last pair: w_s = (1, 0.5) is at distance sqrt(1.25) > 1 from both groups.
    expected = np.array([True, True, False, True])
    np.testing.assert_array_equal(metrics.certified_starvation_basin(pairs, THETA, 0.5), expected)
    grid = np.broadcast_to(pairs, (5, 4, 2, 2))
    assert metrics.certified_starvation_basin(grid, THETA, 0.5).shape == (5, 4)


def test_basin_rejects_bad_alpha_and_shapes():
    with pytest.raises(ValueError, match="alpha"):
        metrics.certified_starvation_basin(COMMON_PAIR, THETA, 1.5)
    with pytest.raises(ValueError, match="cluster_models"):
        metrics.certified_starvation_basin(np.zeros((3, 2)), THETA, 0.5)


def test_recovery_error_is_invariant_to_swapping_clusters():
    models = np.array([[0.0, 1.0], [2.0, 0.5]])  # identity: max(1, 0.5) = 1
    assert metrics.recovery_error(models, THETA) == pytest.approx(1.0)
    assert metrics.recovery_error(models[::-1], THETA) == pytest.approx(1.0)
    np.testing.assert_allclose(metrics.recovery_error(np.stack([models, models[::-1]]), THETA),
                               [1.0, 1.0])


def test_recovery_error_with_more_clusters_than_groups():
    # Best injective map: group 0 -> model 2 (0.2), group 1 -> model 1 (0.5).
    models = np.array([[0.0, 1.0], [2.0, 0.5], [0.0, 0.2]])
    assert metrics.recovery_error(models, THETA) == pytest.approx(0.5)
    # A collapsed pair: both models at the midpoint, error 1.
    assert metrics.recovery_error([[1.0, 0.0], [1.0, 0.0]], THETA) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="theta"):
        metrics.recovery_error(models[:1], THETA)


# -------------------------------------------------------------- routing --
def test_persistent_collapse():
    assert metrics.persistent_collapse([[5, 0], [3, 0], [4, 0]]) is True
    assert metrics.persistent_collapse([[5, 0], [4, 1], [5, 0]]) is False
    assert metrics.persistent_collapse([[0.0, 0.0, 0.7], [0.0, 0.0, 0.3]]) is True
    batch = np.array([[[2, 0], [2, 0]], [[0, 2], [2, 0]], [[0, 0], [0, 0]]])
    np.testing.assert_array_equal(metrics.persistent_collapse(batch), [True, False, True])
    with pytest.raises(ValueError, match="route_counts"):
        metrics.persistent_collapse([[1, -1]])


def test_routed_loss():
    losses = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert metrics.routed_loss(losses, [1, 0, 1]) == pytest.approx(11 / 3)
    batch = np.stack([losses, losses])
    np.testing.assert_allclose(metrics.routed_loss(batch, [[1, 0, 1], [0, 0, 0]]), [11 / 3, 3.0])
    with pytest.raises(ValueError, match="routes"):
        metrics.routed_loss(losses, [0, 2, 1])


def test_group_routing_matrix_and_weak_cluster_mass():
    matrix = metrics.group_routing_matrix([0, 1, 1, 2], [0, 0, 1, 1], num_clusters=3)
    np.testing.assert_allclose(matrix, [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])
    assert metrics.weak_cluster_mass(matrix, [0.25, 0.75], 2) == pytest.approx(0.375)
    assert metrics.weak_cluster_mass(matrix, [0.25, 0.75], 0) == pytest.approx(0.125)
    with pytest.raises(ValueError, match="group_proportions"):
        metrics.weak_cluster_mass(matrix, [0.5, 0.6], 2)
    with pytest.raises(ValueError, match="weak_cluster"):
        metrics.weak_cluster_mass(matrix, [0.25, 0.75], 3)
    with pytest.raises(ValueError, match="routes"):
        metrics.group_routing_matrix([0, 3], [0, 1], num_clusters=3)


def test_composition_with_empty_cluster_is_nan():
    # Cluster 0 gets weights 1 (g0), 3 (g1), 4 (g0): 5/8 vs 3/8; cluster 1 only g1; cluster 2 none.
    beta = metrics.composition([0, 0, 1, 0], [0, 1, 1, 0], [1.0, 3.0, 2.0, 4.0], num_clusters=3)
    np.testing.assert_allclose(beta[:, :2], [[5 / 8, 0.0], [3 / 8, 1.0]])
    assert np.all(np.isnan(beta[:, 2]))
    with pytest.raises(ValueError, match="sample_weights"):
        metrics.composition([0, 1], [0, 1], [1.0, -1.0], num_clusters=2)


# ------------------------------------------------------ assignment accuracy --
def test_assignment_accuracy_k3_identity_is_not_the_maximiser():
    groups = [0, 0, 1, 1, 2, 2]
    routes = np.array([2, 2, 0, 1, 1, 1])
    # Group rows: g0 -> [0, 0, 1], g1 -> [.5, .5, 0], g2 -> [0, 1, 0].
    # Identity scores (0 + .5 + 0)/3; the best map (2, 0, 1) scores (1 + .5 + 1)/3.
    assert metrics.assignment_accuracy(routes, groups, 3) == pytest.approx(5 / 6)


def test_assignment_accuracy_from_losses_uses_greedy_choices():
    losses = np.array([[1.0, 1.0], [0.0, 3.0], [2.0, 1.0], [1.0, 0.0]])  # choices 0, 0, 1, 1
    assert metrics.assignment_accuracy(losses, [1, 1, 0, 0], 2) == pytest.approx(1.0)
    assert metrics.assignment_accuracy(losses, [0, 1, 0, 1], 2) == pytest.approx(0.5)


def test_assignment_accuracy_fewer_groups_than_clusters_is_injective():
    # g0 -> [0, 0, 1], g1 -> [0, 1/3, 2/3]. Non-injective (2, 2) would give 5/6;
    # the best injective map (2, 1) gives (1 + 1/3)/2.
    routes = [2, 2, 2, 2, 1]
    assert metrics.assignment_accuracy(routes, [0, 0, 1, 1, 1], 3) == pytest.approx(2 / 3)


def test_assignment_accuracy_more_groups_than_clusters():
    # g0 -> [1, 0], g1 -> [.5, .5], g2 -> [0, 1]; maps need not be injective.
    routes = [0, 0, 0, 1, 1, 1]
    assert metrics.assignment_accuracy(routes, [0, 0, 1, 1, 2, 2], 2) == pytest.approx(5 / 6)


def test_assignment_accuracy_rejects_empty_group_and_bad_routes():
    with pytest.raises(ValueError, match="groups"):
        metrics.assignment_accuracy([0, 1], [0, 2], 2)
    with pytest.raises(ValueError, match="losses_or_routes"):
        metrics.assignment_accuracy([0, 5], [0, 1], 2)


# ------------------------------------------------------- recovery levels --
def test_recovery_levels_sustained_fails_on_one_collapsed_test_state():
    k_train = np.full(25, 2)
    k_test = np.full(25, 2)
    k_test[10] = 1  # inside the last 20 states (indices 5..24)
    levels = metrics.femnist_recovery_levels(k_train, k_test, 1.0, 1.0)
    assert levels == {"training": True, "joint": True, "sustained": False, "exact": True}
    k_test[10], k_test[4] = 2, 1  # index 4 lies just outside the window
    assert metrics.femnist_recovery_levels(k_train, k_test, 1.0, 1.0)["sustained"] is True


def test_recovery_levels_training_only_and_inexact():
    k_train = np.array([1, 2, 2])
    k_test = np.array([2, 2, 1])
    levels = metrics.femnist_recovery_levels(k_train, k_test, 1.0, 1.0, window=2)
    assert levels == {"training": True, "joint": False, "sustained": False, "exact": False}
    k_test[-1] = 2
    levels = metrics.femnist_recovery_levels(k_train, k_test, 1.0, 0.99, window=2)
    assert levels == {"training": True, "joint": True, "sustained": True, "exact": False}
    # With num_groups=3 the same histories are not recovered.
    assert not any(metrics.femnist_recovery_levels(k_train, k_test, 1.0, 1.0, 2, 3).values())
    with pytest.raises(ValueError, match="window"):
        metrics.femnist_recovery_levels(k_train, k_test, 1.0, 1.0, window=4)
