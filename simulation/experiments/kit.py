"""The experiment kit: an experiment is declared once; one runner computes, writes and reports it.

An :class:`Experiment` declares its ``config`` (an :class:`ExperimentConfig`: the paper's is ``config()``,
``--quick`` is ``config.quick()``, ``variants`` are the named configurations of ``--config NAME``); ``run(config,
sweep) -> Results``, whose cells × methods × seeds are sweeps (``sweep(specs, cells, chunk_size)`` runs every
method — a :class:`~fedroute.simulation.sweep.SweepSpec`, :func:`method_spec`, with the per-run metrics as its
``reduce`` — on every cell, in batches, in-process or as Ray tasks); the ``claims`` (records of :func:`claim`);
the figure ``panels`` (:class:`Panel`) and the tables it ``show``s.  :func:`run_experiment` is the one runner: it
writes ``OUT/<name>[-<variant>]/`` (every table as ``.parquet`` and ``.csv``, ``figures/*.png|pdf``,
``claims.json``, ``config.json`` with the settings, facts, seconds and peak memory).  :func:`reproduce` is
``fedroute reproduce NAME|all``; ``all`` also rewrites the marked tables of ``docs/results.md``
(:func:`update_results_doc`).  docs/experiments.md explains how to add an experiment.
"""

from __future__ import annotations

import json
import math
import resource
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, NamedTuple, Optional, Sequence, Union
from typing import get_args, get_origin, get_type_hints

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fedroute.simulation.fedcam import FedCAMTask, simulate_fedcam_batch
from fedroute.simulation.plotting import Panel
from fedroute.simulation.simulator import concatenate_clients
from fedroute.simulation.sweep import SweepArgs, SweepSpec, run_sweeps
from fedroute.simulation.workers import ChunkRunner
from fedroute.core.aggregation import hard_update
from fedroute.core.influence import InfluenceBounds, aggregate_round
from fedroute.core.methods import EXP3, FEDCAM, GREEDY, method_settings

__all__ = ["Experiment", "ExperimentConfig", "MethodSweepConfig", "Variant", "Results", "Panel", "Sweep", "EXPERIMENTS",
           "register",
           "claim", "not_run", "number", "by_value", "greedy_of_cell", "method_spec", "simulate_fedcam", "task_settings", "RunLosses",
           "train_groups_alone", "StartedTask", "run_experiment", "InputError"]

PAPER = "paper"
EXPERIMENTS: dict[str, "Experiment"] = {}
Claim = dict[str, Any]


class InputError(Exception):
    """An experiment's input (e.g. a data file) cannot be used: reported, exit code 1, nothing written."""


def number(x: Any) -> Optional[float]:
    """JSON-friendly float: rounded to 6 decimals, None for None/NaN/inf."""
    if x is None:
        return None
    x = float(x)
    return round(x, 6) if math.isfinite(x) else None


def claim(text: str, paper: str, measured: Any, holds: Optional[bool]) -> Claim:
    """A claim record ``{claim, paper, measured, holds}`` (``holds`` None: cannot be tested here)."""
    return {"claim": text, "paper": paper, "measured": measured, "holds": None if holds is None else bool(holds)}


def not_run(text: str, paper: str, method: str) -> Claim:
    """The record of a claim about a method this configuration does not run."""
    return claim(text, paper, f"{method} not run", None)


def by_value(table: pd.DataFrame, method: str, key: str, column: str) -> dict[str, Optional[float]]:
    """``{f"{key value:g}": column value}`` of one method's rows, sorted by ``key`` (JSON-friendly)."""
    rows = table[table["method"] == method].sort_values(key)
    return {f"{k:g}": number(v) for k, v in zip(rows[key], rows[column])}


def greedy_of_cell(table: pd.DataFrame, keys: Sequence[str], column: str) -> np.ndarray:
    """Per row of a sweep's table, ``column`` of the Greedy run of the same cell (cells identified by ``keys``)."""
    greedy = table[table["method"] == GREEDY].set_index(list(keys))[column]
    return greedy.reindex(pd.MultiIndex.from_frame(table[list(keys)])).to_numpy()


def _within(value: float, bounds: str) -> bool:
    if not bounds or not math.isfinite(value):
        return not bounds
    if bounds[0] in "≥>":
        limit = float(bounds[1:])
        return value >= limit if bounds[0] == "≥" else value > limit
    low, high = (float(x) for x in bounds[1:-1].split(","))
    return (low <= value if bounds[0] == "[" else low < value) and (value <= high if bounds[-1] == "]" else value < high)


@dataclass(frozen=True)
class ExperimentConfig:
    """Base of an experiment's frozen settings.  A subclass sets ``LABEL`` (error messages), ``QUICK`` (the
    ``--quick`` overrides), ``RULES`` (field → allowed values, checked on construction: bounds such as ``"≥ 1"``,
    ``"> 0"``, ``"(0, 1]"``, ``""`` for the type only, each optionally followed by ``" distinct"``; or a tuple of
    names; the type comes from the annotation — ``int``, ``float``, ``tuple[int|float|str, ...]``, whose elements
    each obey the rule, non-empty, made a tuple) and may define :meth:`validate` (cross-field checks) and
    :meth:`derived` (facts for ``config.json``)."""

    LABEL: ClassVar[str] = "experiment"
    QUICK: ClassVar[Mapping[str, Any]] = {}
    RULES: ClassVar[Mapping[str, Any]] = {}

    def __post_init__(self) -> None:
        hints, rules = get_type_hints(type(self)), {}
        for klass in reversed(type(self).__mro__):
            rules.update(vars(klass).get("RULES", {}))
        for key, rule in rules.items():
            self._check_setting(key, hints[key], rule)
        self.validate()

    def _check_setting(self, key: str, kind: Any, rule: Union[str, tuple[str, ...]]) -> None:
        value, many = getattr(self, key), get_origin(kind) is tuple
        element = get_args(kind)[0] if many else kind
        choices = rule if isinstance(rule, tuple) else ()
        bounds = "" if choices else rule.removesuffix("distinct").strip()
        distinct = bool(choices) or rule.endswith("distinct")
        noun = {int: "integer", float: "number", str: "name"}[element]
        allowed = f"names of {choices}" if choices else \
            f"{noun}{'s' if many else ''} {'in ' if bounds[:1] in '[(' else ''}{bounds}".strip()
        if many:
            allowed = f"a non-empty sequence of {'distinct ' if distinct else ''}{allowed}"
            try:
                value = tuple(element(v) for v in value)
            except (TypeError, ValueError):
                self.fail(key, value, allowed)
            object.__setattr__(self, key, value)
        else:
            allowed = f"{'an' if noun == 'integer' else 'a'} {allowed}"
        items = value if many else (value,)
        typed = all(isinstance(v, str) if element is str else
                    isinstance(v, (int, np.integer)) and not isinstance(v, bool) if element is int else
                    isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in items)
        if not (typed and len(items) >= 1 and all(_within(v, bounds) for v in items if element is not str)
                and (not distinct or len(set(items)) == len(items)) and all(v in (choices or items) for v in items)):
            self.fail(key, value, allowed)

    def validate(self) -> None:
        """Cross-field checks (:meth:`check`) and the task's and routing's own validation."""

    def check(self, checks: Sequence[tuple[Any, str, Any, str]]) -> None:
        """``ValueError`` naming the field of the first failed ``(holds, key, value, allowed)`` check."""
        for holds, key, value, allowed in checks:
            if not holds:
                self.fail(key, value, allowed)

    def fail(self, key: str, value: Any, allowed: str) -> None:
        raise ValueError(f"{self.LABEL} setting '{key}' = {value!r} is invalid; allowed: {allowed}")

    @classmethod
    def quick(cls, **overrides: Any) -> Any:
        """The ``--quick`` configuration (with ``overrides``)."""
        return cls(**{**cls.QUICK, **overrides})

    def derived(self) -> dict[str, Any]:
        """Derived quantities for ``config.json``."""
        return {}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "derived": self.derived()}


def simulate_fedcam(tasks: Sequence[Any], settings: Any, num_rounds: int, seeds: Sequence[int], **options: Any) -> Any:
    """FedCAM's simulator on the cells' tasks, given as such or as their :class:`FedCAMTask` view (whose clients
    score the pairs ``[Θ_glob | Θ_k]`` of the output-sum form for the per-run metrics)."""
    return simulate_fedcam_batch([task.task if isinstance(task, FedCAMTask) else task for task in tasks], settings,
                                 num_rounds, seeds, **options)


def method_spec(method: str, preset: str, num_rounds: int, make_task: Callable, reduce: Callable,
                **overrides: Any) -> SweepSpec:
    """A method of :mod:`fedroute.core.methods` with the task preset's routing as a sweep spec
    (FedCAM with its own simulator)."""
    spec = SweepSpec(method=method, settings=method_settings(method, preset=preset, **overrides),
                     num_rounds=num_rounds, make_task=make_task, reduce=reduce)
    return replace(spec, simulate=simulate_fedcam) if method == FEDCAM else spec


def task_settings(make_task: Callable[[dict[str, Any]], Any], cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The settings (dataclass fields) of the cells' tasks for ``config.json``: the task's defaults with the
    config's overrides, without the fields the cells set (those that differ between the first and last cell)."""
    first, last = ({f.name: getattr(task, f.name) for f in fields(task)}
                   for task in map(make_task, (cells[0], cells[-1])))
    return {key: value for key, value in first.items() if last[key] == value}


@dataclass(frozen=True)
class MethodSweepConfig(ExperimentConfig):
    """Settings of a sweep of named routing methods (Greedy IFCA among them: its runs define the failure or
    collapse cells) on one method preset.  A subclass sets ``PRESET`` and defines ``cells()``,
    ``task_factory()`` (cell → task: a module-level function with keywords, it travels to Ray workers) and
    ``reducer()`` (the per-run metrics); ``task`` overrides the task's own defaults."""

    PRESET: ClassVar[str] = ""
    RULES = dict(first_seed="≥ 0", rounds="≥ 1", num_clusters="≥ 1", block_length="",
                 methods=(GREEDY, EXP3, FEDCAM), chunk_size="≥ 1")

    first_seed: int = 0
    rounds: int = 100
    num_clusters: int = 2
    block_length: int = 10
    exp3_learning_rate: float = 2.0
    exp3_exploration: float = 0.001
    methods: tuple[str, ...] = (GREEDY, EXP3, FEDCAM)
    chunk_size: int = 10
    task: Mapping[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        self.check([(GREEDY in self.methods, "methods", self.methods, f"a sequence including {GREEDY!r}")])
        self.task_factory()(self.cells()[0])  # the task validates its own settings (no data is read)
        self.specs()                          # and the routing its own

    def specs(self) -> dict[str, SweepSpec]:
        """Method → sweep spec."""
        return {method: method_spec(method, self.PRESET, self.rounds, self.task_factory(), self.reducer(),
                                    num_clusters=self.num_clusters, block_length=self.block_length,
                                    exp3_learning_rate=self.exp3_learning_rate, exp3_exploration=self.exp3_exploration)
                for method in self.methods}

    def derived(self) -> dict[str, Any]:
        return {"cells": len(self.cells()), "task_settings": task_settings(self.task_factory(), self.cells()),
                "routing": {m: spec.settings.to_dict() for m, spec in self.specs().items()}}


class Results:
    """What an experiment computed: ``tables`` (written in order as ``<stem>.parquet``/``.csv``) and
    ``facts`` (merged into ``config.json``); both are readable as attributes (``results.runs``)."""

    def __init__(self, tables: Mapping[str, pd.DataFrame], **facts: Any) -> None:
        self.tables, self.facts = dict(tables), facts

    def __getattr__(self, name: str) -> Any:
        merged = {**self.__dict__.get("tables", {}), **self.__dict__.get("facts", {})}
        if name not in merged:
            raise AttributeError(name)
        return merged[name]


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


class RunLosses:
    """Every client's losses of a chunk's runs: ``losses(states, split)`` maps models ``(R, K, P)`` to
    ``(R, n, K)`` (the clients of all runs in one batch)."""

    def __init__(self, tasks: Sequence[Any]) -> None:
        self.num_clients = tasks[0].num_clients
        self.clients = concatenate_clients([task.clients(np.arange(task.num_clients)) for task in tasks])
        self.run_of_client = np.repeat(np.arange(len(tasks)), self.num_clients)

    def __call__(self, states: np.ndarray, split: str) -> np.ndarray:
        losses = self.clients.losses(np.asarray(states)[self.run_of_client], split)
        return losses.reshape(len(states), self.num_clients, -1)


def train_groups_alone(clients: Any, run_of_client: np.ndarray, models: np.ndarray, rounds: Sequence[int],
                       plays: Optional[Callable[[int], np.ndarray]] = None,
                       bounds: Optional[InfluenceBounds] = None,
                       model_of_client: Optional[np.ndarray] = None) -> dict[int, np.ndarray]:
    """Each group's model trained on that group alone, for a batch of runs: every client of group ``g`` trains model
    ``g`` of its run and the hard update averages them (the routing loop with each group routed to its own cluster),
    from ``models`` (R, G, P); returns the models at every ``t`` in ``rounds``.  With ``plays`` (``t`` → which
    clients play round ``t``, e.g. the run's partial participation) only those clients train in round ``t``.  With
    ``bounds`` the server step is the runs' own (:func:`~fedroute.core.influence.aggregate_round`: the sample-weight
    cap at ``c`` × the round's lower-median ``n`` over every playing client of the run); without, the uncapped hard
    update (the paper experiments' reference).  ``model_of_client``: the model each client trains instead of its
    group's (fixed routes, e.g. several groups sharing one model; ``models`` is then (R, M, P))."""
    routes = clients.groups if model_of_client is None else np.asarray(model_of_client, dtype=np.int64)
    last = max(rounds)
    kept = {}
    for t in range(last + 1):
        if t in rounds:
            kept[t] = models
        if t == last:
            break
        rows = np.arange(len(routes)) if plays is None else np.flatnonzero(plays(t))
        if len(rows):                                                # a round nobody plays leaves the models
            trained = clients.local_update(models[run_of_client[rows], routes[rows]], rows, t)
            if bounds is None:
                models = hard_update(models, trained, routes[rows], clients.num_examples[rows], run_of_client[rows])
            else:
                models = aggregate_round(models, trained, routes[rows], clients.num_examples[rows], bounds,
                                         run_of_client[rows]).models
    return kept


class Sweep:
    """``sweep(specs, cells, chunk_size)``: :func:`~fedroute.simulation.sweep.run_sweep` on the runner's workers
    (``sweep.many([...])``: several sweeps whose chunks share the workers' queue); ``seconds`` adds up each
    method's compute seconds (the sum over its chunks, wherever they ran).

    ``workers`` / ``ray_address`` open a :class:`~fedroute.simulation.workers.ChunkRunner` per call, unless
    ``runner`` (an open one, shared by all of an experiment's sweeps) is given."""

    def __init__(self, workers: int = 1, ray_address: Optional[str] = None, progress: bool = False,
                 runner: Optional[ChunkRunner] = None) -> None:
        self.workers, self.ray_address, self.progress, self.runner = workers, ray_address, progress, runner
        self.seconds: dict[str, float] = {}

    def __call__(self, specs: Sequence[SweepSpec], cells: Sequence[dict[str, Any]], chunk_size: int) -> pd.DataFrame:
        return self.many([(specs, cells, chunk_size)])[0]

    def many(self, sweeps: Sequence[SweepArgs]) -> list[pd.DataFrame]:
        """One table per ``(specs, cells, chunk_size)``, their chunks run together."""
        return run_sweeps(sweeps, self.workers, self.ray_address, self.progress, self.runner, self.seconds)


class Variant(NamedTuple):
    """A named configuration: ``make(config)`` of the paper's (or quick) configuration; ``in_all``:
    ``reproduce all`` runs it."""

    description: str
    make: Callable[[Any], Any]
    in_all: bool = True


@dataclass(frozen=True)
class Experiment:
    """An experiment, declared once (module docstring)."""

    name: str
    title: str
    config: type
    run: Callable[[Any, Sweep], Results]
    claims: Callable[[Results, Any], list[Claim]]
    panels: Sequence[Panel] = ()
    show: Callable[[Results], Sequence[pd.DataFrame]] = lambda results: ()
    variants: Mapping[str, Variant] = field(default_factory=dict)
    arguments: Callable[[Any], dict[str, Any]] = lambda args: {}
    """CLI arguments → config overrides (e.g. housing's ``--data-file``)."""
    parallel: bool = True
    """False: one process (``--workers`` / ``--ray-address`` are ignored)."""
    auto_workers: bool = True
    """False: ``--workers auto`` (the default) runs it in one process; ``--workers N`` still runs a pool (for
    experiments whose chunks share costly per-task work, cached per process, that a pool would repeat)."""

    def configure(self, variant: str = PAPER, quick: bool = False, **overrides: Any) -> Any:
        """The configuration of a variant (``paper``: the paper's), quick or full, with overrides."""
        config = self.config.quick() if quick else self.config()
        if variant != PAPER:
            config = self.variants[variant].make(config)
        return replace(config, **overrides) if overrides else config

    def output_name(self, variant: str = PAPER) -> str:
        """``<name>`` for the paper's configuration, ``<name>-<variant>`` for a named one."""
        return self.name if variant == PAPER else f"{self.name}-{variant}"


def register(experiment: Experiment) -> Experiment:
    """Add an experiment to :data:`EXPERIMENTS` (``fedroute reproduce <name>``)."""
    EXPERIMENTS[experiment.name] = experiment
    return experiment


def peak_memory_mb() -> float:
    """Peak resident memory of this process and its finished children (MB; Linux ``ru_maxrss`` in kB)."""
    return max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024


def run_experiment(experiment: Experiment, config: Any, out_dir: Union[str, Path], workers: int = 1,
                   ray_address: Optional[str] = None, progress: bool = False) -> tuple[Results, list[Claim]]:
    """Run an experiment and write its outputs into ``out_dir`` (module docstring); returns what it wrote.

    The results are a pure function of ``config``: ``workers`` and ``ray_address`` do not change them."""
    started = time.perf_counter()
    with ChunkRunner(workers if experiment.parallel else 1, ray_address if experiment.parallel else None) as runner:
        sweep = Sweep(progress=progress, runner=runner)
        results = experiment.run(config, sweep)
    claims = experiment.claims(results, config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stem, table in results.tables.items():
        table = table.reset_index(drop=True)
        table.to_parquet(out / f"{stem}.parquet", index=False)
        table.to_csv(out / f"{stem}.csv", index=False)
    (out / "claims.json").write_text(json.dumps(claims, indent=2, default=_json_default) + "\n")
    for panel in experiment.panels:
        panel.draw(results, config, out / "figures")
    seconds = {**{key: round(value, 2) for key, value in sweep.seconds.items()},
               "total": round(time.perf_counter() - started, 2)}
    settings = {**config.to_json(), **results.facts, "seconds": seconds, "peak_memory_mb": round(peak_memory_mb(), 1)}
    (out / "config.json").write_text(json.dumps(settings, indent=2, default=_json_default) + "\n")
    return results, claims


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
