"""A whole run configuration in the batched simulator, recorded like a Flower run.

:func:`simulate_run` takes the same :class:`~fedroute.server.run_config.RunSettings`
as the ServerApp and writes the same run directory (``status.json``, the
telemetry tables, ``alarms.jsonl``, ``summary.json``; TensorBoard files when
enabled) through the same :class:`~fedroute.monitoring.recorder.RunRecorder`,
so ``fedroute monitor`` reads both alike and a test compares them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

from fedroute.core.evaluation import evaluation_metrics, task_metrics
from fedroute.core.methods import ALGORITHM_FEDCAM, ALGORITHM_LOCAL, REGISTRY, method_spec
from fedroute.core.participation import Participation
from fedroute.monitoring.alarms import task_starvation_basin
from fedroute.monitoring.recorder import RunRecorder
from fedroute.server.results import atomic_write_text, write_status
from fedroute.server.run_config import RunSettings
from fedroute.simulation.fedcam import simulate_fedcam_batch
from fedroute.simulation.simulator import recording, simulate, simulate_local
from fedroute.simulation.summary import run_summary

__all__ = ["simulate_run", "check_simulable", "record_evaluations", "FULL_PARTICIPATION_METHODS"]


def record_evaluations(recorder: RunRecorder, clients: Any, cluster_models: np.ndarray, every: int) -> None:
    """The evaluations during training of a simulated run (every client, after every ``every``-th round
    before the last), as the Flower strategy records them (``evaluation.csv``, TensorBoard, log).

    ``cluster_models`` is ``W^0 … W^T``, shape (T+1, K, P).
    """
    num_rounds = len(cluster_models) - 1
    for server_round in range(every, num_rounds, every) if every else ():
        models = cluster_models[server_round]
        recorder.evaluation(server_round, evaluation_metrics(
            {"test_loss": clients.losses(models, "test"), **task_metrics(clients, models)},
            clients.losses(models, "train"), clients.groups))


def _simulated_method(settings: RunSettings, method: str, clients: Any, recorder: RunRecorder) -> dict[str, Any]:
    """One method in the simulator, its rounds and evaluations during training recorded; its summary."""
    task, routing = settings.task, settings.routing[method]
    algorithm = method_spec(method).algorithm
    if algorithm == ALGORITHM_LOCAL:  # each client's own model: scored as a set of one model per client
        per_client = simulate_local(task, settings.num_rounds)[:, :, None, :]
        record_evaluations(recorder, clients, per_client, settings.evaluate_every)
        final = per_client[-1]
        return run_summary(final.mean(axis=0), clients.losses(final, "train"), clients.losses(final, "test"),
                           clients.groups, np.full((settings.num_rounds, 1), task.num_clients), None,
                           task_metrics(clients, final))
    if algorithm == ALGORITHM_FEDCAM:
        batch = simulate_fedcam_batch([task], routing, settings.num_rounds, [settings.seed],
                                      on_round=recording(recorder))
        final, routes = batch.cluster_models[-1, 0], batch.routes[:, 0].astype(np.int64)
    else:
        history = simulate(task, routing, settings.num_rounds, settings.seed, on_round=recording(recorder),
                           participation=Participation(settings.fraction_train, settings.min_train_nodes,
                                                       settings.report_memory),
                           influence=settings.influence)
        final, routes = history.cluster_models[-1], history.routes
        record_evaluations(recorder, clients, history.cluster_models, settings.evaluate_every)
    counts = np.stack([np.bincount(r[r >= 0], minlength=routing.num_clusters) for r in routes])
    return run_summary(final, clients.losses(final, "train"), clients.losses(final, "test"), clients.groups, counts,
                       getattr(task, "group_parameters", None), task_metrics(clients, final))


FULL_PARTICIPATION_METHODS = tuple(name for name, spec in REGISTRY.items() if spec.simulator_full_participation)
"""Methods whose simulator path has every client in every round."""


def check_simulable(settings: RunSettings) -> None:
    """``ValueError`` (naming the keys and the fix) for a run the simulator cannot replay."""
    full_only = [method for method in settings.methods if method in FULL_PARTICIPATION_METHODS]
    if settings.fraction_train < 1.0 and full_only:
        raise ValueError(f"fraction-train = {settings.fraction_train} with method {', '.join(full_only)}: the "
                         f"simulator runs {' and '.join(FULL_PARTICIPATION_METHODS)} with every client every round; "
                         "allowed: fraction-train = 1.0 for them (run them separately, or drop them from 'method')")


def simulate_run(settings: RunSettings, directory: Optional[Path] = None, progress: bool = False) -> dict[str, Any]:
    """Simulate every method of ``settings``; return the summaries (alarms included).

    Parameters
    ----------
    settings : RunSettings
        From :func:`~fedroute.server.run_config.parse_run_config` (``fraction_train < 1``:
        the round's clients are drawn from the seed, as in the Flower runtime).
    directory : Path, optional
        Write the run directory here.
    progress : bool
        Log progress lines (``settings.progress_interval``).

    Returns
    -------
    dict
        Method → summary (as in ``summary.json``).
    """
    task, methods = settings.task, list(settings.methods)
    check_simulable(settings)
    clients = task.clients(np.arange(task.num_clients))
    plan = {"methods": methods, "num_rounds": settings.num_rounds,
            "num_clusters": {method: settings.routing[method].num_clusters for method in methods}}
    summaries: dict[str, Any] = {}
    for method in methods:
        if directory is not None:
            write_status(directory, "running", **plan, current_method=method, completed=list(summaries))
        routing = settings.routing[method]
        recorder = RunRecorder(
            method, routing.num_clusters, routing.controllers, settings.num_rounds,
            alarm_settings=settings.alarm_settings,
            starvation_basin=task_starvation_basin(task, routing.num_clusters),
            telemetry_dir=directory,
            tensorboard_dir=directory / "tensorboard" / method if directory is not None and settings.tensorboard
            else None,
            progress_interval=settings.progress_interval if progress else None,
            random_ties=routing.tie_breaking == "random",
            table_width=max(other.num_clusters for other in settings.routing.values()))
        recorder.start()
        try:
            summaries[method] = _simulated_method(settings, method, clients, recorder)
            recorder.evaluation(settings.num_rounds, summaries[method]["evaluation_metrics"])
        finally:
            recorder.close()
        summaries[method].update(rounds=settings.num_rounds, **recorder.summary())
        if directory is not None:
            atomic_write_text(directory / "summary.json", json.dumps(summaries, indent=2))
    if directory is not None:
        write_status(directory, "finished", **plan, current_method=None, completed=list(summaries))
    return summaries
