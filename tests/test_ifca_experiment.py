"""IFCA's synthetic experiment (``fedroute reproduce ifca``): the mixture task as the IFCA authors build it, our Greedy
with IFCA's gradient step equal to their update written out, and the success-rate relation of the tables."""

import json

import numpy as np
import pandas as pd
import pytest

from fedroute.core.influence import InfluenceBounds
from fedroute.core.methods import EXP3, GREEDY, method_settings
from fedroute.simulation.experiments import EXPERIMENTS
from fedroute.simulation.experiments.ifca import (
    AVERAGE, IFCA_GRADIENT, RUNS_COLUMNS, SUMMARY_COLUMNS, VARIANTS, IfcaExperimentConfig, ifca_reference)
from fedroute.simulation.experiments.kit import run_experiment
from fedroute.simulation.simulator import simulate_batch
from fedroute.tasks.mixture import MixtureTask

SMALL = dict(groups=(2, 4), machines=(40, 40), learning_rates=(0.2, 0.8), separations=(0.1, 1.0), dimension=10,
             samples_per_client=2, data_seeds=3, restarts=2, rounds=120, chunk_size=6, name="small")


def test_the_task_is_ifcas_mixture_of_linear_regressions():
    task = MixtureTask(num_clients=12, num_groups=3, dimension=6, samples_per_client=5, separation=0.3,
                       noise_std=0.0, seed=4, init_seed=9)
    np.testing.assert_array_equal(task.groups(np.arange(12)), np.repeat([0, 1, 2], 4))   # contiguous blocks
    assert set(np.unique(task.group_parameters)) <= {0.0, 0.3}
    assert set(np.unique(task.initial_models(3))) <= {0.0, 1.0}                          # IFCA's random start
    clients = task.clients(np.arange(12))
    inputs, targets = clients.train
    np.testing.assert_allclose(targets, np.einsum("isd,id->is", inputs, task.group_parameters[clients.groups]),
                               atol=1e-12)                                               # σ = 0: y = xᵀθ*
    models = task.initial_models(3)
    residuals = np.einsum("isd,kd->iks", inputs, models) - targets[:, None]
    np.testing.assert_allclose(clients.losses(models), 0.5 * np.mean(residuals ** 2, axis=-1), rtol=1e-12)
    rows = np.arange(12)
    stepped = clients.local_update(models[rows % 3], rows, 0)
    gradient = np.einsum("is,isd->id", residuals[rows, rows % 3], inputs) / 5
    np.testing.assert_allclose(stepped, models[rows % 3] - task.learning_rate * gradient, rtol=1e-12, atol=1e-12)
    assert task.initial_models(3).tolist() == MixtureTask(seed=5, init_seed=9, dimension=6,
                                                          num_groups=3, num_clients=12).initial_models(3).tolist()


@pytest.mark.parametrize("bad, key", [(dict(num_clients=10, num_groups=4), "num-clients"),
                                      (dict(separation=0.0), "separation"), (dict(learning_rate=2.0), "learning-rate"),
                                      (dict(num_groups=1, num_clients=4), "num-groups")])
def test_bad_task_settings_name_the_key(bad, key):
    with pytest.raises(ValueError, match=f"ifca-mixture task setting '{key}'"):
        MixtureTask(**bad)


@pytest.mark.parametrize("groups, separation", [(2, 0.1), (2, 1.0), (4, 1.0)])
def test_greedy_with_the_gradient_step_is_the_ifca_authors_update(groups, separation):
    """fedroute's Greedy (simulator, ``server-update = ifca-gradient``) and the authors' loop written out agree in
    every round's outcome: the final models within 1e-10 (float order differs)."""
    tasks = [MixtureTask(num_clients=40, num_groups=groups, dimension=10, samples_per_client=2,
                         separation=separation, learning_rate=0.4, seed=seed, init_seed=seed + 1) for seed in range(3)]
    history = simulate_batch(tasks, method_settings(GREEDY, num_clusters=groups), 60, [0, 1, 2],
                             influence=InfluenceBounds(server_update=IFCA_GRADIENT))
    for run, task in enumerate(tasks):
        np.testing.assert_allclose(history.cluster_models[-1, run], ifca_reference(task, 60), rtol=0, atol=1e-10)
    averaged = simulate_batch(tasks, method_settings(GREEDY, num_clusters=groups), 60, [0, 1, 2])
    assert np.abs(averaged.cluster_models[-1] - history.cluster_models[-1]).max() > 1e-3  # the two updates differ


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ifca")
    results, claims = run_experiment(EXPERIMENTS["ifca"], IfcaExperimentConfig(**SMALL), out)
    return out, results, claims


def test_a_small_configuration_writes_its_tables_with_the_expected_columns(small_run):
    out, results, claims = small_run
    runs, summary = pd.read_parquet(out / "runs.parquet"), pd.read_parquet(out / "summary.parquet")
    assert tuple(runs.columns) == RUNS_COLUMNS and tuple(summary.columns) == SUMMARY_COLUMNS
    assert len(runs) == len(VARIANTS) * 2 * 2 * 3 * 2                  # variants × p × R × data seeds × restarts
    assert set(zip(runs["method"], runs["server_update"])) == set(VARIANTS)
    assert (summary["runs"] == 6).all() and (summary["data_seeds"] == 3).all()
    (table,) = EXPERIMENTS["ifca"].show(results)
    assert list(table.columns) == ["groups", "separation", f"greedy_{IFCA_GRADIENT}", f"greedy_{AVERAGE}", "exp3",
                                   f"greedy_{IFCA_GRADIENT}_any_restart", "runs"]
    assert len(table) == 4 and (out / "figures" / "success.png").is_file()
    settings = json.loads((out / "config.json").read_text())
    assert settings["derived"]["cells"] == 2 * 2 * 3 * 2 and settings["derived"]["threshold"] == pytest.approx(0.061)


def test_success_follows_ifcas_criterion_and_averaging_succeeds_at_least_as_often(small_run):
    _, results, claims = small_run
    runs, summary = results.runs, results.summary
    np.testing.assert_array_equal(runs["success"], runs["final_distance"] < runs["threshold"])
    assert (runs.loc[runs["success"], "success_round"] >= 0).all()
    gradient = runs[(runs["method"] == GREEDY) & (runs["server_update"] == IFCA_GRADIENT)]
    assert (gradient["reference_gap"] <= 1e-6).all() and runs.loc[runs.index.difference(gradient.index),
                                                                   "reference_gap"].isna().all()
    rates = summary.set_index(["groups", "separation", "method", "server_update"])["success_rate"]
    for p in (2, 4):
        for r in (0.1, 1.0):
            assert rates[(p, r, GREEDY, AVERAGE)] >= rates[(p, r, GREEDY, IFCA_GRADIENT)], (p, r)
    best = summary.groupby(["groups", "separation", "method", "server_update"])
    assert ((best["success_any_restart"].first() >= best["success_rate"].first())).all()
    assert claims[0]["holds"] and claims[0]["measured"]["matching"] == claims[0]["measured"]["runs"] == 24
    assert claims[2]["holds"] is True and all(c["holds"] is not None for c in claims)


@pytest.mark.parametrize("bad", [dict(machines=(100,)), dict(machines=(100, 402)), dict(learning_rates=(0.2, 1.5)),
                                 dict(separations=(0.1, 0.1)), dict(groups=(1, 4))])
def test_invalid_settings_name_the_field(bad):
    with pytest.raises(ValueError, match="ifca setting '"):
        IfcaExperimentConfig(**bad)


def test_exp3_is_the_generic_default_with_k_equal_p():
    config = IfcaExperimentConfig()
    for p in config.groups:
        specs = {(spec.method, spec.simulate.keywords["influence"].server_update): spec for spec in config.specs(p)}
        assert set(specs) == set(VARIANTS)
        assert specs[(EXP3, AVERAGE)].settings == method_settings(EXP3, num_clusters=p)
        assert specs[(GREEDY, IFCA_GRADIENT)].settings.num_clusters == p


def test_more_seeds_doubles_the_data_seeds_and_stays_out_of_all():
    experiment = EXPERIMENTS["ifca"]
    config = experiment.configure("more-seeds")
    assert (config.data_seeds, config.restarts) == (2 * IfcaExperimentConfig().data_seeds, 2)
    assert experiment.output_name("more-seeds") == "ifca-more-seeds" and not experiment.variants["more-seeds"].in_all
    assert experiment.configure("more-seeds", quick=True).data_seeds == 2 * IfcaExperimentConfig.quick().data_seeds
