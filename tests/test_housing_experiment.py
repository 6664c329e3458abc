"""Tests of E6 (paper Figure B.4) on ``fedroute reproduce housing --quick`` over the real table shipped with the
package (what every experiment writes: tests/test_experiment_kit.py): where the table comes from."""

import json

import pandas as pd
import pytest

from fedroute.cli import main
from fedroute.simulation.experiments.housing import HousingExperimentConfig
from fedroute.tasks.housing import DATA_FILE_ENV, EMBEDDED_TABLE, EMBEDDED_TABLE_SHA256

QUICK = HousingExperimentConfig.quick()


@pytest.fixture(scope="module")
def quick_out(reproduced):
    """``fedroute reproduce housing --quick --data-file <the shipped table>``."""
    return reproduced("housing")


@pytest.fixture(scope="module")
def runs(quick_out) -> pd.DataFrame:
    return pd.read_parquet(quick_out / "runs.parquet")


def test_paper_settings():
    full = HousingExperimentConfig()
    assert (full.radii, full.rounds, full.num_clusters, full.seeds_per_radius) == ((0.0, 0.5, 1.0, 2.0), 1000, 2, 10)
    assert (QUICK.seeds_per_radius, QUICK.radii) == (2, full.radii) and QUICK.rounds < full.rounds
    specs = full.specs()
    assert specs["exp3"].settings.controllers == ("gr", "com", "rev")
    assert {spec.settings.num_clusters for spec in specs.values()} == {2}


def test_config_records_the_table_and_the_round_zero_entrance(quick_out):
    config = json.loads((quick_out / "config.json").read_text())
    assert config["data"] == {"source": "--data-file", "data_file": str(EMBEDDED_TABLE), "rows": 20640,
                              "sha256": EMBEDDED_TABLE_SHA256}
    assert set(config["round_zero"]) == {f"{r:g}" for r in QUICK.radii} and "round 0" in config["notes"]
    draws = config["init_draws"]  # every start conditioned on a collapsed entrance, the draws counted
    assert draws["entrance"] == "collapsed" and config["derived"]["entrance"].startswith("collapsed entrance")
    assert [len(draws["by_R"][f"{r:g}"]) for r in QUICK.radii] == [QUICK.seeds_per_radius] * len(QUICK.radii)
    assert draws["total"] == sum(sum(v) for v in draws["by_R"].values()) and min(min(v) for v in
                                                                                draws["by_R"].values()) >= 1


def test_every_start_is_a_collapsed_entrance(runs, quick_out):
    """Before: 8 of the full sweep's 40 starts (the jitter deciding the round-zero routes) were."""
    assert (runs["round0_clusters_used"] == 1).all()
    summary = pd.read_parquet(quick_out / "summary.parquet")
    assert (summary["round0_pr_single_cluster"] == 1.0).all()


def test_quick_run_claims_on_the_real_table(quick_out):
    """The quick sweep shows what the full one does (docs/results.md): EXP3 keeps two models and every start is
    collapsed; Greedy and FedCAM collapse at every R from collapsed entrances, so not 'more as R grows'; the
    under-training claim needs the full sweep's T = 1000."""
    verdicts = {claim["claim"].split(":")[0]: claim["holds"]
                for claim in json.loads((quick_out / "claims.json").read_text())}
    assert verdicts == {
        "EXP3 keeps two usable models across the sweep": True,
        "Greedy IFCA collapses more as R grows": False,
        "FedCAM collapses more as R grows": False,
        "Every start is a collapsed entrance": True,
        "T = 100 keeps under-training small": False,
    }


def test_runs_table_has_one_row_per_method_and_cell(runs, quick_out):
    assert len(runs) == len(QUICK.methods) * len(QUICK.cells())
    assert not runs.duplicated(["method", "radius", "seed"]).any()
    for method in QUICK.methods:
        assert runs.loc[runs["method"] == method, ["radius", "seed"]].to_dict("records") == QUICK.cells()
    by_method = {m: t.set_index(["radius", "seed"]).sort_index() for m, t in runs.groupby("method")}
    for column in ("round0_clusters_used", "round0_attraction", "oracle_test_loss", "greedy_collapse"):
        pd.testing.assert_series_equal(by_method["greedy"][column], by_method["exp3"][column])
    assert (runs["collapsed"] == (runs["usable_models"] < 2)).all()
    assert runs["usable_models"].between(1, 2).all() and runs["round0_clusters_used"].between(1, 2).all()
    summary = pd.read_parquet(quick_out / "summary.parquet")
    assert len(summary) == len(QUICK.methods) * len(QUICK.radii)
    for row in summary.itertuples():
        cell = runs[(runs["method"] == row.method) & (runs["radius"] == row.radius)]
        assert row.pr_all_usable == pytest.approx((cell["usable_models"] == 2).mean())


def _offline(monkeypatch) -> None:
    """The download host of fetch_california_housing unreachable (as on the reference machine)."""
    import sklearn.datasets

    def unreachable(*args, **kwargs):
        raise OSError("simulated: download host unreachable")

    monkeypatch.delenv(DATA_FILE_ENV, raising=False)
    monkeypatch.setattr(sklearn.datasets, "fetch_california_housing", unreachable)


@pytest.mark.parametrize("source", ["environment", "offline"])
def test_default_sources_give_the_same_runs(source, tmp_path, monkeypatch, quick_out):
    """``$FEDROUTE_HOUSING_FILE``, else (offline, without --data-file) the table shipped with the package."""
    if source == "environment":
        monkeypatch.setenv(DATA_FILE_ENV, str(EMBEDDED_TABLE))
    else:
        _offline(monkeypatch)
    assert main(["reproduce", "housing", "--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "housing" / "config.json").read_text())["data"]
    assert data == {"source": f"${DATA_FILE_ENV}" if source == "environment" else
                    "embedded copy (fetch_california_housing unreachable)", "data_file": str(EMBEDDED_TABLE),
                    "rows": 20640, "sha256": EMBEDDED_TABLE_SHA256}
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "housing" / "runs.parquet"),
                                  pd.read_parquet(quick_out / "runs.parquet"), check_exact=True)


def test_offline_without_the_embedded_copy_fails_with_a_clear_message(tmp_path, monkeypatch, capsys):
    from fedroute.tasks import housing

    _offline(monkeypatch)
    monkeypatch.setattr(housing, "EMBEDDED_TABLE", tmp_path / "absent.csv.gz")
    assert main(["reproduce", "housing", "--quick", "--out", str(tmp_path)]) == 1
    message = capsys.readouterr().err
    assert "cannot load California Housing" in message and DATA_FILE_ENV in message and "--data-file" in message
    assert not (tmp_path / "housing").exists()
