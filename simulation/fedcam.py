"""FedCAM in the batched simulator (the same client function as the Flower client).

What a FedCAM history records as the "cluster models" ``W^t`` depends on the form
(:mod:`fedroute.core.fedcam`):

* additive form: the combined predictors ``Θ_glob + Θ_k`` (``(K, P)`` per run, so
  every metric of a routing method applies unchanged);
* output-sum form: the *pairs* ``[Θ_glob | Θ_k]`` (``(K, 2P)`` per run).  Score them
  with :class:`FedCAMTask` / :class:`FedCAMClients`, whose ``losses`` of a pair is
  the loss of ``h(x; Θ_glob) + f(x; Θ_k)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Optional, Sequence

import numpy as np
from numpy.typing import NDArray

from fedroute.core.fedcam import combined_models, fedcam_client_round, fedcam_losses, initial_global_model, \
    uses_output_sum
from fedroute.core.settings import RoutingSettings
from fedroute.monitoring.telemetry import ClientReplies, node_id_array
from fedroute.simulation.simulator import BatchHistory, OnRound, SimulatedRound, changed_models, concatenate_clients, \
    kept_model_rounds
from fedroute.core.aggregation import hard_update, routing_masses
from fedroute.core.task import ClientBatch, Task

__all__ = ["FedCAMClients", "FedCAMTask", "fedcam_pairs", "simulate_fedcam_batch"]


def fedcam_pairs(global_models: NDArray[np.floating], cluster_models: NDArray[np.floating]) -> NDArray[np.floating]:
    """``[Θ_glob | Θ_k]`` for every cluster: ``(..., P)`` and ``(..., K, P)`` → ``(..., K, 2P)``."""
    repeated = np.broadcast_to(np.asarray(global_models)[..., None, :], cluster_models.shape)
    return np.concatenate([repeated, cluster_models], axis=-1)


@dataclass(frozen=True)
class FedCAMClients:
    """A client batch whose "models" are FedCAM pairs ``[Θ_glob | Θ_k]`` (``2P`` parameters).

    ``losses`` of a pair is the loss of the combined predictor (:func:`fedcam_losses`);
    the global part must be the same for every ``k`` of a client (it is, in a FedCAM state).
    Evaluation only: it has no ``local_update``.
    """

    clients: Any
    """The task's own client batch."""

    @property
    def client_ids(self) -> NDArray[np.int64]:
        return self.clients.client_ids

    @property
    def groups(self) -> NDArray[np.int64]:
        return self.clients.groups

    @property
    def num_examples(self) -> NDArray[np.int64]:
        return self.clients.num_examples

    def losses(self, cluster_models: NDArray[np.floating], split: str = "train") -> NDArray[np.float64]:
        """Combined-predictor losses of pairs ``(K, 2P)`` or ``(n, K, 2P)``, shape (n, K)."""
        pairs = np.asarray(cluster_models)
        half = pairs.shape[-1] // 2
        return fedcam_losses(self.clients, pairs[..., 0, :half], pairs[..., half:], split)


@dataclass(frozen=True)
class FedCAMTask:
    """A task seen through FedCAM pairs: ``clients`` are :class:`FedCAMClients`, ``W^0`` the start pairs."""

    task: Any
    """The task itself."""

    @property
    def num_clients(self) -> int:
        return self.task.num_clients

    @property
    def name(self) -> str:
        return f"fedcam-{self.task.name}"

    def clients(self, client_ids: NDArray[np.int64]) -> FedCAMClients:
        return FedCAMClients(self.task.clients(client_ids))

    def initial_models(self, num_clusters: int) -> NDArray[np.floating]:
        models = self.task.initial_models(num_clusters)
        return fedcam_pairs(initial_global_model(self.task, models), models)


def _evaluated(clients: ClientBatch, global_models: NDArray, cluster_models: NDArray) -> NDArray:
    """What the history records for one state (module docstring)."""
    if uses_output_sum(clients):
        return fedcam_pairs(global_models, cluster_models)
    return combined_models(global_models, cluster_models)


def simulate_fedcam_batch(
    tasks: Sequence[Task], settings: RoutingSettings, num_rounds: int, seeds: Sequence[int], detail: bool = False,
    model_rounds: Optional[Sequence[int]] = None, on_round: Optional[OnRound] = None,
) -> BatchHistory:
    """Simulate FedCAM on ``R`` runs together.

    ``Θ_glob`` starts at zero output (:func:`~fedroute.core.fedcam.initial_global_model`),
    ``Θ_k`` at the task's initial cluster models.  The server averages ``Θ_glob`` over all
    clients and ``Θ_k`` over the clients assigned to ``k`` (sample weighted; an empty cluster
    keeps its model).  The recorded ``cluster_models`` are the combined predictors (additive
    form) or the pairs ``[Θ_glob | Θ_k]`` (output-sum form; module docstring), for the rounds
    ``model_rounds`` (all by default); with ``detail`` the global part of every round is in
    ``detail["global_models"]`` (T+1, R, P) and the final cluster parts in
    ``detail["cluster_parts"]`` (R, K, P).  ``seeds`` are unused (FedCAM draws nothing) but
    kept for the sweep interface.  ``on_round`` is called after every round as in
    :func:`~fedroute.simulation.simulator.simulate_batch` (``changed`` refers to the cluster
    parts, as in the FedCAM strategy).
    """
    del seeds
    num_runs, num_clusters = len(tasks), settings.num_clusters
    num_clients = tasks[0].num_clients
    clients = concatenate_clients([task.clients(np.arange(num_clients)) for task in tasks])
    run_of_client = np.repeat(np.arange(num_runs), num_clients)
    num_examples = clients.num_examples
    cluster_models = np.stack([task.initial_models(num_clusters) for task in tasks])
    global_models = np.stack([initial_global_model(task, models) for task, models in zip(tasks, cluster_models)])
    kept = kept_model_rounds(num_rounds, model_rounds)
    recorded = [_evaluated(clients, global_models, cluster_models)] if 0 in kept else []
    routes_record, masses_record, globals_record = [], [], [global_models]
    for round_index in range(num_rounds):
        result = fedcam_client_round(clients, global_models[run_of_client], cluster_models[run_of_client], round_index)
        previous_parts = cluster_models
        cluster_models = hard_update(cluster_models, result.cluster_models, result.routes, num_examples, run_of_client)
        global_models = hard_update(global_models[:, None, :], result.global_models, np.zeros_like(result.routes),
                                    num_examples, run_of_client)[:, 0, :]
        if round_index + 1 in kept:
            recorded.append(_evaluated(clients, global_models, cluster_models))
        if detail:
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
        cluster_models=np.stack(recorded),
        routes=np.stack(routes_record),
        played=np.ones((num_rounds, num_runs, num_clients), dtype=bool),
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
