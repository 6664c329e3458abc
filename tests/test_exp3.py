"""Tests of EXP3 over controllers (docs/algorithm.md, rules §4); expected values by hand."""

import math

import numpy as np

from fedroute.core.exp3 import (
    arm_probabilities,
    expected_route_loss,
    importance_weighted_update,
    normalised_losses,
)


def test_normalised_losses_divides_by_row_max():
    losses = np.array([[2.0, 4.0, 1.0], [3.0, 3.0, 3.0]])
    np.testing.assert_allclose(normalised_losses(losses), [[0.5, 1.0, 0.25], [1.0, 1.0, 1.0]])


def test_normalised_losses_row_of_zeros_maps_to_zeros():
    result = normalised_losses(np.array([[0.0, 0.0], [1.0, 4.0]]))
    np.testing.assert_array_equal(result, [[0.0, 0.0], [0.25, 1.0]])
    assert np.all(np.isfinite(result))


def test_expected_route_loss():
    distributions = np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.25, 0.25, 0.5]])
    losses = np.array([[2.0, 4.0, 1.0], [1.0, 2.0, 4.0], [8.0, 4.0, 2.0]])
    # row 0: 0.5*0.5 + 0.5*1 = 0.75; row 1: 1.0; row 2: 0.25*1 + 0.25*0.5 + 0.5*0.25 = 0.5
    np.testing.assert_allclose(expected_route_loss(distributions, losses), [0.75, 1.0, 0.5])


def test_arm_probabilities_with_exploration():
    p = arm_probabilities(np.array([[0.0, math.log(3.0)]]), 0.1)
    # softmax = [1/4, 3/4]; p = 0.9 * [0.25, 0.75] + 0.05
    np.testing.assert_allclose(p, [[0.275, 0.725]])


def test_arm_probabilities_extremes_and_shift_invariance():
    v = np.array([[0.0, math.log(3.0)], [1000.0, 1000.0 + math.log(3.0)]])
    np.testing.assert_allclose(arm_probabilities(v, 0.0), [[0.25, 0.75], [0.25, 0.75]])
    np.testing.assert_allclose(arm_probabilities(v, 1.0), np.full((2, 2), 0.5))


def test_arm_probabilities_three_arms():
    v = np.array([[0.0, math.log(2.0), math.log(5.0)]])
    # softmax = [1/8, 2/8, 5/8]; p = 0.7 * softmax + 0.1
    np.testing.assert_allclose(arm_probabilities(v, 0.3), [[0.1875, 0.275, 0.5375]])


def test_importance_weighted_update_only_masked_rows_and_played_arm():
    v = np.array([[0.0, 0.0], [1.0, 2.0], [0.5, -0.5]])
    original = v.copy()
    updated = importance_weighted_update(
        v,
        arms=np.array([1, 0, -1]),  # the unmasked row's arm must be ignored
        mean_feedback=np.array([0.6, 0.3, 0.9]),
        arm_probability=np.array([0.75, 0.2, 0.5]),
        learning_rate=2.0,
        update_mask=np.array([True, True, False]),
    )
    # row 0: v[1] = 0 - 2 * 0.6 / 0.75 = -1.6; row 1: v[0] = 1 - 2 * 0.3 / 0.2 = -2
    np.testing.assert_allclose(updated, [[0.0, -1.6], [-2.0, 2.0], [0.5, -0.5]])
    np.testing.assert_array_equal(v, original)  # input untouched


def test_importance_weighted_update_empty_mask_is_a_copy():
    v = np.array([[0.3, 0.1, -0.2]])
    updated = importance_weighted_update(v, np.array([2]), np.array([1.0]), np.array([0.5]), 2.0,
                                         np.array([False]))
    np.testing.assert_array_equal(updated, v)
    assert updated is not v
