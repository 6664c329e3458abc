"""One client round on a batch of clients: losses → agent step → local training.

Both runtimes call :func:`client_round`: the Flower ClientApp with a batch of
one client, the batched simulator with all clients.  Nothing here knows which
runtime it serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.agent import AgentState, RoundDecision, agent_step
from fedroute.core.controllers import greedy_routes
from fedroute.core.copies import identical_pools
from fedroute.core.entry import entry_benefits
from fedroute.core.health import RoutingView
from fedroute.core.randomness import Purpose, uniform
from fedroute.core.settings import RoutingSettings
from fedroute.core.task import ClientBatch

__all__ = ["ClientRound", "client_round", "local_training", "provisional_greedy_routes", "routed_has_copy"]


@dataclass(frozen=True)
class ClientRound:
    """Result of :func:`client_round` for a batch of clients."""

    state: AgentState
    """Controller state after the round."""
    decision: RoundDecision
    """Routes, distributions, controllers, feedback, episode events."""
    losses: NDArray[np.float64]
    """``ℓ_ik^t`` before training, shape (n, K)."""
    trained_models: NDArray[np.floating]
    """``w_i^+``: each client's routed model after local training, shape (n, P)."""


def client_round(
    clients: ClientBatch,
    state: AgentState,
    settings: RoutingSettings,
    cluster_models: NDArray[np.floating],
    previous_masses: Optional[NDArray[np.float64]],
    round_index: int,
    seed: int | NDArray[np.int64],
    num_rounds: Optional[int] = None,
    view: Optional[RoutingView] = None,
    held_routes: Optional[NDArray[np.int64]] = None,
) -> ClientRound:
    """Run round ``t`` of docs/algorithm.md, rules §2 step 2 for every client of the batch.

    Parameters
    ----------
    clients : ClientBatch
        The clients' data (their loss and local update).
    state : AgentState
        Their controller state before the round.
    settings : RoutingSettings
        Routing hyper-parameters.
    cluster_models : ndarray, shape (K, P) or (n, K, P)
        Broadcast ``W^t`` (one set per client when several runs are batched).
    previous_masses : ndarray, shape (K,) or (n, K), or None
        Broadcast ``μ^{t-1}`` (provisional masses at a synchronized-entry round).
    round_index : int
        ``t`` (0-based).
    seed : int or ndarray of int, shape (n,)
        Run seed (one per client when several runs are batched).
    num_rounds : int, optional
        The run's ``T`` (needed by an exploitation phase, ``settings.exploitation_fraction > 0``).
    view : RoutingView, optional
        The server's report after the previous round, one row per client (exploration on or
        off, merged duplicates: :mod:`fedroute.core.health`).
    held_routes : ndarray of int, shape (n,), optional
        The signature start's holds (``-1``: free; :func:`fedroute.core.signature_start.held_routes`).

    Returns
    -------
    ClientRound
    """
    losses = clients.losses(cluster_models)

    def benefit_fn(candidate_mask: NDArray[np.bool_], greedy_choice: NDArray[np.int64]) -> NDArray[np.float64]:
        return entry_benefits(cluster_models, candidate_mask, greedy_choice, clients.local_update, round_index)

    new_state, decision = agent_step(
        state, settings, losses, previous_masses, round_index, clients.client_ids, seed, benefit_fn, num_rounds, view,
        held_routes)
    trained = local_training(clients, cluster_models, decision.routes, round_index, settings)
    return ClientRound(state=new_state, decision=decision, losses=losses, trained_models=trained)


def local_training(clients: ClientBatch, cluster_models: NDArray[np.floating], routes: NDArray[np.int64],
                   round_index: int, settings: RoutingSettings) -> NDArray[np.floating]:
    """Each client's routed model after the round's local training (``w_i^+``), shape (n, P).

    One local update (the task's ``local_update``; in a user's ClientApp, their ``train_fn``) per round,
    except for the *start probe*: in round 0, a client whose routed model has a copy among the broadcast
    models — another model closer to it than the client's first update moved it, as far as its own
    training can tell the same model — chains ``settings.start_updates`` updates in all.  The server parts
    the replies of copies by their update direction (``split_copies``,
    :func:`fedroute.core.server_step.copy_routes`); after one update that direction can follow the
    client's own label mix more than its group's (Dirichlet label skew inside groups), while a longer run
    from the shared start lets the group's direction build up (``docs/algorithm.md``, "The start probe").
    Clients routed to a model with no copy (a random start), and every later round, train once.

    Parameters
    ----------
    clients : ClientBatch
    cluster_models : ndarray, shape (K, P) or (n, K, P)
        The broadcast models.
    routes : ndarray of int, shape (n,)
        Each client's hard route.
    round_index : int
    settings : RoutingSettings

    Returns
    -------
    ndarray, shape (n, P)
    """
    rows = np.arange(len(routes))
    routed = cluster_models[rows, routes] if cluster_models.ndim == 3 else cluster_models[routes]
    trained = clients.local_update(routed, rows, round_index)
    if round_index != 0 or settings.start_updates <= 1 or not len(rows):
        return trained
    probing = np.flatnonzero(routed_has_copy(cluster_models, routes, routed, trained))
    if not len(probing):
        return trained
    trained = np.array(trained, copy=True)
    for _ in range(settings.start_updates - 1):
        trained[probing] = clients.local_update(trained[probing], probing, round_index)
    return trained


def routed_has_copy(cluster_models: NDArray[np.floating], routes: NDArray[np.int64], routed: NDArray[np.floating],
                    trained: NDArray[np.floating]) -> NDArray[np.bool_]:
    """Per client: whether its routed model is a copy of another broadcast model as far as its update can tell.

    Its route is in one of the :func:`~fedroute.core.copies.identical_pools` of its models within its update's
    length ``‖w_i^+ − W_{r_i}‖`` — another model is equal, or closer to ``W_{r_i}`` than the update moved it
    (with one model, never) — shape (n,).
    """
    steps = np.linalg.norm(np.asarray(trained, dtype=np.float64) - np.asarray(routed, dtype=np.float64), axis=1)
    batched = np.ndim(cluster_models) == 3
    return np.array([any(int(route) in pool
                         for pool in identical_pools(cluster_models[row] if batched else cluster_models, float(step)))
                     for row, (route, step) in enumerate(zip(routes, steps))], dtype=bool)


def provisional_greedy_routes(
    clients: ClientBatch, cluster_models: NDArray[np.floating], settings: Optional[RoutingSettings] = None,
    seed: int | NDArray[np.int64] = 0,
) -> NDArray[np.int64]:
    """Step 1 of synchronized entry: each client's Greedy choice at ``W^0`` (nothing trained).

    With ``settings.tie_breaking = "random"`` exact ties are broken by the
    client's round-0 ``TIE`` draw — the same draw as its round-0 Greedy choice.
    """
    tie_uniforms = None
    if settings is not None and settings.tie_breaking == "random":
        tie_uniforms = uniform(seed, clients.client_ids, 0, Purpose.TIE)
    return greedy_routes(clients.losses(cluster_models), tie_uniforms)
