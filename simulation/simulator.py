"""The batched simulator: all clients of many runs at once, the same functions as Flower.

A batch of ``R`` runs is simulated as one federation whose client axis holds
the ``R·n`` clients; client ``i`` of run ``r`` sees only run ``r``'s ``K``
cluster models, masses and seed.  The client side of a round is
:func:`fedroute.core.client_step.client_round`; the server side is
:func:`fedroute.core.aggregation.hard_update` and
:func:`~fedroute.core.aggregation.routing_masses` with a run index.
This module only loops over rounds and records what the experiments need.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Callable, Optional, Sequence

import numpy as np
from numpy.typing import NDArray

from fedroute.core.agent import AgentState
from fedroute.core.exp3 import arm_probabilities
from fedroute.core.client_step import client_round, provisional_greedy_routes
from fedroute.core.settings import RoutingSettings
from fedroute.monitoring.telemetry import ClientReplies, node_id_array
from fedroute.core.aggregation import hard_update, routing_masses
from fedroute.core.task import ClientBatch, Task

__all__ = ["RunHistory", "BatchHistory", "SimulatedRound", "simulate", "simulate_batch", "concatenate_clients",
           "recording", "changed_models", "kept_model_rounds"]


class SimulatedRound:
    """What one simulated round did, for an observer (``on_round``) of the simulator.

    The per-client view is built only when asked for (a progress bar pays nothing).

    Attributes
    ----------
    round_index : int
        ``t``.
    masses : ndarray, shape (R, K)
        ``μ^t`` after the round.
    num_clients : int
        ``n`` per run.
    """

    def __init__(self, round_index: int, masses: NDArray[np.float64], num_clients: int,
                 replies: Callable[[], ClientReplies], changed: Callable[[], NDArray[np.bool_]]) -> None:
        self.round_index = round_index
        self.masses = masses
        self.num_clients = num_clients
        self._replies, self._changed = replies, changed

    @functools.cached_property
    def replies(self) -> ClientReplies:
        """Every client of every run (``R·n`` rows, run-major), as a Flower strategy would have received them."""
        return self._replies()

    @functools.cached_property
    def changed(self) -> NDArray[np.bool_]:
        """Whether each cluster model changed, shape (R, K)."""
        return self._changed()

    def run(self, run: int) -> ClientReplies:
        """The replies of run ``run``."""
        return self.replies.select(slice(run * self.num_clients, (run + 1) * self.num_clients))


OnRound = Callable[[SimulatedRound], None]
"""``on_round(simulated_round)``: called after every simulated round."""


def recording(recorder: Any, run: int = 0) -> OnRound:
    """An ``on_round`` observer feeding run ``run`` to a :class:`~fedroute.monitoring.recorder.RunRecorder`."""
    def observe(simulated: SimulatedRound) -> None:
        recorder.round(simulated.round_index + 1, simulated.run(run), simulated.masses[run],
                       simulated.changed[run].tolist())
        recorder.commit()

    return observe


def concatenate_clients(batches: Sequence[ClientBatch]) -> ClientBatch:
    """One client batch holding the clients of several (dataclass) batches in order.

    Array fields (and tuples of arrays) are concatenated along the client axis, a
    field holding a client batch (a wrapper's) recursively; other fields (e.g. the
    learning rate) must be equal in every batch.
    """
    first = batches[0]
    if len(batches) == 1:
        return first
    if not is_dataclass(first):
        raise TypeError(f"cannot concatenate {type(first).__name__}: not a dataclass")
    merged: dict[str, Any] = {}
    for field in fields(first):
        values = [getattr(batch, field.name) for batch in batches]
        if isinstance(values[0], np.ndarray):
            merged[field.name] = np.concatenate(values, axis=0)
        elif is_dataclass(values[0]) and not isinstance(values[0], type):  # a wrapped client batch
            merged[field.name] = concatenate_clients(values)
        elif isinstance(values[0], tuple) and isinstance(values[0][0], np.ndarray):
            merged[field.name] = tuple(np.concatenate(parts, axis=0) for parts in zip(*values))
        else:
            if any(value != values[0] for value in values[1:]):
                raise ValueError(f"runs differ in '{field.name}' ({values[0]!r} vs others); batch them separately")
            merged[field.name] = values[0]
    return replace(first, **merged)


@dataclass(frozen=True)
class BatchHistory:
    """What a batch of ``R`` runs recorded (``T`` rounds, ``n`` clients per run, ``K`` clusters).

    Attributes
    ----------
    cluster_models : ndarray, shape (T+1, R, K, P)
        ``W^0 … W^T`` of every run (only the ``model_rounds`` asked for).
    routes : ndarray of int8/int16, shape (T, R, n)
        Executed hard routes.
    masses : ndarray, shape (T, R, K)
        ``μ^t`` after each round.
    mean_arm_probabilities : ndarray, shape (T, R, A)
        Client-averaged EXP3 probabilities at the start of each round.
    arm_fractions : ndarray, shape (T, R, A)
        Fraction of clients with each arm in force during the round.
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
    detail: ``cluster_models`` (T+1, K, P), ``routes`` (T, n), ``masses``
    (T, K), ``train_losses`` (T, n, K), ``controllers``/``arms`` (T, n),
    ``arm_probabilities`` (T, n, A), ``entered``/``released`` (T, n) bool,
    ``provisional_masses`` (K,) or None, ``groups`` (n,), ``num_examples``
    (n,), ``final_state``.
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


def kept_model_rounds(num_rounds: int, model_rounds: Optional[Sequence[int]]) -> set[int]:
    """The rounds ``t ∈ 0..T`` whose models a history records (all when ``model_rounds`` is None)."""
    kept = set(range(num_rounds + 1)) if model_rounds is None else {int(t) for t in model_rounds}
    if any(not 0 <= t <= num_rounds for t in kept):
        raise ValueError(f"model_rounds must lie in [0, {num_rounds}]")
    return kept


def simulate_batch(
    tasks: Sequence[Task],
    settings: RoutingSettings,
    num_rounds: int,
    seeds: Sequence[int],
    detail: bool = False,
    model_rounds: Optional[Sequence[int]] = None,
    on_round: Optional[OnRound] = None,
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

    Returns
    -------
    BatchHistory
        Run ``r`` equals ``simulate(tasks[r], settings, num_rounds, seeds[r])``.
    """
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be ≥ 1, got {num_rounds}")
    if len(tasks) != len(seeds) or not tasks:
        raise ValueError(f"need one seed per task; got {len(tasks)} tasks and {len(seeds)} seeds")
    num_clients = tasks[0].num_clients
    if any(task.num_clients != num_clients for task in tasks):
        raise ValueError("every run of a batch needs the same num_clients")
    num_runs, num_clusters = len(tasks), settings.num_clusters
    clients = concatenate_clients([task.clients(np.arange(num_clients)) for task in tasks])
    run_of_client = np.repeat(np.arange(num_runs), num_clients)
    seed_of_client = np.asarray(seeds, dtype=np.int64)[run_of_client]
    num_examples = clients.num_examples
    models = np.stack([task.initial_models(num_clusters) for task in tasks])
    state = AgentState.initial(num_runs * num_clients, settings)
    masses: Optional[NDArray[np.float64]] = None
    provisional = None
    if settings.synchronized_entry:
        greedy = provisional_greedy_routes(clients, models[run_of_client], settings, seed_of_client)
        provisional = routing_masses(greedy, num_examples, num_clusters, run_of_client, num_runs)
        masses = provisional
    route_dtype = np.int8 if num_clusters < 127 else np.int16
    keys = ["cluster_models", "routes", "masses", "mean_arm_probabilities", "arm_fractions", "entered", "released"]
    record: dict[str, list] = {key: [] for key in keys}
    detailed: dict[str, list] = {key: [] for key in (
        "train_losses", "controllers", "arms", "arm_probabilities", "entered", "released")}
    kept_rounds = kept_model_rounds(num_rounds, model_rounds)
    if 0 in kept_rounds:
        record["cluster_models"].append(models)

    def per_run_mean(values: NDArray) -> NDArray:
        return values.reshape(num_runs, num_clients, *values.shape[1:]).mean(axis=1)

    for round_index in range(num_rounds):
        probabilities = arm_probabilities(state.exp3_log_weights, settings.exp3_exploration)
        result = client_round(
            clients, state, settings, models[run_of_client],
            None if masses is None else masses[run_of_client], round_index, seed_of_client, num_rounds,
        )
        state, decision = result.state, result.decision
        previous_models = models
        models = hard_update(models, result.trained_models, decision.routes, num_examples, run_of_client)
        masses = routing_masses(decision.routes, num_examples, num_clusters, run_of_client, num_runs)
        if on_round is not None:
            on_round(SimulatedRound(
                round_index, masses, num_clients,
                replies=functools.partial(_replies, clients, num_examples, result.losses, decision, state),
                changed=functools.partial(changed_models, models, previous_models)))
        arm_in_force = decision.arm[:, None] == np.arange(settings.num_arms)
        if round_index + 1 in kept_rounds:
            record["cluster_models"].append(models)
        for key, value in (
            ("routes", decision.routes.astype(route_dtype).reshape(num_runs, num_clients)),
            ("masses", masses),
            ("mean_arm_probabilities", per_run_mean(probabilities)),
            ("arm_fractions", per_run_mean(arm_in_force.astype(np.float64))),
            ("entered", decision.entered.reshape(num_runs, num_clients).sum(axis=1)),
            ("released", decision.released.reshape(num_runs, num_clients).sum(axis=1)),
        ):
            record[key].append(value)
        if detail:
            for key, value in (("train_losses", result.losses), ("controllers", decision.controller),
                               ("arms", decision.arm), ("arm_probabilities", probabilities),
                               ("entered", decision.entered), ("released", decision.released)):
                detailed[key].append(value)
    extra: dict[str, Any] = {}
    if detail:
        extra = {key: np.stack(values) for key, values in detailed.items()}
        extra["final_state"] = state
    return BatchHistory(
        **{key: np.stack(values) for key, values in record.items()},
        provisional_masses=provisional,
        groups=clients.groups.reshape(num_runs, num_clients),
        num_examples=num_examples.reshape(num_runs, num_clients),
        detail=extra,
    )


def changed_models(models: NDArray, previous: NDArray) -> NDArray[np.bool_]:
    """Which cluster models of which runs changed, shape (R, K)."""
    return np.any(models != previous, axis=-1)


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
    )


def simulate(task: Task, settings: RoutingSettings, num_rounds: int, seed: int,
             on_round: Optional[OnRound] = None) -> RunHistory:
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

    Returns
    -------
    RunHistory
        Per-client detail of the run (a batch of one run).
    """
    batch = simulate_batch([task], settings, num_rounds, [seed], detail=True, on_round=on_round)
    detail = batch.detail
    return RunHistory(
        cluster_models=batch.cluster_models[:, 0],
        routes=batch.routes[:, 0].astype(np.int64),
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
