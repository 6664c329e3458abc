"""FedCAM in the batched simulator (the same client function as the Flower client)."""

from __future__ import annotations

from functools import partial
from typing import Optional, Sequence

import numpy as np

from fedroute.client.fedcam import combined_models, fedcam_client_round
from fedroute.client.settings import RoutingSettings
from fedroute.monitoring.telemetry import ClientReplies, node_id_array
from fedroute.simulation.simulator import BatchHistory, OnRound, SimulatedRound, changed_models, concatenate_clients
from fedroute.strategies.aggregation import hard_update, routing_masses
from fedroute.tasks.base import Task

__all__ = ["simulate_fedcam_batch"]


def simulate_fedcam_batch(
    tasks: Sequence[Task], settings: RoutingSettings, num_rounds: int, seeds: Sequence[int], detail: bool = False,
    on_round: Optional[OnRound] = None,
) -> BatchHistory:
    """Simulate FedCAM on ``R`` runs together.

    ``Θ_glob`` starts at zero (zero output), ``Θ_k`` at the task's initial
    cluster models.  The server averages ``Θ_glob`` over all clients and
    ``Θ_k`` over the clients assigned to ``k`` (sample weighted; an empty
    cluster keeps its model).  The recorded ``cluster_models`` are the
    *combined* predictors ``Θ_glob + Θ_k`` (what evaluation uses); the global
    part is in ``detail["global_models"]`` (T+1, R, P) and the final cluster
    parts in ``detail["cluster_parts"]`` (R, K, P).  ``seeds`` are unused
    (FedCAM draws nothing) but kept for the sweep interface.  ``on_round`` is
    called after every round as in :func:`~fedroute.simulation.simulator.simulate_batch`
    (``changed`` refers to the cluster parts, as in the FedCAM strategy).
    """
    del seeds
    num_runs, num_clusters = len(tasks), settings.num_clusters
    num_clients = tasks[0].num_clients
    clients = concatenate_clients([task.clients(np.arange(num_clients)) for task in tasks])
    run_of_client = np.repeat(np.arange(num_runs), num_clients)
    num_examples = clients.num_examples
    cluster_models = np.stack([task.initial_models(num_clusters) for task in tasks])
    global_models = np.zeros((num_runs, cluster_models.shape[-1]), dtype=cluster_models.dtype)
    combined, routes_record, masses_record, globals_record = [combined_models(global_models, cluster_models)], [], [], [
        global_models]
    for round_index in range(num_rounds):
        result = fedcam_client_round(clients, global_models[run_of_client], cluster_models[run_of_client], round_index)
        previous_parts = cluster_models
        cluster_models = hard_update(cluster_models, result.cluster_models, result.routes, num_examples, run_of_client)
        global_models = hard_update(global_models[:, None, :], result.global_models, np.zeros_like(result.routes),
                                    num_examples, run_of_client)[:, 0, :]
        combined.append(combined_models(global_models, cluster_models))
        globals_record.append(global_models)
        routes_record.append(result.routes.astype(np.int8 if num_clusters < 127 else np.int16)
                             .reshape(num_runs, num_clients))
        masses_record.append(routing_masses(result.routes, num_examples, num_clusters, run_of_client, num_runs))
        if on_round is not None:
            on_round(SimulatedRound(
                round_index, masses_record[-1], num_clients,
                replies=partial(_fedcam_replies, clients.client_ids, num_examples, result.losses, result.routes,
                                num_clusters),
                changed=partial(changed_models, cluster_models, previous_parts)))
    empty = np.zeros((num_rounds, num_runs, 0))
    return BatchHistory(
        cluster_models=np.stack(combined),
        routes=np.stack(routes_record),
        masses=np.stack(masses_record),
        mean_arm_probabilities=empty,
        arm_fractions=empty,
        entered=np.zeros((num_rounds, num_runs), dtype=np.int64),
        released=np.zeros((num_rounds, num_runs), dtype=np.int64),
        provisional_masses=None,
        groups=clients.groups.reshape(num_runs, num_clients),
        num_examples=num_examples.reshape(num_runs, num_clients),
        detail={"global_models": np.stack(globals_record), "cluster_parts": cluster_models} if detail else {},
    )


def _fedcam_replies(client_ids: np.ndarray, num_examples: np.ndarray, losses: np.ndarray, routes: np.ndarray,
                    num_clusters: int) -> ClientReplies:
    """A FedCAM round as the replies the FedCAM strategy validates (no controller, arm or feedback)."""
    count = len(routes)
    routes = np.asarray(routes, dtype=np.int64)
    return ClientReplies(
        client_ids=np.asarray(client_ids, dtype=np.int64), node_ids=node_id_array([None] * count),
        num_examples=np.asarray(num_examples, dtype=np.float64), routes=routes, losses=np.asarray(losses),
        route_distributions=(routes[:, None] == np.arange(num_clusters)).astype(np.float64),
        controllers=np.full(count, -1, dtype=np.int64), arms=np.full(count, -1, dtype=np.int64),
        feedback=np.full(count, np.nan), entered=np.zeros(count, dtype=bool), released=np.zeros(count, dtype=bool),
        rounds_played=np.full(count, -1, dtype=np.int64), exp3_weight_spread=np.zeros(count),
    )
