"""Sweeps: many independent runs, batched per chunk, chunks in-process or as Ray tasks.

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
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import pandas as pd

from fedroute.client.settings import RoutingSettings
from fedroute.simulation.simulator import BatchHistory, simulate_batch
from fedroute.tasks.base import Task

__all__ = ["SweepSpec", "run_sweep", "chunked"]

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


def _run_chunk(spec: SweepSpec, cells: list[Cell], on_round: Optional[Callable[[Any], None]] = None) -> pd.DataFrame:
    tasks = [spec.make_task(cell) for cell in cells]
    seeds = [int(cell[spec.seed_key]) for cell in cells]
    history = spec.simulate(tasks, spec.settings, spec.num_rounds, seeds,
                            **({} if on_round is None else {"on_round": on_round}))
    table = spec.reduce(history, tasks, cells)
    table.insert(0, "method", spec.method)
    return table


def run_sweep(
    specs: Sequence[SweepSpec],
    cells: Sequence[Cell],
    chunk_size: int = 256,
    workers: int = 1,
    ray_address: Optional[str] = None,
    progress: bool = True,
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
        ``1``: in this process.  ``> 1`` (or ``ray_address``): chunks are Ray
        tasks on a local Ray with ``workers`` CPUs, or on the cluster at
        ``ray_address``.
    ray_address : str, optional
        An existing Ray cluster.
    progress : bool
        Show a progress bar of simulated rounds, with the method, the chunk and an ETA (stderr).

    Returns
    -------
    DataFrame
        Rows ordered by spec, then cell; identical whatever ``workers``.
    """
    from tqdm.auto import tqdm

    jobs = [(spec, chunk) for spec in specs for chunk in chunked(cells, chunk_size)]
    # The bar counts simulated rounds (every run of a chunk advances together) and names the method
    # and chunk; tqdm shows the ETA.  Ray workers report whole chunks.
    bar = tqdm(total=sum(spec.num_rounds for spec, _ in jobs), unit="round", disable=not progress, file=sys.stderr,
               desc=f"{'+'.join(dict.fromkeys(spec.method for spec in specs))}")
    results: list[Optional[pd.DataFrame]] = [None] * len(jobs)
    if workers <= 1 and ray_address is None:
        for index, (spec, chunk) in enumerate(jobs):
            bar.set_description(f"{spec.method}, chunk {index + 1}/{len(jobs)} ({len(chunk)} runs)", refresh=False)
            results[index] = _run_chunk(spec, chunk, (lambda _: bar.update(1)) if progress else None)
    else:
        import ray

        started_here = not ray.is_initialized()
        if started_here:
            ray.init(address=ray_address, num_cpus=None if ray_address else workers, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        remote_chunk = ray.remote(_run_chunk)
        pending = {remote_chunk.remote(spec, chunk): index for index, (spec, chunk) in enumerate(jobs)}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for reference in done:
                    index = pending.pop(reference)
                    results[index] = ray.get(reference)
                    bar.update(jobs[index][0].num_rounds)
        finally:
            if started_here:
                ray.shutdown()
    bar.close()
    return pd.concat(results, ignore_index=True)
