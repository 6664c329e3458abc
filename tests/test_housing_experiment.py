"""Tests of E6 (paper Figure B.4): the California Housing radius sweep (``reproduce housing --quick``).

The sweep runs on a small generated table with the real schema (a linear rule per
occupancy regime); one test runs it offline on the real table shipped with the package.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedroute.simulation.cli import REPRODUCE_COMMANDS, main
from fedroute.simulation.experiments.housing import (
    METHOD_SPECS,
    RUNS_COLUMNS,
    SUMMARY_COLUMNS,
    HousingExperimentConfig,
    collapse_columns,
)
from fedroute.tasks.housing import DATA_FILE_ENV, EMBEDDED_TABLE, EMBEDDED_TABLE_SHA256, FEATURES, TARGET

QUICK = HousingExperimentConfig.quick()
FIGURES = ("figB4a", "figB4b", "figB4c")
NUM_ROWS = 600
INTERCEPTS = np.array([2.0, 0.5])
SLOPES = np.array([
    [0.40, 0.010, -0.05, 0.30, 0.0002, -0.20, -0.10, -0.08],
    [0.25, -0.020, 0.10, -0.40, 0.0005, -0.60, 0.05, 0.03],
])


def _generated_table() -> pd.DataFrame:
    """600 block groups with plausible features and a linear rule (plus small noise) per occupancy regime
    (regime 1 iff ``AveOccup ≥`` its 0.75-quantile over all rows)."""
    rng = np.random.default_rng(7)
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
    occupancy = raw[:, FEATURES.index("AveOccup")]
    regime = (occupancy >= np.quantile(occupancy, 0.75)).astype(int)
    target = INTERCEPTS[regime] + np.einsum("nd,nd->n", raw, SLOPES[regime]) + 0.05 * rng.standard_normal(NUM_ROWS)
    frame = pd.DataFrame(raw, columns=list(FEATURES))
    frame[TARGET] = target
    return frame


@pytest.fixture(scope="module")
def table_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("housing-data") / "generated.csv.gz"
    _generated_table().to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory, table_file):
    """``fedroute reproduce housing --quick --data-file <generated>`` in this process (one worker)."""
    out = tmp_path_factory.mktemp("housing-w1")
    assert main(["reproduce", "housing", "--quick", "--data-file", str(table_file), "--out", str(out)]) == 0
    return out / "housing"


@pytest.fixture(scope="module")
def runs(quick_out) -> pd.DataFrame:
    return pd.read_parquet(quick_out / "runs.parquet")


def test_registered_and_configs():
    assert "housing" in REPRODUCE_COMMANDS
    full = HousingExperimentConfig()
    assert (full.radii, full.rounds, full.num_clusters, full.seeds_per_radius) == ((0.0, 0.5, 1.0, 2.0), 1000, 2, 10)
    assert (QUICK.seeds_per_radius, QUICK.radii) == (2, full.radii) and QUICK.rounds < full.rounds
    assert full.methods == ("greedy", "exp3", "fedcam") and set(full.methods) <= set(METHOD_SPECS)
    assert METHOD_SPECS["exp3"](full).settings.controllers == ("gr", "com", "rev")
    assert {METHOD_SPECS[m](full).settings.num_clusters for m in full.methods} == {2}
    for bad in (dict(radii=()), dict(seeds_per_radius=0), dict(methods=("exp3",)), dict(learning_rate=2.0)):
        with pytest.raises(ValueError):
            HousingExperimentConfig(**bad)


def test_cli_writes_every_file_with_the_right_columns(quick_out, table_file):
    tables = {"runs": RUNS_COLUMNS, "summary": SUMMARY_COLUMNS, "collapse_cells": collapse_columns(QUICK.methods)}
    for stem, columns in tables.items():
        for suffix, read in ((".parquet", pd.read_parquet), (".csv", pd.read_csv)):
            assert tuple(read(quick_out / f"{stem}{suffix}").columns) == columns, (stem, suffix)
    for stem in FIGURES:
        for suffix in (".png", ".pdf"):
            assert (quick_out / "figures" / f"{stem}{suffix}").stat().st_size > 1000
    claims = json.loads((quick_out / "claims.json").read_text())
    assert len(claims) >= 5
    assert all(set(claim) == {"claim", "paper", "measured", "holds"} for claim in claims)
    assert all(claim["holds"] in (True, False, None) for claim in claims)
    assert any(claim["claim"].startswith("EXP3 keeps two usable models") for claim in claims)
    config = json.loads((quick_out / "config.json").read_text())
    assert config["radii"] == list(QUICK.radii) and config["rounds"] == QUICK.rounds
    data = config["data"]
    assert data["source"] == "--data-file" and data["data_file"] == str(table_file.resolve())
    assert data["rows"] == NUM_ROWS and data["sha256"] == hashlib.sha256(table_file.read_bytes()).hexdigest()
    assert set(config["round_zero"]) == {f"{r:g}" for r in QUICK.radii} and "round 0" in config["notes"]


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


def test_results_do_not_depend_on_workers(tmp_path, quick_out, table_file):
    """Two local Ray workers (chunks of 2 cells, finishing out of order) give the same tables as one process."""
    assert main(["reproduce", "housing", "--quick", "--data-file", str(table_file), "--out", str(tmp_path),
                 "--workers", "2"]) == 0
    for stem in ("runs", "summary", "collapse_cells"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "housing" / f"{stem}.parquet"),
                                      pd.read_parquet(quick_out / f"{stem}.parquet"), check_exact=True)


def test_environment_variable_is_the_default_source(tmp_path, monkeypatch, quick_out, table_file):
    monkeypatch.setenv(DATA_FILE_ENV, str(table_file))
    assert main(["reproduce", "housing", "--quick", "--out", str(tmp_path)]) == 0
    config = json.loads((tmp_path / "housing" / "config.json").read_text())
    assert config["data"]["source"] == f"${DATA_FILE_ENV}"
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "housing" / "runs.parquet"),
                                  pd.read_parquet(quick_out / "runs.parquet"), check_exact=True)


def _offline(monkeypatch) -> None:
    """The download host of fetch_california_housing unreachable (as on the reference machine)."""
    import sklearn.datasets

    def unreachable(*args, **kwargs):
        raise OSError("simulated: download host unreachable")

    monkeypatch.delenv(DATA_FILE_ENV, raising=False)
    monkeypatch.setattr(sklearn.datasets, "fetch_california_housing", unreachable)


def test_offline_quick_run_uses_the_embedded_real_table(tmp_path, monkeypatch):
    """Offline and without --data-file, the run reads the table shipped with the package; on the real
    table the quick sweep already shows the claims that hold for any seed (EXP3 keeps two models, Greedy
    and FedCAM collapse at the largest R); the entrance and under-training claims need the full sweep's
    T = 1000 and do not hold at T = 100."""
    _offline(monkeypatch)
    assert main(["reproduce", "housing", "--quick", "--out", str(tmp_path)]) == 0
    config = json.loads((tmp_path / "housing" / "config.json").read_text())
    assert config["data"] == {"source": "embedded copy (fetch_california_housing unreachable)",
                              "data_file": str(EMBEDDED_TABLE), "rows": 20640, "sha256": EMBEDDED_TABLE_SHA256}
    runs = pd.read_parquet(tmp_path / "housing" / "runs.parquet")
    assert len(runs) == len(QUICK.methods) * len(QUICK.cells())
    verdicts = {claim["claim"].split(":")[0]: claim["holds"]
                for claim in json.loads((tmp_path / "housing" / "claims.json").read_text())}
    assert verdicts == {
        "EXP3 keeps two usable models across the sweep": True,
        "Greedy IFCA collapses more as R grows": True,
        "FedCAM collapses more as R grows": True,
        "Every start is a collapsed entrance": False,
        "T = 100 keeps under-training small": False,
    }


def test_offline_without_the_embedded_copy_fails_with_a_clear_message(tmp_path, monkeypatch, capsys):
    from fedroute.tasks import housing

    _offline(monkeypatch)
    monkeypatch.setattr(housing, "EMBEDDED_TABLE", tmp_path / "absent.csv.gz")
    assert main(["reproduce", "housing", "--quick", "--out", str(tmp_path)]) == 1
    message = capsys.readouterr().err
    assert "cannot load California Housing" in message and DATA_FILE_ENV in message and "--data-file" in message
    assert not (tmp_path / "housing").exists()
