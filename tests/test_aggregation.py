"""Tests of the per-cluster hard update and routing masses (docs/algorithm.md, rules §2 steps 3–4)."""

import numpy as np
import pytest

from fedroute import protocol
from fedroute.core import aggregation
from fedroute.core.aggregation import hard_update, routing_masses


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


def test_hard_update_values_are_the_segment_sums_of_the_weighted_replies_bit_for_bit():
    """The simulator's tables depend on the exact values: ``n_i·w_i`` for every reply, summed per cluster in
    reply order (``np.add.reduceat``), divided by the cluster's total; batched runs; the inputs untouched."""
    rng = np.random.default_rng(5)
    runs, num_clusters, per_run, size = 3, 4, 9, 7
    cluster_models = rng.normal(size=(runs, num_clusters, size))
    client_models = rng.normal(size=(runs * per_run, size)) * 10.0 ** rng.integers(-3, 4, size=(runs * per_run, 1))
    routes = rng.integers(0, num_clusters - 1, size=runs * per_run)  # the last cluster stays empty
    num_examples = rng.integers(1, 50, size=runs * per_run).astype(float) / 3.0
    run_index = np.repeat(np.arange(runs), per_run)
    before = client_models.copy()
    updated = hard_update(cluster_models, client_models, routes, num_examples, run_index)
    expected = cluster_models.copy().reshape(runs * num_clusters, size)
    targets = run_index * num_clusters + routes
    for target in np.unique(targets):
        members = np.flatnonzero(targets == target)  # reply order
        weighted = num_examples[members, None] * client_models[members]
        expected[target] = np.add.reduceat(weighted, [0], axis=0)[0] / np.bincount(
            np.zeros(len(members), dtype=np.int64), weights=num_examples[members])[0]
    assert updated.tobytes() == expected.reshape(cluster_models.shape).tobytes()
    assert client_models.tobytes() == before.tobytes()
    np.testing.assert_array_equal(updated[:, -1], cluster_models[:, -1])


def _reference(cluster_models, client_models, routes, num_examples):
    """``Σ n_i w_i / Σ n_i`` per cluster, reply by reply in float64 (the definition; summation order aside)."""
    updated = np.array(cluster_models, copy=True)
    for cluster in range(len(cluster_models)):
        members = np.flatnonzero(routes == cluster)
        if members.size:
            weighted = sum(np.float64(num_examples[i]) * client_models[i].astype(np.float64) for i in members)
            updated[cluster] = (weighted / num_examples[members].sum()).astype(updated.dtype)
    return updated


@pytest.mark.parametrize("reply_dtype", [np.float32, np.float64])
def test_hard_update_in_column_blocks_is_bit_identical_to_one_block(monkeypatch, reply_dtype):
    rng = np.random.default_rng(3)
    cluster_models = rng.normal(size=(3, 1100))
    client_models = (rng.normal(size=(13, 1100)) * 1e3).astype(reply_dtype)
    routes = rng.integers(0, 3, size=13)
    routes[routes == 1] = 2  # cluster 1: nobody routed
    num_examples = rng.integers(1, 500, size=13).astype(np.float64)
    monkeypatch.setattr(aggregation, "_BLOCK_VALUES", 1 << 30)  # the whole (replies, P) array at once
    whole = hard_update(cluster_models, client_models, routes, num_examples)
    monkeypatch.setattr(aggregation, "_BLOCK_VALUES", 13 * 300)  # blocks of 300 columns: 3 and a rest of 200
    blocked = hard_update(cluster_models, client_models, routes, num_examples)
    assert blocked.tobytes() == whole.tobytes()
    np.testing.assert_allclose(blocked, _reference(cluster_models, client_models, routes, num_examples),
                               rtol=0, atol=1e-9)  # sums of ~1e5 in float64: differences ~1e-11
    assert blocked[1].tobytes() == cluster_models[1].tobytes()  # nobody routed: kept bit for bit


def test_stack_flat_keeps_a_float32_layout_in_float32_and_widens_mixed_layouts():
    float32_model = {"w": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "b": np.ones(2, np.float32)}
    mixed_model = {"w": np.arange(3, dtype=np.float32) / 7, "steps": np.array(5, dtype=np.int64)}
    assert protocol.flat_dtype(float32_model) == np.float32
    assert protocol.flat_dtype(mixed_model) == np.float64
    rows = protocol.stack_flat([float32_model, {k: v + 1 for k, v in float32_model.items()}],
                               protocol.flat_dtype(float32_model))
    assert rows.dtype == np.float32 and rows.shape == (2, 8)
    np.testing.assert_array_equal(rows[0], protocol.flatten_arrays(float32_model))  # same values, exactly
    np.testing.assert_array_equal(rows[1], protocol.flatten_arrays({k: v + 1 for k, v in float32_model.items()}))
    mixed = protocol.stack_flat([mixed_model], protocol.flat_dtype(mixed_model))
    assert mixed.dtype == np.float64 and mixed[0, -1] == 5.0
