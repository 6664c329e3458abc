"""E1 — Figure 1: certified starvation basin under population-level Greedy dynamics.

Paper §2 (Figure 1), EXPERIMENTS.md E1, ALGORITHM.md §9.  Two latent groups with
population losses ``L_g(w) = ½‖w − θ_g‖²`` (``θ_0 = +(Δ/2)e_0``, ``θ_1 = −(Δ/2)e_0``,
the convention of :mod:`fedroute.tasks.linear`), proportions ``(α, 1 − α)``, and two
cluster models.  Each round every group routes to ``argmin_k L_g(w_k)`` (ties to
the lowest index) and every cluster with routed groups takes one step towards the
α-weighted mean of its groups' parameters,

    w_k ← w_k − η Σ_{g→k} α_g (w_k − θ_g) / Σ_{g→k} α_g,

while an unrouted cluster is unchanged.  For each ``ρ`` of the grid, 20,000 initial
pairs ``w_k^0 = θ̄ + ρ z_k`` (``θ̄ = (θ_0 + θ_1)/2``, ``z_k ~ N(0, I_d)``) are drawn
from ``generator(seed, 0, rho_index, Purpose.INIT)`` — a pure function of the cell
``(seed, rho_index)`` — and run for ``T = 200`` rounds, all pairs at once
(:func:`greedy_population_dynamics` loops over rounds only).

Per ``ρ`` we report the frequency of
* ``common``: both groups prefer the same cluster at ``W^0``
  (:func:`~fedroute.simulation.metrics.common_preferred_cluster`);
* ``basin``: ``W^0`` lies in the certified starvation basin
  (:func:`~fedroute.simulation.metrics.certified_starvation_basin`);
* ``persistent``: only one cluster is ever updated in the ``T`` rounds
  (:func:`~fedroute.simulation.metrics.persistent_collapse`);
* ``nonrecovery``: ``R_T ≥ Δ/4`` (:func:`~fedroute.simulation.metrics.recovery_error`);
* ``persistent_given_basin``: ``P(persistent | basin)``, NaN when no sample is in
  the basin.  Theorem 2 says it is 1; the experiment checks that it is exactly 1.

Outputs (``fedroute reproduce fig1 --out OUT``), in ``OUT/fig1/``:
``summary.csv``/``summary.parquet`` (columns :data:`SUMMARY_COLUMNS`, one row per ρ),
``runs.csv``/``runs.parquet`` — **per-cell** table: one row per ρ cell (not per
initial pair; a cell holds ``pairs`` initialisations) with the summary columns and
the underlying counts and ``R_T`` statistics (:data:`RUNS_COLUMNS`),
``figures/fig1.png``/``figures/fig1.pdf`` (the four frequencies against ρ),
``claims.json`` (list of ``{claim, paper, measured, holds}``) and ``config.json``.

The experiment is one vectorised NumPy process: ``--workers`` and
``--ray-address`` are accepted by the CLI but ignored, so the results cannot
depend on them.  ``--quick`` runs :meth:`Fig1Config.quick` (2,000 pairs, 50 rounds,
4 values of ρ).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray

from fedroute.client.randomness import Purpose, generator
from fedroute.simulation.cli import REPRODUCE_COMMANDS
from fedroute.simulation.metrics import (
    certified_starvation_basin,
    common_preferred_cluster,
    persistent_collapse,
    recovery_error,
)
from fedroute.tasks.linear import LinearTask

__all__ = [
    "Fig1Config",
    "SUMMARY_COLUMNS",
    "RUNS_COLUMNS",
    "FREQUENCIES",
    "greedy_population_dynamics",
    "cell_outcomes",
    "run_fig1",
    "fig1_claims",
    "write_fig1",
    "run_fig1_command",
]

SUMMARY_COLUMNS = ("rho", "n_inits", "common", "basin", "persistent", "nonrecovery", "persistent_given_basin")
"""Columns of ``summary.csv`` / ``summary.parquet``, in order."""

FREQUENCIES = ("common", "basin", "persistent", "nonrecovery")
"""The four frequencies of paper Figure 1."""

RUNS_COLUMNS = SUMMARY_COLUMNS + (
    "rho_index", "seed", "rounds",
    "n_common", "n_basin", "n_persistent", "n_nonrecovery", "n_basin_persistent",
    "n_common_escaped", "n_persistent_outside_basin", "n_nonrecovery_not_persistent",
    "mean_recovery_error", "median_recovery_error",
)
"""Columns of the per-cell table ``runs.csv`` / ``runs.parquet`` (one row per ρ):
the summary columns, then the cell's coordinates and counts —
``n_common_escaped`` = common preference but not persistently collapsed,
``n_persistent_outside_basin`` = persistent but not certified,
``n_nonrecovery_not_persistent`` = ``R_T ≥ Δ/4`` although both clusters were updated."""

QUICK_RHOS = (0.25, 2.0, 16.0, 128.0)


@dataclass(frozen=True)
class Fig1Config:
    """Settings of E1 (paper-fixed: pairs, rounds, init law; ours: the rest).

    Parameters
    ----------
    dimension : int
        ``d`` (≥ 2).
    group_distance : float
        ``Δ = ‖θ_1 − θ_0‖`` (> 0); non-recovery is ``R_T ≥ Δ/4``.
    alpha : float
        Proportion of group 0, in ``(0, 1)``.
    eta : float
        Server step ``η`` in ``(0, 1]`` (Theorem 2 needs ``0 < η ≤ 1``).
    rounds : int
        ``T`` (≥ 1); the paper uses 200.
    pairs : int
        Initialisation pairs per ρ (≥ 1); the paper uses 20,000.
    seed : int
        Seed of the initialisation draws (≥ 0).
    rhos : tuple of float
        The ρ grid (each ≥ 0).  ``0.25·2^i, i = 0..9``: measured common preference
        runs from 0.10 (ρ = 0.25) to 0.99 (ρ = 128) at ``d = 5, Δ = 4``.
    name, version : str
        Identify the config in ``config.json``.
    """

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

    def __post_init__(self) -> None:
        for key in ("dimension", "rounds", "pairs", "seed"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"fig1 setting '{key}' = {value!r} is invalid; allowed: an integer")
        try:
            rhos = tuple(float(rho) for rho in self.rhos)
        except (TypeError, ValueError):
            raise ValueError(f"fig1 setting 'rhos' = {self.rhos!r} is invalid; allowed: a sequence of numbers")
        object.__setattr__(self, "rhos", rhos)
        checks = [
            (self.dimension >= 2, "dimension", self.dimension, "an integer ≥ 2"),
            (math.isfinite(self.group_distance) and self.group_distance > 0, "group_distance",
             self.group_distance, "> 0"),
            (0.0 < self.alpha < 1.0, "alpha", self.alpha, "(0, 1)"),
            (0.0 < self.eta <= 1.0, "eta", self.eta, "(0, 1]"),
            (self.rounds >= 1, "rounds", self.rounds, "an integer ≥ 1"),
            (self.pairs >= 1, "pairs", self.pairs, "an integer ≥ 1"),
            (self.seed >= 0, "seed", self.seed, "an integer ≥ 0"),
            (len(rhos) >= 1 and all(math.isfinite(r) and r >= 0 for r in rhos), "rhos", self.rhos,
             "a non-empty sequence of finite numbers ≥ 0"),
        ]
        for holds, key, value, allowed in checks:
            if not holds:
                raise ValueError(f"fig1 setting '{key}' = {value!r} is invalid; allowed: {allowed}")

    @classmethod
    def quick(cls, **overrides: Any) -> "Fig1Config":
        """The ``--quick`` version: 2,000 pairs, 50 rounds, 4 values of ρ."""
        settings: dict[str, Any] = dict(pairs=2_000, rounds=50, rhos=QUICK_RHOS, name="E1-fig1-quick")
        settings.update(overrides)
        return cls(**settings)

    @property
    def theta(self) -> NDArray[np.float64]:
        """``θ_g`` as a (2, d) array (the linear task's convention)."""
        return LinearTask(dimension=self.dimension, group_distance=self.group_distance).group_parameters

    @property
    def proportions(self) -> NDArray[np.float64]:
        """``(α, 1 − α)``."""
        return np.array([self.alpha, 1.0 - self.alpha])

    @property
    def nonrecovery_threshold(self) -> float:
        """``Δ/4``."""
        return self.group_distance / 4.0

    def initial_models(self, rho_index: int) -> NDArray[np.float64]:
        """``W^0`` of cell ``rho_index``, shape (pairs, 2, d): ``θ̄ + ρ z``."""
        rng = generator(self.seed, 0, rho_index, Purpose.INIT)
        z = rng.standard_normal((self.pairs, 2, self.dimension))
        return self.theta.mean(axis=0) + self.rhos[rho_index] * z

    def to_json(self) -> dict[str, Any]:
        """The settings plus derived quantities, for ``config.json``."""
        theta = self.theta
        return {
            **asdict(self),
            "rhos": list(self.rhos),
            "derived": {
                "theta": theta.tolist(),
                "theta_bar": theta.mean(axis=0).tolist(),
                "theta_bar_alpha": (self.proportions @ theta).tolist(),
                "nonrecovery_threshold": self.nonrecovery_threshold,
                "initialisation": "w^0 = theta_bar + rho * z, z = generator(seed, 0, rho_index, "
                                  "Purpose.INIT).standard_normal((pairs, 2, d))",
                "runs_table": "per-cell: one row per rho (each cell holds `pairs` initialisations)",
            },
        }


# --------------------------------------------------------------------------- #
# Dynamics
# --------------------------------------------------------------------------- #
def _proportions(alpha: ArrayLike, num_groups: int) -> NDArray[np.float64]:
    weights = np.atleast_1d(np.asarray(alpha, dtype=float))
    if weights.shape == (1,):
        if num_groups != 2:
            raise ValueError(f"a scalar alpha needs two groups, got G={num_groups}")
        weights = np.array([weights[0], 1.0 - weights[0]])
    if weights.shape != (num_groups,):
        raise ValueError(f"alpha must be a scalar (two groups) or have shape ({num_groups},), got {weights.shape}")
    if (not np.all(np.isfinite(weights)) or np.any(weights < 0)
            or np.any((weights > 0) & (weights < np.finfo(float).tiny))):
        raise ValueError(f"group proportions must be finite, ≥ 0 and not subnormal, got {weights.tolist()}")
    return weights


def greedy_population_dynamics(
    initial_models: ArrayLike, theta: ArrayLike, alpha: ArrayLike, eta: float, rounds: int
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Population-level Greedy CFL with ``L_g(w) = ½‖w − θ_g‖²``, for many starts at once.

    Each round, every group ``g`` routes to ``argmin_k ½‖w_k − θ_g‖²`` (ties to the
    lowest index) and every cluster with routed mass ``Σ_{g→k} α_g > 0`` moves to
    ``w_k − η Σ_{g→k} α_g (w_k − θ_g) / Σ_{g→k} α_g``, i.e. (computed as)
    ``(1 − η) w_k + η θ̄_k`` with ``θ̄_k`` the α-weighted mean of its groups' ``θ_g``;
    other clusters are unchanged.  All starts are advanced together; the only
    Python loops are over rounds and over the (few) clusters.

    Parameters
    ----------
    initial_models : array_like, shape (N, K, d)
        ``N`` independent starts ``W^0`` of ``K`` cluster models (``K = 2`` in E1).
    theta : array_like, shape (G, d)
        Group parameters.
    alpha : float or array_like of shape (G,)
        Group proportions; a scalar means ``(α, 1 − α)`` (two groups).  A group
        with proportion 0 routes but carries no mass.
    eta : float
        Step ``η`` in ``(0, 1]``.
    rounds : int
        Number of rounds ``T`` (≥ 0).

    Returns
    -------
    final_models : numpy.ndarray, shape (N, K, d)
        ``W^T``.
    ever_updated : numpy.ndarray of bool, shape (N, K)
        Whether cluster ``k`` received routed mass in any of the ``T`` rounds.
    """
    models = np.asarray(initial_models, dtype=float)
    theta = np.asarray(theta, dtype=float)
    if models.ndim != 3 or models.shape[1] < 1:
        raise ValueError(f"initial_models must have shape (N, K, d), got {models.shape}")
    if theta.ndim != 2 or theta.shape[0] < 1 or theta.shape[1] != models.shape[2]:
        raise ValueError(f"theta must have shape (G, {models.shape[2]}), got {theta.shape}")
    if not (np.all(np.isfinite(models)) and np.all(np.isfinite(theta))):
        raise ValueError("initial_models and theta must be finite")
    if not 0.0 < float(eta) <= 1.0:
        raise ValueError(f"eta must lie in (0, 1], got {eta!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 0:
        raise ValueError(f"rounds must be an integer ≥ 0, got {rounds!r}")
    num_starts, num_clusters, dim = models.shape
    num_groups = theta.shape[0]
    weights = _proportions(alpha, num_groups)
    eta = float(eta)

    # Layout (K, d, N): every elementwise operation runs over the N starts,
    # contiguously, into preallocated buffers (no per-round allocation).
    w = np.ascontiguousarray(np.moveaxis(models, 0, -1))
    ever = np.zeros((num_clusters, num_starts), dtype=bool)
    theta_column = theta[None, :, :, None]                   # (1, G, d, 1)
    theta_t = np.ascontiguousarray(theta.T)                  # (d, G)
    weight_column = weights[None, :, None]                   # (1, G, 1)
    cluster_column = np.arange(num_clusters)[:, None, None]  # (K, 1, 1)
    diff = np.empty((num_clusters, num_groups, dim, num_starts))
    loss = np.empty((num_clusters, num_groups, num_starts))
    best = np.empty((num_groups, num_starts))
    route = np.empty((num_groups, num_starts), dtype=np.intp)
    better = np.empty((num_groups, num_starts), dtype=bool)
    candidate = np.empty((num_groups, num_starts), dtype=np.intp)
    share = np.empty((num_clusters, num_groups, num_starts))
    mass = np.empty((num_clusters, num_starts))
    step = np.empty((num_clusters, num_starts))
    routed = np.empty((num_clusters, num_starts), dtype=bool)
    keep = np.empty((num_clusters, num_starts))
    pull = np.empty((num_clusters, dim, num_starts))
    tiny = np.finfo(float).tiny
    for _ in range(rounds):
        # Routing: loss[k, g] = ‖w_k − θ_g‖² (= 2 L_g(w_k)); argmin over k with ties
        # to the lowest k.  A strict improvement at cluster k sets the route to k,
        # which exceeds every earlier index, hence the running maximum.
        np.subtract(w[:, None], theta_column, out=diff)
        np.multiply(diff, diff, out=diff)
        np.sum(diff, axis=2, out=loss)
        best[...] = loss[0]
        route.fill(0)
        for k in range(1, num_clusters):
            np.less(loss[k], best, out=better)
            np.minimum(best, loss[k], out=best)
            np.multiply(better, k, out=candidate)
            np.maximum(route, candidate, out=route)
        # Update every cluster from this round's routing (W^t -> W^{t+1}):
        # w_k <- (1 - η) w_k + η Σ_{g→k} α_g θ_g / Σ_{g→k} α_g if routed, else w_k.
        np.equal(route[None], cluster_column, out=share, casting="unsafe")
        share *= weight_column                               # α_g 1{g → k}
        np.sum(share, axis=1, out=mass)                      # Σ_{g→k} α_g
        np.greater(mass, 0.0, out=routed)
        ever |= routed
        np.maximum(mass, tiny, out=step)                     # (unrouted: share = 0 anyway)
        np.divide(eta, step, out=step)
        share *= step[:, None, :]                            # η α_g 1{g → k} / Σ α
        np.matmul(theta_t, share, out=pull)                  # η θ̄_k (0 if unrouted)
        np.multiply(routed, -eta, out=keep)
        keep += 1.0                                          # 1 − η if routed, else 1
        w *= keep[:, None, :]
        w += pull
    return np.ascontiguousarray(np.moveaxis(w, -1, 0)), np.ascontiguousarray(ever.T)


def cell_outcomes(config: Fig1Config, rho_index: int) -> dict[str, NDArray]:
    """Per-pair outcomes of one ρ cell.

    Returns
    -------
    dict of numpy.ndarray, each of shape (pairs,)
        ``common``, ``basin``, ``persistent``, ``nonrecovery`` (bool) and
        ``recovery_error`` (``R_T``).
    """
    theta = config.theta
    initial = config.initial_models(rho_index)
    common = np.asarray(common_preferred_cluster(initial, theta)) >= 0
    basin = np.asarray(certified_starvation_basin(initial, theta, config.alpha), dtype=bool)
    final, ever_updated = greedy_population_dynamics(initial, theta, config.alpha, config.eta, config.rounds)
    # ``persistent_collapse`` takes route counts (..., T, K); "ever updated" is
    # their sum over the T rounds (one pseudo-round), which it treats the same way.
    persistent = np.asarray(persistent_collapse(ever_updated[:, None, :].astype(float)), dtype=bool)
    error = np.asarray(recovery_error(final, theta), dtype=float)
    return {
        "common": common,
        "basin": basin,
        "persistent": persistent,
        "nonrecovery": error >= config.nonrecovery_threshold,
        "recovery_error": error,
    }


def _cell_row(config: Fig1Config, rho_index: int) -> dict[str, Any]:
    out = cell_outcomes(config, rho_index)
    common, basin, persistent, nonrecovery = (out[key] for key in FREQUENCIES)
    n = config.pairs
    n_basin = int(basin.sum())
    n_basin_persistent = int((basin & persistent).sum())
    return {
        "rho": config.rhos[rho_index],
        "n_inits": n,
        "common": common.sum() / n,
        "basin": n_basin / n,
        "persistent": persistent.sum() / n,
        "nonrecovery": nonrecovery.sum() / n,
        "persistent_given_basin": n_basin_persistent / n_basin if n_basin else float("nan"),
        "rho_index": rho_index,
        "seed": config.seed,
        "rounds": config.rounds,
        "n_common": int(common.sum()),
        "n_basin": n_basin,
        "n_persistent": int(persistent.sum()),
        "n_nonrecovery": int(nonrecovery.sum()),
        "n_basin_persistent": n_basin_persistent,
        "n_common_escaped": int((common & ~persistent).sum()),
        "n_persistent_outside_basin": int((persistent & ~basin).sum()),
        "n_nonrecovery_not_persistent": int((nonrecovery & ~persistent).sum()),
        "mean_recovery_error": float(out["recovery_error"].mean()),
        "median_recovery_error": float(np.median(out["recovery_error"])),
    }


def run_fig1(config: Fig1Config = Fig1Config(), progress: bool = False) -> pd.DataFrame:
    """Run E1: one row per ρ cell.

    Parameters
    ----------
    config : Fig1Config
    progress : bool
        Show a tqdm bar over the ρ cells on stderr (hidden when stderr is not a TTY).

    Returns
    -------
    pandas.DataFrame
        The per-cell table (:data:`RUNS_COLUMNS`); its first columns,
        ``df[list(SUMMARY_COLUMNS)]``, are the summary.  A pure function of ``config``.
    """
    cells = range(len(config.rhos))
    if progress:
        from tqdm import tqdm

        cells = tqdm(cells, desc="fig1 rho cells", unit="cell", file=sys.stderr, disable=None)
    rows = [_cell_row(config, rho_index) for rho_index in cells]
    frame = pd.DataFrame(rows, columns=list(RUNS_COLUMNS))
    int_columns = [c for c in RUNS_COLUMNS if c.startswith("n_") or c in ("rho_index", "seed", "rounds")]
    return frame.astype({c: "int64" for c in int_columns})


# --------------------------------------------------------------------------- #
# Claims, figure, files
# --------------------------------------------------------------------------- #
MONOTONE_TOLERANCE = 0.02
LARGEST_RHO_LEVEL = 0.80
TRACKING_TOLERANCE = 0.1


def _json_number(x: float) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else round(float(x), 6)


def fig1_claims(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """The E1 claims, each ``{claim, paper, measured, holds}``, from the summary (sorted by ρ)."""
    table = summary.sort_values("rho").reset_index(drop=True)
    claims: list[dict[str, Any]] = []

    largest = table.iloc[-1]
    drops = {f: float(max(0.0, -np.diff(table[f].to_numpy()).min(initial=0.0))) for f in FREQUENCIES}
    claims.append({
        "claim": f"common, basin, persistent and nonrecovery are non-decreasing in rho (up to "
                 f"{MONOTONE_TOLERANCE}) and each exceeds {LARGEST_RHO_LEVEL:.2f} at the largest rho",
        "paper": "All four frequencies increase with rho and exceed 80 percent at the largest tested spread.",
        "measured": {
            "largest_rho": float(largest["rho"]),
            "at_largest_rho": {f: _json_number(largest[f]) for f in FREQUENCIES},
            "largest_drop_between_consecutive_rhos": {f: _json_number(drops[f]) for f in FREQUENCIES},
        },
        "holds": bool(all(drops[f] <= MONOTONE_TOLERANCE for f in FREQUENCIES)
                      and all(largest[f] > LARGEST_RHO_LEVEL for f in FREQUENCIES)),
    })

    gap = (table["common"] - table["basin"]).to_numpy()
    claims.append({
        "claim": "common preference >= certified basin at every rho",
        "paper": "Common preference is more frequent than the other events at smaller rho, showing that a "
                 "shared first choice alone does not certify failure.",
        "measured": {"min_common_minus_basin": _json_number(gap.min()),
                     "common_minus_basin": [_json_number(x) for x in gap]},
        "holds": bool(np.all(gap >= 0)),
    })

    given = table["persistent_given_basin"].to_numpy(dtype=float)
    observed = np.isfinite(given)
    n_basin = (table["basin"] * table["n_inits"]).round().astype(int)
    n_escaped = int(round(float(((1.0 - np.where(observed, given, 1.0)) * n_basin).sum())))
    claims.append({
        "claim": "persistence given the basin is exactly 1 at every rho (Theorem 2)",
        "paper": "Every sampled initialization in B_starve remains persistently collapsed.",
        "measured": {
            "persistent_given_basin": [_json_number(x) for x in given],
            "basin_samples": int(n_basin.sum()),
            "basin_samples_not_persistent": n_escaped,
            "rhos_without_basin_samples": [float(r) for r in table["rho"][~observed]],
        },
        "holds": bool(observed.any() and np.all(given[observed] == 1.0)),
    })

    persistent_gap = float(np.abs(table["persistent"] - table["basin"]).max())
    nonrecovery_gap = float(np.abs(table["nonrecovery"] - table["basin"]).max())
    claims.append({
        "claim": f"persistent collapse and terminal non-recovery track the basin frequency "
                 f"(max |difference| over rho <= {TRACKING_TOLERANCE})",
        "paper": "Persistent collapse and terminal nonrecovery closely follow the certified basin frequency.",
        "measured": {"max_abs_persistent_minus_basin": _json_number(persistent_gap),
                     "max_abs_nonrecovery_minus_basin": _json_number(nonrecovery_gap)},
        "holds": bool(max(persistent_gap, nonrecovery_gap) <= TRACKING_TOLERANCE),
    })
    return claims


def _plot(summary: pd.DataFrame, config: Fig1Config, figures: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = summary.sort_values("rho")
    labels = {
        "common": "initial common preference",
        "basin": r"certified starvation basin $\mathcal{B}_{\mathrm{starve}}$",
        "persistent": "persistent greedy collapse",
        "nonrecovery": rf"terminal non-recovery $R_{{{config.rounds}}} \geq \Delta/4$",
    }
    styles = {"common": ("o", "-"), "basin": ("s", "--"), "persistent": ("^", "-."), "nonrecovery": ("v", ":")}
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for key in FREQUENCIES:
        marker, line = styles[key]
        ax.plot(table["rho"], table[key], marker=marker, linestyle=line, label=labels[key])
    ax.axhline(LARGEST_RHO_LEVEL, color="0.6", linewidth=0.8, linestyle=(0, (1, 3)))
    if (table["rho"] > 0).all() and len(table) > 1:
        ax.set_xscale("log", base=2)
        ax.set_xticks(table["rho"], [f"{rho:g}" for rho in table["rho"]])
        ax.minorticks_off()
    ax.set_xlabel(r"initial spread $\rho$")
    ax.set_ylabel("frequency")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"Greedy population dynamics: {config.pairs:,} pairs per $\\rho$, T = {config.rounds}\n"
                 f"d = {config.dimension}, Δ = {config.group_distance:g}, α = {config.alpha:g}, "
                 f"η = {config.eta:g}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(figures / "fig1.png", dpi=150)
    fig.savefig(figures / "fig1.pdf", metadata={"CreationDate": None})
    plt.close(fig)


def write_fig1(summary: pd.DataFrame, config: Fig1Config, out_dir: str | Path) -> list[dict[str, Any]]:
    """Write the E1 outputs into ``out_dir`` (e.g. ``OUT/fig1``).

    Parameters
    ----------
    summary : pandas.DataFrame
        The frame returned by :func:`run_fig1`: its :data:`SUMMARY_COLUMNS` go
        to ``summary.*``, all of its columns to the per-cell ``runs.*``.
    config : Fig1Config
        Written to ``config.json`` and used for the figure's caption.
    out_dir : path
        Created if needed.

    Returns
    -------
    list of dict
        The claims written to ``claims.json``.
    """
    out = Path(out_dir)
    figures = out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    missing = [c for c in SUMMARY_COLUMNS if c not in summary.columns]
    if missing:
        raise ValueError(f"summary lacks the columns {missing}")
    table = summary[list(SUMMARY_COLUMNS)].reset_index(drop=True)
    table.to_csv(out / "summary.csv", index=False)
    table.to_parquet(out / "summary.parquet", index=False)
    runs = summary.reset_index(drop=True)
    runs.to_csv(out / "runs.csv", index=False)
    runs.to_parquet(out / "runs.parquet", index=False)
    claims = fig1_claims(table)
    (out / "claims.json").write_text(json.dumps(claims, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(config.to_json(), indent=2) + "\n")
    _plot(table, config, figures)
    return claims


def run_fig1_command(args: argparse.Namespace) -> int:
    """``fedroute reproduce fig1 [--quick] [--out OUT]``; ``--workers``/``--ray-address`` are ignored."""
    config = Fig1Config.quick() if getattr(args, "quick", False) else Fig1Config()
    if getattr(args, "workers", 1) not in (None, 1) or getattr(args, "ray_address", None):
        print("fig1 is one vectorised process: --workers and --ray-address are ignored", file=sys.stderr)
    out_dir = Path(args.out) / "fig1"
    start = time.perf_counter()
    summary = run_fig1(config, progress=True)
    claims = write_fig1(summary, config, out_dir)
    elapsed = time.perf_counter() - start
    with pd.option_context("display.width", 120, "display.max_columns", 20):
        print(summary[list(SUMMARY_COLUMNS)].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    for claim in claims:
        print(f"[{'holds' if claim['holds'] else 'FAILS'}] {claim['claim']}")
    print(f"fig1: wrote {out_dir} in {elapsed:.2f} s")
    return 0  # a claim that does not hold is a result (claims.json), not a failure of the command


REPRODUCE_COMMANDS["fig1"] = run_fig1_command
