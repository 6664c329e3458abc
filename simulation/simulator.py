"""The batched simulator: all clients of a run at once, the same functions as Flower.

The server side of a round is :func:`fedroute.strategies.aggregation.hard_update`
and :func:`~fedroute.strategies.aggregation.routing_masses`; the client side
is :func:`fedroute.client.round.client_round`.  This module only loops over
rounds and records the history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.client.agent import AgentState
from fedroute.client.exp3 import arm_probabilities
from fedroute.client.round import client_round, provisional_greedy_routes
from fedroute.client.settings import RoutingSettings
from fedroute.strategies.aggregation import hard_update, routing_masses
from fedroute.tasks.base import Task

__all__ = ["RunHistory", "simulate"]


@dataclass(frozen=True)
class RunHistory:
    """Everything one simulated run recorded (``T`` rounds, ``n`` clients, ``K`` clusters).

    Attributes
    ----------
    cluster_models : ndarray, shape (T+1, K, P)
        ``W^0 … W^T``.
    routes : ndarray of int, shape (T, n)
        Executed hard routes.
    masses : ndarray, shape (T, K)
        ``μ^t`` after each round.
    train_losses : ndarray, shape (T, n, K)
        ``ℓ_ik^t`` (pre-update losses each client observed).
    controllers : ndarray of int, shape (T, n)
        Executed controller codes.
    arms : ndarray of int, shape (T, n)
        Arm in force (``-1`` for none).
    arm_probabilities : ndarray, shape (T, n, A)
        EXP3 probabilities at the start of each round.
    entered, released : ndarray of bool, shape (T, n)
        Episode events.
    provisional_masses : ndarray, shape (K,), or None
        Synchronized entry's provisional masses ``m``.
    groups : ndarray of int, shape (n,)
        Latent groups (evaluation only).
    num_examples : ndarray, shape (n,)
        ``n_i``.
    final_state : AgentState
        Controller state after the last round.
    """

    cluster_models: NDArray[np.floating]
    routes: NDArray[np.int64]
    masses: NDArray[np.float64]
    train_losses: NDArray[np.float64]
    controllers: NDArray[np.int64]
    arms: NDArray[np.int64]
    arm_probabilities: NDArray[np.float64]
    entered: NDArray[np.bool_]
    released: NDArray[np.bool_]
    provisional_masses: Optional[NDArray[np.float64]]
    groups: NDArray[np.int64]
    num_examples: NDArray[np.int64]
    final_state: AgentState


def simulate(task: Task, settings: RoutingSettings, num_rounds: int, seed: int) -> RunHistory:
    """Run ``num_rounds`` rounds of clustered routing on every client of ``task``.

    Parameters
    ----------
    task : Task
        Client data and initial models.
    settings : RoutingSettings
        Routing hyper-parameters (method).
    num_rounds : int
        ``T`` (≥ 1).
    seed : int
        Run seed (the randomness coordinate of every routing draw).

    Returns
    -------
    RunHistory
    """
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be ≥ 1, got {num_rounds}")
    clients = task.clients(np.arange(task.num_clients))
    num_examples = clients.num_examples
    models = task.initial_models(settings.num_clusters)
    state = AgentState.initial(task.num_clients, settings)
    masses: Optional[NDArray[np.float64]] = None
    provisional = None
    if settings.synchronized_entry:
        provisional = routing_masses(provisional_greedy_routes(clients, models), num_examples, settings.num_clusters)
        masses = provisional
    record: dict[str, list] = {key: [] for key in (
        "cluster_models", "routes", "masses", "train_losses", "controllers", "arms",
        "arm_probabilities", "entered", "released")}
    record["cluster_models"].append(models)
    for round_index in range(num_rounds):
        record["arm_probabilities"].append(arm_probabilities(state.exp3_log_weights, settings.exp3_exploration))
        result = client_round(clients, state, settings, models, masses, round_index, seed)
        state, decision = result.state, result.decision
        models = hard_update(models, result.trained_models, decision.routes, num_examples)
        masses = routing_masses(decision.routes, num_examples, settings.num_clusters)
        for key, value in (
            ("cluster_models", models), ("routes", decision.routes), ("masses", masses),
            ("train_losses", result.losses), ("controllers", decision.controller), ("arms", decision.arm),
            ("entered", decision.entered), ("released", decision.released),
        ):
            record[key].append(value)
    return RunHistory(
        **{key: np.stack(values) for key, values in record.items()},
        provisional_masses=provisional,
        groups=clients.groups,
        num_examples=num_examples,
        final_state=state,
    )
