"""Tests of E4 (paper Figure 2 e–h, Appendix B.3): ``fedroute reproduce characters --quick``.

The quick grid is α ∈ {0.55, 0.70} × data seed 0 × selector seed 0, ``T = 60``
(8 runs); it runs once per module, in this process.
"""

import json

import numpy as np
import pandas as pd
import pytest

from fedroute.cli import main
from fedroute.simulation.experiments import EXPERIMENTS
from fedroute.simulation.experiments.characters import (
    METHODS, CharactersExperimentConfig, horizon_check, make_characters_task, method_spec, reduce_characters)
from fedroute.simulation.simulator import simulate, simulate_batch
from fedroute.tasks.characters import ENTRY_THRESHOLD

QUICK = CharactersExperimentConfig.quick()


@pytest.fixture(scope="module")
def quick_out(reproduced):
    return reproduced("characters")


@pytest.fixture(scope="module")
def runs(quick_out) -> pd.DataFrame:
    return pd.read_parquet(quick_out / "runs.parquet")


def test_the_full_config_is_the_papers():
    full = CharactersExperimentConfig()
    assert full.alphas == (0.45, 0.50, 0.55, 0.60, 0.65, 0.70) and full.rounds == 800
    assert full.data_seeds == (0, 1, 2) and full.selector_seeds == (0, 1, 2)
    assert {m: len(full.cells(m)) for m in METHODS} == {"greedy": 18, "fedcam": 18, "exp3": 54, "sync-entry": 54}
    assert full.representative == (0.60, 1, 0) and full.sustained_window == 20
    assert full.kept_rounds() == [0, *range(781, 801)]
    sync, exp3 = full.routing("sync-entry"), full.routing("exp3")
    assert (sync.hysteresis_max_rounds, exp3.hysteresis_max_rounds) == (800, 160)
    assert sync.synchronized_entry and not exp3.synchronized_entry
    for settings in (sync, exp3):
        assert settings.controllers == ("gr", "hys") and settings.exp3_mode == "action"
        assert (settings.hysteresis_min_rounds, settings.hysteresis_exit_gap, settings.reversal_mass_threshold,
                settings.exp3_learning_rate, settings.exp3_exploration) == (5, 0.005, 0.20, 2.0, 0.001)
        assert settings.entry_threshold == ENTRY_THRESHOLD
    assert full.routing("greedy").controllers == ("gr",) == full.routing("fedcam").controllers


def test_config_records_the_routing_and_the_representative_run(quick_out):
    config = json.loads((quick_out / "config.json").read_text())
    assert "output-sum" in config["derived"]["fedcam"] and "h(x; Theta_glob) + f(x; Theta_k)" in config["derived"]["fedcam"]
    assert config["derived"]["routing"]["sync-entry"]["hysteresis_max_rounds"] == 800
    assert config["derived"]["total_runs"] == 8 and len(json.loads((quick_out / "claims.json").read_text())) == 10
    # the representative run, re-simulated alone, ends where the sweep's run of that cell ended
    assert config["representative_run"]["rerun_matches_sweep"] == {m: True for m in METHODS}


def test_quick_run_claims_that_must_hold(quick_out):
    """Claims the small grid cannot miss: the round-zero audit (both groups prefer w_mix at W^0,
    documented for every alpha and data seed), synchronized entry's round-0 entrants holding
    cluster 1 through the run (their episode lasts up to H_max = 800 > T = 60 rounds), and
    autonomous EXP3 never leaving the collapsed state in the representative run."""
    claims = json.loads((quick_out / "claims.json").read_text())
    for text in ("Round-zero audit", "synchronized entry routes to both models in every round",
                 "autonomous EXP3 stays at one usable model"):
        (verdict,) = [claim["holds"] for claim in claims if text in claim["claim"]]
        assert verdict is True, text


def test_runs_table_has_one_row_per_method_and_cell(runs):
    assert len(runs) == sum(len(QUICK.cells(m)) for m in METHODS) == 8
    keys = ["method", "alpha", "data_seed", "selector_seed"]
    assert not runs.duplicated(keys).any()
    for method in METHODS:
        expected = [{k: cell[k] for k in keys[1:]} for cell in QUICK.cells(method)]
        assert runs.loc[runs["method"] == method, keys[1:]].to_dict("records") == expected
    assert (runs.loc[runs["method"].isin(["greedy", "fedcam"]), "selector_seed"] == -1).all()
    # W^0 is shared by the methods of a cell: the round-zero facts agree
    by_method = {m: t.set_index(["alpha", "data_seed"]) for m, t in runs.groupby("method")}
    for method in METHODS:
        pd.testing.assert_series_equal(by_method[method]["round0_attraction"],
                                       by_method["greedy"]["round0_attraction"])
    assert (runs["round0_attraction"] == "[[1.0, 0.0], [1.0, 0.0]]").all()  # the paper's A^0 (quick cells)


def test_recovery_levels_are_consistent(runs, quick_out):
    for level in ("training", "joint", "sustained", "exact", "two_usable_test"):
        assert runs[level].dtype == bool
    assert (runs["training"] == (runs["k_train"] == 2)).all()
    assert (runs["joint"] == ((runs["k_train"] == 2) & (runs["k_test"] == 2))).all()
    assert (runs["two_usable_test"] == (runs["k_test"] == 2)).all()
    assert (~runs["exact"] | runs["joint"]).all() and (~runs["joint"] | runs["training"]).all()
    assert (~runs["sustained"] | runs["joint"]).all()
    assert (runs["exact"] == (runs["joint"] & (runs["accuracy_train"] == 1) & (runs["accuracy_test"] == 1))).all()
    assert runs[["accuracy_train", "accuracy_test"]].stack().between(0.5, 1.0).all()
    assert runs["rounds_both_routed"].between(0, QUICK.rounds).all()
    recovery = pd.read_parquet(quick_out / "recovery.parquet")
    for _, row in recovery.iterrows():
        part = runs[(runs["method"] == row["method"]) & (runs["alpha"] == row["alpha"])]
        assert row["runs"] == len(part)
        assert row["pr_two_usable_test"] == part["two_usable_test"].mean()
        for level in ("training", "joint", "sustained", "exact"):
            assert row[level] == part[level].sum()
    assert (recovery["exact"] <= recovery["joint"]).all() and (recovery["joint"] <= recovery["training"]).all()
    assert (recovery["sustained"] <= recovery["joint"]).all()
    rounds = pd.read_parquet(quick_out / "rounds.parquet")
    assert len(rounds) == len(METHODS) * (QUICK.rounds + 1)
    baselines = rounds[rounds["method"].isin(["greedy", "fedcam"]) & (rounds["round"] < QUICK.rounds)]
    assert (baselines["route_clusters"] == 1).all()  # collapsed start, Greedy routing: one model in use


def test_reduce_picks_the_window_from_a_full_trajectory():
    """The sweep's reduce gives the same row from the kept states as from every state."""
    config = CharactersExperimentConfig.quick(rounds=8, sustained_window=3)
    cell = config.cells("exp3")[0]
    task = make_characters_task(cell, **config.task)
    settings = config.routing("exp3")
    full = simulate_batch([task], settings, config.rounds, [cell["seed"]])
    kept = simulate_batch([task], settings, config.rounds, [cell["seed"]], model_rounds=config.kept_rounds())
    rows = [reduce_characters(h, [task], [cell], num_rounds=8, window=3) for h in (full, kept)]
    pd.testing.assert_frame_equal(rows[0], rows[1])
    with pytest.raises(ValueError, match="states"):
        reduce_characters(kept, [task], [cell], num_rounds=8, window=4)


@pytest.mark.parametrize("method", ["sync-entry", "exp3", "fedcam"])
def test_a_cell_in_a_batch_equals_the_cell_alone(method):
    """Batch = single: one cell inside a batch of three runs (other α and selector seeds) gives the same
    routes, masses and models as ``simulate`` of that cell alone (FedCAM: its simulator on a batch of one).
    Equal to the bit on the reference machine; the full grid's representative run, re-simulated alone, also
    matched its sweep.  The models are float32 torch kernels run on batches of other shapes, which may sum in
    another order on other CPUs (as the output-sum kernels do on AMD EPYC): within float32 rounding."""
    config = CharactersExperimentConfig.quick(rounds=12, sustained_window=5)
    cells = [{"alpha": 0.55, "data_seed": 0, "selector_seed": 1, "seed": 1},
             {"alpha": 0.70, "data_seed": 0, "selector_seed": 0, "seed": 0},
             {"alpha": 0.60, "data_seed": 0, "selector_seed": 2, "seed": 2}]
    tasks = [make_characters_task(cell, **config.task) for cell in cells]
    spec = method_spec(method, config, model_rounds=range(config.rounds + 1))
    batch = spec.simulate(tasks, spec.settings, config.rounds, [cell["seed"] for cell in cells])
    for index, (task, cell) in enumerate(zip(tasks, cells)):
        if method == "fedcam":
            one = spec.simulate([task], spec.settings, config.rounds, [cell["seed"]])
            alone_routes, alone_masses, alone_models = one.routes[:, 0], one.masses[:, 0], one.cluster_models[:, 0]
        else:
            alone = simulate(task, spec.settings, config.rounds, cell["seed"])
            alone_routes, alone_masses, alone_models = alone.routes, alone.masses, alone.cluster_models
            assert batch.entered[:, index].sum() == alone.entered.sum()
        np.testing.assert_array_equal(batch.routes[:, index], alone_routes)
        # masses: float64 sums of the same sample counts (the routes are equal)
        np.testing.assert_allclose(batch.masses[:, index], alone_masses, rtol=0, atol=1e-12)
        # models: ulp-level float32 differences per step, carried along 12 rounds of local SGD
        np.testing.assert_allclose(batch.cluster_models[:, index], alone_models, rtol=1e-5, atol=1e-6)
    if method == "sync-entry":  # the round-0 entry happened (transformed clients at α = 0.70 qualify)
        assert batch.entered[0, 1] > 0


def test_horizon_check_continues_the_runs_with_the_same_settings():
    config = CharactersExperimentConfig.quick()
    table = horizon_check(config, methods=("sync-entry",), alphas=(0.70,), data_seed=0, selector_seed=0,
                          rounds=10, every=5)
    assert table["round"].tolist() == [0, 5, 10] and (table["method"] == "sync-entry").all()
    assert np.isnan(table["to_cluster1_transformed"].iloc[-1])
    assert table["to_cluster1_transformed"].iloc[0] > 0  # transformed clients entered at round 0 (α = 0.70)
    assert (table["loss_transformed_w1"].diff().dropna() < 0).all()  # the specialist is being trained


def test_long_horizon_is_a_named_configuration(tmp_path, monkeypatch):
    """``reproduce characters --config long``: the paper's grid at T = 2400 with both H_max scaled by 3,
    written beside the T = 800 outputs (characters-long/)."""
    experiment = EXPERIMENTS["characters"]
    full, long = CharactersExperimentConfig(), experiment.configure("long")
    assert (long.rounds, long.sync_entry_max_rounds, long.exp3_max_rounds) == (2400, 2400, 480)
    assert (full.rounds, full.sync_entry_max_rounds, full.exp3_max_rounds) == (800, 800, 160)
    for key in ("alphas", "data_seeds", "selector_seeds", "methods", "sustained_window", "representative",
                "entry_threshold", "task", "hysteresis_min_rounds", "hysteresis_exit_gap"):
        assert getattr(long, key) == getattr(full, key), key
    assert long.routing("sync-entry").hysteresis_max_rounds == 2400
    assert long.routing("exp3").hysteresis_max_rounds == 480
    quick_long = experiment.configure("long", quick=True)
    assert (quick_long.rounds, quick_long.alphas) == (3 * QUICK.rounds, QUICK.alphas)
    ran = []

    def fake_run(experiment, config, out, *args, **kwargs):
        ran.append((config, out.name))
        raise SystemExit(0)

    monkeypatch.setattr("fedroute.simulation.experiments.kit.run_experiment", fake_run)
    for args, expected in (([], long), (["--quick"], quick_long)):
        with pytest.raises(SystemExit):
            main(["reproduce", "characters", "--config", "long", "--out", str(tmp_path), *args])
        assert ran[-1] == (expected, "characters-long")
    assert main(["reproduce", "characters", "--config", "short", "--out", str(tmp_path)]) == 2
