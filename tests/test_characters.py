"""Tests of the embedded transformed-digits task (EXPERIMENTS E4, :mod:`fedroute.tasks.characters`)."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from fedroute.core.randomness import Purpose, generator
from fedroute.simulation.simulator import concatenate_clients, simulate, simulate_batch
from fedroute.core.methods import method_settings
from fedroute.tasks.characters import (
    ALPHAS,
    ENTRY_THRESHOLD,
    CharactersTask,
    calibrate_entry_threshold,
    client_batch,
    entry_threshold_from_benefits,
    mlp_num_parameters,
    round_zero_audit,
)

SMALL = dict(pretrain_epochs=5)  # pretraining budget of the fast tests (the default is checked separately)


@pytest.fixture(scope="module")
def task() -> CharactersTask:
    return CharactersTask(seed=1, **SMALL)


@pytest.fixture(scope="module")
def clients(task):
    return task.clients(np.arange(task.num_clients))


def _module(flat: np.ndarray, inputs: int = 64, hidden: int = 64, classes: int = 10) -> torch.nn.Sequential:
    """An independent torch MLP holding the flat vector (state_dict order W1, b1, W2, b2)."""
    module = torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes))
    torch.nn.utils.vector_to_parameters(torch.tensor(flat, dtype=torch.float32), module.parameters())
    return module


def _own(clients, row: int, split: str = "train"):
    """Client ``row``'s real (unpadded) samples as torch tensors."""
    weights = getattr(clients, f"{split}_weights")[row] > 0
    return (torch.from_numpy(getattr(clients, f"{split}_inputs")[row][weights]),
            torch.from_numpy(getattr(clients, f"{split}_labels")[row][weights]))


def test_paper_settings_are_the_defaults():
    task = CharactersTask()
    assert (task.name, task.num_clients, task.hidden_units, task.local_steps, task.learning_rate) == (
        "characters", 20, 64, 1, 0.003)
    assert task.num_parameters == mlp_num_parameters(64, 64, 10) == 64 * 64 + 64 + 10 * 64 + 10
    assert ALPHAS == (0.45, 0.50, 0.55, 0.60, 0.65, 0.70)
    np.testing.assert_array_equal(task.groups(np.arange(20)), [0] * 10 + [1] * 10)


def test_split_sizes_and_dtypes(clients):
    assert clients.train_inputs.shape == (20, 72, 64) and clients.test_inputs.shape == (20, 18, 64)
    assert clients.train_inputs.dtype == np.float32 and clients.train_labels.dtype == np.int64
    # 1,797 images dealt to 20 clients: 17 clients of 90 and 3 of 89, 18 held out each.
    np.testing.assert_array_equal(clients.num_examples, [72] * 17 + [71] * 3)
    assert (clients.test_weights > 0).sum() == 20 * 18
    assert (clients.train_weights > 0).sum() + (clients.test_weights > 0).sum() == 1797
    np.testing.assert_allclose(clients.train_weights.sum(axis=1), 1.0, rtol=1e-6)
    assert clients.train_inputs.min() >= 0 and clients.train_inputs.max() <= 1


def test_data_are_deterministic_per_seed(task, clients):
    again = CharactersTask(seed=1, **SMALL).clients(np.arange(20))
    subset = task.clients(np.array([13, 2]))
    for name in ("train_inputs", "train_labels", "test_inputs", "test_labels", "train_weights"):
        np.testing.assert_array_equal(getattr(again, name), getattr(clients, name))
        np.testing.assert_array_equal(getattr(subset, name), getattr(clients, name)[[13, 2]])
    other = CharactersTask(seed=2, **SMALL).clients(np.arange(20))
    assert not np.array_equal(other.train_inputs, clients.train_inputs)
    # The starts are pure functions of the data seed, too.
    np.testing.assert_array_equal(CharactersTask(seed=1, **SMALL).initial_models(2), task.initial_models(2))


def test_exactly_sixes_and_nines_are_rotated_and_labels_kept(task, clients):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = (digits.images / 16.0).astype(np.float32), digits.target
    order = generator(task.seed, 0, 0, Purpose.DATA).permutation(len(labels))
    rotated_count = 0
    for client in range(20):
        chosen = order[client::20]
        count = int(clients.num_examples[client])
        held_out = len(chosen) - count
        source_test, source_train = chosen[:held_out], chosen[held_out:]
        for split, source, length in (("train", source_train, count), ("test", source_test, held_out)):
            x = getattr(clients, f"{split}_inputs")[client][:length].reshape(-1, 8, 8)
            y = getattr(clients, f"{split}_labels")[client][:length]
            np.testing.assert_array_equal(y, labels[source])  # labels unchanged
            rotate = (client >= 10) & np.isin(labels[source], (6, 9))
            expected = np.where(rotate[:, None, None], images[source][:, ::-1, ::-1], images[source])
            np.testing.assert_array_equal(x, expected)
            # A rotated 6 or 9 is really different from the original image.
            assert not np.any([np.array_equal(a, b) for a, b in zip(x[rotate], images[source][rotate])])
            rotated_count += int(rotate.sum())
    assert rotated_count > 0


def test_losses_shared_and_per_client_agree_and_match_torch(clients, task):
    models = task.initial_models(2)
    shared = clients.losses(models)
    per_client = clients.losses(np.broadcast_to(models, (20,) + models.shape).copy())
    assert shared.shape == (20, 2) and shared.dtype == np.float64
    np.testing.assert_allclose(per_client, shared, rtol=1e-5, atol=1e-6)
    # Different models per client: client i scored on its own set.
    rng = np.random.default_rng(0)
    mixed = (models[None] + 0.05 * rng.standard_normal((20, 2, models.shape[1]))).astype(np.float32)
    mixed_losses = clients.losses(mixed, "test")
    for row in (0, 11, 19):
        for k in range(2):
            inputs, labels = _own(clients, row, "test")
            with torch.no_grad():
                expected = torch.nn.functional.cross_entropy(_module(mixed[row, k])(inputs), labels).item()
            assert mixed_losses[row, k] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="split"):
        clients.losses(models, "validation")


def test_one_sgd_step_equals_a_torch_autograd_step(clients, task):
    models = task.initial_models(2)
    rows = np.array([3, 15, 15, 0])  # a subset, a repeated client, out of order
    start = models[[0, 1, 0, 1]]
    updated = clients.local_update(start, rows, round_index=7)
    assert updated.dtype == np.float32 and updated.shape == start.shape
    np.testing.assert_array_equal(start, models[[0, 1, 0, 1]])  # inputs are not modified
    for j, row in enumerate(rows):
        module = _module(start[j])
        optimiser = torch.optim.SGD(module.parameters(), lr=0.003)
        inputs, labels = _own(clients, row)
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(module(inputs), labels).backward()
        optimiser.step()
        expected = torch.nn.utils.parameters_to_vector(module.parameters()).detach().numpy()
        np.testing.assert_allclose(updated[j], expected, rtol=1e-6, atol=1e-7)
    # The whole batch in client order (the simulator's call) takes the no-gather path: same numbers.
    everyone = clients.local_update(np.repeat(models[:1], 20, axis=0), np.arange(20), 0)
    np.testing.assert_allclose(everyone[3], clients.local_update(models[:1], np.array([3]), 0)[0], rtol=1e-6, atol=1e-8)
    two_steps = replace(clients, local_steps=2).local_update(start[:1], rows[:1], 0)
    once_more = clients.local_update(clients.local_update(start[:1], rows[:1], 0), rows[:1], 1)
    np.testing.assert_allclose(two_steps, once_more, rtol=1e-6, atol=1e-8)


def test_padding_does_not_change_losses_or_updates(clients, task):
    parts = [(_own(clients, row)[0].numpy(), _own(clients, row)[1].numpy()) for row in range(20)]
    tests = [(_own(clients, row, "test")[0].numpy(), _own(clients, row, "test")[1].numpy()) for row in range(20)]
    padded = client_batch(clients.client_ids, clients.groups, parts, tests, 72 + 9, 18 + 4, 64, 10, 1, 0.003)
    assert padded.train_inputs.shape == (20, 81, 64)
    models = task.initial_models(2)
    for split in ("train", "test"):
        np.testing.assert_allclose(padded.losses(models, split), clients.losses(models, split), rtol=1e-5)
    rows = np.arange(20)
    np.testing.assert_allclose(padded.local_update(models[rows % 2], rows, 0),
                               clients.local_update(models[rows % 2], rows, 0), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(padded.num_examples, clients.num_examples)


def test_initial_models_interpolate_the_specialist(task):
    starts = task.pretrained()
    for alpha in (0.0, 0.45, 0.7, 1.0):
        models = replace(task, alpha=alpha).initial_models(2)
        assert models.dtype == np.float32 and models.shape == (2, task.num_parameters)
        np.testing.assert_array_equal(models[0], starts["w_mix"])
        expected = (1 - alpha) * starts["xi"].astype(np.float64) + alpha * starts["w_trans"].astype(np.float64)
        np.testing.assert_allclose(models[1], expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(replace(task, alpha=1.0).initial_models(2)[1], starts["w_trans"])
    # xi is the seeded initial model: both pretraining runs start there, so it is not w_mix or w_trans.
    assert not np.array_equal(starts["xi"], starts["w_mix"]) and not np.array_equal(starts["w_mix"], starts["w_trans"])
    # Cached per data settings: a different alpha or learning rate reuses the same pretrained arrays.
    assert replace(task, alpha=0.3, learning_rate=0.01).pretrained()["w_mix"] is starts["w_mix"]
    with pytest.raises(ValueError, match="num_clusters"):
        task.initial_models(3)


def test_pretraining_fits_the_own_group_better(task):
    """``w_trans`` beats ``w_mix`` on the transformed group and loses on the clean group (held out)."""
    clients = replace(task, pretrain_epochs=15).clients(np.arange(20))
    starts = replace(task, pretrain_epochs=15).pretrained()
    losses = clients.losses(np.stack([starts["w_mix"], starts["w_trans"]]), "test")
    assert losses[clients.groups == 1, 1].mean() < losses[clients.groups == 1, 0].mean()
    assert losses[clients.groups == 0, 0].mean() < losses[clients.groups == 0, 1].mean()


def test_round_zero_audit_shape():
    audit = round_zero_audit(alphas=(0.5, 0.6), data_seeds=(0, 3), task=CharactersTask(**SMALL))
    assert len(audit) == 4
    assert {"alpha", "data_seed", "A00", "A01", "A10", "A11", "K0", "paper_pattern"} <= set(audit.columns)
    np.testing.assert_allclose(audit[["A00", "A01"]].sum(axis=1), 1.0)
    np.testing.assert_allclose(audit[["A10", "A11"]].sum(axis=1), 1.0)
    assert audit["K0"].between(1, 2).all()
    assert sorted(set(audit["alpha"])) == [0.5, 0.6] and sorted(set(audit["data_seed"])) == [0, 3]


def test_entry_threshold_calibration_uses_entry_benefits():
    tau, table, summary = calibrate_entry_threshold(data_seeds=(10,), alphas=(0.6, 0.7), task=CharactersTask(**SMALL))
    assert np.isfinite(tau) and summary["tau"] == tau
    assert set(table["group"]) == {0, 1} and len(table) == 4
    assert table["count"].sum() == summary["probed"] <= 40
    assert (table["min"] >= -1).all() and (table["max"] <= 1).all()  # cosines
    assert 0 <= summary["misclassified"] <= summary["probed"]


def _benefits(rows: dict[float, tuple[list[float], list[float]]]) -> pd.DataFrame:
    """Probed benefits by hand: α → (clean benefits, transformed benefits)."""
    return pd.DataFrame([{"alpha": alpha, "group": group, "benefit": value}
                         for alpha, groups in rows.items() for group, values in enumerate(groups) for value in values])


def test_entry_threshold_rule_by_hand_midpoint():
    # α = 0.6 does not separate (transformed max 0.35 ≥ clean min 0.30); α = 0.7 does
    # (0.20 < 0.28): τ = (0.28 + 0.20) / 2 = 0.24.  At τ = 0.24 the two transformed clients of
    # α = 0.6 stay out (0.25, 0.35 > τ): 2 on the wrong side; nobody clean enters.
    tau, summary = entry_threshold_from_benefits(_benefits({0.6: ([0.30, 0.40], [0.25, 0.35]),
                                                            0.7: ([0.28, 0.36], [0.10, 0.20])}))
    assert tau == pytest.approx(0.24, abs=1e-15) and summary["rule"] == "midpoint"
    assert summary["separated_from_alpha"] == 0.7 and summary["misclassified"] == 2
    assert summary["entry_rate"] == {0.6: {"clean": 0.0, "transformed": 0.0}, 0.7: {"clean": 0.0, "transformed": 1.0}}
    assert summary["per_alpha"][0.6]["separated"] is False and summary["per_alpha"][0.7]["separated"] is True


def test_entry_threshold_rule_by_hand_best_separating():
    # The largest α (0.7) does not separate (transformed 0.35 > clean 0.30), so the rule falls back
    # to the best-separating cut over all six benefits 0.10 0.20 0.30 0.35 0.40 0.50.  Wrong side
    # (transformed above + clean at or below) for each candidate cut:
    #   0.1−1e-6: 3,  0.15: 2,  0.25: 1,  0.325: 2,  0.375: 1,  0.45: 2,  0.5+1e-6: 3
    # → 1 at 0.25 and 0.375; ties go to the lowest: τ = 0.25.
    tau, summary = entry_threshold_from_benefits(_benefits({0.6: ([0.50], [0.20]),
                                                            0.7: ([0.30, 0.40], [0.35, 0.10])}))
    assert tau == pytest.approx(0.25, abs=1e-15) and summary["rule"] == "best-separating"
    assert summary["separated_from_alpha"] is None and summary["midpoint_tau"] is None
    assert summary["misclassified"] == 1 == summary["best_separating_misclassified"]


def test_entry_threshold_constant_is_the_documented_midpoint():
    # Module docstring: over the α = 0.70 calibration cells the clean minimum is 0.229 and the
    # transformed maximum 0.213; τ is their midpoint, and methods use it for the character tasks.
    assert ENTRY_THRESHOLD == pytest.approx((0.229 + 0.213) / 2, abs=1e-12)
    assert method_settings("sync-entry", preset="characters").entry_threshold == ENTRY_THRESHOLD
    assert method_settings("exp3", preset="femnist").entry_threshold == ENTRY_THRESHOLD


def test_runs_of_different_seeds_batch_together():
    tasks = [CharactersTask(seed=seed, alpha=alpha, **SMALL) for seed, alpha in ((0, 0.5), (1, 0.7))]
    merged = concatenate_clients([t.clients(np.arange(20)) for t in tasks])
    assert merged.train_inputs.shape == (40, 72, 64)
    settings = method_settings("greedy", preset="characters")
    batch = simulate_batch(tasks, settings, num_rounds=3, seeds=[0, 0])
    alone = simulate(tasks[1], settings, num_rounds=3, seed=0)
    assert batch.cluster_models.dtype == np.float32
    np.testing.assert_allclose(batch.cluster_models[:, 1], alone.cluster_models, rtol=1e-6, atol=1e-7)


def test_invalid_settings_name_the_key():
    with pytest.raises(ValueError, match="num-clients"):
        CharactersTask(num_clients=7)
    with pytest.raises(ValueError, match="alpha"):
        CharactersTask(alpha=1.5)
    with pytest.raises(ValueError, match="pretrain-epochs"):
        CharactersTask(pretrain_epochs=-1)
    with pytest.raises(ValueError, match="client ids"):
        CharactersTask(**SMALL).clients(np.array([20]))


def test_documented_measurements_hold_with_the_defaults():
    """The module docstring's audit (18/18 cells collapsed) and calibrated τ, recomputed."""
    audit = round_zero_audit()
    assert len(audit) == 18 and audit["paper_pattern"].all()
    tau, _, summary = calibrate_entry_threshold()
    assert tau == pytest.approx(ENTRY_THRESHOLD, abs=2e-3)
    assert summary["rule"] == "midpoint" and summary["separated_from_alpha"] == 0.7
    assert summary["per_alpha"][0.7]["clean_min"] == pytest.approx(0.229, abs=5e-4)
    assert summary["per_alpha"][0.7]["transformed_max"] == pytest.approx(0.213, abs=5e-4)
    assert all(rates["clean"] == 0 for rates in summary["entry_rate"].values())
