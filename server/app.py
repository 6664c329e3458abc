"""The fedroute ServerApp: run config → strategy per method → results directory.

With ``method = "all"`` it runs Greedy IFCA, EXP3, synchronized entry and the
FedCAM baseline in turn on the same nodes (each with its own client-state namespace), prints a
per-method table and writes ``<results-dir>/<run-id>/``.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedroute import protocol
from fedroute.server.results import summary_table, write_results
from fedroute.server.run_config import RunSettings, parse_run_config
from fedroute.simulation.summary import run_summary
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.fedcam import FedCAM
from fedroute.strategies.records import array_record

__all__ = ["app", "run_method"]

logger = logging.getLogger("fedroute")
app = ServerApp()


def run_method(grid: Grid, settings: RunSettings, method: str) -> tuple[ClusteredRouting, dict[str, Any]]:
    """Run one method to the end; return its strategy (history, models) and summary."""
    routing = settings.routing[method]
    num_clients = settings.task.num_clients
    strategy_class = FedCAM if method == "fedcam" else ClusteredRouting
    strategy = strategy_class(
        routing,
        fraction_train=settings.fraction_train,
        min_train_nodes=min(settings.min_train_nodes, num_clients),
        min_available_nodes=num_clients,
        round_timeout=settings.round_timeout,
        seed=settings.seed,
        run_key=f"{method}-{settings.run_digest}",
        checkpoint_dir=None if settings.checkpoint_dir is None else settings.checkpoint_dir / method,
    )
    initial = settings.task.initial_models(routing.num_clusters)
    started = time.monotonic()
    strategy.start(grid, [array_record({"weights": model}) for model in initial], num_rounds=settings.num_rounds)
    wall = time.monotonic() - started
    evaluated = strategy.combined_models() if isinstance(strategy, FedCAM) else strategy.cluster_models
    final = np.stack([protocol.flatten_arrays(model) for model in evaluated])
    evaluation = strategy.final_evaluation
    route_counts = np.array([[row[f"routed_{k}"] for k in range(routing.num_clusters)] for row in strategy.history])
    summary = run_summary(
        final,
        np.stack([reply.train_losses for reply in evaluation]),
        np.stack([reply.test_losses for reply in evaluation]),
        np.array([reply.group for reply in evaluation]),
        route_counts,
        getattr(settings.task, "group_parameters", None),
    )
    rounds_run = settings.num_rounds - strategy.resumed_from_round
    summary.update(rounds=settings.num_rounds, resumed_from_round=strategy.resumed_from_round, wall_seconds=wall,
                   seconds_per_round=wall / max(rounds_run, 1),
                   rejected_replies=len(strategy.rejected), evaluated_clients=len(evaluation))
    return strategy, summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run every requested method and write the results directory."""
    settings = parse_run_config(context.run_config)
    summaries: dict[str, Any] = {}
    rounds, routes, models = [], [], {}
    for method in settings.methods:
        strategy, summary = run_method(grid, settings, method)
        summaries[method] = summary
        rounds.append(pd.DataFrame(strategy.history).assign(method=method))
        routes.extend({"method": method, "round_index": t, "client_id": client, "cluster": cluster}
                      for t, assignment in strategy.client_routes.items() for client, cluster in assignment.items())
        evaluated = strategy.combined_models() if isinstance(strategy, FedCAM) else strategy.cluster_models
        for cluster, model in enumerate(evaluated):
            models[f"{method}/{protocol.cluster_key(cluster)}"] = protocol.flatten_arrays(model)
    directory = settings.results_dir / str(context.run_id)
    config = {
        "run_id": context.run_id,
        "run_config": dict(context.run_config),
        "task": asdict(settings.task),
        "routing": {method: routing.to_dict() for method, routing in settings.routing.items()},
    }
    write_results(directory, config, pd.concat(rounds, ignore_index=True), summaries, models,
                  routes=pd.DataFrame(routes))
    table = summary_table(summaries)
    print(f"\n{table}\n\nresults: {directory}", flush=True)
    sys.stdout.flush()
