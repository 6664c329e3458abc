"""Tests of the per-cluster hard update and routing masses (ALGORITHM.md §2 steps 3–4)."""

import numpy as np

from fedroute.strategies.aggregation import cluster_route_counts, hard_update, routing_masses


def test_hard_update_is_sample_weighted_per_cluster():
    cluster_models = np.array([[0.0, 0.0], [10.0, 10.0]])
    client_models = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    updated = hard_update(cluster_models, client_models, np.array([0, 0, 1]), np.array([1, 3, 2]))
    # cluster 0: (1*[1,2] + 3*[3,4]) / 4 = [2.5, 3.5]; cluster 1: the single client [5, 6]
    np.testing.assert_allclose(updated, [[2.5, 3.5], [5.0, 6.0]])
    np.testing.assert_array_equal(cluster_models, [[0.0, 0.0], [10.0, 10.0]])  # input untouched


def test_hard_update_three_clusters_one_empty_keeps_its_model_exactly():
    kept = np.array([0.1 + 0.2, -1.0 / 3.0])  # not exactly representable: must be copied bit for bit
    cluster_models = np.array([[9.0, 9.0], kept, [-9.0, 4.0]])
    client_models = np.array([[1.0, 0.0], [2.0, 2.0], [3.0, 1.0], [6.0, -2.0]])
    routes = np.array([2, 0, 2, 0])
    num_examples = np.array([1.0, 1.0, 3.0, 3.0])
    updated = hard_update(cluster_models, client_models, routes, num_examples)
    # cluster 0: (1*[2,2] + 3*[6,-2]) / 4 = [5, -1]; cluster 2: (1*[1,0] + 3*[3,1]) / 4 = [2.5, 0.75]
    np.testing.assert_allclose(updated[0], [5.0, -1.0])
    np.testing.assert_allclose(updated[2], [2.5, 0.75])
    assert updated[1].tobytes() == kept.tobytes()


def test_hard_update_nobody_routed_keeps_everything_and_dtype():
    cluster_models = np.array([[1.5, 2.5], [3.5, 4.5]], dtype=np.float32)
    updated = hard_update(cluster_models, np.zeros((0, 2), np.float32), np.zeros(0, np.int64), np.zeros(0))
    np.testing.assert_array_equal(updated, cluster_models)
    assert updated.dtype == np.float32
    routed = hard_update(cluster_models, np.array([[1.0, 1.0]], np.float32), np.array([1]), np.array([5]))
    assert routed.dtype == np.float32
    np.testing.assert_array_equal(routed, [[1.5, 2.5], [1.0, 1.0]])


def test_hard_update_does_not_depend_on_reply_order():
    cluster_models = np.zeros((2, 1))
    client_models = np.array([[1.0], [4.0], [7.0]])
    a = hard_update(cluster_models, client_models, np.array([1, 1, 1]), np.array([1, 1, 2]))
    b = hard_update(cluster_models, client_models[::-1], np.array([1, 1, 1]), np.array([2, 1, 1]))
    np.testing.assert_allclose(a, [[0.0], [19.0 / 4.0]])
    np.testing.assert_allclose(b, a)


def test_routing_masses_sample_weighted():
    np.testing.assert_allclose(routing_masses(np.array([0, 0, 1]), np.array([1, 3, 2]), 2), [4 / 6, 2 / 6])


def test_routing_masses_three_clusters_one_empty():
    masses = routing_masses(np.array([2, 0, 2, 0]), np.array([1.0, 1.0, 3.0, 3.0]), 3)
    np.testing.assert_allclose(masses, [0.5, 0.0, 0.5])
    assert masses[1] == 0.0


def test_routing_masses_no_clients_is_zero():
    np.testing.assert_array_equal(routing_masses(np.zeros(0, np.int64), np.zeros(0), 3), [0.0, 0.0, 0.0])


def test_cluster_route_counts():
    np.testing.assert_array_equal(cluster_route_counts(np.array([2, 0, 2, 2]), 3), [1, 0, 3])
