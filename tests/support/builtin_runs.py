"""A run of ClusteredRouting with the built-in ClientApp on in-process nodes with random 64-bit ids."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedroute.server.run_config import parse_run_config
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.records import array_record
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
