"""One loop over a run's methods, shared by the Flower ServerApp and the batched simulator's recorded runs.

Both runtimes run the methods of one run configuration in turn with the same plan (the methods, the
rounds, each method's ``K``) and report the same ``status.json`` states: ``running`` (naming the current
method and the completed ones) before each method, ``finished`` after the last, and, where the runtime
records failures, ``failed`` naming the method and the error.  :func:`run_methods_in_turn` is that loop;
what a method runs and what is written after it are the caller's (``fedroute.server.app.run_methods``,
``fedroute.simulation.recorded.simulate_run``).  Neither Flower nor torch is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

__all__ = ["MethodPlan", "StatusWriter", "run_methods_in_turn"]


class StatusWriter(Protocol):
    """Writes ``status.json``: ``status(state, **fields)`` (``fedroute.server.results.write_status`` bound to
    a directory)."""

    def __call__(self, state: str, **fields: Any) -> None: ...


@dataclass(frozen=True)
class MethodPlan:
    """What a run will do: its methods in order, the rounds, each method's ``K``."""

    methods: tuple[str, ...]
    num_rounds: int
    num_clusters: dict[str, int]

    @classmethod
    def of(cls, settings: Any) -> "MethodPlan":
        """The plan of a :class:`~fedroute.server.run_config.RunSettings` (``methods``, ``num_rounds``,
        ``routing``)."""
        methods = tuple(settings.methods)
        return cls(methods, settings.num_rounds, {method: settings.routing[method].num_clusters for method in methods})

    def fields(self) -> dict[str, Any]:
        """The plan's ``status.json`` fields."""
        return {"methods": list(self.methods), "num_rounds": self.num_rounds, "num_clusters": dict(self.num_clusters)}


def run_methods_in_turn(plan: MethodPlan, run: Callable[[str], dict[str, Any]],
                        done: Callable[[str, dict[str, Any]], None], status: Optional[StatusWriter] = None,
                        failed: Optional[Callable[[str, Exception, dict[str, Any]], dict[str, Any]]] = None
                        ) -> dict[str, Any]:
    """Run every method of ``plan`` in turn; return method → summary.

    Parameters
    ----------
    plan : MethodPlan
    run : callable
        ``run(method) -> summary``: runs one method to the end.
    done : callable
        ``done(method, summaries)`` after a method ended (e.g. write its results).
    status : StatusWriter, optional
        Writes ``status.json`` before each method and after the last (``None``: no status file).
    failed : callable, optional
        ``failed(method, error, summaries) -> summary`` for a method that raised (``summaries``: the
        completed methods'): its summary (with ``"error"``), which the callback may write; then
        ``status.json`` says ``failed``.  ``None``: the error just propagates.
        Either way the error is re-raised.
    """
    summaries: dict[str, Any] = {}
    for method in plan.methods:
        if status is not None:
            status("running", **plan.fields(), current_method=method, completed=list(summaries))
        try:
            summaries[method] = run(method)
        except Exception as error:
            if failed is not None:
                summaries[method] = failed(method, error, summaries)
                if status is not None:
                    status("failed", **plan.fields(), current_method=method, completed=list(summaries)[:-1],
                           error=summaries[method]["error"])
            raise
        done(method, summaries)
    if status is not None:
        status("finished", **plan.fields(), current_method=None, completed=list(summaries))
    return summaries
