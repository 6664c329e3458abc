"""What the radius sweeps E5 (GMM, Figure B.3) and E6 (California Housing, Figure B.4) share.

Every cluster model starts near a pooled centre ``ū(R)`` of the group oracles pushed out along fixed
unit directions by ``R``; Greedy IFCA, EXP3 (fixed blocks) and FedCAM run from the same ``W^0`` per
cell ``{"radius": R, "seed": s}`` (the same seeds at every R: ``s`` fixes the task — data, split,
directions, jitter — **and** the routing draws); the frozen terminal models are scored with
controller-free greedy routing on held-out data.  :func:`reduce_radius` gives one row per run
(:data:`RUNS_COLUMNS`), :func:`run_radius` the tables ``runs``, ``summary`` (per method and R),
``collapse_cells`` (the Greedy collapse cells, every method side by side) and the round-zero facts;
:func:`alone_convergence` is the under-training check (one model trained alone on its group).
Columns: docs/experiments.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fedroute.core.methods import EXP3, FEDCAM, GREEDY
from fedroute.simulation.experiments.kit import (
    MethodSweepConfig, Results, RunLosses, Sweep, greedy_of_cell, train_groups_alone)
from fedroute.core.metrics import (
    assignment_accuracy, greedy_choices, group_routing_matrix, persistent_collapse, recovery_error, routed_loss,
    usable_models)
from fedroute.simulation.experiments.references import losses_by_method, reference_runs, reference_table
from fedroute.simulation.plotting import Panel
from fedroute.simulation.simulator import BatchHistory

__all__ = ["RadiusSweepConfig", "RUNS_COLUMNS", "SUMMARY_COLUMNS", "collapse_columns", "reduce_radius",
           "run_radius", "radius_results", "radius_summary", "collapse_cells", "alone_convergence", "radius_panels", "radius_table",
           "METHOD_NAMES"]

METHOD_NAMES = {GREEDY: "Greedy IFCA", EXP3: "EXP3", FEDCAM: "FedCAM"}
RUNS_COLUMNS = (
    "method", "radius", "seed", "round0_clusters_used", "round0_eval_clusters", "round0_majority_clusters",
    "round0_attraction", "clusters_updated", "persistent", "usable_models", "train_usable_models", "collapsed",
    "assignment_accuracy", "routed_test_loss", "eval_test_loss", "oracle_test_loss", "oracle_distance",
    "final_gr_probability", "greedy_collapse",
)
SUMMARY_COLUMNS = (
    "method", "radius", "runs", "pr_collapse", "pr_all_usable", "mean_usable_models", "mean_assignment_accuracy",
    "mean_routed_test_loss", "std_routed_test_loss", "mean_eval_test_loss", "mean_oracle_test_loss",
    "greedy_collapse_cells", "all_usable_among_greedy_collapse", "mean_routed_test_loss_on_greedy_collapse",
    "round0_mean_clusters_used", "round0_pr_all_used", "round0_pr_single_cluster", "round0_pr_shared_majority",
)
_PER_METHOD = ("usable_models", "assignment_accuracy", "routed_test_loss", "eval_test_loss")


@dataclass(frozen=True)
class RadiusSweepConfig(MethodSweepConfig):
    """Settings every radius sweep has; a subclass sets ``PRESET``, ``NUM_GROUPS`` and :meth:`task_factory`."""

    NUM_GROUPS: ClassVar[int] = 2
    RULES = dict(radii="≥ 0 distinct", seeds_per_radius="≥ 1", rounds="≥ 2")

    radii: tuple[float, ...] = (0.0,)
    seeds_per_radius: int = 10

    def cells(self) -> list[dict[str, Any]]:
        """``{"radius", "seed"}`` per cell, R-major; the same seeds at every R."""
        return [{"radius": radius, "seed": self.first_seed + j}
                for radius in self.radii for j in range(self.seeds_per_radius)]

    def reducer(self) -> Callable[..., pd.DataFrame]:
        return reduce_radius

    def derived(self) -> dict[str, Any]:
        return {"num_groups": self.NUM_GROUPS, **super().derived()}


def collapse_columns(methods: Sequence[str]) -> tuple[str, ...]:
    """Columns of ``collapse_cells.*`` (one row per Greedy collapse cell) for these methods."""
    return ("radius", "seed", "round0_clusters_used", "oracle_test_loss",
            *(f"{method}_{what}" for method in methods for what in _PER_METHOD),
            "exp3_minus_greedy_routed_test_loss", "exp3_minus_greedy_eval_test_loss")


def _oracle(task: Any) -> NDArray[np.float64]:
    """``β*_g`` of a task, (G, P): GMM ``oracle_parameters``, housing ``group_parameters``."""
    oracle = getattr(task, "oracle_parameters", None)
    return np.asarray(task.group_parameters if oracle is None else oracle, dtype=np.float64)


def reduce_radius(history: BatchHistory, tasks: Sequence[Any], cells: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per cell of a simulated chunk (:data:`RUNS_COLUMNS` without ``method``/``greedy_collapse``)."""
    models = history.cluster_models                                    # (T+1, R, K, P)
    num_runs, num_clusters = models.shape[1], models.shape[2]
    groups = history.groups                                            # (R, n)
    oracles = np.stack([_oracle(task) for task in tasks])             # (R, G, P)
    num_groups = oracles.shape[1]
    losses = RunLosses(tasks)
    initial_train, initial_test = losses(models[0], "train"), losses(models[0], "test")
    final_train, final_test = losses(models[-1], "train"), losses(models[-1], "test")
    last_test = losses(models[-2], "test")
    oracle_test = losses(oracles, "test")                             # (R, n, G)
    counts = np.moveaxis(history.route_counts, 0, 1)                  # (R, T, K)
    persistent = np.asarray(persistent_collapse(counts)).reshape(num_runs)
    routed = np.asarray(routed_loss(last_test, history.routes[-1].astype(np.int64))).reshape(num_runs)
    arms = history.mean_arm_probabilities
    rows = []
    for r, cell in enumerate(cells):
        choices0 = greedy_choices(initial_train[r])
        attraction = group_routing_matrix(choices0, groups[r], num_clusters, num_groups)
        k_eval = int(usable_models(final_test[r]))
        rows.append({
            "radius": float(cell["radius"]), "seed": int(cell["seed"]),
            "round0_clusters_used": int(len(np.unique(choices0))),
            "round0_eval_clusters": int(usable_models(initial_test[r])),
            "round0_majority_clusters": int(len(np.unique(np.argmax(attraction, axis=1)))),
            "round0_attraction": json.dumps(np.round(attraction, 6).tolist()),
            "clusters_updated": int((counts[r].sum(axis=0) > 0).sum()),
            "persistent": bool(persistent[r]),
            "usable_models": k_eval,
            "train_usable_models": int(usable_models(final_train[r])),
            "collapsed": bool(k_eval < num_groups),
            "assignment_accuracy": float(assignment_accuracy(final_test[r], groups[r], num_clusters, num_groups)),
            "routed_test_loss": float(routed[r]),
            "eval_test_loss": float(final_test[r].min(axis=1).mean()),
            "oracle_test_loss": float(np.take_along_axis(oracle_test[r], groups[r][:, None], axis=1).mean()),
            "oracle_distance": float(recovery_error(models[-1, r], oracles[r])),
            "final_gr_probability": float(arms[-1, r, 0]) if arms.shape[-1] else float("nan"),
        })
    return pd.DataFrame(rows)


def run_radius(config: RadiusSweepConfig, sweep: Sweep) -> Results:
    """The sweep of every method and :func:`radius_results`, with the ``references`` table (FedAvg and Local on
    the same cells)."""
    results = radius_results(sweep(list(config.specs().values()), config.cells(), config.chunk_size), config)
    results.tables["references"] = reference_runs(sweep, config.task_factory(), config.rounds, config.num_clusters,
                                                  config.cells(), ("radius", "seed"), config.chunk_size)
    return results


def radius_results(table: pd.DataFrame, config: RadiusSweepConfig) -> Results:
    """The tables of a sweep's rows: ``runs`` with ``greedy_collapse`` (the cell's Greedy run ends with
    ``K_T^eval < G``), ``summary``, ``collapse_cells``, and the fact ``round_zero`` (per R)."""
    table = table.assign(greedy_collapse=greedy_of_cell(table, ["radius", "seed"], "collapsed").astype(bool))
    runs = table[list(RUNS_COLUMNS)].reset_index(drop=True)
    groups, clusters = config.NUM_GROUPS, config.num_clusters
    return Results({"runs": runs, "summary": radius_summary(runs, groups, clusters),
                    "collapse_cells": collapse_cells(runs, config.methods)},
                   round_zero=_round_zero(runs, groups, clusters))


def radius_summary(runs: pd.DataFrame, num_groups: int, num_clusters: int) -> pd.DataFrame:
    """One row per (method, R) with :data:`SUMMARY_COLUMNS`."""
    rows = []
    for (method, radius), cell in runs.groupby(["method", "radius"], sort=False):
        collapse = cell[cell["greedy_collapse"]]
        rows.append({
            "method": method, "radius": radius, "runs": len(cell),
            "pr_collapse": float((cell["usable_models"] < num_groups).mean()),
            "pr_all_usable": float((cell["usable_models"] == num_clusters).mean()),
            "mean_usable_models": cell["usable_models"].mean(),
            "mean_assignment_accuracy": cell["assignment_accuracy"].mean(),
            "mean_routed_test_loss": cell["routed_test_loss"].mean(),
            "std_routed_test_loss": cell["routed_test_loss"].std(ddof=1) if len(cell) > 1 else float("nan"),
            "mean_eval_test_loss": cell["eval_test_loss"].mean(),
            "mean_oracle_test_loss": cell["oracle_test_loss"].mean(),
            "greedy_collapse_cells": len(collapse),
            "all_usable_among_greedy_collapse": int((collapse["usable_models"] == num_clusters).sum()),
            "mean_routed_test_loss_on_greedy_collapse": (collapse["routed_test_loss"].mean() if len(collapse)
                                                         else float("nan")),
            "round0_mean_clusters_used": cell["round0_clusters_used"].mean(),
            "round0_pr_all_used": float((cell["round0_clusters_used"] == num_clusters).mean()),
            "round0_pr_single_cluster": float((cell["round0_clusters_used"] == 1).mean()),
            "round0_pr_shared_majority": float((cell["round0_majority_clusters"] < num_groups).mean()),
        })
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def collapse_cells(runs: pd.DataFrame, methods: Sequence[str]) -> pd.DataFrame:
    """The Greedy collapse cells, one row each, with every method's outcome side by side."""
    cells = runs[(runs["method"] == GREEDY) & runs["greedy_collapse"]][
        ["radius", "seed", "round0_clusters_used", "oracle_test_loss"]]
    table = cells.reset_index(drop=True)
    for method in methods:
        part = runs[runs["method"] == method].set_index(["radius", "seed"])[list(_PER_METHOD)]
        part.columns = [f"{method}_{what}" for what in _PER_METHOD]
        table = table.join(part, on=["radius", "seed"])
    for what in ("routed_test_loss", "eval_test_loss"):
        if EXP3 in methods and GREEDY in methods:
            table[f"exp3_minus_greedy_{what}"] = table[f"exp3_{what}"] - table[f"greedy_{what}"]
        else:
            table[f"exp3_minus_greedy_{what}"] = np.nan
    return pd.DataFrame(table, columns=list(collapse_columns(methods))).reset_index(drop=True)


def _round_zero(runs: pd.DataFrame, num_groups: int, num_clusters: int) -> dict[str, Any]:
    """Round-zero entrance facts per R (from the Greedy rows: ``W^0`` is shared by the methods)."""
    facts = {}
    for radius, cell in runs[runs["method"] == GREEDY].groupby("radius"):
        used = cell["round0_clusters_used"]
        facts[f"{radius:g}"] = {
            "starts": int(len(cell)),
            "clusters_used_histogram": {str(int(k)): int(c) for k, c in used.value_counts().sort_index().items()},
            "all_clusters_used": int((used == num_clusters).sum()),
            "single_cluster": int((used == 1).sum()),
            "shared_majority": int((cell["round0_majority_clusters"] < num_groups).sum()),
            "eval_clusters_histogram": {str(int(k)): int(c) for k, c in
                                        cell["round0_eval_clusters"].value_counts().sort_index().items()},
        }
    return facts


def alone_convergence(task: Any, radius: float, rounds: int) -> dict[str, list[float]]:
    """Train one model per group alone on that group's clients from ``ū(radius)`` for ``rounds`` rounds.

    Every client of group ``g`` trains the group's model (the task's local update) and the server
    takes the sample-weighted average (the hard update with the whole group routed to one cluster).
    Returns, per group, the excess training loss ``L_g(w_T) − L_g(β*_g)`` and the cross-group gap
    ``min_{h≠g} L_g(β*_h) − L_g(β*_g)`` (training, sample-weighted).
    """
    clients = task.clients(np.arange(task.num_clients))
    groups, weights = clients.groups, clients.num_examples.astype(np.float64)
    oracle = _oracle(task)
    num_groups = oracle.shape[0]
    start = np.repeat(np.asarray(task.initial_centre(radius), dtype=np.float64)[None, None], num_groups, axis=1)
    models = train_groups_alone(clients, np.zeros(len(groups), dtype=np.int64), start, [rounds])[rounds][0]

    def group_loss(parameters: NDArray) -> NDArray:                   # (G_models,) per group → (G, G_models)
        table = clients.losses(parameters, "train")
        return np.stack([np.average(table[groups == g], axis=0, weights=weights[groups == g])
                         for g in range(num_groups)])

    trained_loss, oracle_loss = np.diag(group_loss(models)), group_loss(oracle)   # oracle_loss[g, h] = L_g(β*_h)
    own = np.diag(oracle_loss)
    others = np.where(np.eye(num_groups, dtype=bool), np.inf, oracle_loss).min(axis=1)
    return {"excess": (trained_loss - own).tolist(), "gap": (others - own).tolist()}


def radius_panels(prefix: str, name: str, first: tuple[str, str], round_zero: Callable[[pd.Series], pd.Series],
                  round_zero_label: str, exp3_label: str) -> list[Panel]:
    """Figures ``<prefix>a|b|c``: the ``first`` (column, label), ``A_T`` and the routed loss against R, one
    line per method (panel (c) with FedAvg's and Local's); panel (a) adds ``round_zero`` of the Greedy rows' ``round0_pr_all_used`` (dashed)."""
    def title(tag: str) -> Callable[[Results, Any], str]:
        return lambda results, config: (f"{tag} {name}, K = {config.num_clusters}, {config.seeds_per_radius} seeds "
                                        f"per R, T = {config.rounds}")

    def entrance(ax: Any, results: Results, config: Any) -> None:
        greedy = results.summary[results.summary["method"] == GREEDY].set_index("radius")["round0_pr_all_used"]
        series = round_zero(greedy).sort_index()
        ax.plot(series.index, series.to_numpy(), linestyle="--", color="0.4", marker=".", label=round_zero_label)

    common = dict(data="summary", x="radius", xlabel="initialisation radius $R$", xticks=True,
                  styles={EXP3: {"label": exp3_label}})
    return [Panel(f"{prefix}a", y=first[0], ylabel=first[1], title=title("(a)"), ylim=(-0.03, 1.03), extra=entrance,
                  **common),
            Panel(f"{prefix}b", y="mean_assignment_accuracy", ylabel=r"mean terminal assignment $A_T$",
                  title=title("(b)"), ylim=(-0.03, 1.03), **common),
            Panel(f"{prefix}c", y="routed_test_loss", ylabel="mean final routed test loss", title=title("(c)"),
                  **{**common, "data": lambda results: losses_by_method(results.runs, results.references, "radius",
                                                                        "routed_test_loss")})]


def radius_table(results: Results, columns: Sequence[str], greedy_columns: Mapping[str, str]) -> list[pd.DataFrame]:
    """The printed tables: ``columns`` of the summary per R and method, and some Greedy-row columns; then the mean
    routed test loss per R of every method beside FedAvg's and Local's."""
    summary = results.summary
    table = summary.pivot(index="radius", columns="method", values=list(columns))
    table.columns = [f"{method}:{column}" for column, method in table.columns]
    greedy = summary[summary["method"] == GREEDY].set_index("radius")
    for name, column in greedy_columns.items():
        table[name] = greedy[column]
    return [table.reset_index(), reference_table(results.runs, results.references, "radius", "routed_test_loss")]

