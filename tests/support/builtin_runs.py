"""A run of ClusteredRouting with the built-in ClientApp on in-process nodes with random 64-bit ids."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedroute.core.participation import Participation
from fedroute.server.run_config import RunSettings, parse_run_config
from fedroute.simulation.simulator import RunHistory, simulate
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.records import array_record
from support.app_config import app_run_config
from support.grid import InProcessGrid, builtin_handlers


def builtin_nodes(run_config: Mapping[str, Any], num_nodes: int, node_seed: int,
                  query_handler: bool = True) -> InProcessGrid:
    """The built-in ClientApp on ``num_nodes`` nodes whose ids Flower would draw (random 64-bit, from ``node_seed``)."""
    from flwr.app import MessageType

    handlers = builtin_handlers()
    if not query_handler:
        del handlers[MessageType.QUERY]
    node_ids = np.random.default_rng(node_seed).integers(1, 2**62, size=num_nodes)
    return InProcessGrid(handlers, num_nodes, dict(run_config), node_ids=node_ids)


def builtin_run(run_config: Mapping[str, Any], method: str, grid: InProcessGrid, fraction: float,
                num_models: int) -> ClusteredRouting:
    """``method`` of the run config started on ``grid`` from ``num_models`` of the task's initial models
    (every node needed at the start, ``min_train_nodes = 2``, no final evaluation)."""
    settings = parse_run_config(run_config)
    strategy = ClusteredRouting(settings.routing[method], fraction_train=fraction, min_train_nodes=2,
                                min_available_nodes=settings.task.num_clients, seed=settings.seed,
                                progress_interval=None, evaluate_at_end=False, run_key=method)
    strategy.start(grid, [array_record({"weights": m}) for m in settings.task.initial_models(num_models)],
                   num_rounds=settings.num_rounds)
    return strategy


def boundaries_in_both_runtimes(seed: int, fraction: float, num_clusters: int, rounds: int
                                ) -> tuple[RunSettings, ClusteredRouting, RunHistory]:
    """The generic default (``exp3``) on the boundaries task (15 clients, random start, collapse patience 2) in
    Flower (in-process nodes) and in the simulator: the run settings, the strategy after its run, the history.
    The caller compares them round for round (routes of the clients that played, final models)."""
    run_config = app_run_config({"task": "boundaries", "num-clients": 15, "num-server-rounds": rounds, "seed": seed,
                                 "fraction-train": fraction, "preset": "generic", "init": "random",
                                 "num-clusters": num_clusters, "method": "exp3", "collapse-patience": 2})
    settings = parse_run_config(run_config)
    strategy = builtin_run(run_config, "exp3", builtin_nodes(run_config, 15, node_seed=3), fraction,
                           num_models=num_clusters)
    history = simulate(settings.task, settings.routing["exp3"], rounds, seed, participation=Participation(fraction, 2))
    return settings, strategy, history
