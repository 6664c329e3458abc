"""E2 — Figure 2(a–d) and E3 — Figure B.1: two-group linear regression with 80 clients.

The task is :class:`~fedroute.tasks.linear.LinearTask` (80 clients balanced over two groups,
``θ_0 = +(Δ/2)e_0``, ``θ_1 = −(Δ/2)e_0``) with the paper's pooled centred start
``w_k^0 = θ̄ + ρ z_k``.  A cell is ``{"rho": ρ, "seed": s}``; ``s`` seeds the task (data, ``z``) **and**
the routing draws, and is distinct across ρ (``first_seed + i·seeds_per_rho + j``).  Greedy IFCA, EXP3
over ``{gr, rh}`` (blocks of ``B = 10``) and FedCAM run every cell; :func:`reduce_linear` gives one row
per run.  Tables (columns: docs/experiments.md): ``runs``, ``summary`` (per method and ρ, with
``certificate_bound = 1 − basin frequency``, the dashed curve of panel (a)), ``rounds`` (the
representative run, re-simulated alone per method: the Greedy failure with a certified basin at the
largest ρ, lowest seed), ``cell_blocks`` (per run, block and controller: EXP3 probability at the block's
start and executed fraction) and ``blocks`` (E3: their mean over the EXP3 runs of the Greedy failure
cells, with a trailing 5-block mean).  The certificate is about population losses; clients route on
empirical losses (40 samples in d = 5), so basin starts can escape — a claim reports by how much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fedroute.core.methods import EXP3, FEDCAM, GREEDY
from fedroute.simulation.experiments.kit import (
    Experiment, MethodSweepConfig, Results, RunLosses, Sweep, by_value, claim, greedy_of_cell, not_run, number,
    register)
from fedroute.core.metrics import (
    assignment_accuracy, certified_starvation_basin, common_preferred_cluster, composition, group_routing_matrix,
    persistent_collapse, recovery_error, routed_loss, usable_models, weak_cluster_mass)
from fedroute.simulation.experiments.references import reference_panel, reference_runs, reference_table
from fedroute.simulation.plotting import Panel
from fedroute.simulation.simulator import BatchHistory
from fedroute.simulation.sweep import SweepSpec
from fedroute.tasks.linear import LinearTask

__all__ = ["LinearExperimentConfig", "RUNS_COLUMNS", "SUMMARY_COLUMNS", "ROUNDS_COLUMNS", "BLOCKS_COLUMNS",
           "CELL_BLOCKS_COLUMNS", "make_linear_task", "reduce_linear", "linear_claims", "EXPERIMENT"]

RUNS_COLUMNS = (
    "method", "rho", "seed", "common", "preferred_cluster", "basin", "recovery_error", "recovered", "recovery_round",
    "separation_round", "persistent", "clusters_updated", "usable_models", "assignment_accuracy", "routed_test_loss",
    "final_weak_mass", "greedy_failure")
SUMMARY_COLUMNS = (
    "method", "rho", "runs", "recovery_rate", "common", "basin", "persistent", "certificate_bound",
    "persistent_given_basin", "recovered_given_basin", "greedy_failures", "recovered_among_greedy_failures",
    "mean_usable_models", "mean_routed_test_loss")
ROUNDS_COLUMNS = ("method", "rho", "seed", "round", "routed_test_loss", "mu_weak", "beta_gstar_weak",
                  "beta_others_weak", "recovery_error", "weak_cluster", "g_star")
CELL_BLOCKS_COLUMNS = ("method", "rho", "seed", "greedy_failure", "block", "controller", "probability", "fraction")
BLOCKS_COLUMNS = ("block", "first_round", "controller", "probability", "fraction", "probability_smoothed",
                  "fraction_smoothed", "cells")
_BLOCK_ARRAYS = ("block_probabilities", "block_fractions")


@dataclass(frozen=True)
class LinearExperimentConfig(MethodSweepConfig):
    """Settings of E2/E3 (paper-fixed: 80 balanced clients, the init law, the recovery threshold 0.5,
    η_EXP3 = 2, γ = 0.001; ours: the rest).  ``task``: overrides of :class:`LinearTask`'s defaults; the
    ρ grid gives common preference 0.10 (ρ = 0.25) … 0.97 (ρ = 32) in the E1 population dynamics;
    ``final_window``: rounds of the β claim."""

    LABEL = "linear"
    PRESET = "linear"
    QUICK = dict(rhos=(0.5, 4.0, 32.0), seeds_per_rho=6, rounds=60, chunk_size=4, name="E2-E3-linear-quick")
    RULES = dict(rhos="≥ 0 distinct", seeds_per_rho="≥ 1", recovery_threshold="> 0", smoothing_blocks="≥ 1",
                 final_window="≥ 1")

    rhos: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    seeds_per_rho: int = 100
    rounds: int = 200
    recovery_threshold: float = 0.5
    smoothing_blocks: int = 5
    final_window: int = 20
    chunk_size: int = 100
    name: str = "E2-E3-linear"
    version: str = "1"

    def validate(self) -> None:
        self.check([(self.final_window <= self.rounds, "final_window", self.final_window, f"1..{self.rounds}")])
        super().validate()

    @property
    def linear_task(self) -> LinearTask:
        """The task's settings (``θ_g``, ``Δ``, samples per client …) shared by every cell."""
        return LinearTask(**self.task)

    def cells(self) -> list[dict[str, Any]]:
        """``{"rho", "seed"}`` per cell, ρ-major; seeds distinct across ρ."""
        return [{"rho": rho, "seed": self.first_seed + i * self.seeds_per_rho + j}
                for i, rho in enumerate(self.rhos) for j in range(self.seeds_per_rho)]

    def task_factory(self) -> Callable[[dict[str, Any]], LinearTask]:
        return partial(make_linear_task, **self.task)

    def reducer(self) -> Callable[..., pd.DataFrame]:
        return partial(reduce_linear, recovery_threshold=self.recovery_threshold, block_length=self.block_length)

    def derived(self) -> dict[str, Any]:
        return {"theta": self.linear_task.group_parameters.tolist(), **super().derived()}


@dataclass(frozen=True)
class _SweepLinearTask(LinearTask):
    """A :class:`LinearTask` that builds the data of all its clients once.

    The simulator and :func:`reduce_linear` both ask for every client's data;
    generating it (one generator per client) is ~25% of a chunk's time, so the
    second request returns the first result.  Same fields, same data.
    """

    def clients(self, client_ids: NDArray[np.int64]):
        ids = np.asarray(client_ids)
        if ids.shape != (self.num_clients,) or not np.array_equal(ids, np.arange(self.num_clients)):
            return super().clients(client_ids)
        cached = self.__dict__.get("_all_clients")
        if cached is None:
            cached = super().clients(ids)
            object.__setattr__(self, "_all_clients", cached)
        return cached


def make_linear_task(cell: dict[str, Any], **task_settings: Any) -> LinearTask:
    """The task of a cell: the pooled centred start with spread ``cell["rho"]``, seed ``cell["seed"]``."""
    return _SweepLinearTask(init="spread", init_spread=float(cell["rho"]), seed=int(cell["seed"]), **task_settings)


def reduce_linear(
    history: BatchHistory,
    tasks: Sequence[LinearTask],
    cells: Sequence[dict[str, Any]],
    *,
    recovery_threshold: float,
    block_length: int,
) -> pd.DataFrame:
    """One row per cell of a simulated chunk: :data:`RUNS_COLUMNS` without ``method`` and ``greedy_failure``,
    plus two object columns ``block_probabilities`` / ``block_fractions``: ``(blocks, A)`` arrays of the
    client-averaged EXP3 probability of each arm at the start of each block and the share executing it."""
    theta = tasks[0].group_parameters
    if any(not np.array_equal(task.group_parameters, theta) for task in tasks):
        raise ValueError("every run of a chunk must share the group parameters")
    alpha = float(tasks[0].group_proportions[0])
    models = history.cluster_models                              # (T+1, R, K, P)
    num_rounds, num_runs = history.routes.shape[:2]
    num_clusters = models.shape[2]

    initial = models[0]
    preferred = np.asarray(common_preferred_cluster(initial, theta)).reshape(num_runs)
    basin = np.asarray(certified_starvation_basin(initial, theta, alpha)).reshape(num_runs)
    errors = np.asarray(recovery_error(models, theta)).reshape(num_rounds + 1, num_runs)
    below = errors < recovery_threshold
    recovery_round = np.where(below.any(axis=0), below.argmax(axis=0), -1)
    near = errors < np.linalg.norm(theta[1] - theta[0]) / 4.0
    separation_round = np.where(near.any(axis=0), near.argmax(axis=0), -1)
    counts = np.moveaxis(history.route_counts, 0, 1)             # (R, T, K)
    persistent = np.asarray(persistent_collapse(counts)).reshape(num_runs)
    clusters_updated = (counts.sum(axis=1) > 0).sum(axis=1)

    losses = RunLosses(tasks)
    final_test, last_test = losses(models[-1], "test"), losses(models[-2], "test")
    groups = history.groups
    usable = np.asarray(usable_models(final_test)).reshape(num_runs)
    accuracy = [assignment_accuracy(final_test[r], groups[r], num_clusters) for r in range(num_runs)]
    route_loss = np.asarray(routed_loss(last_test, history.routes[-1].astype(np.int64))).reshape(num_runs)
    weak = np.where(preferred >= 0, 1 - preferred, 0)
    weak_mass = np.where(preferred >= 0, history.masses[-1, np.arange(num_runs), weak], np.nan)

    starts = np.arange(0, num_rounds, block_length)
    probabilities = history.mean_arm_probabilities[starts]      # (blocks, R, A)
    fractions = history.arm_fractions[starts]
    return pd.DataFrame({
        "rho": [float(cell["rho"]) for cell in cells],
        "seed": [int(cell["seed"]) for cell in cells],
        "common": preferred >= 0,
        "preferred_cluster": preferred.astype(np.int64),
        "basin": basin.astype(bool),
        "recovery_error": errors[-1],
        "recovered": errors[-1] < recovery_threshold,
        "recovery_round": recovery_round.astype(np.int64),
        "separation_round": separation_round.astype(np.int64),
        "persistent": persistent.astype(bool),
        "clusters_updated": clusters_updated.astype(np.int64),
        "usable_models": usable.astype(np.int64),
        "assignment_accuracy": np.asarray(accuracy, dtype=float),
        "routed_test_loss": route_loss,
        "final_weak_mass": weak_mass,
        "block_probabilities": [probabilities[:, r].copy() for r in range(num_runs)],
        "block_fractions": [fractions[:, r].copy() for r in range(num_runs)],
    })



def _cell_blocks(table: pd.DataFrame, controllers: dict[str, tuple[str, ...]]) -> pd.DataFrame:
    """Long table of the per-run block arrays (``table`` still has the object columns)."""
    parts = []
    for method, rows in table.groupby("method", sort=False):
        names = np.asarray(controllers[method])
        probabilities = np.stack(rows["block_probabilities"].to_list())   # (runs, blocks, A)
        fractions = np.stack(rows["block_fractions"].to_list())
        num_runs, num_blocks, num_arms = probabilities.shape
        if num_arms == 0:  # FedCAM: no controller selection
            continue
        if num_arms != len(names):
            raise ValueError(f"{method}: {num_arms} arms recorded but controllers {tuple(names)}")
        repeat = num_blocks * num_arms
        parts.append(pd.DataFrame({
            "method": method,
            "rho": np.repeat(rows["rho"].to_numpy(), repeat),
            "seed": np.repeat(rows["seed"].to_numpy(), repeat),
            "greedy_failure": np.repeat(rows["greedy_failure"].to_numpy(), repeat),
            "block": np.tile(np.repeat(np.arange(num_blocks), num_arms), num_runs),
            "controller": np.tile(names, num_runs * num_blocks),
            "probability": probabilities.reshape(-1),
            "fraction": fractions.reshape(-1),
        }))
    return pd.concat(parts, ignore_index=True)[list(CELL_BLOCKS_COLUMNS)]


def _summary(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (method, rho), cell in runs.groupby(["method", "rho"], sort=False):
        failures = cell[cell["greedy_failure"]]
        rows.append({
            "method": method, "rho": rho, "runs": len(cell),
            "recovery_rate": cell["recovered"].mean(), "common": cell["common"].mean(),
            "basin": cell["basin"].mean(), "persistent": cell["persistent"].mean(),
            "certificate_bound": 1.0 - cell["basin"].mean(),
            "persistent_given_basin": cell.loc[cell["basin"], "persistent"].mean() if cell["basin"].any() else np.nan,
            "recovered_given_basin": cell.loc[cell["basin"], "recovered"].mean() if cell["basin"].any() else np.nan,
            "greedy_failures": len(failures), "recovered_among_greedy_failures": int(failures["recovered"].sum()),
            "mean_usable_models": cell["usable_models"].mean(),
            "mean_routed_test_loss": cell["routed_test_loss"].mean(),
        })
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def _representative_cell(runs: pd.DataFrame) -> Optional[dict[str, Any]]:
    greedy = runs[(runs["method"] == GREEDY) & runs["greedy_failure"]]
    for rule, candidates in (("greedy failure with a certified basin", greedy[greedy["basin"]]),
                             ("greedy failure (no failure cell has a certified basin)", greedy)):
        if len(candidates):
            rho = candidates["rho"].max()
            seed = int(candidates.loc[candidates["rho"] == rho, "seed"].min())
            return {"rho": float(rho), "seed": seed, "rule": rule + ", largest rho, lowest seed"}
    return None


def _simulate_alone(spec: SweepSpec, cell: dict[str, Any]) -> tuple[BatchHistory, LinearTask]:
    task = spec.make_task(cell)
    return spec.simulate([task], spec.settings, spec.num_rounds, [int(cell["seed"])]), task


def _representative_rounds(specs: dict[str, SweepSpec], runs: pd.DataFrame,
                           cell: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Re-simulate the representative cell for every method; per-round series and facts."""
    histories = {method: _simulate_alone(spec, cell) for method, spec in specs.items()}
    task = histories[GREEDY][1]
    theta, proportions = task.group_parameters, task.group_proportions
    clients = task.clients(np.arange(task.num_clients))
    greedy_models = histories[GREEDY][0].cluster_models[:, 0]
    preferred = int(common_preferred_cluster(greedy_models[0], theta))
    greedy_counts = histories[GREEDY][0].route_counts[:, 0].sum(axis=0)
    weak = 1 - preferred if preferred >= 0 else int(np.argmin(greedy_counts))
    reference = EXP3 if EXP3 in histories else list(histories)[-1]
    final_weak = histories[reference][0].cluster_models[-1, 0, weak]
    g_star = int(np.argmin(np.linalg.norm(theta - final_weak, axis=1)))
    others = [h for h in range(theta.shape[0]) if h != g_star]

    frames, rerun_matches = [], {}
    for method, (history, _) in histories.items():
        models = history.cluster_models[:, 0]                     # (T+1, K, P)
        routes = history.routes[:, 0].astype(np.int64)            # (T, n)
        num_clusters = models.shape[1]
        test = np.stack([clients.losses(models[t], "test") for t in range(len(routes))])
        betas = np.stack([composition(r, clients.groups, clients.num_examples, num_clusters, theta.shape[0])[:, weak]
                          for r in routes])                       # (T, G)
        matrices = np.stack([group_routing_matrix(r, clients.groups, num_clusters, theta.shape[0]) for r in routes])
        errors = np.asarray(recovery_error(models, theta))
        row = runs[(runs["method"] == method) & (runs["rho"] == cell["rho"]) & (runs["seed"] == cell["seed"])]
        rerun_matches[method] = bool(len(row) == 1 and row["recovery_error"].iloc[0] == errors[-1])
        frames.append(pd.DataFrame({
            "method": method, "rho": float(cell["rho"]), "seed": int(cell["seed"]),
            "round": np.arange(len(routes)),
            "routed_test_loss": np.asarray(routed_loss(test, routes)),
            "mu_weak": np.asarray(weak_cluster_mass(matrices, proportions, weak)),
            "beta_gstar_weak": betas[:, g_star],
            "beta_others_weak": betas[:, others].sum(axis=1) if others else 0.0,
            "recovery_error": errors[:-1],
            "weak_cluster": weak, "g_star": g_star,
        }))
    facts = {
        "preferred_cluster": preferred, "weak_cluster": weak, "g_star": g_star,
        "g_star_rule": f"group whose theta is closest to the weak cluster's final {reference} model",
        "greedy_updates_of_weak_cluster": int(greedy_counts[weak]),
        "rerun_matches_sweep": rerun_matches,
    }
    return pd.DataFrame(pd.concat(frames, ignore_index=True), columns=list(ROUNDS_COLUMNS)), facts


def _e3(config: LinearExperimentConfig, runs: pd.DataFrame,
        cell_blocks: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    failures = cell_blocks[(cell_blocks["method"] == EXP3) & cell_blocks["greedy_failure"]]
    exp3_failures = runs[(runs["method"] == EXP3) & runs["greedy_failure"]]

    def median_of(values: NDArray) -> Optional[float]:
        median = float(np.median(values)) if len(values) else float("nan")
        return median if math.isfinite(median) else None

    def blocks_of(rounds: NDArray) -> NDArray:
        return np.where(rounds >= 0, np.maximum(rounds - 1, 0) // config.block_length, np.inf)

    rounds = exp3_failures["recovery_round"].to_numpy()
    separation = exp3_failures["separation_round"].to_numpy()
    recovery_block = blocks_of(rounds)
    facts = {
        "cells": int(len(exp3_failures)),
        "median_recovery_block": median_of(recovery_block),
        "median_recovery_round": median_of(np.where(rounds >= 0, rounds, np.inf)),
        "recovery_blocks_histogram": {str(int(b)) if math.isfinite(b) else "never": int(c)
                                      for b, c in zip(*np.unique(recovery_block, return_counts=True))},
        "median_separation_block": median_of(blocks_of(separation)),
        "median_separation_round": median_of(np.where(separation >= 0, separation, np.inf)),
    }
    if not len(failures):
        return pd.DataFrame(columns=list(BLOCKS_COLUMNS)), facts
    grouped = failures.groupby(["block", "controller"])
    means, cells = grouped[["probability", "fraction"]].mean(), grouped.size()
    parts = []
    for controller in dict.fromkeys(failures["controller"]):       # controllers in arm order
        part = means.xs(controller, level="controller").sort_index()
        smoothed = part.rolling(config.smoothing_blocks, min_periods=1).mean()   # trailing window
        parts.append(pd.DataFrame({
            "block": part.index.to_numpy(), "first_round": part.index.to_numpy() * config.block_length,
            "controller": controller,
            "probability": part["probability"].to_numpy(), "fraction": part["fraction"].to_numpy(),
            "probability_smoothed": smoothed["probability"].to_numpy(),
            "fraction_smoothed": smoothed["fraction"].to_numpy(),
            "cells": cells.xs(controller, level="controller").loc[part.index].to_numpy(),
        }))
    table = pd.concat(parts, ignore_index=True).sort_values("block", kind="stable")
    return table[list(BLOCKS_COLUMNS)].reset_index(drop=True), facts



def _run(config: LinearExperimentConfig, sweep: Sweep) -> Results:
    specs = config.specs()
    table = sweep(list(specs.values()), config.cells(), config.chunk_size)
    table["greedy_failure"] = greedy_of_cell(table, ["rho", "seed"], "recovery_error") >= config.recovery_threshold
    cell_blocks = _cell_blocks(table, {m: spec.settings.controllers for m, spec in specs.items()})
    runs = table.drop(columns=list(_BLOCK_ARRAYS))[list(RUNS_COLUMNS)].reset_index(drop=True)
    representative = _representative_cell(runs)
    rounds = pd.DataFrame(columns=list(ROUNDS_COLUMNS))
    if representative is not None:
        rounds, facts = _representative_rounds(specs, runs, representative)
        representative.update(facts)
    blocks, e3 = _e3(config, runs, cell_blocks)
    references = reference_runs(sweep, config.task_factory(), config.rounds, config.num_clusters, config.cells(),
                                ("rho", "seed"), config.chunk_size)
    return Results({"runs": runs, "summary": _summary(runs), "rounds": rounds, "blocks": blocks,
                    "cell_blocks": cell_blocks, "references": references},
                   representative_run=representative or {}, e3=e3)


BETA_LEVEL = 0.9
START_BAND = (0.4, 0.6)
TRACKING_TOLERANCE = 0.1
PAPER_MEDIAN_RECOVERY_BLOCK = 1


Claim = dict[str, Any]
_RELIABILITY_PAPER = "Greedy IFCA and FedCAM become less reliable as rho increases."


def _loses_reliability(results: Results, config: LinearExperimentConfig, method: str, name: str) -> Claim:
    """``method``'s recovery rate at the largest ρ is below the one at the smallest."""
    summary, smallest, largest = results.summary, min(config.rhos), max(config.rhos)
    text = f"{name} loses reliability as rho grows (recovery rate at the largest rho < at the smallest)"
    if method not in set(results.runs["method"]):
        return not_run(text, _RELIABILITY_PAPER, method)
    rates = summary[summary["method"] == method].set_index("rho")["recovery_rate"]
    return claim(text, _RELIABILITY_PAPER, {"recovery_rate_by_rho": by_value(summary, method, "rho", "recovery_rate"),
                                            "smallest_rho": smallest, "largest_rho": largest},
                 rates[largest] < rates[smallest])


def _certificate_bound(results: Results, config: LinearExperimentConfig) -> Claim:
    """Greedy's recovery rate stays below ``1 − basin frequency`` at every ρ."""
    greedy = results.summary[results.summary["method"] == GREEDY].sort_values("rho")
    excess = greedy["recovery_rate"] - greedy["certificate_bound"]
    task = config.linear_task
    return claim(
        "Greedy recovery rate <= 1 - certified-basin frequency at every rho (the dashed certificate bound of "
        "panel (a))", "The dashed curve is the certificate based upper bound on Greedy recovery.", {
            "by_rho": {f"{r.rho:g}": {"greedy_recovery": number(r.recovery_rate), "bound": number(r.certificate_bound),
                                      "persistent_given_basin": number(r.persistent_given_basin),
                                      "recovered_given_basin": number(r.recovered_given_basin)}
                       for r in greedy.itertuples()},
            "max_excess_over_bound": number(excess.max()),
            "note": "the certificate is for population losses; clients route on empirical losses of "
                    f"{task.samples_per_client} samples in d = {task.dimension}",
        }, (excess <= 0).all())


def _recovers_failures(results: Results, config: LinearExperimentConfig) -> Claim:
    """EXP3 recovers every Greedy failure cell."""
    runs = results.runs
    failures = runs[(runs["method"] == EXP3) & runs["greedy_failure"]]
    missed = failures[~failures["recovered"]]
    return claim(
        "EXP3 recovers every Greedy failure cell (R_T < 0.5 in every cell whose Greedy run has R_T >= 0.5)",
        "EXP3 recovers every evaluated Greedy failure cell (147 Greedy failure cells).", {
            "greedy_failure_cells": int(len(failures)),
            "exp3_recoveries_among_them": int(failures["recovered"].sum()),
            "by_rho": {f"{rho:g}": [int(len(g)), int(g["recovered"].sum())] for rho, g in failures.groupby("rho")},
            "unrecovered_cells": [{"rho": float(r.rho), "seed": int(r.seed), "R_T": number(r.recovery_error)}
                                  for r in missed.itertuples()],
        }, len(failures) > 0 and len(missed) == 0)


def _representative_where(results: Results) -> dict[str, Any]:
    """The representative run's cell and clusters, as the claims about it report them."""
    rep = results.representative_run
    return {key: rep.get(key) for key in ("rho", "seed", "rule", "weak_cluster", "g_star")}


def _restores_weak_mass(results: Results, config: LinearExperimentConfig) -> Claim:
    """In the representative run only EXP3 gives the weak cluster mass."""
    runs = results.runs
    mass = {m: g["mu_weak"].to_numpy() for m, g in results.rounds.groupby("method")}
    return claim(
        "only EXP3 restores weak-cluster mass (representative run: Greedy mu_weak = 0 in every round, EXP3's final "
        "mu_weak > 0)", "Panel (c) shows that only EXP3 restores weak cluster mass.", {
            **_representative_where(results),
            "max_mu_weak": {m: number(v.max()) for m, v in mass.items()},
            "final_mu_weak": {m: number(v[-1]) for m, v in mass.items()},
            "rounds_with_weak_activity": {m: int((v > 0).sum()) for m, v in mass.items()},
            "final_weak_mass_all_greedy_failure_cells": {
                m: {"mean": number(g.loc[g["greedy_failure"], "final_weak_mass"].mean()),
                    "zero": int((g.loc[g["greedy_failure"], "final_weak_mass"] == 0).sum())}
                for m, g in runs.groupby("method")}},
        GREEDY in mass and EXP3 in mass and np.all(mass[GREEDY] == 0) and mass[EXP3][-1] > 0)


def _dominated_by_one_group(results: Results, config: LinearExperimentConfig) -> Claim:
    """EXP3's weak-cluster updates come from one group over the final window."""
    window = results.rounds[results.rounds["method"] == EXP3].tail(config.final_window)
    beta = float(window["beta_gstar_weak"].mean()) if len(window) else float("nan")
    return claim(
        f"EXP3's weak-cluster updates become dominated by one group: mean beta_(g*,weak) over the last "
        f"{config.final_window} rounds >= {BETA_LEVEL}", "beta_(g*,weak) -> 1 and sum_(h != g*) beta_(h,weak) -> 0.",
        {**_representative_where(results), "final_window_mean_beta_gstar": number(beta),
         "final_window_mean_beta_others": number(window["beta_others_weak"].mean()) if len(window) else None,
         "final_window_rounds_without_weak_updates": int(window["beta_gstar_weak"].isna().sum())},
        math.isfinite(beta) and beta >= BETA_LEVEL)


def _greedy_blocks(results: Results) -> tuple[pd.DataFrame, float, float]:
    """E3's Greedy-controller rows by block, and their first and last smoothed probability (NaN without rows)."""
    gr = results.blocks[results.blocks["controller"] == "gr"].sort_values("block")
    if not len(gr):
        return gr, float("nan"), float("nan")
    return gr, float(gr["probability_smoothed"].iloc[0]), float(gr["probability_smoothed"].iloc[-1])


def _e3_start(results: Results, config: LinearExperimentConfig) -> Claim:
    """E3: EXP3 starts with about equal controller probabilities."""
    blocks, (gr, first, _) = results.blocks, _greedy_blocks(results)
    return claim(
        f"E3: EXP3 starts near 0.5/0.5 (first-block mean Greedy probability in {list(START_BAND)})",
        "EXP3 begins with approximately equal probability on both controllers.",
        {"cells": results.e3["cells"], "first_block_probability": {
            c: number(g.sort_values("block")["probability"].iloc[0]) for c, g in blocks.groupby("controller")}},
        len(gr) > 0 and START_BAND[0] <= first <= START_BAND[1])


def _e3_rises(results: Results, config: LinearExperimentConfig) -> Claim:
    """E3: the Greedy probability rises."""
    blocks, (gr, first, last) = results.blocks, _greedy_blocks(results)
    return claim(
        "E3: the Greedy probability rises afterwards (last-block smoothed Greedy probability > first)",
        "After recovery, the mean Greedy probability rises steadily from approximately 0.5 to 0.9, while the Rank "
        "Hedge probability falls to approximately 0.1.",
        {"gr_first_block_smoothed": number(first), "gr_last_block_smoothed": number(last),
         "gr_max_smoothed": number(gr["probability_smoothed"].max()) if len(gr) else None,
         "last_block_smoothed": {c: number(g.sort_values("block")["probability_smoothed"].iloc[-1])
                                 for c, g in blocks.groupby("controller")}},
        len(gr) > 0 and last > first)


def _e3_tracking(results: Results, config: LinearExperimentConfig) -> Claim:
    """E3: the executed fractions track the probabilities."""
    blocks, have = results.blocks, len(_greedy_blocks(results)[0]) > 0
    gap = (blocks["fraction"] - blocks["probability"]).abs()
    gap_smoothed = (blocks["fraction_smoothed"] - blocks["probability_smoothed"]).abs()
    return claim(
        f"E3: executed selection fractions track the probabilities (mean |fraction - probability| over blocks and "
        f"controllers <= {TRACKING_TOLERANCE}, unsmoothed cell means)",
        "The executed selection fractions closely track these learned probabilities.",
        {"mean_abs_difference": number(gap.mean()) if have else None,
         "max_abs_difference": number(gap.max()) if have else None,
         "mean_abs_difference_smoothed": number(gap_smoothed.mean()) if have else None},
        have and gap.mean() <= TRACKING_TOLERANCE)


def _e3_median_block(results: Results, config: LinearExperimentConfig) -> Claim:
    """E3: the median Greedy-failure cell recovers by the paper's block."""
    e3, gr = results.e3, _greedy_blocks(results)[0]
    median = e3["median_recovery_block"]
    return claim(
        f"E3: the median Greedy-failure cell recovers (under EXP3) by block {PAPER_MEDIAN_RECOVERY_BLOCK} (0-based "
        f"block during which R first drops below {config.recovery_threshold})", "The median cell recovers by block 1.",
        {"median_recovery_block": median, "median_recovery_round": e3["median_recovery_round"],
         "recovery_block_counts": e3["recovery_blocks_histogram"], "cells": e3["cells"],
         "with_threshold_delta_over_4": {"median_block": e3["median_separation_block"],
                                         "median_round": e3["median_separation_round"]},
         "gr_probability_by_block": [number(p) for p in gr["probability"]]},
        median is not None and median <= PAPER_MEDIAN_RECOVERY_BLOCK)


def _fedcam_not_run(results: Results, config: LinearExperimentConfig) -> list[Claim]:
    """The record of the FedCAM claims when FedCAM did not run (none otherwise)."""
    if FEDCAM in set(results.runs["method"]):
        return []
    return [not_run("FedCAM claims (reliability vs rho; no weak-cluster mass)", _RELIABILITY_PAPER, FEDCAM)]


LINEAR_CLAIMS: tuple[Callable[[Results, LinearExperimentConfig], Claim], ...] = (
    partial(_loses_reliability, method=GREEDY, name="Greedy IFCA"),
    partial(_loses_reliability, method=FEDCAM, name="FedCAM"),
    _certificate_bound, _recovers_failures, _restores_weak_mass, _dominated_by_one_group,
    _e3_start, _e3_rises, _e3_tracking, _e3_median_block)
"""The E2/E3 claims, in the order of ``claims.json``."""


def linear_claims(results: Results, config: LinearExperimentConfig) -> list[Claim]:
    """The E2/E3 claims (``holds`` None: the method was not run)."""
    return [check(results, config) for check in LINEAR_CLAIMS] + _fedcam_not_run(results, config)


def _where(tag: str) -> Any:
    def title(results: Results, config: LinearExperimentConfig) -> str:
        rep = results.facts.get("representative_run") or {}
        return f"{tag} representative Greedy failure: ρ = {rep['rho']:g}, seed {rep['seed']}" if rep else tag
    return title


def _bound(ax: Any, results: Results, config: LinearExperimentConfig) -> None:
    bound = results.summary[results.summary["method"] == GREEDY]
    ax.plot(bound["rho"], bound["certificate_bound"], linestyle="--", color="0.3",
            label=r"$1 -$ certified-basin frequency (population certificate)")


def _log_scale(ax: Any, results: Results, config: LinearExperimentConfig) -> None:
    if len(results.rounds) and (results.rounds["routed_test_loss"] > 0).all():
        ax.set_yscale("log")


def _betas(results: Results) -> pd.DataFrame:
    exp3 = results.rounds[results.rounds["method"] == EXP3]
    return exp3.melt(id_vars="round", value_vars=["beta_gstar_weak", "beta_others_weak"], var_name="series")


def _controller_use(results: Results) -> pd.DataFrame:
    table = results.blocks.melt(id_vars=["block", "controller"], value_vars=["probability_smoothed",
                                                                               "fraction_smoothed"])
    return table.assign(series=table["variable"].str.split("_").str[0] + " " + table["controller"])


def _median_block(ax: Any, results: Results, config: LinearExperimentConfig) -> None:
    median = results.facts.get("e3", {}).get("median_recovery_block")
    if median is not None:
        ax.axvline(median, color="0.4", linestyle=":", label=f"median recovery block ({median:g})")


_ROUNDS = dict(data="rounds", x="round", xlabel="round $t$", marker=None, styles={EXP3: {"label": "EXP3 {gr, rh}"}})
EXPERIMENT = register(Experiment(
    name="linear", title="E2/E3, Figures 2(a-d) and B.1: two-group linear regression, 80 clients",
    config=LinearExperimentConfig, run=_run, claims=linear_claims,
    panels=[
        Panel("fig2a", "summary", "rho", "recovery_rate", r"initial spread $\rho$",
              r"recovery rate $\widehat{\Pr}(R_T < 0.5)$", log2_x=True, ylim=(-0.03, 1.03), extra=_bound,
              styles={EXP3: {"label": "EXP3 {gr, rh}"}},
              title=lambda results, config: f"(a) {config.seeds_per_rho} cells per ρ, T = {config.rounds}"),
        Panel("fig2b", y="routed_test_loss", ylabel=r"routed test loss $L^{\mathrm{route}}_t$", title=_where("(b)"),
              extra=_log_scale, **_ROUNDS),
        Panel("fig2c", y="mu_weak", ylabel=r"weak-cluster mass $\mu^t_{\mathrm{weak}}$", title=_where("(c)"),
              **_ROUNDS),
        Panel("fig2d", _betas, "round", "value", "round $t$", "composition of the weak cluster (EXP3)", by="series",
              marker=None, ylim=(-0.03, 1.03), title=_where("(d)"),
              styles={"beta_gstar_weak": {"label": r"$\beta^t_{g^\star,\mathrm{weak}}$", "color": "tab:blue"},
                      "beta_others_weak": {"label": r"$\sum_{h \neq g^\star} \beta^t_{h,\mathrm{weak}}$",
                                           "color": "tab:orange"}}),
        Panel("figB1", _controller_use, "block", "value", "block $b$", "EXP3 controller use (trailing mean)",
              by="series", marker=None, ylim=(-0.03, 1.03), extra=_median_block,
              title=lambda results, config: f"B.1: EXP3 on the {results.e3.get('cells', 0)} Greedy-failure cells",
              styles={f"{kind} {c}": {"color": colour, "linestyle": "-" if kind == "probability" else "--",
                                     "label": f"{'mean probability' if kind == 'probability' else 'executed fraction'} "
                                              f"{c}"}
                      for c, colour in (("gr", "tab:blue"), ("rh", "tab:orange"))
                      for kind in ("probability", "fraction")}),
        reference_panel("fig2_references", "rho", "routed_test_loss", r"initial spread $\rho$",
                        r"mean final routed test loss $L^{\mathrm{route}}_{T-1}$", log2_x=True,
                        styles={EXP3: {"label": "EXP3 {gr, rh}"}},
                        title=lambda results, config: f"{config.seeds_per_rho} cells per ρ, T = {config.rounds}, "
                                                      "against FedAvg and Local"),
    ],
    show=lambda results: [_recovery_table(results.summary),
                          reference_table(results.runs, results.references, "rho", "routed_test_loss")],
))


def _recovery_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Recovery rate per ρ and method, the basin and the Greedy failures (EXP3 recovers among them)."""
    table = summary.pivot(index="rho", columns="method", values="recovery_rate").add_prefix("recovery_")
    greedy = summary[summary["method"] == GREEDY].set_index("rho")
    table["basin"] = greedy["basin"]
    table["greedy_failures"] = greedy["greedy_failures"]
    if EXP3 in set(summary["method"]):
        table["exp3_recovered_of_failures"] = summary[summary["method"] == EXP3].set_index("rho")[
            "recovered_among_greedy_failures"]
    return table.reset_index()
