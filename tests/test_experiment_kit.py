"""The experiment kit: what every experiment's ``fedroute reproduce`` writes, settings rules, named configurations,
``reproduce all`` and the generated tables of docs/results.md."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedroute import cli
from fedroute.simulation.experiments import (
    EXPERIMENTS, PAPER, characters, fig1, gmm, housing, ifca, linear, radius, references, scenarios)
from fedroute.simulation.experiments.kit import (
    Experiment, ExperimentConfig, InputError, Results, Variant, claim, number, run_experiment, train_groups_alone)
from fedroute.simulation.plotting import Panel
from fedroute.simulation.results_doc import MARKER, claims_markdown, table_markdown, update_results_doc

TABLES = {
    "fig1": {"summary": fig1.SUMMARY_COLUMNS, "runs": fig1.RUNS_COLUMNS, "references": fig1.REFERENCES_COLUMNS},
    "linear": {"runs": linear.RUNS_COLUMNS, "summary": linear.SUMMARY_COLUMNS, "rounds": linear.ROUNDS_COLUMNS,
               "blocks": linear.BLOCKS_COLUMNS, "cell_blocks": linear.CELL_BLOCKS_COLUMNS,
               "references": ("method", "rho", "seed", *references.RUNS_COLUMNS)},
    "gmm": {"runs": radius.RUNS_COLUMNS, "summary": radius.SUMMARY_COLUMNS,
            "collapse_cells": radius.collapse_columns(("greedy", "exp3", "fedcam")),
            "references": ("method", "radius", "seed", *references.RUNS_COLUMNS)},
    "housing": {"runs": radius.RUNS_COLUMNS, "summary": radius.SUMMARY_COLUMNS,
                "collapse_cells": radius.collapse_columns(("greedy", "exp3", "fedcam")),
                "references": ("method", "radius", "seed", *references.RUNS_COLUMNS)},
    "characters": {"runs": characters.RUNS_COLUMNS, "recovery": characters.RECOVERY_COLUMNS,
                   "round_zero": ("alpha", "data_seed", "A00", "A01", "A10", "A11", "K0", "paper_pattern"),
                   "rounds": characters.ROUNDS_COLUMNS,
                   "references": ("method", "alpha", "data_seed", *references.RUNS_COLUMNS)},
    "scenarios": {"runs": scenarios.RUNS_COLUMNS, "summary": ("scenario", "start", "method", *scenarios.RATES_COLUMNS),
                  "methods": ("method", *scenarios.RATES_COLUMNS), "references": scenarios.REFERENCES_COLUMNS},
    "ifca": {"runs": ifca.RUNS_COLUMNS, "summary": ifca.SUMMARY_COLUMNS},
}
"""Every experiment's tables and their columns (the contract of ``runs.*`` etc.)."""
UNTESTABLE_IN_QUICK = {"scenarios": 1}
"""Claims ``--quick`` cannot test (``holds`` null): the scenarios' horizon check needs the full ``T``."""


def test_every_experiment_is_registered_once():
    assert list(EXPERIMENTS) == list(TABLES)
    assert cli.build_parser().parse_args(["reproduce", "all"]).experiment == "all"


@pytest.mark.parametrize("name", TABLES)
def test_quick_run_writes_every_table_figure_claim_and_setting(name, reproduced):
    experiment, out = EXPERIMENTS[name], reproduced(name)
    assert out.name == name
    assert sorted(p.stem for p in out.glob("*.parquet")) == sorted(TABLES[name])
    for stem, columns in TABLES[name].items():
        table, csv = pd.read_parquet(out / f"{stem}.parquet"), pd.read_csv(out / f"{stem}.csv")
        assert tuple(table.columns[:len(columns)]) == columns and len(table) > 0, stem
        assert list(csv.columns) == list(table.columns) and len(csv) == len(table), stem
    for panel in experiment.panels:
        assert (out / "figures" / f"{panel.stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / "figures" / f"{panel.stem}.pdf").read_bytes()[:5] == b"%PDF-"
    claims = json.loads((out / "claims.json").read_text())
    assert claims and all(set(c) == {"claim", "paper", "measured", "holds"} for c in claims)
    assert not any(str(c["measured"]).endswith(" not run") for c in claims)  # every method of the claims ran
    assert sum(c["holds"] is None for c in claims) == UNTESTABLE_IN_QUICK.get(name, 0)
    settings = json.loads((out / "config.json").read_text())
    data = {"data_file": settings["data_file"]} if name == "housing" else {}  # the fixture names the shipped table
    expected = json.loads(json.dumps(experiment.configure(quick=True, **data).to_json(), default=lambda v: v.item()))
    assert {key: settings[key] for key in expected} == expected
    assert settings["seconds"]["total"] > 0 and settings["peak_memory_mb"] > 0
    if name not in ("fig1", "scenarios"):  # the task's settings, defaults included, without those each cell sets
        assert settings["derived"]["task_settings"]["learning_rate"] > 0
        assert not {"alpha", "init_radius", "init_spread"} & set(settings["derived"]["task_settings"])


@pytest.mark.parametrize("name", ["linear", "housing"])
def test_results_do_not_depend_on_workers(name, reproduced, tmp_path):
    """Two local worker processes (chunks finishing out of order; housing: the table's path reaches the workers) give
    the tables of one process."""
    one = reproduced(name)
    args = ["--data-file", json.loads((one / "config.json").read_text())["data"]["data_file"]] if name == "housing" else []
    assert cli.main(["reproduce", name, "--quick", "--out", str(tmp_path), "--workers", "2", *args]) == 0
    for stem in TABLES[name]:
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / name / f"{stem}.parquet"),
                                      pd.read_parquet(one / f"{stem}.parquet"), check_exact=True)


@pytest.mark.parametrize("config, bad", [
    (fig1.Fig1Config, dict(eta=0.0)), (fig1.Fig1Config, dict(alpha=1.0)), (fig1.Fig1Config, dict(rhos=())),
    (fig1.Fig1Config, dict(rhos=(-1.0,))), (fig1.Fig1Config, dict(pairs=0)), (fig1.Fig1Config, dict(rounds=2.5)),
    (linear.LinearExperimentConfig, dict(rhos=(1.0, 1.0))), (linear.LinearExperimentConfig, dict(seeds_per_rho=0)),
    (linear.LinearExperimentConfig, dict(methods=("exp3",))), (linear.LinearExperimentConfig, dict(methods=("greedy", "nope"))),
    (linear.LinearExperimentConfig, dict(task={"noise_std": -1.0})), (linear.LinearExperimentConfig, dict(final_window=0)),
    (linear.LinearExperimentConfig, dict(final_window=201)), (linear.LinearExperimentConfig, dict(block_length=0)),
    (gmm.GMMExperimentConfig, dict(radii=(0.0, 4.0))), (gmm.GMMExperimentConfig, dict(seeds_per_radius=0)),
    (gmm.GMMExperimentConfig, dict(task={"learning_rate": -1.0})), (gmm.GMMExperimentConfig, dict(rounds=1)),
    (housing.HousingExperimentConfig, dict(radii=())), (housing.HousingExperimentConfig, dict(task={"learning_rate": 2.0})),
    (characters.CharactersExperimentConfig, dict(alphas=(0.5, 1.5))),
    (characters.CharactersExperimentConfig, dict(sustained_window=0)),
    (characters.CharactersExperimentConfig, dict(methods=("greedy", "ifca"))),
    (characters.CharactersExperimentConfig, dict(chunk_sizes=(("greedy", 0),))),
    (characters.CharactersExperimentConfig, dict(rounds=True)),
])
def test_invalid_settings_are_rejected_naming_the_field(config, bad):
    with pytest.raises(ValueError, match="setting '"):
        config(**bad)


@dataclass(frozen=True)
class _Settings(ExperimentConfig):
    LABEL = "toy"
    RULES = dict(share="(0, 1]", sizes="≥ 1 distinct", names=("a", "b"), count="")
    share: float = 0.5
    sizes: tuple[int, ...] = (1, 2)
    names: tuple[str, ...] = ("a",)
    count: int = 3


@pytest.mark.parametrize("bad, message", [
    (dict(share=0.0), "'share' = 0.0 is invalid; allowed: a number in (0, 1]"),
    (dict(share=float("nan")), "'share' = nan is invalid; allowed: a number in (0, 1]"),
    (dict(share="0.5"), "'share' = '0.5' is invalid"),
    (dict(sizes=(1, 1)), "'sizes' = (1, 1) is invalid; allowed: a non-empty sequence of distinct integers ≥ 1"),
    (dict(sizes=()), "'sizes' = () is invalid"),
    (dict(sizes=(0,)), "'sizes' = (0,) is invalid"),
    (dict(sizes=("x",)), "'sizes' = ('x',) is invalid"),
    (dict(names=("a", "c")), "allowed: a non-empty sequence of distinct names of ('a', 'b')"),
    (dict(count=True), "toy setting 'count' = True is invalid; allowed: an integer"),
])
def test_rules_name_the_field_and_the_allowed_values(bad, message):
    with pytest.raises(ValueError) as error:
        _Settings(**bad)
    assert message in str(error.value)


def test_rules_make_sequences_tuples_of_their_type():
    settings = _Settings(sizes=[3, np.int64(1)], names=["b"], share=1)
    assert settings.sizes == (3, 1) and settings.names == ("b",) and settings.share == 1
    assert _Settings.quick() == _Settings()


def test_invalid_named_configuration_runs_nothing(tmp_path, capsys):
    assert cli.main(["reproduce", "gmm", "--config", "long", "--out", str(tmp_path)]) == 2
    assert "allowed: paper, any-entrance" in capsys.readouterr().err
    assert cli.main(["reproduce", "linear", "--config", "any-entrance", "--out", str(tmp_path)]) == 2
    assert cli.main(["reproduce", "all", "--config", "long", "--out", str(tmp_path)]) == 2
    assert cli.main(["reproduce", "housing", "--data-file", str(tmp_path / "absent.csv"), "--out", str(tmp_path)]) == 2
    assert "data-file" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@dataclass(frozen=True)
class _ToyConfig(ExperimentConfig):
    LABEL = "toy"
    QUICK = dict(scale=1.0)
    RULES = dict(scale="> 0")
    scale: float = 2.0


def _toy_run(config, sweep):
    if config.scale > 10:
        raise InputError("no data for this scale")
    table = pd.DataFrame({"method": ["greedy", "greedy"], "x": [1.0, 2.0], "y": [config.scale, 2 * config.scale]})
    return Results({"summary": table}, scale_seen=config.scale)


TOY = Experiment(
    name="toy", title="a toy", config=_ToyConfig, run=_toy_run,
    claims=lambda results, config: [claim("y | doubles", "paper", {"y": number(results.summary["y"].iloc[-1]),
                                                                      "notes": "n" * 100}, config.scale > 1.5)],
    panels=[Panel("toy", "summary", "x", "y", "x", "y")], show=lambda results: [results.summary],
    variants={"big": Variant("scale 3", lambda config: _ToyConfig(scale=3 * config.scale)),
              "huge": Variant("scale 30", lambda config: _ToyConfig(scale=30.0), in_all=False)})


def test_reproduce_all_runs_every_experiment_and_variant_and_rewrites_the_marked_tables(tmp_path, monkeypatch):
    monkeypatch.setattr("fedroute.simulation.experiments.EXPERIMENTS", {"toy": TOY})
    doc = tmp_path / "results.md"
    doc.write_text("intro\n<!-- claims:toy-big:begin -->\nold\n<!-- claims:toy-big:end -->\nmiddle\n"
                   "<!-- table:toy:begin -->\nold\n<!-- table:toy:end -->\n<!-- table:toy-big:begin -->\n<!-- table:toy-big:end -->\n"
                   "<!-- claims:absent:begin -->\nkept\n<!-- claims:absent:end -->\nend\n")
    out = tmp_path / "out"
    assert cli.main(["reproduce", "all", "--out", str(out), "--docs", str(doc)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["toy", "toy-big"]  # "huge" is not part of all
    assert json.loads((out / "toy-big" / "config.json").read_text())["scale_seen"] == 6.0
    assert (out / "toy" / "figures" / "toy.png").is_file()
    text = doc.read_text()
    assert text.startswith("intro\n<!-- claims:toy-big:begin -->\n| claim (as tested) | measured | holds |")
    assert "| y \\| doubles | y = 12 | yes |" in text and "nnnn" not in text  # long notes stay in claims.json
    assert "| method | x | y |\n|---|---|---|\n| greedy | 1.000 | 2.000 |" in text
    assert "<!-- table:toy-big:begin -->\n| method | x | y |\n|---|---|---|\n| greedy | 1.000 | 6.000 |" in text  # a variant
    assert "middle\n" in text and "<!-- claims:absent:begin -->\nkept\n<!-- claims:absent:end -->\nend\n" in text


def test_an_input_error_exits_1_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("fedroute.simulation.experiments.EXPERIMENTS", {"toy": TOY})
    assert cli.main(["reproduce", "toy", "--config", "huge", "--out", str(tmp_path)]) == 1
    assert "no data for this scale" in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_run_experiment_writes_the_tables_claims_and_settings(tmp_path):
    results, claims = run_experiment(TOY, TOY.configure(quick=True), tmp_path / "toy")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "toy" / "summary.parquet"), results.summary)
    assert json.loads((tmp_path / "toy" / "claims.json").read_text()) == claims and claims[0]["holds"] is False
    assert results.scale_seen == 1.0 and json.loads((tmp_path / "toy" / "config.json").read_text())["scale"] == 1.0
    with pytest.raises(AttributeError):
        results.absent


def test_markdown_of_claims_and_tables(tmp_path):
    text = claims_markdown([claim("a", "p", {"rate": 0.123456, "by_R": {"0": 1.0, "2": None}, "deep": {"x": {}},
                                             "cells": [1, 2]}, None), claim("b | c", "p", "greedy not run", False)])
    assert text.splitlines()[2:] == ["| a | rate = 0.1235; by R = 0: 1, 2: –; cells = [1, 2] | untestable |",
                                     "| b \\| c | greedy not run | **no** |"]
    assert table_markdown(pd.DataFrame({"a": [1], "b": [0.5]})) == "| a | b |\n|---|---|\n| 1 | 0.500 |"
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- claims:x:begin -->\nold\n<!-- claims:x:end -->\n")
    assert update_results_doc(tmp_path / "no-outputs", doc, {}) == []
    assert doc.read_text() == "<!-- claims:x:begin -->\nold\n<!-- claims:x:end -->\n"


def test_results_doc_has_the_claims_of_every_output_of_reproduce_all():
    """docs/results.md has a claims table for every output directory ``reproduce all`` writes, and its table
    markers name such outputs (a new experiment or variant needs its place in the document)."""
    markers = [m.groups() for m in MARKER.finditer((Path(cli.__file__).parents[1] / "docs" / "results.md").read_text())]
    outputs = {experiment.output_name(variant) for experiment in EXPERIMENTS.values()
               for variant in (PAPER, *(name for name, v in experiment.variants.items() if v.in_all))}
    assert sorted(name for kind, name in markers if kind == "claims") == sorted(outputs)
    assert {name for kind, name in markers if kind == "table"} <= outputs


def test_groups_trained_alone_for_a_batch_of_runs():
    """Each run's model ``g`` is trained by group ``g``'s clients alone (sample-weighted average of their local
    updates), the runs of a batch independently; the start is kept at ``t = 0``."""
    from fedroute.simulation.simulator import concatenate_clients
    from fedroute.tasks.linear import LinearTask

    tasks = [LinearTask(num_clients=6, samples_per_client=5 + seed, seed=seed) for seed in (0, 1)]
    clients = concatenate_clients([task.clients(np.arange(6)) for task in tasks])
    run_of_client = np.repeat([0, 1], 6)
    start = np.random.default_rng(0).normal(size=(2, 2, tasks[0].dimension))
    trained = train_groups_alone(clients, run_of_client, start, [0, 3])
    np.testing.assert_array_equal(trained[0], start)
    for r, task in enumerate(tasks):
        own = task.clients(np.arange(6))
        models = start[r].copy()
        for t in range(3):
            update = own.local_update(models[own.groups], np.arange(6), t)
            models = np.stack([np.average(update[own.groups == g], axis=0, weights=own.num_examples[own.groups == g])
                               for g in range(2)])
        np.testing.assert_allclose(trained[3][r], models, rtol=1e-12)
