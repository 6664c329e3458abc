"""Scenarios beyond the paper: does routing with default settings recover on models the paper never ran?

``fedroute reproduce scenarios`` (issue 10).  Every *scenario* is a task, a number
of clusters ``K``, a horizon ``T`` and the starts it is run from; every *cell* is
``{"scenario", "start", "seed"}``; every method runs every cell from the same
``W^0`` in the batched simulator.

Scenarios (:data:`SCENARIOS`)
-----------------------------
``digits``      digits MLP (64-32-10), 4 groups seeing the images rotated by 0/90/180/270°,
                24 clients, ``K = 4`` (:class:`~fedroute.tasks.digit_rotations.DigitRotationsTask`);
``boundaries``  2-16-2 MLP on 2-D points, 3 groups whose decision boundaries are rotated by
                0/120/240°, 15 clients, ``K = 3`` (:class:`~fedroute.tasks.boundaries.BoundariesTask`,
                the plugin case of the issue);
``collinear``   linear regression with 3 collinear groups, 30 clients, ``K = 3``
                (:class:`~fedroute.tasks.collinear.CollinearTask`);
``gmm``         the paper's GMM task (E5), 30 clients, ``K = 3``;
``gmm-k4``      the same with ``K = G + 1 = 4`` (over-provisioned).

Starts (:func:`initial_models`)
-------------------------------
``warm``       ``K`` identical copies of one model trained on everyone: FedAvg (the routing
               loop with ``K = 1``) for ``warm_rounds`` rounds from the task's first random model;
``noisy``      ``warm`` plus independent Gaussian noise per copy, std ``0.01 · max(1, RMS(w))``
               per coordinate (``generator(seed, k, 0, Purpose.INIT)`` streams ``1000 + k``);
``random``     ``K`` independent random models (the tasks' default initialisations; GMM:
               standard normal parameters);
``collapsed``  the paper's collapsed start where the task has one (collinear: ``w_0 = θ̄``, the
               others at distance 3 orthogonal to the groups' line; GMM: E5's collapsed entrance,
               ``ū(12) + 0.1 e_k`` conditioned on a model unused at round 0, ``GMMTask.initial_models``).

Per run (``runs.*``)
--------------------
* ``separated``: the plurality of each group's controller-free held-out choices at ``W^T``
  (``argmin_k`` held-out loss per client) is a different model for every group;
* ``converged``: separated, and on its plurality model each group's mean held-out loss is
  within ``CONVERGED_TOLERANCE`` (10 %) of the *reference*: a model trained on that group
  alone for the same ``T`` rounds from the run's first initial model ``w_0^0`` (every client
  of the group routed to it, the hard update — the routing loop with routes fixed to the
  groups), ``worst_ratio`` = the largest of the groups' loss ratios;
* ``routed_test_loss``: the last executed routes ``r^{T−1}`` scored on held-out data with
  the models ``W^{T−1}`` they were executed on (as E2/E5);
* ``no_harm`` (non-Greedy methods, where the cell's Greedy run converged): the method's
  ``routed_test_loss`` ≤ ``(1 + NO_HARM_TOLERANCE)`` × Greedy's (2 %).

``summary.*`` aggregates per (scenario, start, method) and ``methods.*`` per method over all
cells, with the issue's two rates: sep∧conv among the runs whose Greedy run did not converge,
and no-harm among those whose Greedy run did.  ``references.*`` holds the per-group reference
losses at ``T`` and ``T/2`` (the horizon check: the alone models must have converged well
within ``T``).  Figures: ``figures/scenarios.{png,pdf}`` (sep∧conv rate per scenario, start
and method) and ``figures/methods.{png,pdf}``.  ``claims.json``: the issue's done criteria.

Seeds: the suite runs on the *evaluation* seeds ``0 … seeds−1``; the generic default was
chosen on the *development* seeds ``DEV_FIRST_SEED …`` (``--config study`` re-runs that study:
the variants of :data:`STUDY_VARIANTS` on the development seeds).  The defaults were never
tuned on the evaluation seeds.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fedroute.client.fedcam import task_uses_output_sum
from fedroute.client.randomness import Purpose, generator
from fedroute.client.settings import RoutingSettings
from fedroute.simulation.cli import REPRODUCE_COMMANDS, REPRODUCE_CONFIGS, named_config
from fedroute.simulation.experiments.common import number, print_claims, write_radius_outputs
from fedroute.simulation.experiments.linear import _COLOURS
from fedroute.simulation.fedcam import FedCAMTask, simulate_fedcam_batch
from fedroute.simulation.metrics import assignment_accuracy, routed_loss, usable_models
from fedroute.simulation.plotting import pyplot, save_figure
from fedroute.simulation.simulator import BatchHistory, concatenate_clients, simulate_batch
from fedroute.simulation.sweep import SweepSpec, run_sweep
from fedroute.strategies.aggregation import hard_update
from fedroute.strategies.methods import METHODS, method_settings
from fedroute.tasks.base import Task
from fedroute.tasks.boundaries import BoundariesTask
from fedroute.tasks.collinear import CollinearTask
from fedroute.tasks.digit_rotations import DigitRotationsTask
from fedroute.tasks.gmm import GMMTask

__all__ = [
    "Scenario",
    "SCENARIOS",
    "STARTS",
    "STUDY_VARIANTS",
    "ScenarioConfig",
    "ScenarioResults",
    "StartedTask",
    "initial_models",
    "reference_losses",
    "run_scenarios",
    "scenario_claims",
    "write_scenarios",
    "run_scenarios_command",
]

CONVERGED_TOLERANCE = 0.10
"""A separated group's held-out loss may exceed its alone reference by this share."""
NO_HARM_TOLERANCE = 0.02
"""Where Greedy converges, a method's final routed loss may exceed Greedy's by this share."""
TARGET_RECOVERY = 0.90
"""Done criterion: default EXP3 separates and converges in this share of the Greedy failures."""
TARGET_NO_HARM = 0.95
"""Done criterion: no harm in this share of the runs where Greedy converges."""
HORIZON_TOLERANCE = 0.05
"""Horizon check: the alone reference at ``T/2`` is within this share of its value at ``T``."""
DEV_FIRST_SEED = 100
"""First development seed (the study behind the generic default); evaluation seeds start at 0."""
STARTS = ("warm", "noisy", "random", "collapsed")


# --------------------------------------------------------------------------- #
# Scenarios and their tasks (module-level builders: cells travel to Ray workers)
# --------------------------------------------------------------------------- #
def _digits(seed: int) -> DigitRotationsTask:
    return DigitRotationsTask(num_clients=24, seed=seed)


def _boundaries(seed: int) -> BoundariesTask:
    return BoundariesTask(seed=seed)


def _collinear(seed: int) -> CollinearTask:
    return CollinearTask(init="spread", seed=seed)


def _gmm(seed: int) -> GMMTask:
    return GMMTask(seed=seed)


_TASKS: dict[str, Callable[[int], Task]] = {
    "digits": _digits, "boundaries": _boundaries, "collinear": _collinear, "gmm": _gmm}


@dataclass(frozen=True)
class Scenario:
    """A task, ``K``, ``T`` and the starts it is run from.

    Attributes
    ----------
    name : str
    task : str
        Key of the task builder (``digits``, ``boundaries``, ``collinear``, ``gmm``).
    num_clusters, num_groups : int
        ``K`` and ``G``.
    rounds : int
        ``T``: chosen so that a model trained alone on one group has converged well within
        it (the horizon check of ``references.*``).
    warm_rounds : int
        FedAvg rounds of the ``warm`` start.
    starts : tuple of str
        Subset of :data:`STARTS`.
    quick_rounds : int
        ``T`` of ``--quick``.
    description : str
    """

    name: str
    task: str
    num_clusters: int
    num_groups: int
    rounds: int
    warm_rounds: int
    starts: tuple[str, ...]
    quick_rounds: int
    description: str

    def make_task(self, seed: int) -> Task:
        """The scenario's task for one seed (data and the task's own initialisation)."""
        return _TASKS[self.task](seed)


SCENARIOS: dict[str, Scenario] = {scenario.name: scenario for scenario in (
    Scenario("digits", "digits", 4, 4, 250, 20, ("warm", "noisy", "random"), 80,
             "digits MLP 64-32-10, 4 rotation groups (0/90/180/270 deg), 24 clients, K = 4"),
    Scenario("boundaries", "boundaries", 3, 3, 100, 20, ("warm", "noisy", "random"), 30,
             "2-16-2 MLP, 3 groups with decision boundaries rotated by 0/120/240 deg, 15 clients, K = 3"),
    Scenario("collinear", "collinear", 3, 3, 100, 20, ("warm", "noisy", "random", "collapsed"), 30,
             "linear regression, 3 collinear groups (theta = -4, 0, +4 e_0), 30 clients, K = 3"),
    Scenario("gmm", "gmm", 3, 3, 200, 20, ("warm", "noisy", "random", "collapsed"), 40,
             "the paper's GMM task (E5, logistic regression), 3 groups, 30 clients, K = 3"),
    Scenario("gmm-k4", "gmm", 4, 3, 200, 20, ("warm", "noisy", "random", "collapsed"), 40,
             "the GMM task over-provisioned: K = G + 1 = 4"),
)}
"""The suite's scenarios, by name."""


@dataclass(frozen=True, eq=False)
class StartedTask:
    """A task whose initial cluster models are fixed (one start of a cell)."""

    task: Any
    start_models: NDArray[np.floating]

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def num_clients(self) -> int:
        return self.task.num_clients

    def clients(self, client_ids: NDArray[np.int64]) -> Any:
        """The wrapped task's clients."""
        return self.task.clients(client_ids)

    def __getattr__(self, name: str) -> Any:
        # FedCAM's output-sum form asks the task for ``initial_global_model`` (where it has one).
        if name == "initial_global_model":
            return getattr(self.task, name)
        raise AttributeError(name)

    def initial_models(self, num_clusters: int) -> NDArray[np.floating]:
        """The fixed ``W^0`` (``num_clusters`` must be its ``K``)."""
        if num_clusters != len(self.start_models):
            raise ValueError(f"this start has {len(self.start_models)} models; asked for {num_clusters}")
        return self.start_models


def _random_models(task: Task, num_clusters: int) -> NDArray[np.floating]:
    """``K`` independent random models: the task's own initialisation, or standard normal parameters (GMM)."""
    if isinstance(task, GMMTask):
        return np.stack([generator(task.seed, k, 0, Purpose.INIT).standard_normal(task.num_parameters)
                         for k in range(num_clusters)])
    return task.initial_models(num_clusters)


def fedavg_warm_start(task: Task, model: NDArray[np.floating], rounds: int, seed: int) -> NDArray[np.floating]:
    """``model`` after ``rounds`` rounds of FedAvg on every client (the routing loop with ``K = 1``)."""
    if rounds == 0:
        return np.asarray(model)
    history = simulate_batch([StartedTask(task, np.asarray(model)[None])],
                             RoutingSettings(num_clusters=1, controllers=("gr",)), rounds, [seed],
                             model_rounds=[rounds])
    return history.cluster_models[-1, 0, 0]


@lru_cache(maxsize=256)
def initial_models(scenario: Scenario, start: str, seed: int) -> NDArray[np.floating]:
    """``W^0`` of a cell (see the module docstring), shape (K, P), read-only (cached: every method of a
    cell starts from it, and the warm start costs ``warm_rounds`` rounds of FedAvg)."""
    models = _initial_models(scenario, start, seed)
    models.flags.writeable = False
    return models


def _initial_models(scenario: Scenario, start: str, seed: int) -> NDArray[np.floating]:
    task, num_clusters = scenario.make_task(seed), scenario.num_clusters
    if start in ("warm", "noisy"):
        warm = fedavg_warm_start(task, _random_models(task, 1)[0], scenario.warm_rounds, seed)
        models = np.repeat(warm[None], num_clusters, axis=0)
        if start == "noisy":
            scale = 0.01 * max(1.0, float(np.sqrt(np.mean(np.square(warm, dtype=np.float64)))))
            noise = np.stack([generator(seed, 1000 + k, 0, Purpose.INIT).standard_normal(warm.size)
                              for k in range(num_clusters)])
            models = (models + scale * noise).astype(warm.dtype)
        return models
    if start == "random":
        return np.array(_random_models(task, num_clusters))
    if start == "collapsed":
        if isinstance(task, CollinearTask):
            return replace(task, init="collapsed").initial_models(num_clusters)
        if isinstance(task, GMMTask):
            return np.array(task.initial_models(num_clusters))
        raise ValueError(f"scenario {scenario.name!r} has no collapsed start")
    raise ValueError(f"start = {start!r} is invalid; allowed: one of {STARTS}")


def make_cell_task(cell: dict[str, Any]) -> StartedTask:
    """The task of a cell, started from its ``W^0``."""
    scenario = SCENARIOS[cell["scenario"]]
    return StartedTask(scenario.make_task(int(cell["seed"])),
                       initial_models(scenario, str(cell["start"]), int(cell["seed"])))


# --------------------------------------------------------------------------- #
# The alone references
# --------------------------------------------------------------------------- #
def reference_losses(tasks: Sequence[StartedTask], num_groups: int, rounds: Sequence[int]
                     ) -> dict[int, NDArray[np.float64]]:
    """Per run and group, the held-out loss of a model trained on that group alone from ``w_0^0``.

    Every client of group ``g`` trains the group's model and the hard update averages them
    (the routing loop with each group routed to its own cluster), for all runs at once.

    Returns
    -------
    dict
        ``t → (R, G)`` group-mean held-out losses of the alone models after ``t`` rounds,
        for every ``t`` in ``rounds``.
    """
    num_runs, num_clients = len(tasks), tasks[0].num_clients
    clients = concatenate_clients([task.clients(np.arange(num_clients)) for task in tasks])
    run_of_client = np.repeat(np.arange(num_runs), num_clients)
    groups = clients.groups
    models = np.stack([np.repeat(np.asarray(task.start_models[:1]), num_groups, axis=0) for task in tasks])
    rows = np.arange(len(groups))
    wanted, result = set(int(t) for t in rounds), {}
    for t in range(max(wanted) + 1):
        if t in wanted:
            losses = clients.losses(models[run_of_client], "test")[rows, groups]
            result[t] = np.stack([[losses[(run_of_client == r) & (groups == g)].mean() for g in range(num_groups)]
                                  for r in range(num_runs)])
        if t < max(wanted):
            trained = clients.local_update(models[run_of_client, groups], rows, t)
            models = hard_update(models, trained, groups, clients.num_examples, run_of_client)
    return result


# --------------------------------------------------------------------------- #
# Reduce (module level: runs in Ray workers)
# --------------------------------------------------------------------------- #
def reduce_scenario(history: BatchHistory, tasks: Sequence[StartedTask], cells: Sequence[dict[str, Any]],
                    num_groups: int) -> pd.DataFrame:
    """One row per cell: separation, the groups' held-out losses on their models, routed loss."""
    models = history.cluster_models                              # (≥2, R, K, P): W^{T-1}, W^T last
    num_rounds, num_runs, num_clients = history.routes.shape
    num_clusters = models.shape[2]
    clients = concatenate_clients([task.clients(np.arange(num_clients)) for task in tasks])
    run_of_client = np.repeat(np.arange(num_runs), num_clients)
    final = clients.losses(models[-1][run_of_client], "test").reshape(num_runs, num_clients, num_clusters)
    before = clients.losses(models[-2][run_of_client], "test").reshape(num_runs, num_clients, num_clusters)
    routed = np.asarray(routed_loss(before, history.routes[-1].astype(np.int64))).reshape(num_runs)
    rows = []
    for r, cell in enumerate(cells):
        groups = history.groups[r]
        choices = final[r].argmin(axis=1)
        plurality = [int(np.bincount(choices[groups == g], minlength=num_clusters).argmax())
                     for g in range(num_groups)]
        rows.append({
            "scenario": cell["scenario"], "start": cell["start"], "seed": int(cell["seed"]),
            "separated": len(set(plurality)) == num_groups,
            "group_models": json.dumps(plurality),
            "group_losses": json.dumps([float(final[r][groups == g, plurality[g]].mean())
                                        for g in range(num_groups)]),
            "routed_test_loss": float(routed[r]),
            "eval_test_loss": float(final[r].min(axis=1).mean()),
            "usable_models": int(usable_models(final[r])),
            "assignment_accuracy": float(assignment_accuracy(final[r], groups, num_clusters, num_groups)),
        })
    return pd.DataFrame(rows)


def _simulate_last_models(tasks, settings, num_rounds, seeds, **progress):
    """The batched simulator recording only ``W^{T−1}`` and ``W^T`` (what the reduce needs)."""
    return simulate_batch(tasks, settings, num_rounds, seeds, model_rounds=[num_rounds - 1, num_rounds], **progress)


def make_fedcam_cell_task(cell: dict[str, Any]) -> Any:
    """FedCAM's view of a cell: where the task runs FedCAM's output-sum form (the MLP tasks) its models are
    the pairs ``[Θ_glob | Θ_k]`` and its clients score them (:class:`~fedroute.simulation.fedcam.FedCAMTask`);
    elsewhere (additive form) the cell's task itself."""
    task = make_cell_task(cell)
    return FedCAMTask(task) if task_uses_output_sum(task) else task


def _simulate_fedcam(tasks, settings, num_rounds, seeds, **progress):
    """FedCAM on the cells' tasks, recording ``W^{T−1}`` and ``W^T`` (pairs in the output-sum form)."""
    tasks = [task.task if isinstance(task, FedCAMTask) else task for task in tasks]
    return simulate_fedcam_batch(tasks, settings, num_rounds, seeds, model_rounds=[num_rounds - 1, num_rounds],
                                 **progress)


# --------------------------------------------------------------------------- #
# Configuration
# --------------------------------------------------------------------------- #
STUDY_VARIANTS: dict[str, dict[str, Any]] = {
    "paper-linear": {"preset": "linear"},
    "paper-characters": {"preset": "characters"},
    "greedy-random-ties": {"controllers": ("gr",)},
    "no-exploitation": {"exploitation_fraction": 0.0},
    "exploit-0.3": {"exploitation_fraction": 0.3},
    "default": {},
    "exploit-0.7": {"exploitation_fraction": 0.7},
    "no-consolidation": {"exploitation_consolidates": False},
    "no-guard": {"consolidation_loss_ratio": float("inf")},
}
"""``--config study``: EXP3 variants compared on the development seeds (``method_settings("exp3", **v)``;
``preset`` selects a paper configuration)."""


@dataclass(frozen=True)
class ScenarioConfig:
    """Settings of the scenario suite.

    Parameters
    ----------
    scenarios : tuple of str
        Keys of :data:`SCENARIOS`.
    seeds : int
        Seeds per (scenario, start) cell (≥ 1).
    first_seed : int
        The evaluation seeds are ``first_seed … first_seed + seeds − 1`` (0; the development
        seeds of the study start at :data:`DEV_FIRST_SEED`).
    methods : tuple of str
        Run names; each is a method of :data:`~fedroute.strategies.methods.METHODS` (its
        generic default) or a key of ``variants``.  Must include ``greedy``.
    variants : dict
        Extra run names → ``method_settings("exp3", **overrides)`` (the study).
    quick : bool
        ``T = quick_rounds`` and the first start of every scenario only.
    chunk_size : int
        Runs simulated together (results do not depend on it).
    """

    scenarios: tuple[str, ...] = tuple(SCENARIOS)
    seeds: int = 10
    first_seed: int = 0
    methods: tuple[str, ...] = METHODS
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    quick: bool = False
    chunk_size: int = 20
    name: str = "scenarios"

    def __post_init__(self) -> None:
        object.__setattr__(self, "scenarios", tuple(self.scenarios))
        object.__setattr__(self, "methods", tuple(self.methods))
        checks = [
            (len(self.scenarios) >= 1 and all(s in SCENARIOS for s in self.scenarios)
             and len(set(self.scenarios)) == len(self.scenarios), "scenarios", self.scenarios,
             f"distinct names from {sorted(SCENARIOS)}"),
            (isinstance(self.seeds, int) and self.seeds >= 1, "seeds", self.seeds, "an integer ≥ 1"),
            (isinstance(self.first_seed, int) and self.first_seed >= 0, "first_seed", self.first_seed,
             "an integer ≥ 0"),
            ("greedy" in self.methods and len(set(self.methods)) == len(self.methods)
             and all(m in METHODS or m in self.variants for m in self.methods), "methods", self.methods,
             f"distinct names from {METHODS} or the variants, including 'greedy'"),
            (isinstance(self.chunk_size, int) and self.chunk_size >= 1, "chunk_size", self.chunk_size,
             "an integer ≥ 1"),
        ]
        for holds, key, value, allowed in checks:
            if not holds:
                raise ValueError(f"scenarios setting '{key}' = {value!r} is invalid; allowed: {allowed}")
        for scenario in self.scenarios:
            for method in self.methods:
                self.settings(method, SCENARIOS[scenario])  # validates every variant early

    @classmethod
    def quick_config(cls, **overrides: Any) -> "ScenarioConfig":
        """``--quick``: 2 seeds, short horizons, one start per scenario."""
        return cls(**{"seeds": 2, "quick": True, "name": "scenarios-quick", **overrides})

    @classmethod
    def study(cls, **overrides: Any) -> "ScenarioConfig":
        """``--config study``: the EXP3 variants of :data:`STUDY_VARIANTS` and Greedy on the development seeds."""
        return cls(**{"first_seed": DEV_FIRST_SEED, "methods": ("greedy", *STUDY_VARIANTS),
                      "variants": dict(STUDY_VARIANTS), "name": "scenarios-study", **overrides})

    def rounds(self, scenario: Scenario) -> int:
        return scenario.quick_rounds if self.quick else scenario.rounds

    def starts(self, scenario: Scenario) -> tuple[str, ...]:
        return scenario.starts[:1] if self.quick else scenario.starts

    def cells(self, scenario: Scenario) -> list[dict[str, Any]]:
        """``{"scenario", "start", "seed"}`` of one scenario, start-major."""
        return [{"scenario": scenario.name, "start": start, "seed": self.first_seed + j}
                for start in self.starts(scenario) for j in range(self.seeds)]

    def settings(self, method: str, scenario: Scenario) -> RoutingSettings:
        """The routing of a run name on a scenario."""
        if method in self.variants:
            return method_settings("exp3", num_clusters=scenario.num_clusters, **self.variants[method])
        return method_settings(method, num_clusters=scenario.num_clusters)

    def spec(self, method: str, scenario: Scenario) -> SweepSpec:
        """The sweep spec of a run name on a scenario."""
        return SweepSpec(
            method=method, settings=self.settings(method, scenario), num_rounds=self.rounds(scenario),
            make_task=make_fedcam_cell_task if method == "fedcam" else make_cell_task,
            reduce=partial(reduce_scenario, num_groups=scenario.num_groups),
            simulate=_simulate_fedcam if method == "fedcam" else _simulate_last_models,
        )

    def to_json(self) -> dict[str, Any]:
        values = asdict(self)
        values["scenario_definitions"] = {name: asdict(SCENARIOS[name]) for name in self.scenarios}
        values["routing"] = {method: self.settings(method, SCENARIOS[self.scenarios[0]]).to_dict()
                             for method in self.methods}
        return values


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class ScenarioResults:
    """Everything :func:`run_scenarios` computed."""

    runs: pd.DataFrame
    summary: pd.DataFrame
    methods: pd.DataFrame
    references: pd.DataFrame


def _references(config: ScenarioConfig, scenario: Scenario) -> pd.DataFrame:
    """The alone reference of every cell of a scenario at ``T`` and ``T/2``."""
    cells = config.cells(scenario)
    rounds = config.rounds(scenario)
    rows = []
    for start in range(0, len(cells), config.chunk_size):
        chunk = cells[start:start + config.chunk_size]
        losses = reference_losses([make_cell_task(cell) for cell in chunk], scenario.num_groups,
                                  [rounds // 2, rounds])
        for r, cell in enumerate(chunk):
            rows.append({**cell, "reference_losses": json.dumps(losses[rounds][r].tolist()),
                         "half_horizon_losses": json.dumps(losses[rounds // 2][r].tolist()),
                         "half_horizon_ratio": float(np.max(losses[rounds // 2][r] / losses[rounds][r]))})
    return pd.DataFrame(rows)


def _judge(runs: pd.DataFrame, references: pd.DataFrame) -> pd.DataFrame:
    """Add ``worst_ratio``, ``converged``, ``greedy_converged``, ``no_harm`` to the runs."""
    keys = ["scenario", "start", "seed"]
    runs = runs.merge(references[keys + ["reference_losses"]], on=keys, how="left")
    ratios = [float(np.max(np.asarray(json.loads(own)) / np.asarray(json.loads(ref))))
              for own, ref in zip(runs["group_losses"], runs["reference_losses"])]
    runs["worst_ratio"] = ratios
    runs["converged"] = runs["separated"] & (runs["worst_ratio"] <= 1.0 + CONVERGED_TOLERANCE)
    greedy = runs[runs["method"] == "greedy"].set_index(keys)
    index = pd.MultiIndex.from_frame(runs[keys])
    runs["greedy_converged"] = greedy["converged"].reindex(index).to_numpy(dtype=bool)
    greedy_loss = greedy["routed_test_loss"].reindex(index).to_numpy(dtype=float)
    harmless = runs["routed_test_loss"].to_numpy() <= (1.0 + NO_HARM_TOLERANCE) * greedy_loss
    runs["no_harm"] = np.where(runs["greedy_converged"] & (runs["method"] != "greedy"), harmless, np.nan)
    return runs.drop(columns="reference_losses")


def _rates(part: pd.DataFrame) -> dict[str, Any]:
    failures = part[~part["greedy_converged"]]
    successes = part[part["greedy_converged"]]
    recovered = failures["separated"] & failures["converged"]
    return {
        "runs": len(part),
        "separated": float(part["separated"].mean()),
        "converged": float(part["converged"].mean()),
        "greedy_failures": len(failures),
        "recovered_of_greedy_failures": int(recovered.sum()),
        "recovery_rate": float(recovered.mean()) if len(failures) else float("nan"),
        "greedy_successes": len(successes),
        "no_harm_of_greedy_successes": int((successes["no_harm"] == 1).sum()),
        "no_harm_rate": float(successes["no_harm"].astype(float).mean()) if len(successes) else float("nan"),
        "mean_routed_test_loss": float(part["routed_test_loss"].mean()),
        "median_worst_ratio": float(part["worst_ratio"].median()),
    }


def run_scenarios(config: Optional[ScenarioConfig] = None, workers: int = 1, ray_address: Optional[str] = None,
                  progress: bool = False) -> ScenarioResults:
    """Run the suite (a pure function of ``config``; ``workers``/``ray_address`` do not change results)."""
    config = ScenarioConfig() if config is None else config
    tables, references = [], []
    for name in config.scenarios:
        scenario = SCENARIOS[name]
        if progress:
            print(f"scenario {name}: {scenario.description}; T = {config.rounds(scenario)}, "
                  f"starts {list(config.starts(scenario))}, {config.seeds} seeds", flush=True)
        references.append(_references(config, scenario))
        specs = [config.spec(method, scenario) for method in config.methods]
        tables.append(run_sweep(specs, config.cells(scenario), chunk_size=config.chunk_size, workers=workers,
                                ray_address=ray_address, progress=progress))
    reference_table = pd.concat(references, ignore_index=True)
    runs = _judge(pd.concat(tables, ignore_index=True), reference_table)
    summary = pd.DataFrame([{"scenario": s, "start": st, "method": m, **_rates(part)}
                            for (s, st, m), part in runs.groupby(["scenario", "start", "method"], sort=False)])
    methods = pd.DataFrame([{"method": m, **_rates(part)} for m, part in runs.groupby("method", sort=False)])
    return ScenarioResults(runs=runs, summary=summary, methods=methods, references=reference_table)


# --------------------------------------------------------------------------- #
# Claims, figures, files
# --------------------------------------------------------------------------- #
def scenario_claims(results: ScenarioResults, config: ScenarioConfig) -> list[dict[str, Any]]:
    """The issue's done criteria, each ``{claim, paper, measured, holds}``."""
    claims = []
    by_method = results.methods.set_index("method")
    per_scenario = results.summary.groupby(["scenario", "method"], sort=False)
    for method in [m for m in config.methods if m != "greedy"]:
        row = by_method.loc[method]
        scenarios = {f"{s}": {"greedy_failures": int(part["greedy_failures"].sum()),
                              "recovered": int(part["recovered_of_greedy_failures"].sum()),
                              "greedy_successes": int(part["greedy_successes"].sum()),
                              "no_harm": int(part["no_harm_of_greedy_successes"].sum())}
                     for (s, m), part in per_scenario if m == method}
        claims.append({
            "claim": f"{method} separates and converges in ≥ {TARGET_RECOVERY:.0%} of the runs (cell × seed) "
                     f"where Greedy does not",
            "paper": "issue 10, done when: default EXP3 separates and converges in ≥ 90 % of the runs where "
                     "Greedy does not",
            "measured": {"greedy_failures": int(row["greedy_failures"]),
                         "recovered": int(row["recovered_of_greedy_failures"]),
                         "rate": number(row["recovery_rate"]), "by_scenario": scenarios},
            "holds": None if row["greedy_failures"] == 0 else bool(row["recovery_rate"] >= TARGET_RECOVERY),
        })
        claims.append({
            "claim": f"{method} does no harm (final routed loss ≤ {1 + NO_HARM_TOLERANCE:g} × Greedy's) in "
                     f"≥ {TARGET_NO_HARM:.0%} of the runs where Greedy converges",
            "paper": "issue 10, done when: no harm in ≥ 95 % of the runs where Greedy converges",
            "measured": {"greedy_successes": int(row["greedy_successes"]),
                         "no_harm": int(row["no_harm_of_greedy_successes"]),
                         "rate": number(row["no_harm_rate"])},
            "holds": None if row["greedy_successes"] == 0 else bool(row["no_harm_rate"] >= TARGET_NO_HARM),
        })
    worst = results.references.groupby("scenario")["half_horizon_ratio"].max()
    claims.append({
        "claim": f"T leaves no under-training confound: every alone reference at T/2 is within "
                 f"{HORIZON_TOLERANCE:.0%} of its loss at T (every scenario, start, seed and group)",
        "paper": "issue 10: choose T so that the alone model converges well within T",
        "measured": {"worst_half_horizon_ratio_by_scenario": {k: number(v) for k, v in worst.items()}},
        "holds": bool((worst <= 1.0 + HORIZON_TOLERANCE).all()) if not config.quick else None,
    })
    return claims


def _plot(results: ScenarioResults, config: ScenarioConfig, figures: Path) -> None:
    plt = pyplot()
    runs = results.runs.assign(recovered=results.runs["separated"] & results.runs["converged"])
    rates = runs.groupby(["scenario", "start", "method"], sort=False)["recovered"].mean()
    cells = runs[["scenario", "start"]].drop_duplicates().itertuples(index=False)
    cells = [(scenario, start) for scenario, start in cells]
    width = 0.8 / len(config.methods)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(cells)), 3.8))
    for j, method in enumerate(config.methods):
        values = [float(rates.get((scenario, start, method), np.nan)) for scenario, start in cells]
        ax.bar(np.arange(len(cells)) + (j - (len(config.methods) - 1) / 2) * width, values, width,
               label=method, color=_COLOURS.get(method))
    ax.set_xticks(np.arange(len(cells)), [f"{scenario}\n{start}" for scenario, start in cells], fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("separated and converged")
    ax.set_title(f"scenarios: {config.seeds} seeds per cell", fontsize=9)
    ax.legend(fontsize=7, ncol=len(config.methods))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, figures, "scenarios")

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    methods = results.methods.set_index("method").loc[list(config.methods)]
    x = np.arange(len(methods))
    ax.bar(x - 0.2, methods["recovery_rate"].fillna(0), 0.4, label="sep ∧ conv where Greedy fails")
    ax.bar(x + 0.2, methods["no_harm_rate"].fillna(0), 0.4, label="no harm where Greedy converges")
    ax.axhline(TARGET_RECOVERY, color="0.4", linestyle="--", linewidth=0.8)
    ax.set_xticks(x, list(methods.index), fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, figures, "methods")


def write_scenarios(results: ScenarioResults, config: ScenarioConfig, out_dir: str | Path,
                    elapsed_seconds: Optional[float] = None) -> list[dict[str, Any]]:
    """Write the tables, figures, ``claims.json`` and ``config.json`` into ``out_dir``; return the claims."""
    out = Path(out_dir)
    claims = scenario_claims(results, config)
    settings = config.to_json()
    if elapsed_seconds is not None:
        settings["sweep_seconds"] = round(elapsed_seconds, 2)
    write_radius_outputs(out, {"runs": results.runs, "summary": results.summary, "methods": results.methods,
                               "references": results.references}, claims, settings)
    _plot(results, config, out / "figures")
    return claims


def run_scenarios_command(args: argparse.Namespace) -> int:
    """``fedroute reproduce scenarios [--config paper|study] [--quick] [--out OUT] [--workers N] [--ray-address A]``.

    ``paper`` (the default name) is the suite on the evaluation seeds; ``study`` the study behind the
    generic default on the development seeds.
    """
    if named_config(args) == "study":
        config = ScenarioConfig.study(quick=bool(getattr(args, "quick", False)))
    else:
        config = ScenarioConfig.quick_config() if getattr(args, "quick", False) else ScenarioConfig()
    out_dir = Path(args.out) / config.name
    start = time.perf_counter()
    results = run_scenarios(config, workers=getattr(args, "workers", 1) or 1,
                            ray_address=getattr(args, "ray_address", None), progress=True)
    elapsed = time.perf_counter() - start
    claims = write_scenarios(results, config, out_dir, elapsed_seconds=elapsed)
    columns = ["runs", "separated", "converged", "greedy_failures", "recovered_of_greedy_failures",
               "greedy_successes", "no_harm_of_greedy_successes"]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(results.summary[["scenario", "start", "method", *columns]].to_string(
            index=False, float_format=lambda x: f"{x:.2f}"))
        print(results.methods[["method", *columns, "recovery_rate", "no_harm_rate"]].to_string(
            index=False, float_format=lambda x: f"{x:.3f}"))
    print_claims(claims)
    print(f"scenarios: {elapsed:.1f} s; wrote {out_dir}")
    return 0  # a claim that does not hold is a result (claims.json), not a failure of the command


REPRODUCE_COMMANDS["scenarios"] = run_scenarios_command
REPRODUCE_CONFIGS["scenarios"] = {"study": "the study behind the generic default: its variants on the development seeds"}
