"""The FedAvg and Local reference rows of every paper experiment (issue 22): ``references.*``, the table beside the
paper's tables and the figure lines, on the ``--quick`` runs; the reference runs themselves against direct loops."""

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from fedroute.core.aggregation import hard_update
from fedroute.core.methods import FEDAVG, LOCAL, REFERENCE_METHODS, method_settings
from fedroute.simulation.experiments import EXPERIMENTS
from fedroute.simulation.experiments.fig1 import Fig1Config
from fedroute.simulation.experiments.linear import make_linear_task
from fedroute.simulation.experiments.references import (
    reference_specs, reference_table, reference_task, simulate_alone)
from fedroute.simulation.simulator import simulate_batch, simulate_local

PAPER_EXPERIMENTS = {"fig1": ("rho",), "linear": ("rho", "seed"), "gmm": ("radius", "seed"),
                     "housing": ("radius", "seed"), "characters": ("alpha", "data_seed")}
"""Each paper experiment and the keys of its reference cells."""


def _outputs(out) -> SimpleNamespace:
    return SimpleNamespace(**{path.stem: pd.read_parquet(path) for path in out.glob("*.parquet")})


@pytest.mark.parametrize("name", PAPER_EXPERIMENTS)
def test_every_paper_experiment_has_both_reference_rows_on_every_cell(name, reproduced):
    results, keys = _outputs(reproduced(name)), PAPER_EXPERIMENTS[name]
    references = results.references
    assert tuple(references["method"].unique()) == REFERENCE_METHODS
    per_method = references.groupby("method")[list(keys)].apply(lambda part: sorted(map(tuple, part.to_numpy())))
    assert per_method[FEDAVG] == per_method[LOCAL] and len(per_method[FEDAVG]) == len(references) // 2
    numbers = references.select_dtypes("number").drop(columns=list(keys))
    assert np.isfinite(numbers.to_numpy()).all() and (numbers.to_numpy() >= 0).all()


@pytest.mark.parametrize("name", PAPER_EXPERIMENTS)
def test_the_paper_tables_keep_their_columns_and_the_reference_table_comes_last(name, reproduced):
    """The shown tables of the paper's methods have no reference column; the last one has one column per
    reference, one row per key value."""
    tables = EXPERIMENTS[name].show(_outputs(reproduced(name)))
    *paper, last = tables
    assert paper and not any(column.startswith((f"{FEDAVG}:", f"{LOCAL}:")) for t in paper for column in t.columns)
    assert {c.split(":")[0] for c in last.columns[1:]} >= set(REFERENCE_METHODS)
    assert last.columns[0] == PAPER_EXPERIMENTS[name][0] and last[last.columns[0]].is_unique


def test_fig1_references_are_the_two_limits_of_the_population_dynamics(reproduced):
    """One model for two groups stays Δ/2 from each θ_g (never recovers); each group alone converges to its θ_g."""
    references = _outputs(reproduced("fig1")).references.set_index("method")
    distance = Fig1Config.quick().group_distance
    assert (references.loc[FEDAVG, "nonrecovery"] == 1.0).all()
    np.testing.assert_allclose(references.loc[FEDAVG, "mean_recovery_error"], distance / 2, rtol=1e-9)
    assert (references.loc[LOCAL, "nonrecovery"] == 0.0).all()
    assert (references.loc[LOCAL, "mean_recovery_error"] < 1e-6).all()


def test_linear_local_beats_fedavg_for_every_group_of_every_cell(reproduced):
    """Two separated groups (Δ = 4): one global model sits between them, each client's own model does not."""
    references = _outputs(reproduced("linear")).references
    fedavg = references[references["method"] == FEDAVG].set_index(["rho", "seed"])
    local = references[references["method"] == LOCAL].set_index(["rho", "seed"])
    groups_fedavg = np.array([json.loads(v) for v in fedavg["group_test_losses"]])
    groups_local = np.array([json.loads(v) for v in local.loc[fedavg.index, "group_test_losses"]])
    assert groups_fedavg.shape == groups_local.shape and groups_fedavg.shape[1] == 2
    assert (groups_local < groups_fedavg).all()
    assert (local.loc[fedavg.index, "eval_test_loss"] < 0.5 * fedavg["eval_test_loss"]).all()


def test_reference_table_sets_the_routing_methods_beside_the_references():
    runs = pd.DataFrame({"method": ["greedy", "greedy", "exp3", "exp3"], "rho": [1.0, 2.0, 1.0, 2.0],
                         "routed_test_loss": [1.0, 3.0, 0.5, 0.7]})
    references = pd.DataFrame({"method": [FEDAVG, FEDAVG, FEDAVG, LOCAL, LOCAL, LOCAL], "rho": [1.0, 1.0, 2.0] * 2,
                               "routed_test_loss": [2.0, 4.0, 2.5, 0.1, 0.3, 0.2]})
    table = reference_table(runs, references, "rho", "routed_test_loss")
    assert list(table.columns) == ["rho", "greedy:mean_routed_test_loss", "exp3:mean_routed_test_loss",
                                   "fedavg:mean_routed_test_loss", "local:mean_routed_test_loss"]
    np.testing.assert_allclose(table.to_numpy(), [[1.0, 1.0, 0.5, 3.0, 0.2], [2.0, 3.0, 0.7, 2.5, 0.2]], rtol=1e-12)


CELLS = [{"rho": 4.0, "seed": 3}, {"rho": 8.0, "seed": 4}]
ROUNDS = 12


def test_local_reference_is_simulate_local_run_by_run():
    tasks = [reference_task(cell, make_task=make_linear_task, num_clusters=2) for cell in CELLS]
    together = simulate_alone(tasks, method_settings(LOCAL), ROUNDS, [0, 0]).cluster_models
    for run, task in enumerate(tasks):
        alone = simulate_local(task, ROUNDS)
        np.testing.assert_allclose(together[:, run], alone[-2:], rtol=0, atol=1e-12)
        np.testing.assert_allclose(alone[0], np.repeat(make_linear_task(CELLS[run]).initial_models(2)[:1], 80, axis=0),
                                   rtol=0, atol=0)


def test_fedavg_reference_is_the_sample_weighted_mean_of_every_client_update():
    """K = 1 through the simulator from w_0^0 equals a direct loop: every client trains the one model, the server
    takes the hard update of all of them."""
    task = reference_task(CELLS[0], make_task=make_linear_task, num_clusters=2)
    clients = task.clients(np.arange(task.num_clients))
    model, everyone = task.initial_models(1)[None], np.arange(task.num_clients)
    for round_index in range(ROUNDS):
        trained = clients.local_update(model[0][np.zeros(task.num_clients, dtype=np.int64)], everyone, round_index)
        model = hard_update(model, trained, np.zeros(task.num_clients, dtype=np.int64), clients.num_examples,
                            np.zeros(task.num_clients, dtype=np.int64))
    fedavg = reference_specs(make_linear_task, ROUNDS, 2, ("rho", "seed"))[0]
    assert fedavg.method == FEDAVG and fedavg.settings.num_clusters == 1
    history = fedavg.simulate([task], fedavg.settings, ROUNDS, [CELLS[0]["seed"]])
    np.testing.assert_allclose(history.cluster_models[-1, 0], model[0], rtol=0, atol=1e-12)
    direct = simulate_batch([task], method_settings(FEDAVG), ROUNDS, [CELLS[0]["seed"]]).cluster_models
    np.testing.assert_allclose(history.cluster_models[-2:], direct[-2:], rtol=0, atol=1e-12)
