"""The batched simulator: all clients of many runs at once, the same functions as Flower.

A batch of ``R`` runs is simulated as one federation whose client axis holds
the ``R·n`` clients; client ``i`` of run ``r`` sees only run ``r``'s ``K``
cluster models, masses and seed.  Each round samples the clients that play
(:func:`fedroute.core.participation.participating`, the Flower strategy's sample);
their side of the round is :func:`fedroute.core.client_step.client_round`; the
server side is the strategy's own update, :func:`fedroute.core.influence.aggregate_round`
(hard update under the influence bounds) and the federation estimate
:func:`fedroute.core.federation.estimate_federation` (masses from every client's
latest report), with a run index.  This module only loops over rounds and
records what the experiments need; the loop itself is
:func:`fedroute.simulation.rounds.run_rounds`, shared with FedCAM
(:mod:`fedroute.simulation.fedcam`), and this module's :class:`RoutingAlgorithm` is the
routing side it drives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
from numpy.typing import NDArray

from fedroute.core.agent import AgentState
from fedroute.core.aggregation import routing_masses
from fedroute.core.client_step import client_round, provisional_greedy_routes
from fedroute.core.exp3 import arm_probabilities
from fedroute.core.health import RoutingView
from fedroute.core.influence import InfluenceBounds, RoundAggregate, capped_weights
from fedroute.core.participation import Participation
from fedroute.core.server_step import RoundReplies
from fedroute.core.settings import RoutingSettings
from fedroute.core.signature_start import SignatureOrders, sent_signatures
from fedroute.core.task import ClientBatch, Task
from fedroute.monitoring.telemetry import ClientReplies, node_id_array
from fedroute.simulation.rounds import (ClientStep, Federation, LoopResult, OnRound, SimulatedRound, changed_models,
                                        concatenate_clients, fill_rows, kept_model_rounds, run_rounds, select_clients)

__all__ = ["RunHistory", "BatchHistory", "SimulatedRound", "simulate", "simulate_batch", "concatenate_clients",
           "select_clients", "recording", "changed_models", "kept_model_rounds", "simulate_local", "RoutingAlgorithm",
           "batch_history", "OnRound"]


def recording(recorder: Any, run: int = 0) -> OnRound:
    """An ``on_round`` observer feeding run ``run`` to a :class:`~fedroute.monitoring.recorder.RunRecorder`."""
    def observe(simulated: SimulatedRound) -> None:
        recorder.round(simulated.round_index + 1, simulated.run(run), simulated.masses[run],
                       simulated.changed[run].tolist(), spare=None if simulated.spare is None else simulated.spare[run])
        recorder.commit()

    return observe


@dataclass(frozen=True)
class BatchHistory:
    """What a batch of ``R`` runs recorded (``T`` rounds, ``n`` clients per run, ``K`` clusters).

    Attributes
    ----------
    cluster_models : ndarray, shape (T+1, R, K, P)
        ``W^0 … W^T`` of every run (only the ``model_rounds`` asked for).
    routes : ndarray of int8/int16, shape (T, R, n)
        Each client's latest executed hard route after round ``t`` (its route of round ``t``
        where it played; ``-1`` before its first round).
    played : ndarray of bool, shape (T, R, n)
        Which clients played each round (all of them with full participation).
    masses : ndarray, shape (T, R, K)
        ``μ̂^t`` after each round (the federation estimate: the round's own masses with full participation).
    mean_arm_probabilities : ndarray, shape (T, R, A)
        EXP3 probabilities at the start of each round, averaged over the clients that played.
    arm_fractions : ndarray, shape (T, R, A)
        Fraction of the clients that played with each arm in force during the round.
    entered, released : ndarray of int, shape (T, R)
        Clients entering / leaving a hysteresis episode.
    provisional_masses : ndarray, shape (R, K), or None
        Synchronized entry's provisional masses.
    groups : ndarray of int, shape (R, n)
        Latent groups (evaluation only).
    num_examples : ndarray, shape (R, n)
        ``n_i``.
    detail : dict
        With ``detail=True``: per-client ``train_losses`` (T, R·n, K),
        ``controllers``, ``arms`` (T, R·n), ``arm_probabilities`` (T, R·n, A),
        ``entered``/``released`` (T, R·n), and ``final_state``.
    """

    cluster_models: NDArray[np.floating]
    routes: NDArray[np.integer]
    played: NDArray[np.bool_]
    masses: NDArray[np.float64]
    mean_arm_probabilities: NDArray[np.float64]
    arm_fractions: NDArray[np.float64]
    entered: NDArray[np.int64]
    released: NDArray[np.int64]
    provisional_masses: Optional[NDArray[np.float64]]
    groups: NDArray[np.int64]
    num_examples: NDArray[np.int64]
    detail: dict[str, Any]

    @property
    def route_counts(self) -> NDArray[np.int64]:
        """Clients routed to each cluster, shape (T, R, K)."""
        num_clusters = self.masses.shape[-1]
        return (self.routes[..., None] == np.arange(num_clusters)).sum(axis=2)


@dataclass(frozen=True)
class RunHistory:
    """Everything one simulated run recorded, per client (``T`` rounds, ``n`` clients).

    Attributes are those of :class:`BatchHistory` for one run, with per-client
    detail: ``cluster_models`` (T+1, K, P), ``routes`` (T, n), ``played`` (T, n), ``masses``
    (T, K), ``train_losses`` (T, n, K), ``controllers``/``arms`` (T, n),
    ``arm_probabilities`` (T, n, A), ``entered``/``released`` (T, n) bool,
    ``provisional_masses`` (K,) or None, ``groups`` (n,), ``num_examples``
    (n,), ``final_state``.
    """

    cluster_models: NDArray[np.floating]
    routes: NDArray[np.int64]
    played: NDArray[np.bool_]
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


def simulate_batch(
    tasks: Sequence[Task],
    settings: RoutingSettings,
    num_rounds: int,
    seeds: Sequence[int],
    detail: bool = False,
    model_rounds: Optional[Sequence[int]] = None,
    on_round: Optional[OnRound] = None,
    participation: Participation = Participation(),
    influence: InfluenceBounds = InfluenceBounds(),
    join_rounds: Optional[NDArray[np.int64]] = None,
) -> BatchHistory:
    """Simulate ``R = len(tasks)`` independent runs of one method together.

    Parameters
    ----------
    tasks : sequence of Task
        One task per run (data and initial models); equal ``num_clients``.
    settings : RoutingSettings
        The method (shared by all runs).
    num_rounds : int
        ``T`` (≥ 1).
    seeds : sequence of int
        The routing seed of each run.
    detail : bool
        Also record per-client arrays (memory ``O(T·R·n·K)``).
    model_rounds : sequence of int, optional
        Record the cluster models ``W^t`` only for these ``t`` (in ``0..T``);
        all rounds by default.  ``cluster_models`` then has one entry per
        listed round, in increasing order (large models over many rounds).
    on_round : callable, optional
        Called with a :class:`SimulatedRound` after every round (telemetry,
        alarms: see :func:`recording`).
    participation : Participation
        Who plays each round (:mod:`fedroute.core.participation`, the sample the Flower
        strategy draws) and how long a report counts in the masses; everyone by default.
    influence : InfluenceBounds
        The strategy's bounds on one reply's influence (weight cap, update norm, robust
        rule), applied by the same server update (:func:`~fedroute.core.influence.aggregate_round`).
    join_rounds : ndarray of int, shape (n,) or (R, n), optional
        The first round each client can be sampled in (late joiners); 0 for all by default.

    Returns
    -------
    BatchHistory
        Run ``r`` equals ``simulate(tasks[r], settings, num_rounds, seeds[r])``.
    """
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be ≥ 1, got {num_rounds}")
    federation = Federation.of_tasks(tasks, seeds, join_rounds)
    result = run_rounds(RoutingAlgorithm(settings), tasks, federation, num_rounds, detail,
                        kept_model_rounds(num_rounds, model_rounds), on_round, participation, influence)
    return batch_history(result, federation)


def batch_history(result: LoopResult, federation: Federation) -> BatchHistory:
    """The :class:`BatchHistory` of what :func:`~fedroute.simulation.rounds.run_rounds` recorded."""
    return BatchHistory(
        **{key: np.stack(values) for key, values in result.record.items()},
        provisional_masses=result.provisional_masses,
        groups=federation.clients.groups.reshape(federation.num_runs, federation.num_clients),
        num_examples=federation.num_examples.reshape(federation.num_runs, federation.num_clients),
        detail=result.detail,
    )


@dataclass(frozen=True)
class RoutingAlgorithm:
    """Clustered routing as the round loop drives it: the agent's client round and the hard update.

    ``models`` are the cluster models ``(R, K, P)``, the client state an
    :class:`~fedroute.core.agent.AgentState` of every client of every run.
    """

    settings: RoutingSettings

    def init(self, tasks: Sequence[Task], federation: Federation) -> tuple[NDArray, AgentState]:
        models = np.stack([task.initial_models(self.settings.num_clusters) for task in tasks])
        return models, AgentState.initial(len(federation.run_of_client), self.settings)

    def provisional_masses(self, models: NDArray, client_state: AgentState, federation: Federation,
                           participation: Participation, influence: InfluenceBounds) -> Optional[NDArray]:
        """Synchronized entry's provisional masses: round 0's sample's Greedy choices at ``W^0`` (capped weights)."""
        if not self.settings.synchronized_entry:
            return None
        rows = np.flatnonzero(federation.playing(0, participation))
        runs = federation.run_of_client[rows]
        greedy = provisional_greedy_routes(select_clients(federation.clients, rows), models[runs], self.settings,
                                           federation.seed_of_client[rows])
        weights = capped_weights(federation.num_examples[rows], influence.max_weight_ratio, runs, federation.num_runs)
        return routing_masses(greedy, weights, self.settings.num_clusters, runs, federation.num_runs)

    def cluster_parts(self, models: NDArray) -> NDArray:
        return models

    def client_step(self, models: NDArray, client_state: AgentState, federation: Federation,
                    rows: NDArray[np.int64], masses: Optional[NDArray], view: Optional[RoutingView],
                    round_index: int, num_rounds: int, orders: Optional[SignatureOrders] = None
                    ) -> tuple[AgentState, ClientStep]:
        """:func:`~fedroute.core.client_step.client_round` of the clients ``rows`` (held where ``orders`` say),
        with the signatures asked for."""
        every = len(rows) == len(federation.run_of_client)
        before = client_state if every else client_state.select(rows)
        probabilities = arm_probabilities(before.exp3_log_weights, self.settings.exp3_exploration)
        runs = federation.run_of_client[rows]
        part = federation.part(rows)
        result = client_round(part, before, self.settings, models[runs],
                              None if masses is None else masses[runs], round_index, federation.seed_of_client[rows],
                              num_rounds, view, None if orders is None else orders.held)
        decision = result.decision
        client_state = result.state if every else client_state.scatter(rows, result.state)
        return client_state, ClientStep(
            routes=decision.routes, preferred=decision.preferred, losses=result.losses,
            trained_models=result.trained_models, arm=decision.arm, arm_probabilities=probabilities,
            entered=decision.entered, released=decision.released,
            signatures=None if orders is None else sent_signatures(part, orders.wanted, federation.seed_of_client[rows],
                                                                   self.settings.signature_dim),
            extra=result)

    def server_update(self, models: NDArray, aggregate: RoundAggregate, step: ClientStep, replies: RoundReplies,
                      influence: InfluenceBounds) -> NDArray:
        return aggregate.models

    def recorded_models(self, models: NDArray, federation: Federation) -> NDArray:
        return models

    def replies(self, step: ClientStep, part: ClientBatch, num_examples: NDArray) -> ClientReplies:
        return _replies(part, num_examples, step.losses, step.extra.decision, step.extra.state)

    def detail(self, models: NDArray, step: Optional[ClientStep], federation: Federation,
               rows: NDArray[np.int64]) -> dict[str, NDArray]:
        """Per-client training losses, controllers, arms, arm probabilities and episode events."""
        if step is None:
            return {}
        size, decision = len(federation.run_of_client), step.extra.decision
        return {key: fill_rows(rows, np.asarray(value), fill, size) for key, value, fill in (
            ("train_losses", step.losses, np.nan), ("controllers", decision.controller, -1),
            ("arms", decision.arm, -1), ("arm_probabilities", step.arm_probabilities, np.nan),
            ("entered", decision.entered, False), ("released", decision.released, False))}

    def final_detail(self, models: NDArray, client_state: AgentState) -> dict[str, Any]:
        return {"final_state": client_state}


def _replies(clients: ClientBatch, num_examples: NDArray, losses: NDArray[np.float64], decision: Any,
             state: AgentState) -> ClientReplies:
    """A simulated round as the replies a Flower strategy would have validated."""
    weights = state.exp3_log_weights
    return ClientReplies(
        client_ids=np.asarray(clients.client_ids, dtype=np.int64), node_ids=node_id_array([None] * len(losses)),
        num_examples=np.asarray(num_examples, dtype=np.float64), routes=np.asarray(decision.routes, dtype=np.int64),
        losses=losses, route_distributions=decision.route_distributions,
        controllers=np.asarray(decision.controller, dtype=np.int64), arms=np.asarray(decision.arm, dtype=np.int64),
        feedback=np.asarray(decision.feedback, dtype=np.float64), entered=np.asarray(decision.entered, dtype=bool),
        released=np.asarray(decision.released, dtype=bool), rounds_played=np.asarray(state.rounds_played),
        exp3_weight_spread=np.ptp(weights, axis=1) if weights.shape[1] else np.zeros(len(losses)),
        preferred=np.asarray(decision.preferred, dtype=np.int64),
    )


def simulate(task: Task, settings: RoutingSettings, num_rounds: int, seed: int,
             on_round: Optional[OnRound] = None, **options: Any) -> RunHistory:
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
    on_round : callable, optional
        Called after every round (see :func:`simulate_batch`).
    **options
        ``participation``, ``influence``, ``join_rounds`` of :func:`simulate_batch`.

    Returns
    -------
    RunHistory
        Per-client detail of the run (a batch of one run).
    """
    batch = simulate_batch([task], settings, num_rounds, [seed], detail=True, on_round=on_round, **options)
    detail = batch.detail
    return RunHistory(
        cluster_models=batch.cluster_models[:, 0],
        routes=batch.routes[:, 0].astype(np.int64),
        played=batch.played[:, 0],
        masses=batch.masses[:, 0],
        train_losses=detail["train_losses"],
        controllers=detail["controllers"],
        arms=detail["arms"],
        arm_probabilities=detail["arm_probabilities"],
        entered=detail["entered"],
        released=detail["released"],
        provisional_masses=None if batch.provisional_masses is None else batch.provisional_masses[0],
        groups=batch.groups[0],
        num_examples=batch.num_examples[0],
        final_state=detail["final_state"],
    )


def simulate_local(task: Task, num_rounds: int) -> NDArray[np.floating]:
    """The ``local`` reference: every client trains its own model alone from ``task.initial_models(1)``.

    What :class:`~fedroute.strategies.local.LocalTraining` does in Flower: round ``t`` applies the
    task's local update of round ``t`` to every client's own model.

    Parameters
    ----------
    task : Task
        Client data and the initial model.
    num_rounds : int
        ``T`` (≥ 1).

    Returns
    -------
    ndarray, shape (T+1, n, P)
        Every client's model before round 1 and after every round.
    """
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be ≥ 1, got {num_rounds}")
    clients = task.clients(np.arange(task.num_clients))
    everyone = np.arange(task.num_clients)
    models = [np.repeat(task.initial_models(1), task.num_clients, axis=0)]
    for round_index in range(num_rounds):
        models.append(np.asarray(clients.local_update(models[-1], everyone, round_index)))
    return np.stack(models)
