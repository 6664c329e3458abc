"""Tests of E5 (paper Figure B.3) on ``fedroute reproduce gmm --quick`` (what every experiment writes:
tests/test_experiment_kit.py)."""

import json

import numpy as np
import pandas as pd
import pytest

from fedroute.simulation.experiments.gmm import GMMExperimentConfig, make_gmm_task
from fedroute.tasks.gmm import GMMTask

QUICK = GMMExperimentConfig.quick()


@pytest.fixture(scope="module")
def quick_out(reproduced):
    return reproduced("gmm")


@pytest.fixture(scope="module")
def runs(quick_out) -> pd.DataFrame:
    return pd.read_parquet(quick_out / "runs.parquet")


def test_paper_settings_use_the_tasks_own():
    full = GMMExperimentConfig()
    assert 12.0 in full.radii and full.far_radius == 12.0
    assert (full.rounds, full.num_clusters, full.NUM_GROUPS) == (GMMTask().rounds, 3, 3) == (200, 3, 3)
    assert full.methods == ("greedy", "exp3", "fedcam") and full.seeds_per_radius == 20
    assert QUICK.seeds_per_radius == 3 and 12.0 in QUICK.radii
    task, default = full.task_factory()({"radius": 12.0, "seed": 0}), GMMTask(init_radius=12.0, seed=0)
    for key in ("learning_rate", "local_steps", "init_jitter", "noise_std", "centre_norm", "num_clients"):
        assert getattr(task, key) == getattr(default, key)
    np.testing.assert_array_equal(task.initial_models(3), default.initial_models(3))
    specs = full.specs()
    assert specs["exp3"].settings.controllers == ("gr", "rh") and {s.settings.num_clusters for s in specs.values()} == {3}
    cells = full.cells()
    assert len(cells) == 5 * 20 and {c["seed"] for c in cells} == set(range(20))  # paired seeds


def test_config_records_the_entrance_the_notes_and_the_convergence_check(quick_out):
    config = json.loads((quick_out / "config.json").read_text())
    assert set(config["round_zero"]) == {f"{r:g}" for r in QUICK.radii} and "round 0" in config["notes"]
    assert config["convergence_check"]["rounds"] == QUICK.rounds and config["entrance"] == "collapsed"


def test_quick_run_claims_that_must_hold(quick_out):
    """Claims the small sweep cannot miss: one model trained alone from u_bar(12) converges within
    T = 60 (full-batch gradient descent on a convex loss: the task's T was chosen so), and EXP3
    keeps three models on the cells where Greedy leaves one unused."""
    claims = json.loads((quick_out / "claims.json").read_text())
    for start in ("T = 60 leaves no under-training confound", "EXP3 usually restores three-group specialisation"):
        (verdict,) = [claim["holds"] for claim in claims if claim["claim"].startswith(start)]
        assert verdict is True, start


def test_runs_table_has_one_row_per_method_and_cell(runs, quick_out):
    assert len(runs) == len(QUICK.methods) * len(QUICK.cells())
    assert not runs.duplicated(["method", "radius", "seed"]).any()
    for method in QUICK.methods:
        assert runs.loc[runs["method"] == method, ["radius", "seed"]].to_dict("records") == QUICK.cells()
    # W^0 is shared by the methods of a cell: so are the round-zero facts and the collapse flag.
    by_method = {m: t.set_index(["radius", "seed"]).sort_index() for m, t in runs.groupby("method")}
    for column in ("round0_clusters_used", "round0_eval_clusters", "round0_majority_clusters", "round0_attraction",
                   "oracle_test_loss", "greedy_collapse"):
        for method in ("exp3", "fedcam"):
            pd.testing.assert_series_equal(by_method["greedy"][column], by_method[method][column])
    assert (runs["collapsed"] == (runs["usable_models"] < 3)).all()
    greedy = by_method["greedy"]
    assert (greedy["greedy_collapse"] == greedy["collapsed"]).all()
    assert runs["usable_models"].between(1, 3).all() and runs["round0_clusters_used"].between(1, 3).all()
    assert runs["assignment_accuracy"].between(0, 1).all()
    for attraction in runs["round0_attraction"]:
        matrix = np.asarray(json.loads(attraction))
        assert matrix.shape == (3, 3)
        np.testing.assert_allclose(matrix.sum(axis=1), 1.0)
    assert (runs.loc[runs["method"] == "greedy", "final_gr_probability"] == 1.0).all()
    assert runs.loc[runs["method"] == "fedcam", "final_gr_probability"].isna().all()

    summary = pd.read_parquet(quick_out / "summary.parquet")
    assert len(summary) == len(QUICK.methods) * len(QUICK.radii)
    for row in summary.itertuples():
        cell = runs[(runs["method"] == row.method) & (runs["radius"] == row.radius)]
        assert row.runs == QUICK.seeds_per_radius
        assert row.pr_collapse == pytest.approx((cell["usable_models"] < 3).mean())
        assert row.mean_routed_test_loss == pytest.approx(cell["routed_test_loss"].mean())
    collapse = pd.read_parquet(quick_out / "collapse_cells.parquet")
    assert len(collapse) == int(greedy["greedy_collapse"].sum())
    assert (collapse["greedy_usable_models"] < 3).all()


def test_every_start_is_a_collapsed_entrance_and_the_draws_are_reported(runs, quick_out):
    """E5 by default starts every run from a collapsed entrance (K^0 < 3) and reports the draws it took;
    --config any-entrance keeps the first E5 (the task's starts as they fall)."""
    assert QUICK.entrance == "collapsed" and GMMExperimentConfig().entrance == "collapsed"
    assert (runs["round0_clusters_used"] < 3).all() and (runs["round0_majority_clusters"] < 3).all()
    claims = {claim["claim"].split(":")[0]: claim for claim in json.loads((quick_out / "claims.json").read_text())}
    assert claims["Every start is a collapsed entrance"]["holds"] is True
    draws = json.loads((quick_out / "config.json").read_text())["init_draws"]
    assert draws["entrance"] == "collapsed"
    assert [len(draws["by_R"][f"{r:g}"]) for r in QUICK.radii] == [QUICK.seeds_per_radius] * len(QUICK.radii)
    for cell in QUICK.cells():
        task = QUICK.task_factory()(cell)
        assert draws["by_R"][f"{cell['radius']:g}"][cell["seed"]] == task.initial_draw(3)[1]
    assert draws["total"] == sum(sum(v) for v in draws["by_R"].values()) > len(QUICK.cells())
    first = make_gmm_task(QUICK.cells()[0], entrance="any", rounds=QUICK.rounds)
    assert first.initial_draw(3)[1] == 1
