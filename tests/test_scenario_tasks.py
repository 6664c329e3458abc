"""The scenario tasks of issue 10: rotated boundaries (2-D MLP), rotated digits, collinear linear groups."""

import numpy as np
import pytest
import torch

from fedroute.tasks.boundaries import BoundariesTask
from fedroute.tasks.characters import _digits
from fedroute.tasks.collinear import CollinearTask
from fedroute.tasks.digit_rotations import DigitRotationsTask
from fedroute.tasks.linear import LinearTask


def _torch_mlp(flat: np.ndarray, inputs: int, hidden: int, classes: int) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes))
    torch.nn.utils.vector_to_parameters(torch.from_numpy(np.asarray(flat, dtype=np.float32)), model.parameters())
    return model


def test_boundaries_data_groups_and_torch_layout():
    task = BoundariesTask(seed=3)
    clients = task.clients(np.arange(15))
    np.testing.assert_array_equal(clients.groups, np.arange(15) % 3)
    np.testing.assert_array_equal(task.clients(np.array([7])).train_inputs[0], clients.train_inputs[7])
    assert clients.train_inputs.shape == (15, 200, 2) and task.num_parameters == 82
    # Labels follow the group's rotated boundary: agreement with sign(u_gᵀx) well above chance, and the
    # groups' boundaries differ by 120°.
    for g, normal in enumerate(task.normals):
        rows = clients.groups == g
        agree = (clients.train_labels[rows] == (clients.train_inputs[rows] @ normal > 0)).mean()
        assert agree > 0.85
    assert np.isclose(task.normals[0] @ task.normals[1], np.cos(2 * np.pi / 3))
    models = task.initial_models(3)
    assert models.shape == (3, 82) and not np.array_equal(models[0], models[1])
    model = _torch_mlp(models[1], 2, 16, 2)
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model(torch.from_numpy(clients.train_inputs[4])),
                                                     torch.from_numpy(clients.train_labels[4]))
    assert clients.losses(models)[4, 1] == pytest.approx(float(expected), rel=1e-5)
    with pytest.raises(ValueError, match="'label-sharpness'"):
        BoundariesTask(label_sharpness=0.0)


def test_digit_rotations_groups_see_the_pool_rotated_and_decay_the_weights():
    task = DigitRotationsTask(num_clients=8, seed=1)
    clients = task.clients(np.arange(8))
    images, labels = _digits()
    pool = {images[i].tobytes(): labels[i] for i in range(len(labels))}
    for client in (0, 1, 2, 3):  # groups 0..3: un-rotating by g quarter turns recovers a pool image, label kept
        image = clients.train_inputs[client, 0].reshape(8, 8)
        original = np.rot90(image, k=-client, axes=(0, 1))
        assert pool[np.ascontiguousarray(original).tobytes()] == clients.train_labels[client, 0]
    models = task.initial_models(2)
    index = np.array([0, 5])
    plain = DigitRotationsTask(num_clients=8, seed=1, weight_decay=0.0).clients(np.arange(8))
    gradient = plain.gradients(models, index)
    expected = models - np.float32(task.learning_rate) * (gradient + np.float32(task.weight_decay) * models)
    one_step = DigitRotationsTask(num_clients=8, seed=1, local_steps=1).clients(np.arange(8))
    np.testing.assert_allclose(one_step.local_update(models, index, 0), expected, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="'num-clients'"):
        DigitRotationsTask(num_clients=10)


@pytest.mark.parametrize("make_task", [lambda: DigitRotationsTask(num_clients=8, seed=1), lambda: BoundariesTask(seed=2)])
def test_fedcam_global_start_has_zero_output_and_the_first_models_hidden_layer(make_task):
    task = make_task()
    start, first = task.initial_global_model(), task.initial_models(1)[0]
    clients = task.clients(np.arange(4))
    hidden_end = clients.hidden_units * (clients.train_inputs.shape[-1] + 1)
    np.testing.assert_array_equal(start[:hidden_end], first[:hidden_end])
    assert not start[hidden_end:].any() and first[hidden_end:].any()
    # h(x; Θ_glob^0) = 0: the combined predictor's losses are the cluster models' own
    models = task.initial_models(2)
    np.testing.assert_allclose(clients.output_sum_losses(start, models), clients.losses(models), rtol=1e-6)


def test_digit_rotations_fedcam_steps_decay_both_parts():
    task = DigitRotationsTask(num_clients=8, seed=1, local_steps=1)
    decayed = task.clients(np.arange(8))
    plain = DigitRotationsTask(num_clients=8, seed=1, local_steps=1, weight_decay=0.0).clients(np.arange(8))
    glob = np.repeat(task.initial_global_model()[None], 2, axis=0)
    cluster, index = task.initial_models(2), np.array([0, 5])
    got, want = decayed.output_sum_update(glob, cluster, index, 0), plain.output_sum_update(glob, cluster, index, 0)
    shrink = np.float32(0.5 * task.learning_rate * task.weight_decay)
    np.testing.assert_allclose(got[0], want[0] - shrink * glob, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1], want[1] - shrink * cluster, rtol=1e-5, atol=1e-7)


def test_collinear_groups_and_collapsed_start():
    task = CollinearTask(seed=2, init="collapsed")
    theta = task.group_parameters
    np.testing.assert_array_equal(theta[:, 1:], 0)
    np.testing.assert_array_equal(theta[:, 0], [-4.0, 0.0, 4.0])
    np.testing.assert_array_equal(task.groups(np.arange(6)), [0, 1, 2, 0, 1, 2])
    models = task.initial_models(3)
    population = 0.5 * ((models[None, :, :] - theta[:, None, :]) ** 2).sum(-1)  # ½‖w − θ_g‖² (G, K)
    assert (population.argmin(axis=1) == 0).all()  # every group prefers cluster 0: a collapsed start


def test_linear_copies_start_repeats_the_spread_start_first_model():
    copies = LinearTask(init="copies", seed=4).initial_models(3)
    spread = LinearTask(init="spread", seed=4).initial_models(3)
    np.testing.assert_array_equal(copies, np.repeat(spread[:1], 3, axis=0))


@pytest.mark.parametrize("task", [BoundariesTask(), DigitRotationsTask(), LinearTask()], ids=lambda t: t.name)
def test_client_ids_outside_the_population_are_refused_naming_the_range(task):
    last = task.num_clients - 1
    for bad in ([-1], [0, task.num_clients]):
        with pytest.raises(ValueError, match=rf"client ids must lie in \[0, {last}\], got \{bad}"):
            task.clients(np.array(bad))
    assert task.clients(last).client_ids.tolist() == [last]  # a scalar id is one client
