"""Tests of the routing controllers (docs/algorithm.md, rules §3); expected values worked out by hand."""

import math

import numpy as np
import pytest

from fedroute.core import controllers as ctl


# ------------------------------------------------------------------ greedy --
def test_greedy_ties_go_to_lowest_index():
    losses = np.array([[1.0, 1.0, 2.0], [3.0, 0.5, 0.5], [2.0, 2.0, 2.0], [0.3, 0.2, 0.1]])
    np.testing.assert_array_equal(ctl.greedy_routes(losses), [0, 1, 0, 2])


def test_greedy_two_clusters():
    np.testing.assert_array_equal(ctl.greedy_routes(np.array([[2.0, 1.0], [1.0, 1.0]])), [1, 0])


def test_one_hot():
    np.testing.assert_array_equal(ctl.one_hot(np.array([2, 0]), 3), [[0, 0, 1], [1, 0, 0]])


# -------------------------------------------------------------- rank hedge --
def test_rank_hedge_temperature_zero_is_uniform():
    losses = np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 5.0]])
    np.testing.assert_allclose(ctl.rank_hedge(losses, 0.0), np.full((2, 3), 1 / 3))


def test_rank_hedge_temperature_ln2_three_clusters():
    # ranks of [3, 1, 2] are [2, 0, 1]: weights 2^-rank = [1/4, 1, 1/2], total 7/4.
    result = ctl.rank_hedge(np.array([[3.0, 1.0, 2.0]]), math.log(2.0))
    np.testing.assert_allclose(result, [[1 / 7, 4 / 7, 2 / 7]])


def test_rank_hedge_temperature_ln2_two_clusters():
    # ranks [1, 0] -> weights [1/2, 1] -> [1/3, 2/3].
    np.testing.assert_allclose(ctl.rank_hedge(np.array([[2.0, 1.0]]), math.log(2.0)), [[1 / 3, 2 / 3]])


def test_rank_hedge_ties_ranked_by_index():
    losses = np.array([
        [1.0, 1.0, 0.0],  # ranks [1, 2, 0] -> weights [1/2, 1/4, 1]
        [5.0, 5.0, 5.0],  # ranks [0, 1, 2] -> weights [1, 1/2, 1/4]
    ])
    np.testing.assert_allclose(
        ctl.rank_hedge(losses, math.log(2.0)),
        [[2 / 7, 1 / 7, 4 / 7], [4 / 7, 2 / 7, 1 / 7]],
    )


# ---------------------------------------------------------------- reversal --
def test_reversal_picks_lightest_mass_regardless_of_loss():
    losses = np.array([[0.1, 0.9, 0.5]])
    np.testing.assert_array_equal(ctl.reversal(losses, np.array([0.5, 0.2, 0.3])), [[0, 1, 0]])


def test_reversal_mass_tie_goes_to_lower_loss_then_lower_index():
    masses = np.array([0.2, 0.6, 0.2])
    losses = np.array([
        [0.9, 0.1, 0.5],  # lightest {0, 2}; lower loss is 2 (cluster 1 has lowest loss but heavy)
        [0.5, 0.1, 0.5],  # lightest {0, 2}; equal losses -> lower index 0
        [0.1, 0.9, 0.4],  # lightest {0, 2}; lower loss 0
    ])
    np.testing.assert_array_equal(ctl.reversal(losses, masses), [[0, 0, 1], [1, 0, 0], [1, 0, 0]])


def test_reversal_all_masses_equal_is_greedy():
    losses = np.array([[0.3, 0.2], [0.4, 0.4]])
    np.testing.assert_array_equal(ctl.reversal(losses, np.zeros(2)), [[0, 1], [1, 0]])


def test_reversal_accepts_per_client_masses():
    losses = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    masses = np.array([[0.5, 0.1, 0.4], [0.1, 0.5, 0.4]])
    np.testing.assert_array_equal(ctl.reversal(losses, masses), [[0, 1, 0], [1, 0, 0]])


# -------------------------------------------------------------- commitment --
def test_commitment_keeps_previous_at_the_margin_boundary():
    # delta = 0.25, previous loss 4 -> switch only if min < 3.0 (strict).
    losses = np.array([[4.0, 3.0, 5.0]])
    np.testing.assert_array_equal(ctl.commitment(losses, np.array([0]), 0.25), [[1, 0, 0]])


def test_commitment_switches_just_below_the_margin():
    losses = np.array([[4.0, 2.999, 5.0]])
    np.testing.assert_array_equal(ctl.commitment(losses, np.array([0]), 0.25), [[0, 1, 0]])


def test_commitment_switches_to_argmin_not_merely_better_cluster():
    # previous 2 (loss 5): threshold 3.75; min is cluster 1 (3.5) -> switch to 1.
    losses = np.array([[4.0, 3.5, 5.0]])
    np.testing.assert_array_equal(ctl.commitment(losses, np.array([2]), 0.25), [[0, 1, 0]])


def test_commitment_first_use_is_greedy():
    losses = np.array([[4.0, 3.9, 5.0], [2.0, 2.0, 1.0]])
    np.testing.assert_array_equal(ctl.commitment(losses, np.array([-1, -1]), 0.25), [[0, 1, 0], [0, 0, 1]])


def test_commitment_zero_margin_equal_loss_does_not_switch():
    # previous 1 has the same loss as cluster 0; greedy would say 0, commitment stays on 1.
    losses = np.array([[2.0, 2.0]])
    np.testing.assert_array_equal(ctl.commitment(losses, np.array([1]), 0.0), [[0, 1]])


def test_commitment_mixed_batch():
    losses = np.array([
        [4.0, 3.0, 5.0],    # prev 0, not strictly below 3 -> stay 0
        [4.0, 2.0, 5.0],    # prev 0, 2 < 3 -> switch to 1
        [1.0, 3.0, 0.5],    # first use -> greedy 2
        [1.0, 3.0, 0.9],    # prev 0, 0.9 >= 0.75 -> stay 0
    ])
    routes = np.array([0, 0, -1, 0])
    np.testing.assert_array_equal(
        ctl.commitment(losses, routes, 0.25),
        np.eye(3)[[0, 1, 2, 0]],
    )


def test_controller_ids():
    assert ctl.CONTROLLER_IDS == ("gr", "rh", "rev", "com", "hys")
