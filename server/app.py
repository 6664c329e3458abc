"""The fedroute ServerApp: run config → strategy per method → results directory.

With ``method = "all"`` it runs Greedy IFCA, EXP3, synchronized entry and the
FedCAM baseline in turn on the same nodes (each with its own client-state namespace), prints a
per-method table and writes ``<results-dir>/<run-id>/``: ``config.json`` and
``status.json`` at once, the telemetry tables and alarm events round by round,
``summary.json``, the final models and routes as soon as each method ends
(each file atomically).  A run that fails records the error and its alarms in
``summary.json`` and ``status.json`` and stops with the error (Flower then
reports the run failed, and ``fedroute flower`` / ``deploy`` exit non-zero):
among others a dead federation — no valid training reply in ``dead-rounds``
rounds in a row, or in any round of a shorter run — and a final evaluation
without a valid reply (:class:`~fedroute.monitoring.alarms.DeadFederation`).
With ``save-round-models = true`` it also
writes ``round_models.npz``: every method's models after every round (for short
runs and runtime-equivalence checks).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedroute import protocol
from fedroute.atomic_files import atomic_write
from fedroute.core.fedcam import initial_global_model, task_uses_output_sum
from fedroute.monitoring.alarms import task_starvation_basin
from fedroute.monitoring.progress import ensure_console_handler
from fedroute.server.results import summary_table, write_results, write_status
from fedroute.server.run_config import RunSettings, parse_run_config
from fedroute.simulation.summary import run_summary
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.fedcam import FedCAM
from fedroute.strategies.records import array_record

__all__ = ["app", "make_strategy", "run_method"]

logger = logging.getLogger("fedroute")
app = ServerApp()


def make_strategy(settings: RunSettings, method: str, directory: Path) -> ClusteredRouting:
    """The strategy of one method, writing its telemetry (and TensorBoard files) into ``directory``."""
    routing = settings.routing[method]
    num_clients = settings.task.num_clients
    fedcam: dict[str, Any] = {}
    if method == "fedcam":  # Θ_glob^0: the task's zero-output start
        initial = settings.task.initial_models(routing.num_clusters)
        fedcam["initial_global_arrays"] = {"weights": initial_global_model(settings.task, initial)}
    strategy_class = FedCAM if method == "fedcam" else ClusteredRouting
    return strategy_class(
        routing,
        **fedcam,
        fraction_train=settings.fraction_train,
        min_train_nodes=min(settings.min_train_nodes, num_clients),
        report_memory=settings.report_memory,
        min_available_nodes=num_clients,
        round_timeout=settings.round_timeout,
        seed=settings.seed,
        run_key=f"{method}-{settings.run_digest}",
        checkpoint_dir=None if settings.checkpoint_dir is None else settings.checkpoint_dir / method,
        label=method,
        telemetry_dir=directory,
        tensorboard_dir=directory / "tensorboard" / method if settings.tensorboard else None,
        alarm_settings=settings.alarm_settings,
        starvation_basin=task_starvation_basin(settings.task, routing.num_clusters),
        progress_interval=settings.progress_interval,
        influence=settings.influence,
    )


def evaluated_models(strategy: ClusteredRouting, task: Any) -> list[dict[str, np.ndarray]]:
    """The final models a run reports: the cluster models; under FedCAM the combined predictors
    ``Θ_glob + Θ_k`` (additive form) or the cluster parts (output-sum form, written beside ``Θ_glob``)."""
    if isinstance(strategy, FedCAM) and not task_uses_output_sum(task):
        return strategy.combined_models()
    return strategy.cluster_models


def _keep_round_models(store: dict[int, list[np.ndarray]], strategy: ClusteredRouting,
                       task: Any) -> Callable[[int, ArrayRecord], None]:
    """An ``evaluate_fn`` for ``Strategy.start`` that keeps, per server round, the models the run reports
    (:func:`evaluated_models`: the cluster models; FedCAM's combined predictors in the additive form), flat.

    ``Strategy.start`` calls it once per cluster at round 0 and after every round; the first call of a
    round takes all ``K`` models.
    """

    def keep(server_round: int, arrays: ArrayRecord) -> None:
        if server_round not in store:
            store[server_round] = [protocol.flatten_arrays(model) for model in evaluated_models(strategy, task)]

    return keep


def run_method(grid: Grid, settings: RunSettings, method: str, strategy: ClusteredRouting,
               round_models: Optional[dict[int, list[np.ndarray]]] = None) -> dict[str, Any]:
    """Run one method to the end with ``strategy`` (:func:`make_strategy`); return its summary.

    With ``round_models`` (a dict), server round → the ``K`` models evaluated after that round
    (``0``: ``W^0``, unless the run resumed from a checkpoint) is collected into it.
    """
    routing = settings.routing[method]
    initial = settings.task.initial_models(routing.num_clusters)
    started = time.monotonic()
    strategy.start(grid, [array_record({"weights": model}) for model in initial], num_rounds=settings.num_rounds,
                   evaluate_fn=None if round_models is None else _keep_round_models(round_models, strategy,
                                                                                       settings.task))
    wall = time.monotonic() - started
    final = protocol.stack_flat(evaluated_models(strategy, settings.task))
    evaluation = strategy.final_evaluation
    route_counts = np.array([[row[f"routed_{k}"] for k in range(routing.num_clusters)] for row in strategy.history])
    # start() raised DeadFederation if the final evaluation brought no valid reply
    summary = run_summary(
        final,
        np.stack([reply.train_losses for reply in evaluation]),
        np.stack([reply.test_losses for reply in evaluation]),
        np.array([reply.group for reply in evaluation]),
        route_counts,
        getattr(settings.task, "group_parameters", None),
    )
    summary["evaluation"] = "complete" if len(evaluation) >= settings.task.num_clients else "partial"
    rounds_run = settings.num_rounds - strategy.resumed_from_round
    summary.update(rounds=settings.num_rounds, resumed_from_round=strategy.resumed_from_round, wall_seconds=wall,
                   seconds_per_round=wall / max(rounds_run, 1),
                   rejected_replies=strategy.rejections.total, evaluated_clients=len(evaluation))
    summary.update(strategy.recorder.summary() if strategy.recorder is not None else {})
    return summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run every requested method and write the results directory as each one ends."""
    ensure_console_handler(logger)
    settings = parse_run_config(context.run_config)
    directory = settings.results_dir / str(context.run_id)
    config = {
        "run_id": context.run_id,
        "run_config": dict(context.run_config),
        "task": asdict(settings.task),
        "routing": {method: routing.to_dict() for method, routing in settings.routing.items()},
        "influence": settings.influence.to_dict(),
    }
    methods = list(settings.methods)
    plan = {"methods": methods, "num_rounds": settings.num_rounds,
            "num_clusters": {method: settings.routing[method].num_clusters for method in methods}}
    summaries: dict[str, Any] = {}
    routes: list[dict[str, Any]] = []
    models: dict[str, np.ndarray] = {}
    per_round: dict[str, np.ndarray] = {}
    write_results(directory, config, None, summaries, models)
    write_status(directory, "running", **plan, current_method=methods[0], completed=[])
    logger.info("results: %s (follow it with: fedroute monitor %s)", directory, directory)
    for index, method in enumerate(methods, start=1):
        write_status(directory, "running", **plan, current_method=method, completed=list(summaries))
        logger.info("method %d/%d: %s, %d rounds", index, len(methods), method, settings.num_rounds)
        strategy = make_strategy(settings, method, directory)
        kept: Optional[dict[int, list[np.ndarray]]] = {} if settings.save_round_models else None
        try:
            summaries[method] = run_method(grid, settings, method, strategy, kept)
        except Exception as error:
            summaries[method] = {"error": f"{type(error).__name__}: {error}",
                                 **(strategy.recorder.summary() if strategy.recorder is not None else {})}
            write_results(directory, config, None, summaries, models, routes=pd.DataFrame(routes))
            write_status(directory, "failed", **plan, current_method=method, completed=list(summaries)[:-1],
                         error=summaries[method]["error"])
            logger.error("run failed in method %s: %s: %s", method, type(error).__name__, error)
            raise
        routes.extend({"method": method, "round_index": t, "client_id": client, "cluster": cluster}
                      for t, assignment in strategy.client_routes.items() for client, cluster in assignment.items())
        for cluster, model in enumerate(evaluated_models(strategy, settings.task)):
            models[f"{method}/{protocol.cluster_key(cluster)}"] = protocol.flatten_arrays(model)
        if isinstance(strategy, FedCAM) and task_uses_output_sum(settings.task):
            models[f"{method}/{protocol.GLOBAL_MODEL}"] = protocol.flatten_arrays(strategy.global_model)
        write_results(directory, config, None, summaries, models, routes=pd.DataFrame(routes))
        if kept is not None:  # <method>/server_round (m,), <method>/cluster_models (m, K, P)
            per_round[f"{method}/server_round"] = np.array(sorted(kept), dtype=np.int64)
            per_round[f"{method}/cluster_models"] = np.stack([np.stack(kept[t]) for t in sorted(kept)])
            atomic_write(directory / "round_models.npz", lambda stream: np.savez(stream, **per_round))
    write_status(directory, "finished", **plan, current_method=None, completed=list(summaries))
    table = summary_table(summaries)
    print(f"\n{table}\n\nresults: {directory}", flush=True)
    sys.stdout.flush()
