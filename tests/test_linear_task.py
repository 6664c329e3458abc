"""Tests of the two-group linear task (paper §2)."""

import numpy as np
import pytest

from fedroute.core.metrics import certified_starvation_basin, common_preferred_cluster
from fedroute.tasks.linear import LinearTask


def test_client_data_depend_only_on_seed_and_client_id():
    task = LinearTask(num_clients=10, samples_per_client=8, test_samples_per_client=4, seed=3)
    everyone = task.samples(np.arange(10))
    alone = task.samples(np.array([5]))
    subset = task.samples(np.array([7, 5]))
    for name in ("train_inputs", "train_targets", "test_inputs", "test_targets"):
        np.testing.assert_array_equal(getattr(alone, name)[0], getattr(everyone, name)[5])
        np.testing.assert_array_equal(getattr(subset, name)[1], getattr(everyone, name)[5])
    # A larger population does not change client 5's data either.
    bigger = LinearTask(num_clients=20, samples_per_client=8, test_samples_per_client=4, seed=3)
    np.testing.assert_array_equal(bigger.samples(np.array([5])).train_inputs, alone.train_inputs)
    # Another seed or another client gives other data.
    other_seed = LinearTask(num_clients=10, samples_per_client=8, test_samples_per_client=4, seed=4)
    assert not np.array_equal(other_seed.samples(np.array([5])).train_inputs, alone.train_inputs)
    assert not np.array_equal(everyone.train_inputs[4], everyone.train_inputs[5])


def test_shapes_and_num_examples():
    task = LinearTask(num_clients=4, dimension=3, samples_per_client=6, test_samples_per_client=2)
    clients = task.clients(np.arange(4))
    samples = task.samples(np.arange(4))
    assert samples.train_inputs.shape == (4, 6, 3) and samples.test_inputs.shape == (4, 2, 3)
    assert samples.train_targets.shape == (4, 6) and samples.test_targets.shape == (4, 2)
    np.testing.assert_array_equal(clients.num_examples, [6, 6, 6, 6])


def test_groups_are_balanced():
    task = LinearTask(num_clients=10)
    np.testing.assert_array_equal(task.groups(np.arange(10)), [0, 1] * 5)
    np.testing.assert_array_equal(task.clients(np.arange(10)).groups, [0, 1] * 5)
    np.testing.assert_allclose(task.group_proportions, [0.5, 0.5])


def test_group_parameters():
    task = LinearTask(dimension=3, group_distance=4.0)
    np.testing.assert_array_equal(task.group_parameters, [[2.0, 0.0, 0.0], [-2.0, 0.0, 0.0]])


def test_noiseless_targets_follow_the_group_parameter():
    task = LinearTask(num_clients=4, dimension=3, noise_std=0.0, group_distance=4.0)
    clients = task.samples(np.arange(4))
    for i, group in enumerate([0, 1, 0, 1]):
        sign = 1.0 if group == 0 else -1.0
        np.testing.assert_allclose(clients.train_targets[i], sign * 2.0 * clients.train_inputs[i, :, 0])


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("spread", [0.5, 3.0])
def test_collapsed_init_is_in_the_certified_starvation_basin(seed, spread):
    task = LinearTask(init="collapsed", init_spread=spread, seed=seed, group_distance=4.0, dimension=5)
    models = task.initial_models(2)
    theta = task.group_parameters
    # w_0 = θ̄ = 0; w_1 = ρ u with u a unit vector orthogonal to e_0.
    np.testing.assert_array_equal(models[0], np.zeros(5))
    assert models[1, 0] == 0.0
    np.testing.assert_allclose(np.linalg.norm(models[1]), spread)
    # Distances: ‖w_0 - θ_g‖ = 2 < sqrt(4 + ρ²) = ‖w_1 - θ_g‖ for both groups -> both prefer 0.
    for g in range(2):
        assert np.linalg.norm(models[0] - theta[g]) == pytest.approx(2.0)
        assert np.linalg.norm(models[1] - theta[g]) == pytest.approx(np.sqrt(4.0 + spread ** 2))
    assert common_preferred_cluster(models, theta) == 0
    assert certified_starvation_basin(models, theta, 0.5)


def test_collapsed_init_both_groups_prefer_cluster_zero_on_client_data():
    task = LinearTask(num_clients=40, init="collapsed", init_spread=3.0, noise_std=0.0, samples_per_client=400)
    clients = task.clients(np.arange(40))
    losses = clients.losses(task.initial_models(2))
    assert np.all(np.argmin(losses, axis=1) == 0)


def test_initial_models_depend_on_the_seed_only():
    a = LinearTask(seed=2, init="spread").initial_models(3)
    b = LinearTask(seed=2, init="spread", num_clients=10).initial_models(3)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3, 5)
    assert not np.array_equal(a, LinearTask(seed=3, init="spread").initial_models(3))


def test_loss_is_half_mean_squared_error():
    task = LinearTask(num_clients=2, dimension=2, samples_per_client=3, noise_std=0.0)
    clients = task.clients(np.arange(2))
    models = np.array([[2.0, 0.0], [0.0, 1.0]])
    losses = clients.losses(models)
    samples = task.samples(np.arange(2))
    x, y = samples.train_inputs, samples.train_targets
    for i in range(2):
        for k in range(2):
            residual = x[i] @ models[k] - y[i]
            assert losses[i, k] == pytest.approx(0.5 * np.mean(residual ** 2))
    # Client 0 is group 0 with θ_0 = (2, 0) = w_0: zero loss on noiseless data.
    assert losses[0, 0] == pytest.approx(0.0, abs=1e-12)


def test_local_update_is_a_gradient_step_towards_theta():
    task = LinearTask(num_clients=2, dimension=3, noise_std=0.0, learning_rate=0.3, samples_per_client=5)
    clients = task.clients(np.arange(2))
    theta = task.group_parameters
    w = np.array([[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]])
    updated = clients.local_update(w.copy(), np.array([0, 1]), 0)
    for i in range(2):
        x = task.samples(np.arange(2)).train_inputs[i]
        covariance = x.T @ x / 5  # empirical Σ̂
        np.testing.assert_allclose(updated[i], w[i] - 0.3 * covariance @ (w[i] - theta[i]))
    # Client index selects the data: model 0 on client 1.
    swapped = clients.local_update(w[:1].copy(), np.array([1]), 0)
    x1 = task.samples(np.arange(2)).train_inputs[1]
    np.testing.assert_allclose(swapped[0], w[0] - 0.3 * (x1.T @ x1 / 5) @ (w[0] - theta[1]))


def test_local_update_with_two_steps_and_no_input_mutation():
    task = LinearTask(num_clients=2, dimension=2, noise_std=0.0, learning_rate=0.5, local_steps=2,
                      samples_per_client=4)
    clients = task.clients(np.arange(2))
    w = np.array([[1.0, 1.0]])
    before = w.copy()
    updated = clients.local_update(w, np.array([1]), 3)
    x = task.samples(np.arange(2)).train_inputs[1]
    covariance = x.T @ x / 4
    theta = task.group_parameters[1]
    step = lambda v: v - 0.5 * covariance @ (v - theta)  # noqa: E731
    np.testing.assert_allclose(updated[0], step(step(before[0])))
    np.testing.assert_array_equal(w, before)


def test_bad_client_ids_raise():
    task = LinearTask(num_clients=4)
    with pytest.raises(ValueError, match="client ids"):
        task.clients(np.array([4]))
    with pytest.raises(ValueError, match="client ids"):
        task.clients(np.array([-1]))
    with pytest.raises(ValueError, match="split"):
        task.clients(np.array([0])).losses(np.zeros((1, 5)), split="valid")


@pytest.mark.parametrize("changes, key", [
    (dict(num_clients=1), "num-clients"),
    (dict(dimension=1), "dimension"),
    (dict(group_distance=0.0), "group-distance"),
    (dict(samples_per_client=0), "samples-per-client"),
    (dict(test_samples_per_client=0), "test-samples-per-client"),
    (dict(noise_std=-0.1), "noise-std"),
    (dict(local_steps=0), "local-steps"),
    (dict(learning_rate=0.0), "learning-rate"),
    (dict(learning_rate=1.5), "learning-rate"),
    (dict(init="random"), "init"),
    (dict(init_spread=-1.0), "init-spread"),
    (dict(seed=-1), "seed"),
])
def test_bad_settings_raise_naming_the_key(changes, key):
    with pytest.raises(ValueError, match=f"'{key}'"):
        LinearTask(**changes)


def test_integer_settings_reject_non_integers():
    """Documented as integers ("an integer ≥ 2"); num_clients = 10.5 silently builds 11 clients."""
    accepted = []
    for key in ("num_clients", "dimension", "samples_per_client", "test_samples_per_client", "local_steps"):
        try:
            LinearTask(**{key: 10.5})
        except ValueError:
            continue
        accepted.append(key)
    assert accepted == [], f"non-integer values accepted for {accepted}"
