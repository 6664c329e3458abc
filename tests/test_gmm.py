"""Tests of the multiclass Gaussian-mixture task (paper Appendix B.4, EXPERIMENTS E5)."""

from dataclasses import replace

import numpy as np
import pytest

from fedroute.simulation.simulator import simulate
from fedroute.core.methods import method_settings
from fedroute.tasks.gmm import GMMTask, cross_entropy, fit_logistic_regression, fit_logistic_regressions


@pytest.fixture(scope="module")
def task() -> GMMTask:
    return GMMTask(seed=1)


@pytest.fixture(scope="module")
def clients(task):
    return task.clients(np.arange(task.num_clients))


def test_paper_settings_are_the_defaults():
    task = GMMTask()
    assert (task.name, task.num_clients, task.num_groups, task.num_classes, task.dimension) == ("gmm", 30, 3, 5, 10)
    assert task.num_parameters == 5 * 11
    assert task.init_radius == 12.0


def test_client_data_depend_only_on_seed_and_client_id(task, clients):
    alone = task.clients(np.array([7]))
    subset = task.clients(np.array([12, 7]))
    for name in ("train_inputs", "train_labels", "test_inputs", "test_labels"):
        np.testing.assert_array_equal(getattr(alone, name)[0], getattr(clients, name)[7])
        np.testing.assert_array_equal(getattr(subset, name)[1], getattr(clients, name)[7])
    fresh = GMMTask(seed=1)  # a new instance, same seed
    np.testing.assert_array_equal(fresh.clients(np.array([7])).train_labels, alone.train_labels)
    other_seed = GMMTask(seed=2)
    assert not np.array_equal(other_seed.clients(np.array([7])).train_inputs, alone.train_inputs)
    assert not np.array_equal(clients.train_inputs[7], clients.train_inputs[10])


def test_shapes_labels_and_num_examples(task, clients):
    assert clients.train_inputs.shape == (30, 50, 10) and clients.test_inputs.shape == (30, 50, 10)
    assert clients.train_labels.shape == (30, 50) and clients.test_labels.shape == (30, 50)
    assert clients.train_labels.dtype == np.int64 and clients.train_inputs.dtype == np.float64
    assert clients.train_labels.min() >= 0 and clients.train_labels.max() <= 4
    assert len(np.unique(clients.train_labels)) == 5
    np.testing.assert_array_equal(clients.num_examples, np.full(30, 50))
    np.testing.assert_array_equal(clients.client_ids, np.arange(30))


def test_groups_are_pure_and_balanced(task, clients):
    np.testing.assert_array_equal(clients.groups, np.arange(30) % 3)
    np.testing.assert_allclose(task.group_proportions, [1 / 3] * 3)
    # Pure: every sample of a client is centred on its group's centre.
    sample_means = clients.train_inputs.mean(axis=1)  # (n, d)
    distances = np.linalg.norm(sample_means[:, None, :] - task.centres[None], axis=-1)
    group_means = np.stack([clients.train_inputs[clients.groups == g].reshape(-1, 10).mean(0) for g in range(3)])
    np.testing.assert_allclose(group_means, task.centres, atol=0.25)
    assert np.mean(distances.argmin(axis=1) == clients.groups) > 0.8
    np.testing.assert_allclose(np.linalg.norm(task.centres, axis=1), task.centre_norm)


def test_shared_models_equal_their_per_client_broadcast(task, clients):
    models = task.initial_models(3) + np.random.default_rng(0).standard_normal((3, task.num_parameters))
    per_client = np.broadcast_to(models, (30,) + models.shape)
    for split in ("train", "test"):
        shared = clients.losses(models, split)
        assert shared.shape == (30, 3)
        np.testing.assert_allclose(clients.losses(per_client, split), shared, rtol=1e-12, atol=0)
    # Distinct sets per client: row i uses its own set.
    stacked = np.stack([models, models[::-1]] * 15)
    mixed = clients.losses(stacked)
    np.testing.assert_allclose(mixed[0], clients.losses(models)[0])
    np.testing.assert_allclose(mixed[1], clients.losses(models[::-1])[1])
    with pytest.raises(ValueError):
        clients.losses(models, "validation")


def test_local_update_is_a_gradient_step(task):
    small = GMMTask(seed=1, local_steps=1, learning_rate=1e-3)
    one = small.clients(np.array([4]))
    w = np.random.default_rng(3).standard_normal(small.num_parameters)
    stepped = one.local_update(w[None], np.array([0]), 0)[0]
    gradient = (w - stepped) / small.learning_rate
    eps = 1e-6
    numeric = np.empty_like(w)
    for p in range(len(w)):
        shift = np.zeros_like(w)
        shift[p] = eps
        numeric[p] = (one.losses((w + shift)[None])[0, 0] - one.losses((w - shift)[None])[0, 0]) / (2 * eps)
    np.testing.assert_allclose(gradient, numeric, rtol=1e-6, atol=1e-8)
    # Several steps for several rows, each on its own client; the input is untouched.
    multi = GMMTask(seed=1, local_steps=3)
    batch = multi.clients(np.arange(6))
    models = np.stack([w, w, -w])
    before = models.copy()
    out = batch.local_update(models, np.array([5, 2, 2]), 0)
    np.testing.assert_array_equal(models, before)
    assert out.shape == (3, multi.num_parameters)
    single = multi.clients(np.array([2])).local_update(w[None], np.array([0]), 0)
    np.testing.assert_allclose(out[1], single[0])
    assert batch.losses(out[1:2])[2, 0] < batch.losses(w[None])[2, 0]


def test_cross_entropy_is_stable_for_large_logits(clients):
    logits = np.array([[[1e3, 0.0, -1e3, 5e2, 1e3 - 1.0], [-1e3, -1e3, -1e3, -1e3, -1e3]]])
    labels = np.array([[3, 2]])
    value = cross_entropy(logits, labels)
    assert np.all(np.isfinite(value))
    expected = np.mean([1e3 + np.log1p(np.exp(-1.0)) - 5e2, np.log(5.0)])
    np.testing.assert_allclose(value, [expected], rtol=1e-12)
    # Models whose logits are ~1e3 on the clients' data: finite losses and updates.
    huge = 300.0 * np.random.default_rng(1).standard_normal((2, clients.num_classes * 11))
    losses = clients.losses(huge)
    assert np.all(np.isfinite(losses)) and losses.max() > 100
    assert np.all(np.isfinite(clients.local_update(huge, np.array([0, 1]), 0)))


def test_oracles_fit_their_own_group_best(task, clients):
    oracle = task.oracle_parameters
    assert oracle.shape == (3, task.num_parameters)
    for split in ("train", "test"):
        losses = clients.losses(oracle, split)
        per_group = np.stack([losses[clients.groups == g].mean(axis=0) for g in range(3)])  # (group, oracle)
        for g in range(3):
            assert per_group[g, g] < np.delete(per_group[g], g).min()
    # β*_g is the minimiser of group g's pooled training loss (the gradient vanishes there).
    one_step = replace(clients, local_steps=1, learning_rate=1.0)
    for g in range(3):
        members = np.flatnonzero(clients.groups == g)
        gradients = oracle[g] - one_step.local_update(np.repeat(oracle[g:g + 1], len(members), 0), members, 0)
        assert np.linalg.norm(gradients.mean(axis=0)) < 1e-7  # equal client sizes: the pooled gradient
    # Class rows sum to zero (the identifiable part).
    np.testing.assert_allclose(oracle.reshape(3, 5, 11).sum(axis=1), 0.0, atol=1e-9)


def test_initial_models_are_centred_on_the_pushed_oracle_mean(task):
    flat = GMMTask(seed=1, init_jitter=0.0, init_radius=5.0)
    directions = flat.directions
    np.testing.assert_allclose(np.linalg.norm(directions, axis=1), 1.0)
    np.testing.assert_allclose(directions.reshape(3, 5, 11).sum(axis=1), 0.0, atol=1e-12)
    u_bar = (flat.oracle_parameters + 5.0 * directions).mean(axis=0)
    np.testing.assert_allclose(flat.initial_centre(), u_bar)
    np.testing.assert_allclose(flat.initial_models(3), np.tile(u_bar, (3, 1)))
    # With jitter: offsets of norm init_jitter around the same centre, deterministic.
    jittered = GMMTask(seed=1, init_radius=5.0)
    models = jittered.initial_models(3)
    np.testing.assert_allclose(np.linalg.norm(models - u_bar, axis=1), jittered.init_jitter)
    np.testing.assert_array_equal(models, jittered.initial_models(3))
    assert len({tuple(row) for row in models}) == 3


@pytest.mark.parametrize("bad", [
    {"num_clients": 2}, {"num_classes": 1}, {"noise_std": 0.0}, {"learning_rate": 0.0},
    {"init_radius": -1.0}, {"init_jitter": -0.1}, {"samples_per_client": 0}, {"seed": -1},
    {"local_steps": 1.5}, {"rounds": True}, {"init_radius": float("inf")}, {"teacher_scale": float("nan")},
])
def test_invalid_settings_are_rejected(bad):
    with pytest.raises(ValueError, match="gmm task setting"):
        GMMTask(**bad)


def test_runs_in_the_simulator(task, clients):
    history = simulate(task, method_settings("exp3", preset="gmm", num_clusters=3), 4, 0)
    assert history.cluster_models.shape == (5, 3, task.num_parameters)
    assert np.all(np.isfinite(history.cluster_models))
    np.testing.assert_array_equal(history.groups, clients.groups)


def test_batched_kernels_equal_the_per_sample_formulas(task, clients):
    """Losses and the update (label moments, class-major products) equal the textbook formulas."""
    models = task.initial_models(3) + np.random.default_rng(5).standard_normal((3, task.num_parameters))
    features = np.concatenate([clients.train_inputs, np.ones(clients.train_inputs.shape[:-1] + (1,))], axis=-1)
    logits = np.einsum("nsd,kcd->nksc", features, models.reshape(3, task.num_classes, -1))
    np.testing.assert_allclose(clients.losses(models), cross_entropy(logits, clients.train_labels[:, None, :]),
                               rtol=1e-12, atol=0)
    one_step = replace(clients, local_steps=1, learning_rate=0.5)
    rows = np.array([0, 7, 7])
    stepped = one_step.local_update(models, rows, 0)
    z = np.einsum("msd,mcd->msc", features[rows], models.reshape(3, task.num_classes, -1))
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p[np.arange(3)[:, None], np.arange(z.shape[1]), clients.train_labels[rows]] -= 1.0
    gradient = np.einsum("msc,msd->mcd", p, features[rows]).reshape(3, -1) / z.shape[1]
    np.testing.assert_allclose(stepped, models - 0.5 * gradient, rtol=1e-12, atol=1e-14)


def _plain_gradient_descent(features, labels, num_classes, tolerance=1e-8):
    """The textbook loop (the oracle fit before it was batched), for comparison."""
    count = len(features)
    step = 1.0 / (0.5 * np.linalg.eigvalsh(features.T @ features / count)[-1] * count)
    onehot = np.eye(num_classes)[labels]
    weights = np.zeros((num_classes, features.shape[1]))
    while True:
        logits = features @ weights.T
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        grad = (probabilities - onehot).T @ features
        if np.linalg.norm(grad) < tolerance * count:
            return weights
        weights -= step * grad


def test_group_fits_together_equal_separate_fits():
    """fit_logistic_regressions batches data sets without changing any of them (the oracles of E5):
    each equals its separate fit and the textbook loop (bit for bit on the reference machine)."""
    task = GMMTask(seed=0)
    clients = task.clients(np.arange(task.num_clients))
    features = np.stack([np.concatenate([clients.train_inputs[clients.groups == g],
                                         np.ones((10, 50, 1))], axis=-1).reshape(-1, 11) for g in range(3)])
    labels = np.stack([clients.train_labels[clients.groups == g].reshape(-1) for g in range(3)])
    together, steps = fit_logistic_regressions(features, labels, task.num_classes, max_steps=20_000)
    assert len(set(steps.tolist())) > 1  # the groups leave the batch at different steps
    # Three code paths (stacked matmuls, the single fit's 2-D ones, the textbook loop's norm and sums): a
    # rounding difference at the stopping test ‖grad‖ < tol·N moves the stop by one step of at most
    # step·tol·N ≈ 8e-9 here, so they are compared within two such steps.
    one_step = 2e-8
    for g in range(3):
        alone = fit_logistic_regression(features[g], labels[g], task.num_classes, max_steps=20_000)
        np.testing.assert_allclose(together[g], alone, rtol=0, atol=one_step)
        np.testing.assert_allclose(alone, _plain_gradient_descent(features[g], labels[g], task.num_classes),
                                   rtol=0, atol=one_step)
    capped, capped_steps = fit_logistic_regressions(features, labels, task.num_classes, max_steps=int(steps.min()))
    assert np.isnan(capped[steps > steps.min()]).all() and (capped_steps[steps > steps.min()] > steps.min()).all()
    with pytest.raises(RuntimeError, match="did not converge"):
        fit_logistic_regression(features[0], labels[0], task.num_classes, max_steps=10)


def test_collapsed_entrance_is_the_first_init_draw_that_leaves_a_model_unused():
    """entrance='collapsed': every start leaves a model unused at W^0; draw 0 is the 'any' start."""
    seen_later_draw = False
    for seed, radius in ((0, 0.0), (1, 4.0), (2, 12.0)):
        any_start = GMMTask(seed=seed, init_radius=radius, entrance="any")
        collapsed = replace(any_start, entrance="collapsed")
        models, draws = collapsed.initial_draw(3)
        clients = any_start.clients(np.arange(any_start.num_clients))
        choices = np.argmin(clients.losses(models), axis=1)
        assert len(np.unique(choices)) < 3
        shared = [np.bincount(choices[clients.groups == g], minlength=3).argmax() for g in range(3)]
        assert len(set(shared)) < 3  # two groups share a plurality cluster
        np.testing.assert_array_equal(collapsed.initial_models(3), models)
        # The draws before it were not collapsed; draw 0 is the task's start as it falls.
        for draw in range(draws - 1):
            earlier = collapsed._init_draw(draw, 3)
            assert len(np.unique(np.argmin(clients.losses(earlier), axis=1))) == 3
        np.testing.assert_array_equal(collapsed._init_draw(0, 3), any_start.initial_models(3))
        assert any_start.initial_draw(3)[1] == 1
        seen_later_draw |= draws > 1
    assert seen_later_draw  # the rejection loop was exercised
    with pytest.raises(ValueError, match="max-init-draws"):
        GMMTask(seed=0, init_radius=0.0, entrance="collapsed", max_init_draws=1).initial_models(3)
    for bad in (dict(entrance="split"), dict(max_init_draws=0)):
        with pytest.raises(ValueError, match="entrance|max-init-draws"):
            GMMTask(**bad)
