"""E1 — Figure 1: certified starvation basin under population-level Greedy dynamics.

Two groups (``θ_0 = +(Δ/2)e_0``, ``θ_1 = −(Δ/2)e_0``, proportions ``(α, 1 − α)``) and two cluster
models follow :func:`~fedroute.simulation.population.greedy_population_dynamics` for ``T`` rounds.
For each ``ρ``, ``pairs`` starts ``w_k^0 = θ̄ + ρ z_k`` are drawn from
``generator(seed, 0, rho_index, Purpose.INIT)`` and we count ``common`` preference, the certified
``basin``, ``persistent`` collapse, ``nonrecovery`` (``R_T ≥ Δ/4``) and ``persistent_given_basin``
(Theorem 2 says 1).  Tables (docs/experiments.md): ``summary`` (one row per ρ), ``runs`` (per
ρ cell, with the counts behind the frequencies) and ``references`` (per reference method and ρ: the same
population dynamics for one global model, FedAvg, from ``w_0^0``, and for each group training its own model
alone from ``w_0^0``, Local).  One vectorised process.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fedroute.core.methods import FEDAVG, GREEDY, LOCAL
from fedroute.core.randomness import Purpose, generator
from fedroute.simulation.experiments.kit import (
    Experiment, ExperimentConfig, Results, Sweep, claim, number, register)
from fedroute.core.metrics import (
    certified_starvation_basin, common_preferred_cluster, persistent_collapse, recovery_error)
from fedroute.simulation.plotting import METHOD_STYLES, Panel
from fedroute.simulation.population import greedy_population_dynamics
from fedroute.tasks.linear import LinearTask

__all__ = ["Fig1Config", "SUMMARY_COLUMNS", "RUNS_COLUMNS", "REFERENCES_COLUMNS", "FREQUENCIES", "cell_outcomes",
           "run_fig1", "reference_outcomes", "run_references", "fig1_claims", "EXPERIMENT"]

SUMMARY_COLUMNS = ("rho", "n_inits", "common", "basin", "persistent", "nonrecovery", "persistent_given_basin")
FREQUENCIES = ("common", "basin", "persistent", "nonrecovery")
"""The four frequencies of paper Figure 1."""
RUNS_COLUMNS = SUMMARY_COLUMNS + (
    "rho_index", "seed", "rounds", "n_common", "n_basin", "n_persistent", "n_nonrecovery", "n_basin_persistent",
    "n_common_escaped", "n_persistent_outside_basin", "n_nonrecovery_not_persistent",
    "mean_recovery_error", "median_recovery_error",
)
REFERENCES_COLUMNS = ("method", "rho", "n_inits", "nonrecovery", "mean_recovery_error", "median_recovery_error")
MONOTONE_TOLERANCE = 0.02
LARGEST_RHO_LEVEL = 0.80
TRACKING_TOLERANCE = 0.1


@dataclass(frozen=True)
class Fig1Config(ExperimentConfig):
    """Settings of E1 (paper-fixed: pairs, rounds, the init law; ours: ``d = 5``, ``Δ = 4``, ``α = η = ½``,
    ``ρ = 0.25·2^i``, ``i = 0..9``).  ``eta`` is the server step in ``(0, 1]`` (Theorem 2)."""

    LABEL = "fig1"
    QUICK = dict(pairs=2_000, rounds=50, rhos=(0.25, 2.0, 16.0, 128.0), name="E1-fig1-quick")
    RULES = dict(dimension="≥ 2", group_distance="> 0", alpha="(0, 1)", eta="(0, 1]", rounds="≥ 1", pairs="≥ 1",
                 seed="≥ 0", rhos="≥ 0")

    dimension: int = 5
    group_distance: float = 4.0
    alpha: float = 0.5
    eta: float = 0.5
    rounds: int = 200
    pairs: int = 20_000
    seed: int = 0
    rhos: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
    name: str = "E1-fig1"
    version: str = "1"

    @property
    def theta(self) -> NDArray[np.float64]:
        """``θ_g`` as a (2, d) array (the linear task's convention)."""
        return LinearTask(dimension=self.dimension, group_distance=self.group_distance).group_parameters

    def initial_models(self, rho_index: int) -> NDArray[np.float64]:
        """``W^0`` of cell ``rho_index``, shape (pairs, 2, d): ``θ̄ + ρ z``."""
        z = generator(self.seed, 0, rho_index, Purpose.INIT).standard_normal((self.pairs, 2, self.dimension))
        return self.theta.mean(axis=0) + self.rhos[rho_index] * z

    def derived(self) -> dict[str, Any]:
        theta = self.theta
        return {"theta": theta.tolist(), "theta_bar": theta.mean(axis=0).tolist(),
                "theta_bar_alpha": (np.array([self.alpha, 1.0 - self.alpha]) @ theta).tolist(),
                "nonrecovery_threshold": self.group_distance / 4.0,
                "initialisation": "w^0 = theta_bar + rho * z, z = generator(seed, 0, rho_index, "
                                  "Purpose.INIT).standard_normal((pairs, 2, d))",
                "runs_table": "per-cell: one row per rho (each cell holds `pairs` initialisations)"}


def cell_outcomes(config: Fig1Config, rho_index: int) -> dict[str, NDArray]:
    """Per-pair outcomes of one ρ cell, each of shape (pairs,): ``common``, ``basin``, ``persistent``,
    ``nonrecovery`` (bool) and ``recovery_error`` (``R_T``)."""
    theta = config.theta
    initial = config.initial_models(rho_index)
    final, ever_updated = greedy_population_dynamics(initial, theta, config.alpha, config.eta, config.rounds)
    # ``persistent_collapse`` takes route counts (..., T, K); "ever updated" is their sum over the
    # T rounds (one pseudo-round), which it treats the same way.
    error = np.asarray(recovery_error(final, theta), dtype=float)
    return {
        "common": np.asarray(common_preferred_cluster(initial, theta)) >= 0,
        "basin": np.asarray(certified_starvation_basin(initial, theta, config.alpha), dtype=bool),
        "persistent": np.asarray(persistent_collapse(ever_updated[:, None, :].astype(float)), dtype=bool),
        "nonrecovery": error >= config.group_distance / 4.0,
        "recovery_error": error,
    }


def reference_outcomes(config: Fig1Config, rho_index: int) -> dict[str, NDArray[np.float64]]:
    """``R_T`` per pair of the references from ``w_0^0`` of cell ``rho_index``, each of shape (pairs,): ``fedavg``,
    one model on both groups' mass (the one model in both roles of ``R``); ``local``, each group's own model trained
    on that group alone."""
    theta, start = config.theta, config.initial_models(rho_index)[:, :1]
    shared = greedy_population_dynamics(start, theta, config.alpha, config.eta, config.rounds)[0]
    own = np.concatenate([greedy_population_dynamics(start, theta[[g, g]], 1.0, config.eta, config.rounds)[0]
                          for g in range(len(theta))], axis=1)  # the group's whole mass on its own model
    return {FEDAVG: np.asarray(recovery_error(np.repeat(shared, len(theta), axis=1), theta), dtype=float),
            LOCAL: np.asarray(recovery_error(own, theta), dtype=float)}


def run_references(config: Fig1Config) -> pd.DataFrame:
    """The ``references`` table: per reference method and ρ, the non-recovery frequency (``R_T ≥ Δ/4``) and
    ``R_T``'s mean and median."""
    outcomes = [reference_outcomes(config, rho_index) for rho_index in range(len(config.rhos))]
    return pd.DataFrame([{"method": method, "rho": rho, "n_inits": config.pairs,
                          "nonrecovery": float((out[method] >= config.group_distance / 4.0).mean()),
                          "mean_recovery_error": float(out[method].mean()),
                          "median_recovery_error": float(np.median(out[method]))}
                         for method in (FEDAVG, LOCAL) for rho, out in zip(config.rhos, outcomes)],
                        columns=list(REFERENCES_COLUMNS))


def _cell_row(config: Fig1Config, rho_index: int) -> dict[str, Any]:
    out = cell_outcomes(config, rho_index)
    common, basin, persistent, nonrecovery = (out[key] for key in FREQUENCIES)
    n, n_basin, n_basin_persistent = config.pairs, int(basin.sum()), int((basin & persistent).sum())
    return {
        "rho": config.rhos[rho_index], "n_inits": n, "common": common.sum() / n, "basin": n_basin / n,
        "persistent": persistent.sum() / n, "nonrecovery": nonrecovery.sum() / n,
        "persistent_given_basin": n_basin_persistent / n_basin if n_basin else float("nan"),
        "rho_index": rho_index, "seed": config.seed, "rounds": config.rounds,
        "n_common": int(common.sum()), "n_basin": n_basin, "n_persistent": int(persistent.sum()),
        "n_nonrecovery": int(nonrecovery.sum()), "n_basin_persistent": n_basin_persistent,
        "n_common_escaped": int((common & ~persistent).sum()),
        "n_persistent_outside_basin": int((persistent & ~basin).sum()),
        "n_nonrecovery_not_persistent": int((nonrecovery & ~persistent).sum()),
        "mean_recovery_error": float(out["recovery_error"].mean()),
        "median_recovery_error": float(np.median(out["recovery_error"])),
    }


def run_fig1(config: Fig1Config = Fig1Config(), progress: bool = False) -> pd.DataFrame:
    """E1: one row per ρ cell (:data:`RUNS_COLUMNS`; the first ones are the summary); a pure function
    of ``config``.  ``progress``: a tqdm bar over the cells (stderr)."""
    cells = range(len(config.rhos))
    if progress:
        from tqdm import tqdm

        cells = tqdm(cells, desc="fig1 rho cells", unit="cell", file=sys.stderr, disable=None)
    frame = pd.DataFrame([_cell_row(config, rho_index) for rho_index in cells], columns=list(RUNS_COLUMNS))
    integers = [c for c in RUNS_COLUMNS if c.startswith("n_") or c in ("rho_index", "seed", "rounds")]
    return frame.astype({c: "int64" for c in integers})


def fig1_claims(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """The E1 claims from the summary."""
    table = summary.sort_values("rho").reset_index(drop=True)
    largest = table.iloc[-1]
    drops = {f: float(max(0.0, -np.diff(table[f].to_numpy()).min(initial=0.0))) for f in FREQUENCIES}
    gap = (table["common"] - table["basin"]).to_numpy()
    given = table["persistent_given_basin"].to_numpy(dtype=float)
    observed = np.isfinite(given)
    n_basin = (table["basin"] * table["n_inits"]).round().astype(int)
    n_escaped = int(round(float(((1.0 - np.where(observed, given, 1.0)) * n_basin).sum())))
    persistent_gap = float(np.abs(table["persistent"] - table["basin"]).max())
    nonrecovery_gap = float(np.abs(table["nonrecovery"] - table["basin"]).max())
    return [
        claim(f"common, basin, persistent and nonrecovery are non-decreasing in rho (up to {MONOTONE_TOLERANCE}) "
              f"and each exceeds {LARGEST_RHO_LEVEL:.2f} at the largest rho",
              "All four frequencies increase with rho and exceed 80 percent at the largest tested spread.",
              {"largest_rho": float(largest["rho"]),
               "at_largest_rho": {f: number(largest[f]) for f in FREQUENCIES},
               "largest_drop_between_consecutive_rhos": {f: number(drops[f]) for f in FREQUENCIES}},
              all(drops[f] <= MONOTONE_TOLERANCE for f in FREQUENCIES)
              and all(largest[f] > LARGEST_RHO_LEVEL for f in FREQUENCIES)),
        claim("common preference >= certified basin at every rho",
              "Common preference is more frequent than the other events at smaller rho, showing that a shared "
              "first choice alone does not certify failure.",
              {"min_common_minus_basin": number(gap.min()), "common_minus_basin": [number(x) for x in gap]},
              np.all(gap >= 0)),
        claim("persistence given the basin is exactly 1 at every rho (Theorem 2)",
              "Every sampled initialization in B_starve remains persistently collapsed.",
              {"persistent_given_basin": [number(x) for x in given], "basin_samples": int(n_basin.sum()),
               "basin_samples_not_persistent": n_escaped,
               "rhos_without_basin_samples": [float(r) for r in table["rho"][~observed]]},
              observed.any() and np.all(given[observed] == 1.0)),
        claim(f"persistent collapse and terminal non-recovery track the basin frequency (max |difference| over "
              f"rho <= {TRACKING_TOLERANCE})",
              "Persistent collapse and terminal nonrecovery closely follow the certified basin frequency.",
              {"max_abs_persistent_minus_basin": number(persistent_gap),
               "max_abs_nonrecovery_minus_basin": number(nonrecovery_gap)},
              max(persistent_gap, nonrecovery_gap) <= TRACKING_TOLERANCE),
    ]


def _run(config: Fig1Config, sweep: Sweep) -> Results:
    table = run_fig1(config, progress=sweep.progress)
    return Results({"summary": table[list(SUMMARY_COLUMNS)], "runs": table, "references": run_references(config)})


def _frequencies(results: Results) -> pd.DataFrame:
    return results.summary.melt(id_vars="rho", value_vars=list(FREQUENCIES), var_name="frequency")


def _reference_lines(ax: Any, results: Results, config: Fig1Config) -> None:
    """The references' non-recovery frequency (thin lines in the methods' colours)."""
    for method, part in results.references.groupby("method", sort=False):
        style = METHOD_STYLES[method]
        ax.plot(part["rho"], part["nonrecovery"], linewidth=1.0, marker=".",
                **{**style, "label": f"{style['label']}: non-recovery"})


def _reference_table(results: Results) -> pd.DataFrame:
    """Per ρ, Greedy's non-recovery and mean ``R_T`` beside the references'."""
    greedy = results.runs.assign(method=GREEDY)[list(REFERENCES_COLUMNS)]
    rows = pd.concat([greedy, results.references], ignore_index=True)
    table = rows.pivot(index="rho", columns="method", values=["nonrecovery", "mean_recovery_error"])
    table.columns = [f"{method}:{column}" for column, method in table.columns]
    order = [f"{m}:{c}" for c in ("nonrecovery", "mean_recovery_error") for m in dict.fromkeys(rows["method"])]
    return table[order].reset_index()


EXPERIMENT = register(Experiment(
    name="fig1", title="E1, Figure 1: certified starvation basin (population Greedy dynamics)", config=Fig1Config,
    run=_run, claims=lambda results, config: fig1_claims(results.summary), parallel=False,
    panels=[Panel(
        "fig1", _frequencies, "rho", "value", r"initial spread $\rho$", "frequency", by="frequency", log2_x=True,
        ylim=(-0.02, 1.02),
        title=lambda results, config: (f"Greedy population dynamics: {config.pairs:,} pairs per ρ, T = {config.rounds}, "
                                       f"d = {config.dimension}, Δ = {config.group_distance:g}, α = {config.alpha:g}"),
        styles={"common": {"label": "initial common preference", "marker": "o"},
                "basin": {"label": r"certified starvation basin $\mathcal{B}_{\mathrm{starve}}$", "linestyle": "--",
                          "marker": "s"},
                "persistent": {"label": "persistent greedy collapse", "linestyle": "-.", "marker": "^"},
                "nonrecovery": {"label": r"terminal non-recovery $R_T \geq \Delta/4$", "linestyle": ":",
                                "marker": "v"}},
        extra=_reference_lines)],
    show=lambda results: [results.summary, _reference_table(results)],
))
