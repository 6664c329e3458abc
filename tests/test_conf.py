"""``conf/<experiment>.toml``: the Flower path of every paper experiment and the scenario suite.

* Each file's settings, fused with ``[tool.flwr.app.config]`` as ``flwr run --run-config FILE`` does, are
  the experiment's own for its cell: the same task (every field), the same ``W^0`` where a start is built,
  the same routing per method, the same ``T`` (``fedroute reproduce``'s configuration, not a copy of it).
* ``flwr run <repo> --run-config conf/fig1.toml`` with Flower's default federation (2 SuperNodes,
  ``num-clients = "auto"``: 2 clients) completes and its routes equal the simulator's every round.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fedroute.deployment.flwr_config import load_run_config_file, resolve_run_config
from fedroute.deployment.launcher import run_flower_app
from fedroute.server.run_config import RunSettings, parse_run_config
from fedroute.simulation.experiments import EXPERIMENTS, PAPER
from fedroute.simulation.simulator import simulate

CONF = Path(__file__).resolve().parents[1] / "conf"
EXPERIMENT_NAMES = ("fig1", "linear", "gmm", "housing", "characters", "scenarios")
SIMULATOR_ONLY = ("ifca",)
"""Experiments without a conf file: IFCA's synthetic experiment (the IFCA authors', not the paper's) has no
run-config task; it runs in the batched simulator only."""


def _settings(repository: Path, name: str, num_clients: int) -> tuple[dict[str, Any], RunSettings]:
    """A conf file's resolved run config and its settings with the paper cell's number of clients."""
    resolved = resolve_run_config(repository, load_run_config_file(CONF / f"{name}.toml"))
    assert resolved["num-clients"] == "auto"  # the federation decides; the header names the paper's size
    return resolved, parse_run_config({**resolved, "num-clients": num_clients})


def _task_fields(task: Any) -> dict[str, Any]:
    return {field.name: getattr(task, field.name) for field in fields(task)}


def _same_routing(settings: RunSettings, expected: dict[str, Any]) -> None:
    assert set(settings.methods) == set(expected), (settings.methods, list(expected))
    for method, routing in expected.items():
        assert settings.routing[method].to_dict() == routing.to_dict(), method


def test_every_experiment_has_a_conf_file() -> None:
    assert sorted(path.stem for path in CONF.glob("*.toml")) == sorted(EXPERIMENT_NAMES)
    assert set(EXPERIMENT_NAMES) == set(EXPERIMENTS) - set(SIMULATOR_ONLY)


@pytest.mark.parametrize("name, cell", [
    ("linear", {"rho": 32.0, "seed": 701}),
    ("gmm", {"radius": 4.0, "seed": 0}),
    ("housing", {"radius": 2.0, "seed": 0}),
])
def test_a_radius_or_rho_cell_is_the_experiments_own(repository: Path, name: str, cell: dict[str, Any]) -> None:
    config = EXPERIMENTS[name].configure(PAPER, False)
    assert cell in config.cells()
    expected_task = config.task_factory()(cell)
    _, settings = _settings(repository, name, expected_task.num_clients)
    assert _task_fields(settings.task) == _task_fields(expected_task)
    _same_routing(settings, {method: spec.settings for method, spec in config.specs().items()})
    assert settings.num_rounds == config.rounds and settings.seed == cell["seed"]


def test_the_characters_cell_is_the_grids_own(repository: Path) -> None:
    from fedroute.simulation.experiments.characters import make_characters_task

    config = EXPERIMENTS["characters"].configure(PAPER, False)
    expected_task = make_characters_task({"alpha": 0.6, "data_seed": 1}, **config.task)
    _, settings = _settings(repository, "characters", expected_task.num_clients)
    assert _task_fields(settings.task) == _task_fields(expected_task)
    _same_routing(settings, {method: config.routing(method) for method in config.methods})
    assert settings.num_rounds == config.rounds
    assert 0.6 in config.alphas and settings.seed in config.data_seeds and settings.seed in config.selector_seeds


def test_the_scenario_cell_is_the_suites_own(repository: Path) -> None:
    from fedroute.simulation.experiments.scenarios import SCENARIOS, initial_models

    config, scenario = EXPERIMENTS["scenarios"].configure(PAPER, False), SCENARIOS["collinear"]
    assert "collapsed" in scenario.starts and 0 in range(config.first_seed, config.first_seed + config.seeds)
    expected_task = scenario.make_task(0)
    _, settings = _settings(repository, "scenarios", expected_task.num_clients)
    mine = {key: value for key, value in _task_fields(settings.task).items() if key != "init"}
    assert mine == {key: value for key, value in _task_fields(expected_task).items() if key != "init"}
    np.testing.assert_array_equal(settings.task.initial_models(scenario.num_clusters),
                                  initial_models(scenario, "collapsed", 0))
    _same_routing(settings, {method: config.settings(method, scenario) for method in config.methods})
    assert settings.num_rounds == scenario.rounds


def test_the_fig1_start_follows_figure_1s_law(repository: Path) -> None:
    config = EXPERIMENTS["fig1"].configure(PAPER, False)
    _, settings = _settings(repository, "fig1", 80)
    task = settings.task
    assert (task.dimension, task.group_distance, task.learning_rate, task.local_steps) == \
        (config.dimension, config.group_distance, config.eta, 1)
    assert task.init == "spread" and task.init_spread in config.rhos and settings.num_rounds == config.rounds
    assert settings.methods == ("greedy",)
    np.testing.assert_array_equal(task.group_parameters, config.theta)


def test_a_bad_run_config_file_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("method = \n")
    with pytest.raises(ValueError, match="broken.toml' does not parse"):
        load_run_config_file(broken)
    with pytest.raises(ValueError, match="is not an existing .toml file"):
        load_run_config_file(tmp_path / "missing.toml")


@pytest.mark.process
def test_conf_fig1_through_flowers_default_federation_equals_the_simulator(
        repository: Path, flower_app: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        no_fedroute_bin: Path) -> None:
    """`flwr run <repo> --run-config conf/fig1.toml` (the repository's app files, ``flower_app``), no federation
    config: 2 SuperNodes, so 2 clients; from an environment where `import fedroute` fails (the FAB's files run the
    ServerApp and, in the Ray workers, the ClientApps)."""
    monkeypatch.setenv("FEDROUTE_RESULTS_ROOT", str(tmp_path))  # conf files leave results-dir relative
    result = run_flower_app(flower_app, {}, num_supernodes=None, run_config_file=CONF / "fig1.toml", timeout=600,
                            environment_bin=no_fedroute_bin)
    assert result.completed, f"{result.status}\n{result.stdout[-4000:]}"
    (directory,) = (tmp_path / "results").iterdir()
    config = json.loads((directory / "config.json").read_text())
    assert config["federation"] == {"num_clients": 2, "num_nodes": 2, "source": "num-partitions"}
    assert config["python"] == str(no_fedroute_bin / "python") and "/apps/" in config["app_files"]
    with open(repository / "pyproject.toml", "rb") as stream:
        defaults = tomllib.load(stream)["tool"]["flwr"]["app"]["config"]
    settings = parse_run_config({**defaults, **load_run_config_file(CONF / "fig1.toml"), "num-clients": 2})
    assert asdict(settings.task) == config["task"]
    history = simulate(settings.task, settings.routing["greedy"], settings.num_rounds, settings.seed)
    routes = pd.read_csv(directory / "routes.csv").pivot(index="round_index", columns="client_id", values="cluster")
    np.testing.assert_array_equal(routes.to_numpy(), history.routes)
    assert not history.routes.any()  # the basin start: Greedy never routes anyone to cluster 1
    models = np.load(directory / "cluster_models.npz")
    np.testing.assert_allclose(np.stack([models[f"greedy/cluster-{k}"] for k in range(2)]),
                               history.cluster_models[-1], rtol=0, atol=1e-12)
