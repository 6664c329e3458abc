"""Tests of the California Housing task (paper B.5, EXPERIMENTS E6) on a generated table and on the
real table shipped with the package (offline fallback)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pandas as pd
import pytest

from fedroute.core.randomness import Purpose, generator
from fedroute.tasks import housing
from fedroute.tasks.housing import (
    COLUMNS,
    DATA_FILE_ENV,
    EMBEDDED_TABLE,
    EMBEDDED_TABLE_SHA256,
    FEATURES,
    TARGET,
    HousingTask,
    load_california_housing,
    load_california_housing_from,
    split_rows,
)
from fedroute.tasks.linear import LinearTask
from fedroute.tasks.registry import TASKS, task_from_config

NUM_ROWS = 400
TEST_FRACTION = 0.2
SEED = 5
# Generating rule per occupancy regime: y = a_g + b_g · (raw features).
INTERCEPTS = np.array([2.0, 0.5])
SLOPES = np.array([
    [0.40, 0.010, -0.05, 0.30, 0.0002, -0.20, -0.10, -0.08],
    [0.25, -0.020, 0.10, -0.40, 0.0005, -0.60, 0.05, 0.03],
])


def _generated_table() -> tuple[pd.DataFrame, np.ndarray]:
    """400 block groups with plausible features and a noiseless linear rule per regime.

    The regime of a row is ``AveOccup ≥`` the 0.75-quantile of the training
    rows of the task's split (computed here independently of the task).
    """
    rng = np.random.default_rng(2024)
    raw = np.column_stack([
        rng.uniform(0.5, 10.0, NUM_ROWS),            # MedInc
        rng.integers(1, 53, NUM_ROWS).astype(float),  # HouseAge
        rng.uniform(3.0, 8.0, NUM_ROWS),              # AveRooms
        rng.uniform(0.8, 1.5, NUM_ROWS),              # AveBedrms
        rng.uniform(100.0, 3000.0, NUM_ROWS),         # Population
        rng.uniform(1.5, 5.0, NUM_ROWS),              # AveOccup
        rng.uniform(32.5, 42.0, NUM_ROWS),            # Latitude
        rng.uniform(-124.0, -114.0, NUM_ROWS),        # Longitude
    ])
    train, _ = split_rows(NUM_ROWS, TEST_FRACTION, SEED)
    occupancy = raw[:, FEATURES.index("AveOccup")]
    regime = (occupancy >= np.quantile(occupancy[train], 0.75)).astype(int)
    target = INTERCEPTS[regime] + np.einsum("nd,nd->n", raw, SLOPES[regime])
    frame = pd.DataFrame(raw, columns=list(FEATURES))
    frame[TARGET] = target
    return frame, regime


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    frame, regime = _generated_table()
    directory = tmp_path_factory.mktemp("housing")
    csv_gz, parquet = directory / "housing.csv.gz", directory / "housing.parquet"
    frame.to_csv(csv_gz, index=False)
    frame.to_parquet(parquet, index=False)
    return {"frame": frame, "regime": regime, "csv_gz": csv_gz, "parquet": parquet}


@pytest.fixture()
def task(generated: dict) -> HousingTask:
    # 7 clients: 2 for group 1 (80 training rows → 40 each), 5 for group 0 (240 → 48 each),
    # so a batch of all clients is padded.
    return HousingTask(num_clients=7, test_fraction=TEST_FRACTION, seed=SEED, local_steps=3,
                       learning_rate=0.01, data_file=str(generated["csv_gz"]))


def _real_rows(samples, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """The masked-in rows of a (padded) HousingSamples batch, all clients stacked."""
    inputs, targets, mask = (
        (samples.train_inputs, samples.train_targets, samples.train_mask) if split == "train"
        else (samples.test_inputs, samples.test_targets, samples.test_mask)
    )
    return inputs[mask], targets[mask]


# -- loader -------------------------------------------------------------------------------------

def test_loader_reads_csv_gz_and_parquet(generated: dict) -> None:
    from_csv = load_california_housing(generated["csv_gz"])
    from_parquet = load_california_housing(str(generated["parquet"]))
    for frame in (from_csv, from_parquet):
        assert list(frame.columns) == list(COLUMNS) and len(frame) == NUM_ROWS
        np.testing.assert_allclose(frame.to_numpy(), generated["frame"].to_numpy(), rtol=1e-12)


def test_loader_rejects_a_file_missing_a_column(generated: dict, tmp_path: Path) -> None:
    broken = tmp_path / "broken.csv.gz"
    generated["frame"].drop(columns=["AveOccup"]).to_csv(broken, index=False)
    with pytest.raises(ValueError, match="AveOccup"):
        load_california_housing(broken)
    unknown = tmp_path / "table.json"
    unknown.write_text("{}")
    with pytest.raises(ValueError, match="format"):
        load_california_housing(unknown)
    with pytest.raises(FileNotFoundError):
        load_california_housing(tmp_path / "absent.csv")


def _unreachable(*args, **kwargs):
    raise URLError("[Errno -3] Temporary failure in name resolution")


def test_offline_loader_falls_back_to_the_embedded_table(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    import sklearn.datasets

    monkeypatch.delenv(DATA_FILE_ENV, raising=False)
    monkeypatch.setattr(sklearn.datasets, "fetch_california_housing", _unreachable)
    with caplog.at_level("WARNING", logger="fedroute"):
        frame, path = load_california_housing_from()
    assert path == EMBEDDED_TABLE and frame.shape == (20_640, 9)
    (record,) = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert record.levelname == "WARNING" and str(EMBEDDED_TABLE) in record.getMessage()
    pd.testing.assert_frame_equal(load_california_housing(), frame)


def test_offline_without_the_embedded_copy_tells_how_to_pass_a_local_copy(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    import sklearn.datasets

    monkeypatch.delenv(DATA_FILE_ENV, raising=False)
    monkeypatch.setattr(sklearn.datasets, "fetch_california_housing", _unreachable)
    monkeypatch.setattr(housing, "EMBEDDED_TABLE", tmp_path / "absent.csv.gz")
    with pytest.raises(RuntimeError, match="unreachable") as caught:
        load_california_housing()
    message = str(caught.value)
    for hint in ("data_file=", "'data-file'", "--data-file", "absent.csv.gz", DATA_FILE_ENV):
        assert hint in message


def test_environment_variable_is_the_default_file(generated: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    import sklearn.datasets

    def must_not_download(*args, **kwargs):
        raise AssertionError("fetch_california_housing called although a data file is set")

    monkeypatch.setattr(sklearn.datasets, "fetch_california_housing", must_not_download)
    monkeypatch.setenv(DATA_FILE_ENV, str(generated["parquet"]))
    assert len(load_california_housing()) == NUM_ROWS
    task = HousingTask(num_clients=7, test_fraction=TEST_FRACTION, seed=SEED)
    assert task.clients(np.arange(7)).num_examples.sum() == NUM_ROWS - round(TEST_FRACTION * NUM_ROWS)


def test_processed_table_is_cached_per_file(generated: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    first = HousingTask(num_clients=7, seed=SEED, data_file=str(generated["parquet"]))
    expected = first.samples(np.array([3])).train_inputs

    def no_reading(*args, **kwargs):
        raise AssertionError("the table was read again")

    monkeypatch.setattr(housing, "_read_table", no_reading)
    again = HousingTask(num_clients=7, seed=SEED, data_file=str(generated["parquet"]))
    np.testing.assert_array_equal(again.samples(np.array([3])).train_inputs, expected)
    assert again.clients(np.array([3])).num_examples[0] == len(expected[0])


# -- processing (paper B.5) ----------------------------------------------------------------------

def test_group_split_at_the_training_quantile(task: HousingTask, generated: dict) -> None:
    table = task.table
    train = table[table["split"] == "train"]
    assert len(train) == NUM_ROWS - round(TEST_FRACTION * NUM_ROWS)
    threshold = np.quantile(train["AveOccup"], 0.75)
    assert task.occupancy_threshold == pytest.approx(threshold)
    np.testing.assert_array_equal(table["group"], (table["AveOccup"] >= threshold).astype(int))
    np.testing.assert_array_equal(table["group"], generated["regime"])
    assert abs(train["group"].mean() - 0.25) <= 1.5 / len(train)


def test_split_is_seeded(generated: dict) -> None:
    same = HousingTask(num_clients=7, seed=SEED, data_file=str(generated["csv_gz"])).table["split"]
    again = HousingTask(num_clients=7, seed=SEED, data_file=str(generated["parquet"])).table["split"]
    other = HousingTask(num_clients=7, seed=SEED + 1, data_file=str(generated["csv_gz"])).table["split"]
    assert same.equals(again) and not same.equals(other)


def test_features_are_standardised_with_training_statistics(task: HousingTask, generated: dict) -> None:
    samples = task.samples(np.arange(task.num_clients))
    inputs, _ = _real_rows(samples)
    assert inputs.shape == (NUM_ROWS - round(TEST_FRACTION * NUM_ROWS), 9)
    np.testing.assert_allclose(inputs[:, :8].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(inputs[:, :8].std(axis=0), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(inputs[:, 8], 1.0)
    # The held-out rows use the same (training) statistics.
    train, test = split_rows(NUM_ROWS, TEST_FRACTION, SEED)
    raw = generated["frame"][list(FEATURES)].to_numpy()
    mean, std = raw[train].mean(axis=0), raw[train].std(axis=0)
    test_inputs, _ = _real_rows(samples, "test")
    expected = np.sort(((raw[test] - mean) / std)[:, 0])
    np.testing.assert_allclose(np.sort(test_inputs[:, 0]), expected, rtol=1e-10)


def test_oracle_recovers_the_generating_coefficients(task: HousingTask, generated: dict) -> None:
    train, _ = split_rows(NUM_ROWS, TEST_FRACTION, SEED)
    raw = generated["frame"][list(FEATURES)].to_numpy()
    mean, std = raw[train].mean(axis=0), raw[train].std(axis=0)
    # y = a + bᵀx_raw = (a + bᵀmean) + (b ⊙ std)ᵀ x_std
    expected = np.column_stack([SLOPES * std, INTERCEPTS + SLOPES @ mean])
    assert task.group_parameters.shape == (2, 9)
    np.testing.assert_allclose(task.group_parameters, expected, rtol=1e-7, atol=1e-9)
    assert task.group_distance == pytest.approx(np.linalg.norm(expected[0] - expected[1]))


# -- clients ------------------------------------------------------------------------------------

def test_clients_are_pure_and_hold_every_row(task: HousingTask) -> None:
    ids = np.arange(task.num_clients)
    clients = task.clients(ids)
    table = task.table
    assert np.bincount(clients.groups, minlength=2).min() >= 2
    np.testing.assert_array_equal(task.groups(ids), clients.groups)
    for split in ("train", "test"):
        part = table[table["split"] == split]
        assert set(part["client"]) == set(ids)
        # every client's rows come from one group, its own
        per_client = part.groupby("client")["group"].agg(["min", "max", "size"])
        np.testing.assert_array_equal(per_client["min"], per_client["max"])
        np.testing.assert_array_equal(per_client["min"], clients.groups)
        counts = clients.num_examples if split == "train" else clients.num_test_examples
        np.testing.assert_array_equal(per_client["size"], counts)
    assert clients.num_examples.sum() == (table["split"] == "train").sum()
    assert clients.num_examples.dtype == np.int64
    # group sizes in proportion: 80 of 320 training rows in group 1 → 2 of 7 clients
    np.testing.assert_array_equal(np.bincount(clients.groups), [5, 2])
    # the targets of a client are its rows' MedHouseVal
    samples = task.samples(ids)
    np.testing.assert_array_equal(samples.num_examples, clients.num_examples)
    rows = table[(table["split"] == "train") & (table["client"] == 6)]
    np.testing.assert_allclose(np.sort(samples.train_targets[6][samples.train_mask[6]]), np.sort(rows[TARGET]))


def test_losses_for_shared_and_per_client_models_agree(task: HousingTask) -> None:
    clients = task.clients(np.arange(task.num_clients))
    models = generator(1, 0, 0, Purpose.INIT).standard_normal((3, 9))
    shared = clients.losses(models)
    assert shared.shape == (task.num_clients, 3)
    np.testing.assert_allclose(clients.losses(np.broadcast_to(models, (task.num_clients, 3, 9))), shared)
    per_client = generator(2, 0, 0, Purpose.INIT).standard_normal((task.num_clients, 3, 9))
    batched = clients.losses(per_client, "test")
    for i in range(task.num_clients):
        np.testing.assert_allclose(batched[i], clients.losses(per_client[i], "test")[i])
    with pytest.raises(ValueError, match="split"):
        clients.losses(models, "validation")


def test_padding_does_not_change_losses_or_updates(task: HousingTask) -> None:
    everyone = task.samples(np.arange(task.num_clients))
    sizes = everyone.num_examples
    small = int(np.argmin(sizes))
    assert sizes[small] < sizes.max() and not everyone.train_mask[small].all()  # client `small` is padded
    alone = task.samples(np.array([small]))
    assert alone.train_mask.all() and alone.train_inputs.shape[1] == sizes[small]
    padded_rows = everyone.train_inputs[small][everyone.train_mask[small]]
    np.testing.assert_array_equal(padded_rows, alone.train_inputs[0])
    np.testing.assert_array_equal(everyone.train_inputs[small][~everyone.train_mask[small]], 0.0)

    # The losses and updates (built from the padded batch of all clients) against a direct,
    # unpadded computation of L_i and E gradient steps on L_i for the padded client.
    clients = task.clients(np.arange(task.num_clients))
    np.testing.assert_array_equal(clients.num_examples, sizes)
    models = task.initial_models(2)
    for split in ("train", "test"):
        inputs, targets = _real_rows(alone, split)
        direct = np.mean((inputs @ models.T - targets[:, None]) ** 2, axis=0)
        np.testing.assert_allclose(clients.losses(models, split)[small], direct, rtol=1e-10)
        np.testing.assert_allclose(task.clients(np.array([small])).losses(models, split)[0], direct, rtol=1e-10)
    inputs, targets = _real_rows(alone)
    weights = models.copy()
    for _ in range(task.local_steps):
        residuals = weights @ inputs.T - targets
        weights = weights - task.learning_rate * 2.0 * residuals @ inputs / len(targets)
    np.testing.assert_allclose(clients.local_update(models, np.array([small, small]), 0), weights, rtol=1e-10)


def test_one_step_of_the_group_is_pooled_gradient_descent(task: HousingTask) -> None:
    single = HousingTask(num_clients=7, seed=SEED, learning_rate=0.01, data_file=task.data_file)
    clients = single.clients(np.arange(7))
    members = np.flatnonzero(clients.groups == 1)
    start = single.initial_centre()
    updates = clients.local_update(np.repeat(start[None], len(members), axis=0), members, 0)
    aggregated = np.average(updates, axis=0, weights=clients.num_examples[members])
    inputs, targets = _real_rows(single.samples(members))
    expected = start - 0.01 * 2.0 * inputs.T @ (inputs @ start - targets) / len(targets)
    np.testing.assert_allclose(aggregated, expected, rtol=1e-12)


# -- initialisation ------------------------------------------------------------------------------

def test_initial_centre_is_u_bar(generated: dict) -> None:
    task = HousingTask(num_clients=7, seed=SEED, init_radius=2.5, init_jitter=0.0,
                       data_file=str(generated["csv_gz"]))
    beta, directions = task.group_parameters, task.directions
    np.testing.assert_allclose(np.linalg.norm(directions, axis=1), 1.0)
    delta = np.linalg.norm(beta[0] - beta[1])
    u = beta + 2.5 * delta * directions
    np.testing.assert_allclose(task.displaced_parameters(), u)
    models = task.initial_models(3)
    assert models.shape == (3, 9)
    np.testing.assert_allclose(models, np.broadcast_to((u[0] + u[1]) / 2, (3, 9)))
    # With jitter the models scatter around ū(R) at scale jitter·Δ_β; the directions depend on the seed.
    jittered = HousingTask(num_clients=7, seed=SEED, init_radius=2.5, init_jitter=0.05,
                           data_file=str(generated["csv_gz"])).initial_models(3)
    offsets = jittered - models
    assert not np.allclose(offsets, 0.0)
    assert 0.2 * 0.05 * delta < np.sqrt(np.mean(offsets ** 2)) < 5 * 0.05 * delta
    other = HousingTask(num_clients=7, seed=SEED + 1, data_file=str(generated["csv_gz"]))
    assert not np.allclose(other.directions, directions)


def test_the_collapsed_entrance_is_the_first_init_draw_that_leaves_a_model_unused(generated: dict) -> None:
    """E6's starts, conditioned like E5's: init draw j takes its jitter from generator(seed, 0, j, INIT)."""
    def task(seed: int, **settings) -> HousingTask:
        return HousingTask(num_clients=7, seed=seed, init_radius=1.0, init_jitter=0.3,
                           data_file=str(generated["csv_gz"]), **settings)

    def clusters_used(task: HousingTask, models: np.ndarray) -> int:
        return len(np.unique(np.argmin(task.clients(np.arange(7)).losses(models), axis=1)))

    searched = [(seed, *task(seed).initial_draw(2)) for seed in range(SEED, SEED + 20)]
    seed, models, draws = next(found for found in searched if found[2] > 1)  # a start that needed a search
    collapsed, as_it_falls = task(seed), task(seed, entrance="any")
    assert collapsed.entrance == "collapsed" and clusters_used(collapsed, models) == 1
    assert [clusters_used(collapsed, collapsed._init_draw(j, 2)) for j in range(draws - 1)] == [2] * (draws - 1)
    noise = generator(seed, 0, draws - 1, Purpose.INIT).standard_normal((2, 9))
    np.testing.assert_allclose(models, collapsed.initial_centre() + 0.3 * collapsed.group_distance * noise,
                               rtol=1e-12, atol=0)
    np.testing.assert_array_equal(collapsed.initial_models(2), models)
    # "any" is draw 0, the start of the task's first version (generator(seed, 0, 0, INIT))
    first = generator(seed, 0, 0, Purpose.INIT).standard_normal((2, 9))
    np.testing.assert_allclose(as_it_falls.initial_models(2),
                               as_it_falls.initial_centre() + 0.3 * as_it_falls.group_distance * first, rtol=1e-12)
    assert as_it_falls.initial_draw(2)[1] == 1 and clusters_used(as_it_falls, as_it_falls.initial_models(2)) == 2
    with pytest.raises(ValueError, match=r"no collapsed entrance in max-init-draws = 1 draws; allowed: a larger "
                                         r"'max-init-draws'"):
        task(seed, max_init_draws=1).initial_models(2)
    with pytest.raises(ValueError, match="'entrance' = 'collapsed' needs num_clusters ≥ 2"):
        collapsed.initial_models(1)
    for key, value in (("entrance", "collapse"), ("max_init_draws", 0)):
        with pytest.raises(ValueError, match=key.replace("_", "-")):
            task(seed, **{key: value})


def test_runs_of_different_seeds_batch_in_the_simulator(generated: dict) -> None:
    from fedroute.simulation.simulator import concatenate_clients, simulate, simulate_batch
    from fedroute.core.methods import method_settings

    tasks = [HousingTask(num_clients=7, seed=seed, learning_rate=0.01, data_file=str(generated["csv_gz"]))
             for seed in (SEED, SEED + 1)]
    parts = [task.clients(np.arange(7)) for task in tasks]
    merged = concatenate_clients(parts)
    models = tasks[0].initial_models(2)
    np.testing.assert_allclose(merged.losses(models), np.concatenate([part.losses(models) for part in parts]))
    settings = method_settings("exp3", preset="housing")
    batch = simulate_batch(tasks, settings, 6, [0, 1])
    for run, task in enumerate(tasks):
        alone = simulate(task, settings, 6, run)
        np.testing.assert_allclose(batch.cluster_models[:, run], alone.cluster_models, rtol=1e-12)


# -- registry and validation ---------------------------------------------------------------------

def test_registry_builds_the_housing_task(generated: dict) -> None:
    assert TASKS == ("linear", "housing", "gmm", "characters", "femnist", "boundaries", "digit-rotations", "collinear",
                     "dataset")
    task = task_from_config({
        "task": "housing", "num-clients": 7, "test-fraction": 0.25, "local-steps": 2, "learning-rate": 0.02,
        "init-radius": 3, "init-jitter": 0.1, "seed": 4, "data-file": str(generated["parquet"]),
        "dimension": 5,  # a linear-task key: ignored
    })
    assert task == HousingTask(num_clients=7, test_fraction=0.25, local_steps=2, learning_rate=0.02,
                               init_radius=3.0, init_jitter=0.1, seed=4, data_file=str(generated["parquet"]))
    assert task_from_config({"task": "housing", "data-file": ""}).data_file is None
    linear = task_from_config({"task": "linear", "num-clients": 10, "init-spread": 2, "data-file": "x"})
    assert linear == LinearTask(num_clients=10, init_spread=2.0)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num-clients", 3),
        ("num-clients", 7.5),
        ("test-fraction", 1.0),
        ("local-steps", 0),
        ("learning-rate", 0.0),
        ("init-radius", -1.0),
        ("init-jitter", "lots"),
        ("seed", -2),
        ("data-file", "/nonexistent/california_housing.csv.gz"),
    ],
)
def test_bad_settings_name_the_run_config_key(generated: dict, key: str, value: object) -> None:
    config = {"task": "housing", "data-file": str(generated["csv_gz"]), key: value}
    with pytest.raises(ValueError, match=f"'{key}'.*allowed"):
        task_from_config(config)


def test_too_many_clients_for_the_table_is_named(generated: dict) -> None:
    task = HousingTask(num_clients=100, data_file=str(generated["csv_gz"]))
    with pytest.raises(ValueError, match="num-clients"):
        task.clients(np.arange(3))


# -- the real table ------------------------------------------------------------------------------

def test_embedded_table_is_the_documented_real_table() -> None:
    digest = hashlib.sha256(EMBEDDED_TABLE.read_bytes()).hexdigest()
    assert digest == EMBEDDED_TABLE_SHA256
    assert digest in (EMBEDDED_TABLE.parent / "README.md").read_text()
    frame = load_california_housing(EMBEDDED_TABLE)
    assert frame.shape == (20_640, 9) and list(frame.columns) == list(COLUMNS)
    # scikit-learn's fetch_california_housing: mean target 2.068558, mean MedInc 3.870671.
    assert frame[TARGET].mean() == pytest.approx(2.068558, abs=1e-6)
    assert frame["MedInc"].mean() == pytest.approx(3.870671, abs=1e-6)
    task = HousingTask(data_file=str(EMBEDDED_TABLE))
    clients = task.clients(np.arange(task.num_clients))
    assert clients.num_examples.sum() == 20_640 - round(0.2 * 20_640)
    np.testing.assert_array_equal(np.bincount(clients.groups), [15, 5])
    assert task.group_parameters.shape == (2, 9) and task.group_distance > 0
