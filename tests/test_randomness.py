"""Tests of counter-based randomness (docs/algorithm.md, rules §8)."""

import numpy as np
import pytest

from fedroute.core.randomness import Purpose, categorical, generator, uniform


def test_uniform_is_the_same_alone_or_in_a_batch():
    clients = np.arange(20)
    batch = uniform(7, clients, 3, Purpose.ROUTE)
    alone = np.array([uniform(7, int(c), 3, Purpose.ROUTE) for c in clients])
    np.testing.assert_array_equal(batch, alone)
    # A sub-batch in a different order gives the same numbers.
    np.testing.assert_array_equal(uniform(7, clients[[5, 2, 17]], 3, Purpose.ROUTE), batch[[5, 2, 17]])


def test_uniform_broadcasts_seeds_against_clients():
    seeds = np.arange(3)[:, None]
    clients = np.arange(5)[None, :]
    grid = uniform(seeds, clients, 11, Purpose.ARM)
    assert grid.shape == (3, 5)
    for s in range(3):
        for c in range(5):
            assert grid[s, c] == uniform(s, c, 11, Purpose.ARM)


def test_uniform_is_repeatable():
    assert uniform(1, 2, 3, Purpose.ARM) == uniform(1, 2, 3, Purpose.ARM)
    assert uniform(1, 2, 3, Purpose.ARM, draw=4) == uniform(1, 2, 3, Purpose.ARM, draw=4)


def test_uniform_values_in_unit_interval():
    values = uniform(0, np.arange(50_000), 0, Purpose.TRAIN)
    assert values.dtype == np.float64
    assert values.min() >= 0.0 and values.max() < 1.0


def test_uniform_differs_across_coordinates():
    base = uniform(0, 5, 9, Purpose.ARM)
    others = [
        uniform(0, 5, 9, Purpose.ROUTE),   # purpose
        uniform(0, 5, 10, Purpose.ARM),    # round
        uniform(0, 6, 9, Purpose.ARM),     # client
        uniform(1, 5, 9, Purpose.ARM),     # seed
        uniform(0, 5, 9, Purpose.ARM, 1),  # draw index
    ]
    for value in others:
        assert value != base
    # Swapping coordinates also changes the value (the hash is not symmetric).
    assert uniform(5, 0, 9, Purpose.ARM) != base
    # No collisions on a grid of clients x rounds.
    grid = uniform(3, np.arange(200)[:, None], np.arange(200)[None, :], Purpose.ROUTE)
    assert len(np.unique(grid)) == grid.size


def test_uniform_is_roughly_uniform():
    values = uniform(0, np.arange(100_000), 3, Purpose.ROUTE)
    assert abs(values.mean() - 0.5) < 0.01
    assert abs(values.var() - 1 / 12) < 0.005
    counts = np.histogram(values, bins=10, range=(0.0, 1.0))[0]
    assert np.all(np.abs(counts - 10_000) < 500)


@pytest.mark.parametrize("coordinates, name", [
    ((-1, 0, 0, 0), "seed"),
    ((0, -1, 0, 0), "client_id"),
    ((0, 0, -1, 0), "round_index"),
    ((0, 0, 0, -1), "draw"),
    ((0, np.array([3, -2]), 0, 0), "client_id"),
])
def test_uniform_negative_coordinates_raise(coordinates, name):
    seed, client, round_index, draw = coordinates
    with pytest.raises(ValueError, match=name):
        uniform(seed, client, round_index, Purpose.ARM, draw)


def test_generator_is_default_rng_of_the_coordinates():
    a = generator(3, 4, 5, Purpose.DATA).standard_normal(4)
    b = np.random.default_rng([3, 4, 5, int(Purpose.DATA)]).standard_normal(4)
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------- categorical --
def test_categorical_inverse_cdf_boundaries():
    p = np.array([[0.2, 0.8]] * 4)
    u = np.array([0.0, 0.19, 0.21, 0.999])
    np.testing.assert_array_equal(categorical(p, u), [0, 0, 1, 1])


def test_categorical_three_categories():
    p = np.array([[0.5, 0.25, 0.25]] * 5)
    u = np.array([0.1, 0.49, 0.6, 0.74, 0.9])
    np.testing.assert_array_equal(categorical(p, u), [0, 0, 1, 1, 2])


def test_categorical_never_returns_a_zero_probability_category():
    u = np.concatenate([np.linspace(0.0, 1.0, 2001, endpoint=False), [np.nextafter(1.0, 0.0)]])
    for row in ([0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0, 1.0], [0.3, 0.0, 0.7, 0.0]):
        p = np.tile(row, (len(u), 1))
        draws = categorical(p, u)
        assert np.all(np.asarray(row)[draws] > 0), row


def test_categorical_point_mass():
    u = np.array([0.0, 0.5, np.nextafter(1.0, 0.0)])
    np.testing.assert_array_equal(categorical(np.tile([0.0, 0.0, 1.0], (3, 1)), u), [2, 2, 2])
    np.testing.assert_array_equal(categorical(np.tile([1.0, 0.0, 0.0], (3, 1)), u), [0, 0, 0])


def test_categorical_frequencies_match_probabilities():
    u = uniform(1, np.arange(100_000), 0, Purpose.ROUTE)
    draws = categorical(np.tile([0.1, 0.6, 0.3], (len(u), 1)), u)
    np.testing.assert_allclose(np.bincount(draws, minlength=3) / len(u), [0.1, 0.6, 0.3], atol=0.01)
