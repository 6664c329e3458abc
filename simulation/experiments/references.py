"""The references every paper result is read against (issue 22): FedAvg (one global model) and Local (every client
alone), run on the cells of an experiment's sweep.

Both start from the routing methods' first cluster model ``w_0^0`` of the cell (``task.initial_models(K)[0]``, so
that a collapsed entrance, which needs ``K ≥ 2`` models, is the same start).  ``fedavg`` is the batched simulator
with :func:`~fedroute.core.methods.method_settings` of ``fedavg`` (``K = 1``, Greedy: every client's update goes
into the one model by the hard update, FedAvg's sample-weighted mean); ``local`` trains every client's own model
with the task's local update of every round (what :func:`~fedroute.simulation.simulator.simulate_local` and
:class:`~fedroute.strategies.local.LocalTraining` do, here for a chunk of runs at once, keeping ``W^{T−1}`` and
``W^T`` only).  Each client is scored at its model — the one global model, or its own — as the routing methods are
at theirs: :data:`RUNS_COLUMNS` (after the cell's keys) per (method, cell), means over clients unweighted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fedroute.core.methods import FEDAVG, LOCAL, REFERENCE_METHODS, method_settings
from fedroute.simulation.experiments.kit import RunLosses, StartedTask
from fedroute.simulation.plotting import Panel
from fedroute.simulation.simulator import concatenate_clients, simulate_batch
from fedroute.simulation.sweep import SweepSpec

__all__ = ["REFERENCES", "RUNS_COLUMNS", "reference_task", "simulate_alone", "reduce_reference", "reference_specs",
           "reference_runs", "losses_by_method", "reference_table", "reference_panel"]

REFERENCES = REFERENCE_METHODS
"""``fedavg`` and ``local``, in this order."""
RUNS_COLUMNS = ("routed_test_loss", "eval_test_loss", "worst_decile_test_loss", "eval_train_loss",
                "group_test_losses")
"""Columns of ``references.*`` after ``method`` and the cell's keys: the held-out loss at ``W^{T−1}``
(``L^route_{T−1}``: every client routed to its model) and at ``W^T``, the mean of the worst tenth of the clients
at ``W^T``, the training loss at ``W^T`` and each group's mean held-out loss at ``W^T`` (JSON list)."""
WORST_SHARE = 0.1


@dataclass(frozen=True)
class OwnModels:
    """What :func:`simulate_alone` records: every client's own model at ``W^{T−1}`` and ``W^T``,
    ``cluster_models`` of shape (2, R, n, P)."""

    cluster_models: NDArray[np.floating]


def reference_task(cell: dict[str, Any], *, make_task: Callable[[dict[str, Any]], Any], num_clusters: int
                   ) -> StartedTask:
    """The cell's task started from ``w_0^0`` of its ``K``-model start (one model)."""
    task = make_task(cell)
    return StartedTask(task, np.asarray(task.initial_models(num_clusters))[:1])


def simulate_alone(tasks: Sequence[Any], settings: Any, num_rounds: int, seeds: Sequence[int],
                   on_round: Optional[Callable[[Any], None]] = None) -> OwnModels:
    """``local`` for a chunk of runs: every client trains its own model from ``task.initial_models(1)``, round
    ``t`` applying the task's local update of round ``t`` (``settings`` and ``seeds``: the sweep's, unused)."""
    clients = concatenate_clients([task.clients(np.arange(task.num_clients)) for task in tasks])
    models = np.concatenate([np.repeat(task.initial_models(1), task.num_clients, axis=0) for task in tasks])
    everyone = np.arange(len(models))
    previous = models
    for round_index in range(num_rounds):
        previous, models = models, np.asarray(clients.local_update(models, everyone, round_index))
        if on_round is not None:
            on_round(None)
    return OwnModels(np.stack([previous, models]).reshape(2, len(tasks), tasks[0].num_clients, -1))


def reduce_reference(history: Any, tasks: Sequence[Any], cells: Sequence[dict[str, Any]], *, keys: Sequence[str],
                     own: bool) -> pd.DataFrame:
    """One row per cell (the ``keys`` and :data:`RUNS_COLUMNS`); ``own``: the models are the clients' own
    (:class:`OwnModels`), else the one shared model of the simulator's history."""
    losses = RunLosses(tasks)
    num_runs, num_clients = len(tasks), tasks[0].num_clients

    def at(state: NDArray[np.floating], split: str) -> NDArray[np.float64]:   # (R, n): each client at its model
        if own:
            return losses.clients.losses(state.reshape(num_runs * num_clients, 1, -1), split).reshape(num_runs, -1)
        return losses(state, split)[..., 0]

    models = history.cluster_models
    last, test, train = at(models[-2], "test"), at(models[-1], "test"), at(models[-1], "train")
    groups = losses.clients.groups.reshape(num_runs, num_clients)
    worst = np.sort(test, axis=1)[:, -max(1, math.ceil(WORST_SHARE * num_clients)):]
    return pd.DataFrame({
        **{key: [cell[key] for cell in cells] for key in keys},
        "routed_test_loss": last.mean(axis=1), "eval_test_loss": test.mean(axis=1),
        "worst_decile_test_loss": worst.mean(axis=1), "eval_train_loss": train.mean(axis=1),
        "group_test_losses": [json.dumps([float(test[r, groups[r] == g].mean()) for g in np.unique(groups[r])])
                              for r in range(num_runs)],
    })


def reference_specs(make_task: Callable[[dict[str, Any]], Any], num_rounds: int, num_clusters: int,
                    keys: Sequence[str]) -> list[SweepSpec]:
    """The sweep specs of ``fedavg`` and ``local`` on an experiment's cells (``make_task``: its cell → task)."""
    make = partial(reference_task, make_task=make_task, num_clusters=num_clusters)
    keys = tuple(keys)
    return [SweepSpec(FEDAVG, method_settings(FEDAVG), num_rounds, make, partial(reduce_reference, keys=keys, own=False),
                      simulate=partial(simulate_batch, model_rounds=(num_rounds - 1, num_rounds))),
            SweepSpec(LOCAL, method_settings(LOCAL), num_rounds, make, partial(reduce_reference, keys=keys, own=True),
                      simulate=simulate_alone)]


def reference_runs(sweep: Callable[..., pd.DataFrame], make_task: Callable[[dict[str, Any]], Any], num_rounds: int,
                   num_clusters: int, cells: Sequence[dict[str, Any]], keys: Sequence[str],
                   chunk_size: int) -> pd.DataFrame:
    """The ``references`` table: ``fedavg`` then ``local`` on every cell (``sweep``: the experiment's)."""
    table = sweep(reference_specs(make_task, num_rounds, num_clusters, keys), cells, chunk_size)
    return table[["method", *keys, *RUNS_COLUMNS]].reset_index(drop=True)


def losses_by_method(runs: pd.DataFrame, references: pd.DataFrame, key: str, column: str) -> pd.DataFrame:
    """Long table ``(method, key, column)``: the mean of ``column`` per method and ``key`` value, the experiment's
    methods (``runs``) first, then the references."""
    both = pd.concat([runs[["method", key, column]], references[["method", key, column]]], ignore_index=True)
    return both.groupby(["method", key], sort=False)[column].mean().reset_index()


def reference_table(runs: pd.DataFrame, references: pd.DataFrame, key: str, column: str) -> pd.DataFrame:
    """One row per ``key`` value, one column ``<method>:mean_<column>`` per method (references last)."""
    long = losses_by_method(runs, references, key, column)
    table = long.pivot(index=key, columns="method", values=column)[list(dict.fromkeys(long["method"]))]
    return table.add_suffix(f":mean_{column}").rename_axis(columns=None).reset_index()


def reference_panel(stem: str, key: str, column: str, xlabel: str, ylabel: str, **options: Any) -> Panel:
    """A figure of ``column`` (mean over the runs) against ``key``: one line per method, the references included."""
    return Panel(stem, lambda results: losses_by_method(results.runs, results.references, key, column), key, column,
                 xlabel, ylabel, **options)
