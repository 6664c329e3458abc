"""Where a sweep's chunks run: in this process, in a local pool of processes, or on a Ray cluster.

A :class:`ChunkRunner` is opened once for all of an experiment's sweeps (the
pool's processes start once, import once and stay warm) and runs *jobs*
(module-level functions with picklable arguments) to completion, yielding
each result as it finishes.  Which one runs a job never changes its result:
a run's draws depend only on its own seed, client, round and purpose.

* ``workers = 1`` and no Ray address: nothing is started; the caller runs the
  jobs itself (with per-round progress).
* ``workers > 1``: a local pool of ``workers`` processes (``spawn``: no
  state is inherited, each worker imports what its jobs need), each with
  **one** thread for OpenMP, BLAS and torch, unless ``OMP_NUM_THREADS`` /
  ``OPENBLAS_NUM_THREADS`` / ``MKL_NUM_THREADS`` say otherwise: one process per
  CPU, as Ray gives its workers, so that the workers do not oversubscribe the
  cores (the torch kernels of :mod:`fedroute.tasks.characters` keep one thread
  in one process for the same reason, measured there).
* ``ray_address``: tasks of the existing Ray cluster there (its CPUs, however
  many machines), whatever ``workers`` says.

:func:`resolve_workers` turns the command line's ``auto`` (the default) into a
number: the CPUs this process may use where a pool pays, else one — for
``--quick`` (a pool's start-up, ≈ 3 s per worker importing torch, costs more
than the small version's seconds) and for an experiment whose chunks share
work cached per process (``Experiment.auto_workers = False``: GMM).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from fedroute.core.validation import invalid

__all__ = ["AUTO", "ChunkRunner", "resolve_workers", "usable_cpus"]

AUTO = "auto"
"""``--workers auto``: the CPUs this process may use (one for ``--quick``)."""


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def resolve_workers(workers: Union[int, str, None], quick: bool = False, pool_pays: bool = True) -> int:
    """``workers`` as a number ≥ 1: ``auto``/``None`` → :func:`usable_cpus`, or 1 with ``quick`` or
    without ``pool_pays`` (an experiment whose chunks share work cached per process); a number is kept.

    Raises
    ------
    ValueError
        ``workers`` is neither ``auto`` nor an integer ≥ 1 (the message names the field).
    """
    if workers is None or workers == AUTO:
        return 1 if quick or not pool_pays else usable_cpus()
    try:
        count = int(workers)
        if isinstance(workers, bool) or str(count) != str(workers).strip():
            raise ValueError
    except (TypeError, ValueError):
        raise invalid("workers", workers, f"{AUTO!r} or an integer ≥ 1") from None
    if count < 1:
        raise invalid("workers", workers, f"{AUTO!r} or an integer ≥ 1")
    return count


_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _one_thread_per_worker() -> None:
    """A pool worker's initializer: one OpenMP/BLAS/torch thread unless the environment sets a count."""
    if any(os.environ.get(key) for key in _THREAD_VARIABLES):
        return
    for key in _THREAD_VARIABLES:  # libraries loaded from now on (torch reads OMP_NUM_THREADS)
        os.environ[key] = "1"
    try:  # libraries the worker's bootstrap already loaded (numpy's BLAS when __main__ imports numpy)
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - comes with scikit-learn
        return
    threadpool_limits(limits=1)


class ChunkRunner:
    """A context that runs jobs in a local process pool or on a Ray cluster (module docstring).

    Parameters
    ----------
    workers : int
        Processes of the local pool (``1``: :attr:`parallel` is false, nothing starts).
    ray_address : str, optional
        An existing Ray cluster; its tasks run the jobs.
    """

    def __init__(self, workers: int = 1, ray_address: Optional[str] = None) -> None:
        self.workers = resolve_workers(workers)
        self.ray_address = ray_address
        self._pool: Optional[ProcessPoolExecutor] = None
        self._ray_started = False
        self._open = False

    @property
    def parallel(self) -> bool:
        """Whether jobs leave this process."""
        return self.ray_address is not None or self.workers > 1

    @property
    def kind(self) -> str:
        """``"in-process"``, ``"processes"`` or ``"ray"``."""
        return "ray" if self.ray_address is not None else "processes" if self.workers > 1 else "in-process"

    def __enter__(self) -> "ChunkRunner":
        if self.ray_address is not None:
            import ray

            if not ray.is_initialized():
                ray.init(address=self.ray_address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
                self._ray_started = True
        elif self.workers > 1:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_one_thread_per_worker)
        self._open = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._open = False
        if self._pool is not None:
            failed = exc_info[0] is not None
            self._pool.shutdown(wait=not failed, cancel_futures=True)
            self._pool = None
        if self._ray_started:
            import ray

            ray.shutdown()
            self._ray_started = False

    def run(self, function: Callable[..., Any], jobs: Sequence[tuple[Any, ...]],
            order: Optional[Sequence[int]] = None) -> Iterator[tuple[int, Any]]:
        """Run ``function(*job)`` for every job; yield ``(job index, result)`` as each finishes.

        ``order`` is the order of submission (e.g. largest first, for balance); by default the jobs'.
        A job's exception is raised here (the remaining jobs are cancelled when the context closes).
        """
        if not self._open:
            raise RuntimeError("ChunkRunner.run needs the runner open: use `with ChunkRunner(...) as runner:`")
        order = list(range(len(jobs))) if order is None else list(order)
        if not self.parallel:
            for index in order:
                yield index, function(*jobs[index])
        elif self._pool is not None:
            pending: dict[Future, int] = {self._pool.submit(function, *jobs[index]): index for index in order}
            while pending:
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for future in done:
                    try:
                        result = future.result()
                    except BrokenProcessPool as error:
                        raise RuntimeError(
                            "a worker process of the local pool died before finishing its chunk (out of memory, "
                            "killed, or started from a script whose top level runs the experiment again: the pool "
                            "uses 'spawn', so such a script needs `if __name__ == \"__main__\":`); run with "
                            "workers=1 (--workers 1) to see the error in this process") from error
                    yield pending.pop(future), result
        else:
            import ray

            remote = ray.remote(function)
            references = {remote.remote(*jobs[index]): index for index in order}
            while references:
                done, _ = ray.wait(list(references), num_returns=1)
                for reference in done:
                    yield references.pop(reference), ray.get(reference)
