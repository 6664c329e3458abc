"""The reference methods (fedavg, local) and IFCA's gradient step, in Flower and in the simulator.

Both runtimes take the same run config: the ServerApp on the in-process grid of the built-in
ClientApp and ``simulate_run`` must report the same final evaluation (issue 22, deliverable 3).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedroute.core.aggregation import ifca_gradient_step
from fedroute.core.influence import InfluenceBounds, aggregate_round
from fedroute.core.methods import method_settings
from fedroute.server.run_config import parse_run_config
from fedroute.simulation.recorded import simulate_run
from fedroute.simulation.simulator import simulate, simulate_local
from fedroute.strategies.local import LocalTraining
from fedroute.tasks.linear import LinearTask
from support.grid import SERVER_RUN_ID, builtin_grid, server_main

pytestmark = pytest.mark.usefixtures("task_identity")

RUN = {"task": "linear", "num-clients": 6, "samples-per-client": 20, "test-samples-per-client": 10,
       "num-server-rounds": 4, "evaluate-every": 2, "progress-interval": 0.0}


def test_ifca_gradient_step_sums_the_routed_updates_over_all_clients() -> None:
    models = np.array([[0.0, 0.0], [10.0, 10.0]])
    replies = np.array([[1.0, 1.0], [3.0, 3.0], [11.0, 11.0], [2.0, 2.0]])
    routes, examples = np.array([0, 0, 1, 0]), np.ones(4)
    averaged = aggregate_round(models, replies, routes, examples, InfluenceBounds()).models
    np.testing.assert_allclose(averaged, [[2.0, 2.0], [11.0, 11.0]])  # model averaging (our Greedy)
    stepped = aggregate_round(models, replies, routes, examples, InfluenceBounds(server_update="ifca-gradient"))
    np.testing.assert_allclose(stepped.models, [[1.5, 1.5], [10.25, 10.25]])  # (Σ over routed updates) / m = 4
    batched = ifca_gradient_step(np.stack([models, models]), np.stack([averaged, averaged]),
                                 np.concatenate([routes, [1]]), np.ones(5), np.array([0, 0, 0, 0, 1]))
    np.testing.assert_allclose(batched[0], stepped.models)  # run 0 alone: the same step
    np.testing.assert_allclose(batched[1], [[0.0, 0.0], [11.0, 11.0]])  # run 1: one client, all of its weight
    with pytest.raises(ValueError, match="'server_update' = 'sgd' is invalid"):
        InfluenceBounds(server_update="sgd")
    with pytest.raises(ValueError, match="run-config 'server-update' = 'sgd' is invalid"):
        parse_run_config({"server-update": "sgd"})
    assert "server_update" not in InfluenceBounds().to_dict()  # the paper's update: checkpoints as before
    assert parse_run_config({"server-update": "average"}).run_digest == parse_run_config({}).run_digest


def test_reference_methods_and_ifca_gradient_agree_between_flower_and_the_simulator(tmp_path) -> None:
    config = {**RUN, "method": "greedy,fedavg,local", "server-update": "ifca-gradient",
              "results-dir": str(tmp_path)}
    server_main(builtin_grid(6, config), config)
    flower = json.loads((tmp_path / str(SERVER_RUN_ID) / "summary.json").read_text())
    simulated = simulate_run(parse_run_config(config), tmp_path / "simulated")
    for method in ("greedy", "fedavg", "local"):
        assert flower[method]["evaluation_metrics"] == pytest.approx(simulated[method]["evaluation_metrics"],
                                                                     rel=1e-9), method
    assert flower["fedavg"]["usable_models_test"] == 1 and "recovery_error" not in flower["fedavg"]
    # local: every client alone, from the one initial model; fedavg: one model, K = 1 Greedy
    task = parse_run_config(config).task
    clients = task.clients(np.arange(6))
    own = simulate_local(task, 4)[-1]
    assert flower["local"]["evaluation_metrics"]["test_loss"] == pytest.approx(
        float(np.mean(clients.losses(own[:, None, :], "test"))), rel=1e-9)
    assert simulated["local"]["evaluation_metrics"]["test_loss"] < simulated["fedavg"]["evaluation_metrics"]["test_loss"]
    rows = (tmp_path / str(SERVER_RUN_ID) / "evaluation.csv").read_text().splitlines()
    assert {line.split(",")[1] for line in rows[1:]} == {"2", "4"}  # round 2 during training, 4 the final
    # the monitor reads K = 1 rows out of the run's K = 2 tables and shows the latest evaluation
    from rich.console import Console

    from fedroute.monitoring.monitor import load_run, render

    console = Console(width=140, record=True)
    console.print(render(load_run(tmp_path / str(SERVER_RUN_ID)), "fedavg"))
    shown = console.export_text()
    assert "evaluation (round 4)  test_loss" in shown and "      1  " not in shown  # no second cluster row


def test_method_settings_and_local_strategy_refuse_what_does_not_fit() -> None:
    assert method_settings("fedavg", num_clusters=4).num_clusters == 1
    with pytest.raises(ValueError, match="num_clusters = 1"):
        LocalTraining(method_settings("greedy"))
    with pytest.raises(ValueError, match="checkpoint_dir=None"):
        LocalTraining(checkpoint_dir="somewhere")
    with pytest.raises(ValueError, match=r"'greedy,exp3,fedavg,local'"):
        parse_run_config({"method": "greedy,fedsgd"})
    task = LinearTask(num_clients=4, samples_per_client=5, test_samples_per_client=5)
    fedavg = simulate(task, method_settings("fedavg"), 2, 0)
    assert fedavg.cluster_models.shape[1] == 1 and np.all(fedavg.routes == 0)
