"""Sweeps: many independent runs, batched per chunk, chunks in-process, in a local process pool or as Ray tasks.

A sweep is a list of *cells* (plain dicts of parameters, e.g. ``{"rho": 2.0,
"seed": 7}``) and one method.  Cells are cut into chunks in order; each chunk is
simulated as one batch (:func:`~fedroute.simulation.simulator.simulate_batch`)
and reduced to one table row per cell by the experiment's ``reduce`` function.
Because every run's draws depend only on its own ``(seed, client, round,
purpose)``, a run's outcome does not depend on which chunk or worker ran it:
results are identical for any ``workers`` and any Ray cluster (a test checks it).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import pandas as pd

from fedroute.core.settings import RoutingSettings
from fedroute.simulation.simulator import BatchHistory, simulate_batch
from fedroute.simulation.workers import ChunkRunner
from fedroute.core.task import Task

__all__ = ["SweepSpec", "run_sweep", "run_sweeps", "chunked"]

Cell = dict[str, Any]
MakeTask = Callable[[Cell], Task]
Reduce = Callable[[BatchHistory, Sequence[Task], Sequence[Cell]], pd.DataFrame]


@dataclass(frozen=True)
class SweepSpec:
    """One method over many cells.

    Attributes
    ----------
    method : str
        Name written into every row.
    settings : RoutingSettings
        The method's routing.
    num_rounds : int
        ``T``.
    make_task : callable
        Cell → task (module-level function: it is sent to Ray workers).
    reduce : callable
        ``(history, tasks, cells) -> DataFrame`` with one row per cell
        (module-level function).
    seed_key : str
        The cell key holding the run's routing seed.
    simulate : callable
        ``(tasks, settings, num_rounds, seeds, on_round=None) -> history``; the
        batched simulator by default (FedCAM passes its own).  ``on_round`` drives
        the progress bar.
    """

    method: str
    settings: RoutingSettings
    num_rounds: int
    make_task: MakeTask
    reduce: Reduce
    seed_key: str = "seed"
    simulate: Callable[..., Any] = simulate_batch


def chunked(cells: Sequence[Cell], chunk_size: int) -> list[list[Cell]]:
    """Consecutive chunks of at most ``chunk_size`` cells."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    return [list(cells[start:start + chunk_size]) for start in range(0, len(cells), chunk_size)]


def _run_chunk(spec: SweepSpec, cells: list[Cell], on_round: Optional[Callable[[Any], None]] = None
               ) -> tuple[pd.DataFrame, float]:
    """One chunk simulated as one batch: its table and the seconds it took (where it ran)."""
    started = time.perf_counter()
    tasks = [spec.make_task(cell) for cell in cells]
    seeds = [int(cell[spec.seed_key]) for cell in cells]
    history = spec.simulate(tasks, spec.settings, spec.num_rounds, seeds,
                            **({} if on_round is None else {"on_round": on_round}))
    table = spec.reduce(history, tasks, cells)
    table.insert(0, "method", spec.method)
    return table, time.perf_counter() - started


SweepArgs = tuple[Sequence[SweepSpec], Sequence[Cell], int]
"""``(specs, cells, chunk_size)``: every spec on every cell, in chunks of at most ``chunk_size`` cells."""


def run_sweeps(
    sweeps: Sequence[SweepArgs],
    workers: int = 1,
    ray_address: Optional[str] = None,
    progress: bool = True,
    runner: Optional[ChunkRunner] = None,
    seconds: Optional[dict[str, float]] = None,
) -> list[pd.DataFrame]:
    """Several sweeps whose chunks share one queue: one table per sweep (see :func:`run_sweep`).

    Parallel, a job is one chunk under one spec; the jobs of all sweeps are
    submitted together, the largest (cells × rounds) first, so that the
    workers stay busy to the end.  The tables do not depend on any of it.

    Parameters
    ----------
    sweeps : sequence of (specs, cells, chunk_size)
        The sweeps.
    workers, ray_address
        Where the chunks run (:class:`~fedroute.simulation.workers.ChunkRunner`), unless ``runner``
        (an open one, shared by several calls) is given.
    progress : bool
        A progress bar of simulated rounds (stderr); in process it advances every round, names
        the method and chunk and shows tqdm's ETA; parallel, it advances per finished chunk.
    seconds : dict, optional
        Adds each method's compute seconds (the sum over its chunks, wherever they ran) under its name.

    Returns
    -------
    list of DataFrame
        Per sweep: rows ordered by spec, then cell; identical whatever the workers.
    """
    if runner is None:
        with ChunkRunner(workers, ray_address) as own:
            return run_sweeps(sweeps, progress=progress, runner=own, seconds=seconds)
    from tqdm.auto import tqdm

    # Output order: per sweep, spec by spec, chunk by chunk; a parallel job is one (spec, chunk).
    chunks = [chunked(cells, chunk_size) for _, cells, chunk_size in sweeps]
    slots = [(sweep_index, spec_index, chunk_index) for sweep_index, (specs, _, _) in enumerate(sweeps)
             for spec_index in range(len(specs)) for chunk_index in range(len(chunks[sweep_index]))]
    jobs = [(sweeps[w][0][k], chunks[w][c]) for w, k, c in slots]
    methods = "+".join(dict.fromkeys(spec.method for spec, _ in jobs))
    bar = tqdm(total=sum(spec.num_rounds for spec, _ in jobs), unit="round", disable=not progress, file=sys.stderr,
               desc=methods if not runner.parallel else f"{methods} ({len(jobs)} chunks, {runner.kind})")
    results: list[Optional[pd.DataFrame]] = [None] * len(jobs)
    if not runner.parallel:
        for index, (spec, chunk) in enumerate(jobs):
            bar.set_description(f"{spec.method}, chunk {index + 1}/{len(jobs)} ({len(chunk)} runs)", refresh=False)
            results[index], spent = _run_chunk(spec, chunk, (lambda _: bar.update(1)) if progress else None)
            _add(seconds, spec.method, spent)
    else:
        largest_first = sorted(range(len(jobs)), key=lambda i: -len(jobs[i][1]) * jobs[i][0].num_rounds)
        for index, (table, spent) in runner.run(_run_chunk, jobs, order=largest_first):
            results[index] = table
            _add(seconds, jobs[index][0].method, spent)
            bar.update(jobs[index][0].num_rounds)
    bar.close()
    return [pd.concat([results[i] for i, slot in enumerate(slots) if slot[0] == sweep_index], ignore_index=True)
            for sweep_index in range(len(sweeps))]


def _add(seconds: Optional[dict[str, float]], method: str, spent: float) -> None:
    if seconds is not None:
        seconds[method] = seconds.get(method, 0.0) + spent


def run_sweep(
    specs: Sequence[SweepSpec],
    cells: Sequence[Cell],
    chunk_size: int = 256,
    workers: int = 1,
    ray_address: Optional[str] = None,
    progress: bool = True,
    runner: Optional[ChunkRunner] = None,
) -> pd.DataFrame:
    """Run every spec (method) on every cell; one row per (method, cell).

    Parameters
    ----------
    specs : sequence of SweepSpec
        The methods.
    cells : sequence of dict
        The cells, in output order.
    chunk_size : int
        Runs simulated together (memory ∝ chunk size).
    workers : int
        ``1``: in this process.  ``> 1``: chunks run in a local pool of ``workers`` processes.
    ray_address : str, optional
        An existing Ray cluster: chunks run as its tasks.
    progress : bool
        Show a progress bar of simulated rounds, with the method, the chunk and an ETA (stderr).
    runner : ChunkRunner, optional
        An open runner shared by several sweeps (then ``workers`` and ``ray_address`` are not used).

    Returns
    -------
    DataFrame
        Rows ordered by spec, then cell; identical whatever ``workers``.
    """
    return run_sweeps([(specs, cells, chunk_size)], workers, ray_address, progress, runner)[0]
