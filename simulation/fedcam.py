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
from typing import Any, Optional, Sequence

import numpy as np
from numpy.typing import NDArray

from fedroute.core.fedcam import combined_models, fedcam_client_round, fedcam_global_update, fedcam_losses, \
    initial_global_model, uses_output_sum
from fedroute.core.health import RoutingView
from fedroute.core.influence import InfluenceBounds, RoundAggregate
from fedroute.core.participation import Participation
from fedroute.core.server_step import RoundReplies
from fedroute.core.settings import RoutingSettings
from fedroute.core.task import ClientBatch, Task
from fedroute.monitoring.telemetry import ClientReplies, node_id_array
from fedroute.simulation.rounds import ClientStep, Federation, OnRound, kept_model_rounds, run_rounds
from fedroute.simulation.simulator import BatchHistory, batch_history

__all__ = ["FedCAMClients", "FedCAMTask", "FedCAMAlgorithm", "FedCAMModels", "fedcam_pairs",
           "simulate_fedcam_batch"]


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


@dataclass(frozen=True)
class FedCAMModels:
    """FedCAM's server models of ``R`` runs: the global parts ``Θ_glob`` (R, P) and cluster parts ``Θ_k`` (R, K, P)."""

    global_models: NDArray[np.floating]
    cluster_models: NDArray[np.floating]


@dataclass(frozen=True)
class FedCAMAlgorithm:
    """FedCAM as the round loop drives it (:func:`~fedroute.simulation.rounds.run_rounds`).

    The client side is :func:`~fedroute.core.fedcam.fedcam_client_round`; the server side the
    FedCAM strategy's: the server step on the cluster parts, then the global part averaged
    over the kept replies under the same influence bounds
    (:func:`~fedroute.core.fedcam.fedcam_global_update`).  No client state, no arms.
    """

    settings: RoutingSettings

    def init(self, tasks: Sequence[Task], federation: Federation) -> tuple[FedCAMModels, None]:
        cluster_models = np.stack([task.initial_models(self.settings.num_clusters) for task in tasks])
        global_models = np.stack([initial_global_model(task, models) for task, models in zip(tasks, cluster_models)])
        return FedCAMModels(global_models, cluster_models), None

    def provisional_masses(self, models: FedCAMModels, client_state: None, federation: Federation,
                           participation: Participation, influence: InfluenceBounds) -> None:
        return None

    def cluster_parts(self, models: FedCAMModels) -> NDArray[np.floating]:
        return models.cluster_models

    def client_step(self, models: FedCAMModels, client_state: None, federation: Federation, rows: NDArray[np.int64],
                    masses: Optional[NDArray], view: Optional[RoutingView], round_index: int, num_rounds: int,
                    orders: Optional[object] = None) -> tuple[None, ClientStep]:
        """Assignment by the combined predictor and the joint local update of the clients ``rows`` (FedCAM has no
        signature start: ``orders`` is None)."""
        runs = federation.run_of_client[rows]
        result = fedcam_client_round(federation.part(rows), models.global_models[runs], models.cluster_models[runs],
                                     round_index)
        count = len(rows)
        return None, ClientStep(
            routes=result.routes, preferred=result.routes, losses=result.losses,
            trained_models=result.cluster_models, arm=np.full(count, -1, dtype=np.int64),
            arm_probabilities=np.zeros((count, 0)), entered=np.zeros(count, dtype=bool),
            released=np.zeros(count, dtype=bool), extra=result)

    def server_update(self, models: FedCAMModels, aggregate: RoundAggregate, step: ClientStep,
                      replies: RoundReplies, influence: InfluenceBounds) -> FedCAMModels:
        global_models, _ = fedcam_global_update(models.global_models, step.extra.global_models, aggregate.kept,
                                                replies.num_examples, influence, replies.run_index)
        return FedCAMModels(global_models, aggregate.models)

    def recorded_models(self, models: FedCAMModels, federation: Federation) -> NDArray[np.floating]:
        return _evaluated(federation.clients, models.global_models, models.cluster_models)

    def replies(self, step: ClientStep, part: ClientBatch, num_examples: NDArray) -> ClientReplies:
        return _fedcam_replies(part.client_ids, num_examples, step.losses, step.routes, self.settings.num_clusters)

    def detail(self, models: FedCAMModels, step: Optional[ClientStep], federation: Federation,
               rows: NDArray[np.int64]) -> dict[str, NDArray]:
        return {"global_models": models.global_models}

    def final_detail(self, models: FedCAMModels, client_state: None) -> dict[str, NDArray]:
        return {"cluster_parts": models.cluster_models}


def simulate_fedcam_batch(
    tasks: Sequence[Task], settings: RoutingSettings, num_rounds: int, seeds: Sequence[int], detail: bool = False,
    model_rounds: Optional[Sequence[int]] = None, on_round: Optional[OnRound] = None,
    influence: InfluenceBounds = InfluenceBounds(),
) -> BatchHistory:
    """Simulate FedCAM on ``R`` runs together (every client in every round).

    ``Θ_glob`` starts at zero output (:func:`~fedroute.core.fedcam.initial_global_model`),
    ``Θ_k`` at the task's initial cluster models.  The server averages ``Θ_glob`` over all
    clients and ``Θ_k`` over the clients assigned to ``k`` (sample weighted under the
    ``influence`` bounds, as the FedCAM strategy does; an empty cluster keeps its model), and
    the masses are the federation estimate of the routing methods.  The recorded
    ``cluster_models`` are the combined predictors (additive form) or the pairs
    ``[Θ_glob | Θ_k]`` (output-sum form; module docstring), for the rounds ``model_rounds``
    (all by default); with ``detail`` the global part of every round is in
    ``detail["global_models"]`` (T+1, R, P) and the final cluster parts in
    ``detail["cluster_parts"]`` (R, K, P).  ``seeds`` (one per task) are kept for the sweep
    interface; FedCAM draws nothing.  ``on_round`` is called after every round as in
    :func:`~fedroute.simulation.simulator.simulate_batch` (``changed`` refers to the cluster
    parts, as in the FedCAM strategy).  The round loop is the routing methods' own
    (:func:`~fedroute.simulation.rounds.run_rounds`).
    """
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be ≥ 1, got {num_rounds}")
    federation = Federation.of_tasks(tasks, seeds)
    result = run_rounds(FedCAMAlgorithm(settings), tasks, federation, num_rounds, detail,
                        kept_model_rounds(num_rounds, model_rounds), on_round, Participation(), influence)
    return batch_history(result, federation)


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
