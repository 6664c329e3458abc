"""Tests of E5 (paper Figure B.3): the GMM radius sweep and its outputs (``reproduce gmm --quick``)."""

import json

import numpy as np
import pandas as pd
import pytest

from fedroute.simulation.cli import REPRODUCE_COMMANDS, main
from fedroute.simulation.experiments.gmm import (
    METHOD_SPECS,
    RUNS_COLUMNS,
    SUMMARY_COLUMNS,
    GMMExperimentConfig,
    collapse_columns,
    make_gmm_task,
)
from fedroute.tasks.gmm import GMMTask

QUICK = GMMExperimentConfig.quick()
FIGURES = ("figB3a", "figB3b", "figB3c")


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory):
    """``fedroute reproduce gmm --quick`` in this process (one worker)."""
    out = tmp_path_factory.mktemp("gmm")
    assert main(["reproduce", "gmm", "--quick", "--out", str(out)]) == 0
    return out / "gmm"


@pytest.fixture(scope="module")
def runs(quick_out) -> pd.DataFrame:
    return pd.read_parquet(quick_out / "runs.parquet")


def test_registered_and_configs():
    assert "gmm" in REPRODUCE_COMMANDS
    full = GMMExperimentConfig()
    assert 12.0 in full.radii and full.far_radius == 12.0
    assert (full.rounds, full.num_clusters, full.num_groups) == (GMMTask().rounds, 3, 3) == (200, 3, 3)
    assert full.methods == ("greedy", "exp3", "fedcam") and set(full.methods) <= set(METHOD_SPECS)
    assert full.seeds_per_radius == 20 and QUICK.seeds_per_radius == 3 and 12.0 in QUICK.radii
    # The task's own settings are used unchanged.
    task = make_gmm_task({"radius": 12.0, "seed": 0}, **full.task_settings())
    default = GMMTask(init_radius=12.0, seed=0)
    for key in ("learning_rate", "local_steps", "init_jitter", "noise_std", "centre_norm", "num_clients"):
        assert getattr(task, key) == getattr(default, key)
    np.testing.assert_array_equal(task.initial_models(3), default.initial_models(3))
    assert METHOD_SPECS["exp3"](full).settings.controllers == ("gr", "rh")
    assert {METHOD_SPECS[m](full).settings.num_clusters for m in full.methods} == {3}
    cells = full.cells()
    assert len(cells) == 5 * 20 and {c["seed"] for c in cells} == set(range(20))  # paired seeds
    for bad in (dict(radii=()), dict(radii=(0.0, 4.0)), dict(seeds_per_radius=0), dict(methods=("exp3",)),
                dict(learning_rate=-1.0), dict(rounds=1)):
        with pytest.raises(ValueError):
            GMMExperimentConfig(**bad)


def test_cli_writes_every_file_with_the_right_columns(quick_out):
    tables = {"runs": RUNS_COLUMNS, "summary": SUMMARY_COLUMNS, "collapse_cells": collapse_columns(QUICK.methods)}
    for stem, columns in tables.items():
        for suffix, read in ((".parquet", pd.read_parquet), (".csv", pd.read_csv)):
            table = read(quick_out / f"{stem}{suffix}")
            assert tuple(table.columns) == columns, (stem, suffix)
    for stem in FIGURES:
        for suffix in (".png", ".pdf"):
            assert (quick_out / "figures" / f"{stem}{suffix}").stat().st_size > 1000
    claims = json.loads((quick_out / "claims.json").read_text())
    assert len(claims) >= 6
    assert all(set(claim) == {"claim", "paper", "measured", "holds"} for claim in claims)
    assert all(claim["holds"] in (True, False, None) for claim in claims)
    assert any(claim["claim"].startswith("Greedy IFCA") for claim in claims)
    assert any(claim["claim"].startswith("FedCAM") for claim in claims)
    config = json.loads((quick_out / "config.json").read_text())
    assert config["radii"] == list(QUICK.radii) and config["rounds"] == QUICK.rounds
    assert set(config["round_zero"]) == {f"{r:g}" for r in QUICK.radii}
    assert isinstance(config["notes"], str) and "round 0" in config["notes"]
    assert config["convergence_check"]["rounds"] == QUICK.rounds


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
        task = make_gmm_task(cell, **QUICK.task_settings())
        assert draws["by_R"][f"{cell['radius']:g}"][cell["seed"]] == task.initial_draw(3)[1]
    assert draws["total"] == sum(sum(v) for v in draws["by_R"].values()) > len(QUICK.cells())
    first = make_gmm_task(QUICK.cells()[0], **{**QUICK.task_settings(), "entrance": "any"})
    assert first.initial_draw(3)[1] == 1


def test_named_configurations_of_reproduce(tmp_path, capsys):
    assert main(["reproduce", "gmm", "--config", "long", "--out", str(tmp_path)]) == 2
    assert "allowed: paper, any-entrance" in capsys.readouterr().err
    assert main(["reproduce", "linear", "--config", "any-entrance", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())  # nothing ran
