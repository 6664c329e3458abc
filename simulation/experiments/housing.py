"""E6 — Figure B.4: California Housing, two occupancy regimes, radius sweep (paper Appendix B.5).

The task is :class:`~fedroute.tasks.housing.HousingTask` with its own defaults (paper-fixed: 8 standardised
features plus intercept, group 1 iff ``AveOccup ≥`` the training 0.75-quantile, least-squares oracles,
start ``ū(R)``; ours, chosen by the task: 20 pure clients, 20 % held out, one local step of 0.05, jitter
``0.05 Δ_β``).  ``K = 2``; Greedy IFCA, EXP3 over ``{gr, com, rev}`` (blocks of 10) and FedCAM
(:mod:`.radius`); the paper's quantity is ``pr_all_usable`` = Pr(K_T^eval = 2).  ``T = 1000`` and
``R ≤ 2``: a model trained alone on group 0 (ill-conditioned along ``AveOccup``) converges slowly;
the under-training check re-measures this for every seed at the largest R (``config.json``, a claim).

Round zero (``entrance``, as E5's): the experiment studies recovery *from* a collapsed entrance (every client's
controller-free greedy choice at ``W^0`` the same model, ``K^0 = 1``).  The task's start as it falls (``"any"``,
the first version of E6; ``--config any-entrance``) is one in only 8 of the 40 starts, the jitter deciding the
round-zero routes, so by default every start is conditioned on it (``"collapsed"``: the first of the task's init
draws whose greedy choices leave a model unused, :meth:`~fedroute.tasks.housing.HousingTask.initial_draw`);
``config.json`` reports the draws (``init_draws``) and what the entrance means (``notes``).

Data: ``data_file`` (``--data-file``), else ``$FEDROUTE_HOUSING_FILE``, else the real loader (offline: the copy
shipped in the package, ``tasks/data/california_housing.csv.gz``, with a logged warning).  The table is passed
to every task as an absolute path (Ray workers do not depend on the working directory or the environment, and
retry no download); ``config.json`` records the source, the file, its row count and sha256.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from fedroute.core.methods import EXP3, FEDCAM, GREEDY
from fedroute.simulation.experiments.gmm import summarise_init_draws
from fedroute.simulation.experiments.kit import (
    Experiment, InputError, Results, Sweep, Variant, by_value, claim, not_run, number, register)
from fedroute.simulation.experiments.radius import (
    METHOD_NAMES, RadiusSweepConfig, alone_convergence, radius_panels, radius_table, run_radius)
from fedroute.tasks.housing import DATA_FILE_ENV, HousingTask, load_california_housing_from

__all__ = ["HousingExperimentConfig", "make_housing_task", "housing_claims", "EXPERIMENT"]

KEEP_LEVEL = 0.8
"""EXP3 "keeps two usable models": Pr(K_T^eval = 2) at least this at every R."""
EMBEDDED_SOURCE = "embedded copy"
"""``config.json`` source of the table shipped in the package."""
ENTRANCE_TEXT = {
    "collapsed": "collapsed entrance in every run: the first init draw j = 0, 1, ... (jitter z_k from "
                 "generator(seed, 0, j, INIT); draw 0 = the 'any' start) whose controller-free greedy choices on "
                 "the clients' training losses at W^0 leave a model unused (K^0 = 1); draws per cell in init_draws",
    "any": "the task's start as it falls (init draw 0; the first version of E6): K^0 = 2 in most starts",
}


@dataclass(frozen=True)
class HousingExperimentConfig(RadiusSweepConfig):
    """Settings of E6 (paper-fixed: the task's data processing and init law, K = 2, EXP3 over {gr, com, rev};
    ours: the rest).  ``task``: overrides of :class:`HousingTask`'s defaults; ``data_file`` and ``entrance``
    (``"collapsed"`` or ``"any"``): module docstring."""

    LABEL = "housing"
    PRESET = "housing"
    NUM_GROUPS = 2
    QUICK = dict(seeds_per_radius=2, rounds=100, chunk_size=2, name="E6-housing-quick")

    radii: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0)
    seeds_per_radius: int = 10
    rounds: int = 1000
    num_clusters: int = 2
    chunk_size: int = 10
    data_file: Optional[str] = None
    entrance: str = HousingTask.entrance
    name: str = "E6-housing"
    version: str = "2"

    def task_factory(self) -> Callable[[dict[str, Any]], HousingTask]:
        return partial(make_housing_task, data_file=self.data_file, entrance=self.entrance, **self.task)

    def derived(self) -> dict[str, Any]:
        return {**super().derived(), "entrance": ENTRANCE_TEXT[self.entrance]}


def make_housing_task(cell: dict[str, Any], **task_settings: Any) -> HousingTask:
    """The task of a cell: radius ``cell["radius"]``, seed ``cell["seed"]``."""
    return HousingTask(init_radius=float(cell["radius"]), seed=int(cell["seed"]), **task_settings)


def resolve_data(data_file: Optional[str]) -> tuple[Optional[str], dict[str, Any]]:
    """The table's absolute path (None: the download) and its description; loads it once, so that a missing file
    fails early (:class:`InputError`, with the loader's message).  Offline without a file, the copy shipped in the
    package is read (logged), and the tasks read that file instead of retrying the download."""
    given = data_file or os.environ.get(DATA_FILE_ENV) or None
    source = "--data-file" if data_file else (f"${DATA_FILE_ENV}" if given else "fetch_california_housing")
    try:
        frame, path = load_california_housing_from(str(Path(given).expanduser().resolve()) if given else None)
    except (RuntimeError, FileNotFoundError, ValueError) as error:
        raise InputError(str(error)) from error
    if given is None and path is not None:
        source = f"{EMBEDDED_SOURCE} (fetch_california_housing unreachable)"
    facts: dict[str, Any] = {"source": source, "data_file": None if path is None else str(path), "rows": len(frame)}
    if path is not None:
        facts["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return facts["data_file"], facts


def _convergence_check(config: HousingExperimentConfig) -> dict[str, Any]:
    """From ``ū(R_max)`` one model per group trained alone for ``T`` rounds, every seed; excess training loss
    against the cross-group gap."""
    radius = max(config.radii)
    checks = [alone_convergence(config.task_factory()({"radius": radius, "seed": config.first_seed + j}), radius,
                                config.rounds) for j in range(config.seeds_per_radius)]
    excess, gaps = np.asarray([c["excess"] for c in checks]), np.asarray([c["gap"] for c in checks])
    return {
        "start": f"u_bar(R = {radius:g})", "rounds": config.rounds,
        "excess_by_seed_and_group": [[number(v) for v in row] for row in excess],
        "gap_by_seed_and_group": [[number(v) for v in row] for row in gaps],
        "max_excess_by_group": [number(v) for v in excess.max(axis=0)],
        "median_excess_by_group": [number(v) for v in np.median(excess, axis=0)],
        "max_excess_over_gap": number((excess / gaps).max()),
    }


def _init_draws(config: HousingExperimentConfig) -> dict[str, Any]:
    """The init draws each cell's start took (:meth:`HousingTask.initial_draw`), per R and overall."""
    draws: dict[str, list[int]] = {f"{r:g}": [] for r in config.radii}
    for cell in config.cells():
        draws[f"{cell['radius']:g}"].append(config.task_factory()(cell).initial_draw(config.num_clusters)[1])
    return summarise_init_draws(config.entrance, draws)


def _run(config: HousingExperimentConfig, sweep: Sweep) -> Results:
    data_file, data = resolve_data(config.data_file)
    config = replace(config, data_file=data_file)
    results = run_radius(config, sweep)
    results.facts.update(data=data, convergence_check=_convergence_check(config), init_draws=_init_draws(config))
    results.facts["notes"] = _notes(results, config)
    return results


def _notes(results: Results, config: HousingExperimentConfig) -> str:
    greedy = results.runs[results.runs["method"] == GREEDY]
    starts, single = len(greedy), int((greedy["round0_clusters_used"] == 1).sum())
    collapsed = int(greedy["collapsed"].sum())
    from_both = int((greedy["collapsed"] & (greedy["round0_clusters_used"] == config.num_clusters)).sum())
    if config.entrance == "collapsed":
        draws = results.init_draws
        return (
            f"Round-zero entrance (collapsed by construction): every start is the first init draw whose "
            f"controller-free greedy choices at round 0 (training losses at W^0) put every client on the same "
            f"model (K^0 = 1); it took {draws['total']} draws for {starts} starts (mean {draws['mean']}, at most "
            f"{draws['max']} per cell; per R in config.json init_draws). {single} of {starts} starts are fully "
            f"collapsed. Greedy ends with K_eval < 2 in {collapsed} of {starts} runs (it escapes a collapsed start "
            f"only if training the shared model makes the unused one some client's best).")
    return (
        f"Round-zero entrance (the task's start as it falls, entrance = 'any'): {single} of {starts} starts are "
        f"fully collapsed at round 0 (every client's controller-free greedy choice on training losses at W^0 is "
        f"the same model, K^0 = 1); in the others both models receive clients, because the jitter "
        f"(0.05 Delta_beta) around u_bar(R) decides the round-zero routes. Greedy ends with K_eval < 2 in "
        f"{collapsed} of {starts} runs, {from_both} of them from starts that used both models at round 0: "
        f"collapse that develops during training (one model wins both regimes) rather than being inherited "
        f"from the entrance. entrance = 'collapsed' (the default) conditions every start on K^0 = 1.")


def _sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test of ``wins`` vs ``losses`` discordant pairs (1.0 if there are none)."""
    total = wins + losses
    if total == 0:
        return 1.0
    return min(1.0, 2.0 * (sum(math.comb(total, k) for k in range(min(wins, losses) + 1)) / 2.0 ** total))


Claim = dict[str, Any]


def _keeps_two_models(results: Results, config: HousingExperimentConfig) -> Claim:
    """EXP3 keeps both models usable in most runs at every R."""
    runs, summary, cells, K = results.runs, results.summary, results.collapse_cells, config.num_clusters
    exp3, n_cells, ran = summary[summary["method"] == EXP3], len(cells), EXP3 in set(runs["method"])
    return claim(
        f"EXP3 keeps two usable models across the sweep: Pr(K_T^eval = {K}) >= {KEEP_LEVEL} at every R of "
        f"{list(config.radii)}", "EXP3 retains two usable models throughout the tested radius sweep.", {
            "pr_all_usable_by_R": by_value(summary, EXP3, "radius", "pr_all_usable"),
            "equals_one_at_every_R": bool(len(exp3) and (exp3["pr_all_usable"] == 1).all()),
            "greedy_collapse_cells": n_cells,
            "distinct_seeds_among_them": sorted(int(x) for x in cells["seed"].unique()),
            "exp3_two_usable_on_greedy_collapse_cells": int((cells[f"{EXP3}_usable_models"] == K).sum())
            if n_cells and ran else None,
            "exp3_minus_greedy_routed_test_loss_on_greedy_collapse_cells": number(
                cells["exp3_minus_greedy_routed_test_loss"].mean()) if n_cells and ran else None,
            "notes": _notes(results, config),
        }, (len(exp3) and (exp3["pr_all_usable"] >= KEEP_LEVEL).all()) if ran else None)


def _collapses_more(results: Results, config: HousingExperimentConfig, method: str) -> Claim:
    """``method`` has both models usable less often at the largest R than at the smallest."""
    runs, summary, K = results.runs, results.summary, config.num_clusters
    smallest, largest = min(config.radii), max(config.radii)
    paper = "Greedy IFCA and FedCAM increasingly collapse as the initialization radius R grows."
    text = (f"{METHOD_NAMES[method]} collapses more as R grows: Pr(K_T^eval = {K}) at the largest R "
            f"({largest:g}) < at the smallest R ({smallest:g})")
    if method not in set(runs["method"]):
        return not_run(text, paper, method)
    rates = summary[summary["method"] == method].set_index("radius")["pr_all_usable"].sort_index()
    mine = runs[runs["method"] == method].pivot(index="seed", columns="radius", values="usable_models")
    worse = int(((mine[smallest] == K) & (mine[largest] < K)).sum())
    better = int(((mine[smallest] < K) & (mine[largest] == K)).sum())
    return claim(text, paper, {
        "pr_all_usable_by_R": by_value(summary, method, "radius", "pr_all_usable"),
        "non_increasing_in_R": bool(np.all(np.diff(rates.to_numpy()) <= 0)),
        "paired_seeds": {"two_usable_at_smallest_collapsed_at_largest": worse,
                         "collapsed_at_smallest_two_usable_at_largest": better,
                         "sign_test_p_two_sided": number(_sign_test(worse, better))},
        "runs_per_R": config.seeds_per_radius,
    }, rates[largest] < rates[smallest])


def _collapsed_entrances(results: Results, config: HousingExperimentConfig) -> Claim:
    """Every start has all clients on the same model at ``W^0``."""
    greedy = results.runs[results.runs["method"] == GREEDY]
    entrance = greedy["round0_clusters_used"] == 1
    return claim(
        "Every start is a collapsed entrance: at W^0 all clients' controller-free greedy choices (training losses) "
        "are the same model (K^0 = 1)",
        "The collapse-and-recovery experiments start from a collapsed entrance (Section 4: a collapsed entrance "
        "sends several groups to the same cluster and leaves another unused).",
        {"starts": int(len(greedy)), "fully_collapsed_starts": int(entrance.sum()), "share": number(entrance.mean()),
         "by_R": results.round_zero,
         "init_draws": {key: results.init_draws[key] for key in ("entrance", "summary_by_R", "total", "max")},
         "notes": _notes(results, config)}, entrance.all())


def _small_under_training(results: Results, config: HousingExperimentConfig) -> Claim:
    """One model trained alone from ``ū(R_max)`` ends closer to its oracle than the cross-group gap."""
    check = results.convergence_check
    return claim(
        f"T = {config.rounds} keeps under-training small: from u_bar(R = {max(config.radii):g}) one model trained "
        f"alone on its own group for T rounds ends with excess training loss below the cross-group gap "
        f"L_g(beta*_h) - L_g(beta*_g), for every seed and group",
        "EXPERIMENTS E6 / task docstring: T >= 1000 and R <= 2 keep under-training small against the group gap.",
        {k: check[k] for k in ("max_excess_by_group", "median_excess_by_group", "max_excess_over_gap", "rounds")},
        check["max_excess_over_gap"] is not None and check["max_excess_over_gap"] < 1)


HOUSING_CLAIMS: tuple[Callable[[Results, HousingExperimentConfig], Claim], ...] = (
    _keeps_two_models, partial(_collapses_more, method=GREEDY), partial(_collapses_more, method=FEDCAM),
    _collapsed_entrances, _small_under_training)
"""The E6 claims, in the order of ``claims.json``."""


def housing_claims(results: Results, config: HousingExperimentConfig) -> list[Claim]:
    """The E6 claims."""
    return [check(results, config) for check in HOUSING_CLAIMS]


EXPERIMENT = register(Experiment(
    name="housing", title="E6, Figure B.4: California Housing, radius sweep", config=HousingExperimentConfig,
    run=_run, claims=housing_claims, arguments=lambda args: {"data_file": getattr(args, "data_file", None)},
    panels=radius_panels("figB4", "Housing", ("pr_all_usable", r"$\widehat{\Pr}(K_T^{\mathrm{eval}} = 2)$"),
                         lambda all_used: all_used, r"round 0: $\Pr(K^0 = 2)$ (all methods)", "EXP3 {gr, com, rev}"),
    show=lambda results: radius_table(results, ["pr_all_usable", "mean_assignment_accuracy", "mean_routed_test_loss"],
                                      {"round0_single_cluster": "round0_pr_single_cluster"}),
    variants={"any-entrance": Variant("the task's starts as they fall, K^0 = 2 in most (the first E6)",
                                      lambda config: replace(config, entrance="any",
                                                             name=f"{config.name}-any-entrance"))},
))
