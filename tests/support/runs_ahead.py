"""Real Flower runs of a module started ahead of the tests that read them, a few at a time.

A Ray simulation keeps about one of two cores busy (its start-up is mostly one process at a time: ``flwr``,
the local SuperLink, the SuperExec's polls, the ServerApp), and a deployment far less (its SuperNodes and
ServerApp poll every 3 s, and a round waits for its slowest reply or its timeout).  Run one after the other
they leave the machine half idle; two at a time they share it.  Each run keeps its own ``FLWR_HOME``, ports
(:func:`~fedroute.deployment.processes.free_port` is safe across threads) and private Ray.

A module fixture makes a :class:`RunsAhead`, starts the runs that its selected tests read
(:func:`module_items`; a run no selected test reads is not started) and closes it at the end of the module.
A test takes its run's result with :meth:`RunsAhead.result`: what the run raised (a failed assertion about
the run, ``pytest.fail``) is raised there, in the test.  Runs start only while the module's tests run, so
every process starts while a test marked ``process`` runs (:mod:`support.process_guard`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest


def module_items(request: pytest.FixtureRequest) -> list[pytest.Item]:
    """The session's selected tests of the module whose fixture asks (in the order they run)."""
    return [item for item in request.session.items if getattr(item, "module", None) is request.module]


class RunsAhead:
    """Named runs in background threads, at most ``workers`` at a time, in the order they were started."""

    def __init__(self, workers: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fedroute-run-ahead")
        self._runs: dict[Hashable, Future] = {}

    def __contains__(self, name: Hashable) -> bool:
        return name in self._runs

    def start(self, name: Hashable, function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue ``function(*args, **kwargs)`` as run ``name`` (once: a started name is kept)."""
        if name not in self._runs:
            self._runs[name] = self._pool.submit(function, *args, **kwargs)

    def result(self, name: Hashable) -> Any:
        """Run ``name``'s result once it is done (what it raised, raised here)."""
        return self._runs[name].result()

    def close(self) -> None:
        """Drop the runs not started yet; wait for the others (each stops itself at its timeout)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
