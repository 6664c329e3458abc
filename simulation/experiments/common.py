"""Shared pieces of the radius sweeps E5 (GMM, Figure B.3) and E6 (California Housing, Figure B.4).

Both experiments start every cluster model near a pooled centre ``ū(R)`` of the
group oracles pushed out along fixed unit directions by ``R``, run Greedy IFCA,
EXP3 (fixed blocks) and FedCAM from the same ``W^0`` per cell, and score the
frozen terminal models with controller-free greedy routing on held-out data.
A *cell* is ``{"radius": R, "seed": s}``; ``s`` seeds the task (data, split,
directions, jitter) **and** the routing draws.

:func:`reduce_radius` is the sweep's ``reduce``: one row per run with the columns
:data:`RUNS_COLUMNS` (``method`` and ``greedy_collapse`` are added by the sweep /
after it):

* round zero (method independent; at ``W^0``, before any training):
  ``round0_clusters_used`` ``K^0`` = number of distinct controller-free greedy
  choices on the clients' *training* losses (the paper's attraction ``A^0`` uses
  ``L̂_i``); ``round0_eval_clusters`` the same on held-out losses (the metric of
  ``K_T^eval`` applied to ``W^0``); ``round0_majority_clusters`` = number of
  distinct clusters that hold the plurality of some group under ``A^0`` (``< G``:
  two groups share a majority cluster); ``round0_attraction`` = ``A^0`` (G × K,
  rows = groups) as a JSON string;
* ``clusters_updated`` (clusters with ≥ 1 executed route in ``T`` rounds),
  ``persistent`` (at most one ever updated);
* ``usable_models`` ``K_T^eval``: distinct held-out greedy choices at ``W^T``;
  ``train_usable_models`` the same on training losses; ``collapsed``:
  ``K_T^eval < G``;
* ``assignment_accuracy`` ``A_T``: permutation-invariant, group-balanced accuracy
  of the held-out greedy choices at ``W^T``;
* ``routed_test_loss``: ``L^route_{T−1}``, the last executed routes ``r^{T−1}``
  scored on held-out data with the models ``W^{T−1}`` they were executed on (as E2);
  ``eval_test_loss``: the controller-free version at ``W^T`` (mean over clients of
  ``min_k`` held-out loss); ``oracle_test_loss``: each client's own group oracle;
* ``oracle_distance``: ``min_π max_g ‖w_π(g) − β*_g‖`` at ``W^T`` (parameter space);
* ``final_gr_probability``: client-mean EXP3 probability of ``gr`` at the start of
  the last round (1 for Greedy, NaN for FedCAM, which selects nothing).

All means over clients are unweighted.  :func:`radius_summary` aggregates per
(method, R); :func:`collapse_cells` compares the methods on the Greedy collapse
cells; :func:`alone_convergence` is the under-training check of EXPERIMENTS
E5/E6 (one model started at ``ū(R)`` and trained alone on its own group's clients,
full participation, sample-weighted hard-update average — the routing loop with
every client of the group routed to one cluster).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fedroute.simulation.experiments.linear import _COLOURS, _json_default, _number, _write_table
from fedroute.simulation.metrics import (
    assignment_accuracy,
    greedy_choices,
    group_routing_matrix,
    persistent_collapse,
    recovery_error,
    routed_loss,
    usable_models,
)
from fedroute.simulation.plotting import pyplot, save_figure
from fedroute.simulation.simulator import BatchHistory, concatenate_clients

__all__ = [
    "RUNS_COLUMNS",
    "SUMMARY_COLUMNS",
    "collapse_columns",
    "reduce_radius",
    "radius_summary",
    "collapse_cells",
    "alone_convergence",
    "round_zero_by_radius",
    "plot_radius_panels",
    "write_radius_outputs",
    "print_claims",
    "mark_greedy_collapse",
    "check_radius_sweep",
    "radius_cells",
    "by_radius",
    "number",
    "METHOD_NAMES",
]

number = _number
"""JSON-friendly float (rounded to 6 decimals; None for NaN/inf)."""

METHOD_NAMES = {"greedy": "Greedy IFCA", "exp3": "EXP3", "fedcam": "FedCAM"}

RUNS_COLUMNS = (
    "method", "radius", "seed", "round0_clusters_used", "round0_eval_clusters", "round0_majority_clusters",
    "round0_attraction", "clusters_updated", "persistent", "usable_models", "train_usable_models", "collapsed",
    "assignment_accuracy", "routed_test_loss", "eval_test_loss", "oracle_test_loss", "oracle_distance",
    "final_gr_probability", "greedy_collapse",
)
"""Columns of ``runs.*``: one row per (method, cell)."""

SUMMARY_COLUMNS = (
    "method", "radius", "runs", "pr_collapse", "pr_all_usable", "mean_usable_models", "mean_assignment_accuracy",
    "mean_routed_test_loss", "std_routed_test_loss", "mean_eval_test_loss", "mean_oracle_test_loss",
    "greedy_collapse_cells", "all_usable_among_greedy_collapse", "mean_routed_test_loss_on_greedy_collapse",
    "round0_mean_clusters_used", "round0_pr_all_used", "round0_pr_single_cluster", "round0_pr_shared_majority",
)
"""Columns of ``summary.*``: one row per (method, R).  ``pr_collapse`` = Pr(K_T^eval < G),
``pr_all_usable`` = Pr(K_T^eval = G) (= 1 − pr_collapse when K = G); ``round0_*`` are over the
R's starts (the same for every method): mean ``K^0``, Pr(K^0 = K), Pr(K^0 = 1), Pr(two groups
share a majority cluster)."""

_PER_METHOD = ("usable_models", "assignment_accuracy", "routed_test_loss", "eval_test_loss")


def check_radius_sweep(config: Any, label: str, method_keys: Sequence[str],
                       extra_checks: Sequence[tuple[Any, ...]] | Callable[[Any], Sequence[tuple[Any, ...]]] = (),
                       ) -> None:
    """Normalise and validate the fields every radius-sweep config shares (a frozen dataclass).

    ``radii`` and ``methods`` become tuples; the integer fields, the radii, the
    seeds, rounds, clusters, methods (``method_keys``, including ``greedy``) and
    chunk size are checked, with ``extra_checks`` — ``(holds, key, value,
    allowed)`` tuples, or a callable of the normalised config returning them —
    right after the radii.  Errors name ``<label> setting '<key>'``.
    """
    try:
        object.__setattr__(config, "radii", tuple(float(r) for r in config.radii))
    except (TypeError, ValueError):
        raise ValueError(f"{label} setting 'radii' = {config.radii!r} is invalid; allowed: a sequence of numbers")
    object.__setattr__(config, "methods", tuple(config.methods))
    for key in ("seeds_per_radius", "first_seed", "rounds", "num_clusters", "block_length", "chunk_size"):
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{label} setting '{key}' = {value!r} is invalid; allowed: an integer")
    extra = extra_checks(config) if callable(extra_checks) else extra_checks
    checks = [
        (len(config.radii) >= 1 and all(np.isfinite(r) and r >= 0 for r in config.radii)
         and len(set(config.radii)) == len(config.radii), "radii", config.radii, "distinct finite numbers ≥ 0"),
        *extra,
        (config.seeds_per_radius >= 1, "seeds_per_radius", config.seeds_per_radius, "≥ 1"),
        (config.first_seed >= 0, "first_seed", config.first_seed, "≥ 0"),
        (config.rounds >= 2, "rounds", config.rounds, "≥ 2"),
        (config.num_clusters >= 1, "num_clusters", config.num_clusters, "≥ 1"),
        ("greedy" in config.methods and all(m in method_keys for m in config.methods)
         and len(set(config.methods)) == len(config.methods), "methods", config.methods,
         f"distinct keys of {sorted(method_keys)} including 'greedy'"),
        (config.chunk_size >= 1, "chunk_size", config.chunk_size, "≥ 1"),
    ]
    for holds, key, value, allowed in checks:
        if not holds:
            raise ValueError(f"{label} setting '{key}' = {value!r} is invalid; allowed: {allowed}")


def radius_cells(config: Any) -> list[dict[str, Any]]:
    """``{"radius", "seed"}`` per cell, R-major; the same seeds at every R."""
    return [{"radius": radius, "seed": config.first_seed + j}
            for radius in config.radii for j in range(config.seeds_per_radius)]


def collapse_columns(methods: Sequence[str]) -> tuple[str, ...]:
    """Columns of ``collapse_cells.*`` (one row per Greedy collapse cell) for these methods."""
    columns = ["radius", "seed", "round0_clusters_used", "oracle_test_loss"]
    columns += [f"{method}_{what}" for method in methods for what in _PER_METHOD]
    columns += ["exp3_minus_greedy_routed_test_loss", "exp3_minus_greedy_eval_test_loss"]
    return tuple(columns)


# --------------------------------------------------------------------------- #
# Reduce (module level: runs in Ray workers)
# --------------------------------------------------------------------------- #
def _oracle(task: Any) -> NDArray[np.float64]:
    """``β*_g`` of a task, (G, P): GMM ``oracle_parameters``, housing ``group_parameters``."""
    oracle = getattr(task, "oracle_parameters", None)
    return np.asarray(task.group_parameters if oracle is None else oracle, dtype=np.float64)


def reduce_radius(history: BatchHistory, tasks: Sequence[Any], cells: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per cell of a simulated chunk (columns: module docstring, without ``method``/``greedy_collapse``)."""
    models = history.cluster_models                                    # (T+1, R, K, P)
    num_rounds, num_runs, num_clients = history.routes.shape
    num_clusters = models.shape[2]
    clients = concatenate_clients([task.clients(np.arange(task.num_clients)) for task in tasks])
    run_of_client = np.repeat(np.arange(num_runs), num_clients)
    groups = history.groups                                            # (R, n)
    oracles = np.stack([_oracle(task) for task in tasks])             # (R, G, P)
    num_groups = oracles.shape[1]

    def losses(state: NDArray, split: str) -> NDArray:
        return clients.losses(state[run_of_client], split).reshape(num_runs, num_clients, -1)

    initial_train, initial_test = losses(models[0], "train"), losses(models[0], "test")
    final_train, final_test = losses(models[-1], "train"), losses(models[-1], "test")
    last_test = losses(models[-2], "test")
    oracle_test = losses(oracles, "test")                             # (R, n, G)

    rows = []
    counts = np.moveaxis(history.route_counts, 0, 1)                  # (R, T, K)
    persistent = np.asarray(persistent_collapse(counts)).reshape(num_runs)
    routed = np.asarray(routed_loss(last_test, history.routes[-1].astype(np.int64))).reshape(num_runs)
    arms = history.mean_arm_probabilities
    for r, cell in enumerate(cells):
        choices0 = greedy_choices(initial_train[r])
        attraction = group_routing_matrix(choices0, groups[r], num_clusters, num_groups)
        k_eval = int(usable_models(final_test[r]))
        rows.append({
            "radius": float(cell["radius"]),
            "seed": int(cell["seed"]),
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


# --------------------------------------------------------------------------- #
# Tables
# --------------------------------------------------------------------------- #
def mark_greedy_collapse(table: pd.DataFrame) -> pd.DataFrame:
    """Add ``greedy_collapse``: the cell's Greedy run ends with ``K_T^eval < G``."""
    greedy = table[table["method"] == "greedy"].set_index(["radius", "seed"])["collapsed"]
    index = pd.MultiIndex.from_frame(table[["radius", "seed"]])
    table = table.copy()
    table["greedy_collapse"] = greedy.reindex(index).to_numpy(dtype=bool)
    return table[list(RUNS_COLUMNS)].reset_index(drop=True)


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
    columns = list(collapse_columns(methods))
    cells = runs[(runs["method"] == "greedy") & runs["greedy_collapse"]][
        ["radius", "seed", "round0_clusters_used", "oracle_test_loss"]]
    table = cells.reset_index(drop=True)
    for method in methods:
        part = runs[runs["method"] == method].set_index(["radius", "seed"])[list(_PER_METHOD)]
        part.columns = [f"{method}_{what}" for what in _PER_METHOD]
        table = table.join(part, on=["radius", "seed"])
    for what in ("routed_test_loss", "eval_test_loss"):
        if "exp3" in methods and "greedy" in methods:
            table[f"exp3_minus_greedy_{what}"] = table[f"exp3_{what}"] - table[f"greedy_{what}"]
        else:
            table[f"exp3_minus_greedy_{what}"] = np.nan
    return pd.DataFrame(table, columns=columns).reset_index(drop=True)


def round_zero_by_radius(runs: pd.DataFrame, num_groups: int, num_clusters: int) -> dict[str, Any]:
    """Round-zero entrance facts per R (from the Greedy rows: ``W^0`` is shared by the methods)."""
    greedy = runs[runs["method"] == "greedy"]
    facts = {}
    for radius, cell in greedy.groupby("radius"):
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


# --------------------------------------------------------------------------- #
# Under-training check
# --------------------------------------------------------------------------- #
def alone_convergence(task: Any, radius: float, rounds: int) -> dict[str, list[float]]:
    """Train one model per group alone on that group's clients from ``ū(radius)`` for ``rounds`` rounds.

    Every client of group ``g`` trains the group's model (the task's local update) and the
    server takes the sample-weighted average (the hard update with all of the group routed
    to one cluster).  Returns, per group, the excess training loss ``L_g(w_T) − L_g(β*_g)``
    and the cross-group gap ``min_{h≠g} L_g(β*_h) − L_g(β*_g)`` (training, sample-weighted).
    """
    clients = task.clients(np.arange(task.num_clients))
    groups, weights = clients.groups, clients.num_examples.astype(np.float64)
    oracle = _oracle(task)
    num_groups = oracle.shape[0]
    models = np.repeat(np.asarray(task.initial_centre(radius), dtype=np.float64)[None], num_groups, axis=0)
    everyone = np.arange(len(groups))
    for round_index in range(rounds):
        trained = clients.local_update(models[groups], everyone, round_index)
        for g in range(num_groups):
            members = groups == g
            models[g] = np.average(trained[members], axis=0, weights=weights[members])

    def group_loss(parameters: NDArray) -> NDArray:                   # (G_models,) per group → (G, G_models)
        table = clients.losses(parameters, "train")                   # (n, G_models)
        return np.stack([np.average(table[groups == g], axis=0, weights=weights[groups == g])
                         for g in range(num_groups)])

    trained_loss = np.diag(group_loss(models))
    oracle_loss = group_loss(oracle)                                  # [g, h] = L_g(β*_h)
    own = np.diag(oracle_loss)
    others = np.where(np.eye(num_groups, dtype=bool), np.inf, oracle_loss).min(axis=1)
    return {"excess": (trained_loss - own).tolist(), "gap": (others - own).tolist()}


# --------------------------------------------------------------------------- #
# Figures and files
# --------------------------------------------------------------------------- #
def plot_radius_panels(summary: pd.DataFrame, figures: Path, panels: Sequence[tuple[str, str, str, str]],
                       labels: dict[str, str], subtitle: str,
                       round_zero: Optional[tuple[str, pd.Series, str]] = None) -> None:
    """One figure per panel ``(stem, column, ylabel, tag)``: the column vs R, a line per method.

    ``round_zero = (stem, series indexed by R, label)`` adds that series (dashed grey) to the
    panel ``stem``.
    """
    plt = pyplot()
    for stem, column, ylabel, tag in panels:
        fig, ax = plt.subplots(figsize=(5.2, 3.6))
        for method, table in summary.groupby("method", sort=False):
            table = table.sort_values("radius")
            ax.plot(table["radius"], table[column], marker="o", color=_COLOURS.get(method),
                    label=labels.get(method, method))
        if round_zero is not None and round_zero[0] == stem:
            series = round_zero[1].sort_index()
            ax.plot(series.index, series.to_numpy(), linestyle="--", color="0.4", marker=".", label=round_zero[2])
        if column.startswith("pr_") or column.endswith("accuracy"):
            ax.set_ylim(-0.03, 1.03)
        ax.set_xticks(sorted(summary["radius"].unique()))
        ax.set_xlabel("initialisation radius $R$")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{tag} {subtitle}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, figures, stem)


def write_radius_outputs(out: Path, tables: dict[str, pd.DataFrame], claims: list[dict[str, Any]],
                         settings: dict[str, Any]) -> None:
    """Write ``<stem>.parquet``/``.csv`` per table, ``claims.json`` and ``config.json`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for stem, table in tables.items():
        _write_table(table.reset_index(drop=True), out, stem)
    (out / "claims.json").write_text(json.dumps(claims, indent=2, default=_json_default) + "\n")
    (out / "config.json").write_text(json.dumps(settings, indent=2, default=_json_default) + "\n")


def print_claims(claims: list[dict[str, Any]]) -> None:
    """One status line per claim."""
    for claim in claims:
        status = "untestable" if claim["holds"] is None else ("holds" if claim["holds"] else "FAILS")
        print(f"[{status}] {claim['claim']}")


def by_radius(summary: pd.DataFrame, method: str, column: str) -> dict[str, Any]:
    """``{R: value}`` of one summary column of one method (JSON-friendly)."""
    rows = summary[summary["method"] == method].sort_values("radius")
    return {f"{r:g}": _number(v) for r, v in zip(rows["radius"], rows[column])}

