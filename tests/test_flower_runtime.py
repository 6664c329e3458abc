"""The real app through Flower's Ray simulation (``flwr run``), against the simulator.

One run of every method (12 clients, 20 rounds) is shared by the tests of
this module; a second run uses a ClientApp whose partitions 0–3 send
malformed replies.
"""

from __future__ import annotations

import json
import tomllib
from types import SimpleNamespace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedroute.server.launcher import run_flower_app
from fedroute.server.run_config import parse_run_config
from fedroute.simulation.fedcam import simulate_fedcam_batch
from fedroute.simulation.simulator import simulate

NUM_CLIENTS, NUM_ROUNDS, BLOCK = 12, 20, 5
RUN_CONFIG = {
    "method": "all", "num-clients": NUM_CLIENTS, "num-server-rounds": NUM_ROUNDS, "seed": 3,
    "block-length": BLOCK, "entry-threshold": 1.0, "hysteresis-min-rounds": 3,
}


def _results(result, results_root: Path) -> Path:
    assert result.completed, f"status {result.status!r}\n{result.stdout[-4000:]}"
    (directory,) = [path for path in results_root.iterdir() if path.is_dir()]
    return directory


@pytest.fixture(scope="module")
def flower_run(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    results_root = tmp_path_factory.mktemp("results")
    result = run_flower_app(repository, {**RUN_CONFIG, "results-dir": str(results_root)},
                            num_supernodes=NUM_CLIENTS, timeout=600)
    return _results(result, results_root)


def _full_run_config(repository: Path) -> dict:
    with open(repository / "pyproject.toml", "rb") as stream:
        defaults = tomllib.load(stream)["tool"]["flwr"]["app"]["config"]
    return {**defaults, **RUN_CONFIG}


def test_writes_every_result_file(flower_run: Path) -> None:
    for name in ("config.json", "rounds.csv", "rounds.parquet", "summary.json", "cluster_models.npz", "routes.csv"):
        assert (flower_run / name).is_file(), name
    summary = json.loads((flower_run / "summary.json").read_text())
    assert set(summary) == {"greedy", "exp3", "sync-entry", "fedcam"}
    for method in summary.values():
        assert method["evaluated_clients"] == NUM_CLIENTS and method["rejected_replies"] == 0


def test_flower_and_simulator_make_identical_routes_and_models(flower_run: Path, repository: Path) -> None:
    settings = parse_run_config(_full_run_config(repository))
    routes = pd.read_csv(flower_run / "routes.csv")
    models = np.load(flower_run / "cluster_models.npz")
    entered_somewhere = False
    for method in settings.methods:
        if method == "fedcam":
            batch = simulate_fedcam_batch([settings.task], settings.routing[method], NUM_ROUNDS, [settings.seed])
            history = SimpleNamespace(routes=batch.routes[:, 0], cluster_models=batch.cluster_models[:, 0],
                                      entered=np.zeros(1, dtype=bool))
        else:
            history = simulate(settings.task, settings.routing[method], NUM_ROUNDS, settings.seed)
        table = routes[routes.method == method].pivot(index="round_index", columns="client_id", values="cluster")
        assert table.shape == (NUM_ROUNDS, NUM_CLIENTS)
        np.testing.assert_array_equal(table.to_numpy(), history.routes, err_msg=method)
        flower_models = np.stack([models[f"{method}/cluster-{k}"] for k in range(2)])
        np.testing.assert_allclose(flower_models, history.cluster_models[-1], atol=1e-5, rtol=0)
        entered_somewhere |= bool(history.entered.any())
    assert entered_somewhere, "the configuration must exercise synchronized entry"


def test_only_routed_clusters_change(flower_run: Path) -> None:
    rounds = pd.read_csv(flower_run / "rounds.csv")
    for cluster in range(2):
        routed = rounds[f"routed_{cluster}"] > 0
        np.testing.assert_array_equal(rounds[f"changed_{cluster}"].to_numpy(), routed.to_numpy())
    greedy = rounds[rounds.method == "greedy"]
    assert (greedy.routed_1 == 0).all() and not greedy.changed_1.any()  # collapsed start: cluster 1 starves


def test_client_state_persists_across_rounds(flower_run: Path) -> None:
    rounds = pd.read_csv(flower_run / "rounds.csv")
    for method, table in rounds.groupby("method"):
        if method == "fedcam":  # FedCAM keeps no controller state
            continue
        np.testing.assert_array_equal(table.min_rounds_played, table.server_round, err_msg=method)
        np.testing.assert_array_equal(table.max_rounds_played, table.server_round, err_msg=method)
    exp3 = rounds[rounds.method == "exp3"].set_index("round_index").exp3_weight_spread
    assert (exp3.loc[: BLOCK - 2] == 0).all()  # no EXP3 update before the first block ends
    assert (exp3.loc[BLOCK - 1:] > 0).all()  # updated at the block end and kept afterwards
    assert (rounds[rounds.method == "greedy"].exp3_weight_spread == 0).all()


def test_greedy_stays_collapsed_and_exp3_routes_to_both(flower_run: Path) -> None:
    summary = json.loads((flower_run / "summary.json").read_text())
    assert summary["greedy"]["persistent_collapse"] and summary["greedy"]["recovery_error"] >= 0.5
    assert summary["exp3"]["rounds_with_two_routed"] > 0


def test_flower_telemetry_and_alarms_equal_the_simulators(flower_run: Path, repository: Path, tmp_path: Path) -> None:
    from fedroute.simulation.recorded import simulate_run
    from test_telemetry import assert_same_telemetry

    settings = parse_run_config(_full_run_config(repository))
    simulated = simulate_run(settings, tmp_path)
    assert_same_telemetry(flower_run, tmp_path)
    summary = json.loads((flower_run / "summary.json").read_text())
    for method in settings.methods:
        assert summary[method]["alarms"] == simulated[method]["alarms"], method
    greedy = {alarm["kind"]: alarm for alarm in summary["greedy"]["alarms"]}
    assert greedy["collapsed-entrance"]["raised_round"] == 0 and greedy["collapsed-entrance"]["cleared_round"] is None
    assert greedy["starvation"]["clusters"] == [1] and greedy["starvation"]["cleared_round"] is None
    exp3 = summary["exp3"]["alarms"]
    assert [alarm["kind"] for alarm in exp3][:1] == ["collapsed-entrance"] and exp3[0]["cleared_round"] is not None
    assert any(alarm["kind"] == "recovery" for alarm in exp3) and not summary["exp3"]["active_alarms"]
    status = json.loads((flower_run / "status.json").read_text())
    assert status["state"] == "finished" and status["completed"] == list(settings.methods)


def test_malformed_replies_are_rejected_and_good_ones_aggregated(test_app, tmp_path: Path) -> None:
    app_dir = test_app("hostile")
    results_root = tmp_path / "results"
    num_clients, num_rounds = 10, 5
    result = run_flower_app(app_dir, {"method": "exp3", "num-clients": num_clients, "num-server-rounds": num_rounds,
                                      "results-dir": str(results_root)}, num_supernodes=num_clients, timeout=600)
    directory = _results(result, results_root)
    rounds = pd.read_csv(directory / "rounds.csv")
    assert (rounds.rejected == 4).all() and (rounds.num_replies == num_clients - 4).all()
    assert (rounds.routed_0 + rounds.routed_1 == num_clients - 4).all()
    routes = pd.read_csv(directory / "routes.csv")
    assert set(routes.client_id) == set(range(4, num_clients))
    models = np.load(directory / "cluster_models.npz")
    final = np.stack([models[f"exp3/cluster-{k}"] for k in range(2)])
    assert np.isfinite(final).all()
    assert rounds.changed_0.any() and rounds.changed_1.any()  # the good replies were aggregated
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["exp3"]["rejected_replies"] == 4 * num_rounds
