"""The fedroute ServerApp: run config → the federation's clients → strategy per method → results directory.

The number of clients is run-config ``num-clients``, or, with ``"auto"`` (the
default), the connected SuperNodes' ``num-partitions``
(:mod:`fedroute.server.federation`): plain ``flwr run .`` with Flower's
default federation of 2 simulated SuperNodes runs the main job with 2
clients.  A task that cannot run with that many (e.g. housing needs 4) stops
before round 1, naming the smallest federation that works and how to start it.
Every message tells the clients the chosen number, so that their data and the
server's agree.

With ``method = "all"`` it runs Greedy IFCA, EXP3, synchronized entry and the
FedCAM baseline (named in the list, also the references ``fedavg``, ``K = 1``, and ``local``,
:class:`~fedroute.strategies.local.LocalTraining`) in turn on the same nodes (each with its own client-state
namespace; the strategy class is ``STRATEGIES[method_spec(method).algorithm]``, the loop over the methods
:func:`~fedroute.core.method_loop.run_methods_in_turn`, shared with the simulator), prints a
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
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

import fedroute
from fedroute import protocol
from fedroute.atomic_files import atomic_write
from fedroute.core.fedcam import initial_global_model, task_uses_output_sum
from fedroute.core.method_loop import MethodPlan, run_methods_in_turn
from fedroute.core.methods import method_spec
from fedroute.monitoring.alarms import task_starvation_basin
from fedroute.monitoring.progress import ensure_console_handler
from fedroute.server.federation import Federation, FederationError, discover_federation, starting_hint
from fedroute.server.flower_exit import report_before_cleanup
from fedroute.server.results import summary_table, write_results, write_status
from fedroute.server.run_config import RunSettings, explicit_num_clients, parse_run_config, results_directory
from fedroute.tasks.registry import task_from_config
from fedroute.simulation.summary import run_summary
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.evaluation import evaluation_values
from fedroute.strategies.records import array_record
from fedroute.strategies.registry import STRATEGIES

__all__ = ["app", "make_strategy", "run_method", "federation_settings"]

logger = logging.getLogger("fedroute")
app = ServerApp()


def make_strategy(settings: RunSettings, method: str, directory: Path) -> ClusteredRouting:
    """The strategy of one method (``STRATEGIES[method_spec(method).algorithm]``), writing its telemetry
    (and TensorBoard files) into ``directory``."""
    spec, routing, num_clients = method_spec(method), settings.routing[method], settings.task.num_clients
    extra: dict[str, Any] = {}
    if spec.zero_output_start:  # Θ_glob^0: the task's zero-output start
        initial = settings.task.initial_models(routing.num_clusters)
        extra["initial_global_arrays"] = {"weights": initial_global_model(settings.task, initial)}
    if not spec.shared_models and settings.checkpoint_dir is not None:
        logger.warning("method %s keeps one model per client and does not checkpoint them: it restarts "
                       "from round 1 if the run is resumed", method)
    strategy = STRATEGIES[spec.algorithm](
        routing,
        **extra,
        fraction_train=settings.fraction_train,
        min_train_nodes=min(settings.min_train_nodes, num_clients),
        report_memory=settings.report_memory,
        min_available_nodes=num_clients,
        round_timeout=settings.round_timeout,
        node_wait_timeout=settings.node_wait_timeout,
        client_config={protocol.TASK_NUM_CLIENTS: num_clients},
        seed=settings.seed,
        run_key=f"{method}-{settings.run_digest}",
        checkpoint_dir=None if settings.checkpoint_dir is None or not spec.shared_models
        else settings.checkpoint_dir / method,
        label=method,
        telemetry_dir=directory,
        tensorboard_dir=directory / "tensorboard" / method if settings.tensorboard else None,
        alarm_settings=settings.alarm_settings,
        starvation_basin=task_starvation_basin(settings.task, routing.num_clusters),
        progress_interval=settings.progress_interval,
        influence=settings.influence,
        evaluate_every=settings.evaluate_every,
        fraction_evaluate=settings.fraction_evaluate,
        min_evaluate_nodes=min(settings.min_evaluate_nodes, num_clients),
    )
    strategy.telemetry_width = max(routing.num_clusters for routing in settings.routing.values())
    return strategy


def evaluated_models(strategy: ClusteredRouting, task: Any) -> list[dict[str, np.ndarray]]:
    """The final models a run reports (the algorithm's: the cluster models; under FedCAM the combined
    predictors ``Θ_glob + Θ_k`` in the additive form, the cluster parts in the output-sum form)."""
    return strategy.algorithm.reported_models(strategy.state, task_uses_output_sum(task))


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
    values, _ = evaluation_values(evaluation)
    summary = run_summary(
        final,
        np.stack([reply.train_losses for reply in evaluation]),
        np.stack([reply.test_losses for reply in evaluation]),
        np.array([reply.group for reply in evaluation]),
        route_counts,
        getattr(settings.task, "group_parameters", None) if method_spec(method).shared_models else None,  # R_T
        metric_values={name: table for name, table in values.items() if name != "test_loss"},
    )
    summary["evaluation"] = "complete" if len(evaluation) >= settings.task.num_clients else "partial"
    rounds_run = settings.num_rounds - strategy.resumed_from_round
    summary.update(rounds=settings.num_rounds, resumed_from_round=strategy.resumed_from_round, wall_seconds=wall,
                   seconds_per_round=wall / max(rounds_run, 1),
                   rejected_replies=strategy.rejections.total, evaluated_clients=len(evaluation))
    summary.update(strategy.recorder.summary() if strategy.recorder is not None else {})
    return summary


def _smallest_federation(run_config: dict[str, Any], num_nodes: int, tries: int = 1024) -> Optional[int]:
    """The smallest number of clients above ``num_nodes`` the task accepts (None if none within ``tries``)."""
    for candidate in range(num_nodes + 1, num_nodes + 1 + tries):
        try:
            task_from_config({**run_config, "num-clients": candidate})
        except ValueError:
            continue
        return candidate
    return None


def federation_settings(grid: Grid, run_config: dict[str, Any]) -> tuple[RunSettings, Federation]:
    """The run's settings with the number of clients the federation gives (:mod:`fedroute.server.federation`).

    The run config is validated in full first (a bad key fails before any waiting); with
    ``num-clients = "auto"`` the task is then built for the federation's size.

    Raises
    ------
    ValueError
        An invalid run config; :class:`~fedroute.server.federation.FederationError` when the nodes
        contradict each other or the task cannot run with as many clients as there are SuperNodes
        (naming the smallest federation that works and how to start it).
    """
    settings = parse_run_config(run_config)
    explicit = settings.task.num_clients if explicit_num_clients(run_config) else None
    federation = discover_federation(grid, explicit, settings.node_wait_timeout, settings.round_timeout)
    if explicit is not None:
        return settings, federation
    size = federation.num_clients
    try:
        return parse_run_config({**run_config, "num-clients": size}), federation
    except ValueError as error:
        if "'num-clients'" not in str(error):
            raise
        smallest = _smallest_federation(run_config, size)
        advice = (f"start at least {smallest} SuperNodes ({starting_hint(smallest)})" if smallest is not None
                  else "start more SuperNodes")
        raise FederationError(f"the federation has {size} SuperNodes, so the run has {size} clients (run-config "
                              f"num-clients = \"auto\" follows the SuperNodes' num-partitions), but {error}; "
                              f"{advice}") from None


def _record_method(method: str, strategy: ClusteredRouting, settings: RunSettings,
                   routes: list[dict[str, Any]], models: dict[str, np.ndarray]) -> None:
    """Add one finished method's routes and final models (and the algorithm's further models: FedCAM's
    ``Θ_glob`` in the output-sum form, Local's per-client models) to the run's tables."""
    routes.extend({"method": method, "round_index": t, "client_id": client, "cluster": cluster}
                  for t, assignment in strategy.client_routes.items() for client, cluster in assignment.items())
    for cluster, model in enumerate(evaluated_models(strategy, settings.task)):
        models[f"{method}/{protocol.cluster_key(cluster)}"] = protocol.flatten_arrays(model)
    output_sum = task_uses_output_sum(settings.task)
    for name, model in strategy.algorithm.extra_models(strategy.state, output_sum).items():
        models[f"{method}/{name}"] = protocol.flatten_arrays(model)


def _save_round_models(directory: Path, method: str, kept: dict[int, list[np.ndarray]],
                       per_round: dict[str, np.ndarray]) -> None:
    """``round_models.npz``: <method>/server_round (m,), <method>/cluster_models (m, K, P)."""
    per_round[f"{method}/server_round"] = np.array(sorted(kept), dtype=np.int64)
    per_round[f"{method}/cluster_models"] = np.stack([np.stack(kept[t]) for t in sorted(kept)])
    atomic_write(directory / "round_models.npz", lambda stream: np.savez(stream, **per_round))


def run_methods(grid: Grid, settings: RunSettings, directory: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Run every method in turn (:func:`~fedroute.core.method_loop.run_methods_in_turn`), writing the results
    directory as each one ends; return the summaries.

    A method that raises is recorded (``summary.json``, ``status.json`` ``failed``) and the error re-raised."""
    plan = MethodPlan.of(settings)
    routes: list[dict[str, Any]] = []
    models: dict[str, np.ndarray] = {}
    per_round: dict[str, np.ndarray] = {}
    strategies: dict[str, ClusteredRouting] = {}
    kept: dict[str, dict[int, list[np.ndarray]]] = {}

    def run(method: str) -> dict[str, Any]:
        logger.info("method %d/%d: %s, %d rounds", plan.methods.index(method) + 1, len(plan.methods), method,
                    settings.num_rounds)
        strategies[method] = make_strategy(settings, method, directory)
        kept[method] = {}
        return run_method(grid, settings, method, strategies[method], kept[method] if settings.save_round_models
                          else None)

    def done(method: str, summaries: dict[str, Any]) -> None:
        _record_method(method, strategies[method], settings, routes, models)
        write_results(directory, config, None, summaries, models, routes=pd.DataFrame(routes))
        if settings.save_round_models:
            _save_round_models(directory, method, kept[method], per_round)

    def failed(method: str, error: Exception, summaries: dict[str, Any]) -> dict[str, Any]:
        if method not in strategies:  # no strategy made (bad settings): nothing of the method to record
            raise error
        strategy = strategies[method]
        summary = {"error": f"{type(error).__name__}: {error}",
                   **(strategy.recorder.summary() if strategy.recorder is not None else {})}
        write_results(directory, config, None, {**summaries, method: summary}, models, routes=pd.DataFrame(routes))
        logger.error("run failed in method %s: %s: %s", method, type(error).__name__, error)
        return summary

    write_results(directory, config, None, {}, models)
    return run_methods_in_turn(plan, run, done, partial(write_status, directory), failed)


def _fail_early(directory: Path, run_config: dict[str, Any], error: Exception) -> None:
    """A run that cannot start (invalid run config, unfit federation): ``status.json`` says why, the log too."""
    try:
        write_status(directory, "failed", methods=[], num_rounds=0, num_clusters={}, current_method=None,
                     completed=[], error=f"{type(error).__name__}: {error}")
    except OSError:  # e.g. an unwritable results-dir: the log line below still says why
        pass
    logger.error("run failed before round 1: %s", error)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Find the federation's clients, run every requested method and write the results directory."""
    ensure_console_handler(logger)
    report_before_cleanup()  # Flower 1.42 would delete a per-run environment before reporting the outcome
    run_config = dict(context.run_config)
    directory = results_directory(run_config) / str(context.run_id)
    try:
        settings, federation = federation_settings(grid, run_config)
    except ValueError as error:
        _fail_early(directory, run_config, error)
        raise
    config = {
        "run_id": context.run_id,
        "run_config": run_config,
        "federation": federation.to_dict(),
        "app_files": str(Path(fedroute.__file__).resolve().parent),  # the FAB's, or an installed fedroute's
        "python": sys.executable,
        "task": asdict(settings.task),
        "routing": {method: routing.to_dict() for method, routing in settings.routing.items()},
        "influence": settings.influence.to_dict(),
    }
    logger.info("results: %s (follow it with: fedroute monitor %s)", directory, directory)
    summaries = run_methods(grid, settings, directory, config)
    print(f"\n{summary_table(summaries)}\n\nresults: {directory}", flush=True)
    sys.stdout.flush()
