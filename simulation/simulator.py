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
records what the experiments need.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Callable, Optional, Sequence

import numpy as np
from numpy.typing import NDArray

from fedroute.core.agent import AgentState
from fedroute.core.aggregation import routing_masses
from fedroute.core.client_step import client_round, provisional_greedy_routes
from fedroute.core.exp3 import arm_probabilities
from fedroute.core.federation import FederationState
from fedroute.core.health import RoutingView
from fedroute.core.influence import InfluenceBounds, capped_weights
from fedroute.core.participation import Participation, participating
from fedroute.core.server_step import RoundReplies, server_init, server_step
from fedroute.core.settings import RoutingSettings
from fedroute.core.task import ClientBatch, Task
from fedroute.monitoring.telemetry import ClientReplies, node_id_array

__all__ = ["RunHistory", "BatchHistory", "SimulatedRound", "simulate", "simulate_batch", "concatenate_clients",
           "select_clients", "recording", "changed_models", "kept_model_rounds", "simulate_local"]


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
    spare : ndarray of bool, shape (R, K), or None
        The server's spare clusters (when the routing reads the health view).
    """

    def __init__(self, round_index: int, masses: NDArray[np.float64], num_clients: int,
                 replies: Callable[[], ClientReplies], changed: Callable[[], NDArray[np.bool_]],
                 run_index: Optional[NDArray[np.int64]] = None, spare: Optional[NDArray[np.bool_]] = None) -> None:
        self.round_index = round_index
        self.masses = masses
        self.spare = spare
        self.num_clients = num_clients
        self.run_index = run_index
        self._replies, self._changed = replies, changed

    @functools.cached_property
    def replies(self) -> ClientReplies:
        """Every client that played, of every run (run-major), as a Flower strategy would have received them."""
        return self._replies()

    @functools.cached_property
    def changed(self) -> NDArray[np.bool_]:
        """Whether each cluster model changed, shape (R, K)."""
        return self._changed()

    def run(self, run: int) -> ClientReplies:
        """The replies of run ``run``."""
        if self.run_index is None:
            return self.replies.select(slice(run * self.num_clients, (run + 1) * self.num_clients))
        return self.replies.select(np.flatnonzero(self.run_index == run))


OnRound = Callable[[SimulatedRound], None]
"""``on_round(simulated_round)``: called after every simulated round."""


def recording(recorder: Any, run: int = 0) -> OnRound:
    """An ``on_round`` observer feeding run ``run`` to a :class:`~fedroute.monitoring.recorder.RunRecorder`."""
    def observe(simulated: SimulatedRound) -> None:
        recorder.round(simulated.round_index + 1, simulated.run(run), simulated.masses[run],
                       simulated.changed[run].tolist(), spare=None if simulated.spare is None else simulated.spare[run])
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


def select_clients(batch: ClientBatch, index: NDArray[np.int64]) -> ClientBatch:
    """The clients ``index`` of a (dataclass) batch, in that order: the inverse of :func:`concatenate_clients`.

    Array fields (and tuples of arrays) are indexed along the client axis, a nested
    client batch recursively; other fields are kept.
    """
    if not is_dataclass(batch):
        raise TypeError(f"cannot select clients of {type(batch).__name__}: not a dataclass")
    chosen: dict[str, Any] = {}
    for field in fields(batch):
        value = getattr(batch, field.name)
        if isinstance(value, np.ndarray):
            chosen[field.name] = value[index]
        elif is_dataclass(value) and not isinstance(value, type):
            chosen[field.name] = select_clients(value, index)
        elif isinstance(value, tuple) and value and isinstance(value[0], np.ndarray):
            chosen[field.name] = tuple(part[index] for part in value)
    return replace(batch, **chosen)


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
    if len(tasks) != len(seeds) or not tasks:
        raise ValueError(f"need one seed per task; got {len(tasks)} tasks and {len(seeds)} seeds")
    num_clients = tasks[0].num_clients
    if any(task.num_clients != num_clients for task in tasks):
        raise ValueError("every run of a batch needs the same num_clients")
    num_runs, num_clusters = len(tasks), settings.num_clusters
    clients = concatenate_clients([task.clients(np.arange(num_clients)) for task in tasks])
    run_of_client = np.repeat(np.arange(num_runs), num_clients)
    seed_of_client = np.asarray(seeds, dtype=np.int64)[run_of_client]
    client_ids = np.asarray(clients.client_ids, dtype=np.int64)
    joins = np.zeros(num_runs * num_clients, np.int64) if join_rounds is None else \
        np.broadcast_to(np.asarray(join_rounds, dtype=np.int64), (num_runs, num_clients)).reshape(-1)
    num_examples = clients.num_examples
    models = np.stack([task.initial_models(num_clusters) for task in tasks])
    state = AgentState.initial(num_runs * num_clients, settings)
    server = server_init(FederationState.of_clients(client_ids, num_clusters, run_of_client), num_runs, num_clusters,
                         settings, participation)
    masses: Optional[NDArray[np.float64]] = None
    provisional = None
    if settings.synchronized_entry:
        reporting = participating(client_ids, run_of_client, seed_of_client, num_runs, 0, participation, joins <= 0)
        rows = np.flatnonzero(reporting)
        greedy = provisional_greedy_routes(select_clients(clients, rows), models[run_of_client[rows]], settings,
                                           seed_of_client[rows])
        weights = capped_weights(num_examples[rows], influence.max_weight_ratio, run_of_client[rows], num_runs)
        provisional = routing_masses(greedy, weights, num_clusters, run_of_client[rows], num_runs)
        masses = provisional
    route_dtype = np.int8 if num_clusters < 127 else np.int16
    recorder = _Record(num_runs, num_clients, detail, kept_model_rounds(num_rounds, model_rounds))
    recorder.models(0, models)
    latest_routes = np.full(num_runs * num_clients, -1, dtype=np.int64)
    for round_index in range(num_rounds):
        played = participating(client_ids, run_of_client, seed_of_client, num_runs, round_index, participation,
                               joins <= round_index)
        rows = np.flatnonzero(played)
        every = len(rows) == len(played)
        part = clients if every else select_clients(clients, rows)
        before = state if every else state.select(rows)
        probabilities = arm_probabilities(before.exp3_log_weights, settings.exp3_exploration)
        runs = run_of_client[rows]
        view = None if server.view is None else RoutingView(
            explore=server.view.explore[runs], merged_into=server.view.merged_into[runs], spare=server.view.spare[runs])
        result = client_round(part, before, settings, models[runs], None if masses is None else masses[runs],
                              round_index, seed_of_client[rows], num_rounds, view)
        decision = result.decision
        state = result.state if every else state.scatter(rows, result.state)
        previous_models = models
        outcome, server = server_step(models, server, RoundReplies(
            rows=rows, routes=decision.routes, preferred=decision.preferred, num_examples=num_examples[rows],
            losses=result.losses, trained_models=result.trained_models, run_index=runs),
            round_index, settings, participation, influence, num_runs)
        models = outcome.models
        masses = server.estimate.masses
        latest_routes[rows] = decision.routes
        if on_round is not None:
            on_round(SimulatedRound(
                round_index, masses, num_clients,
                replies=functools.partial(_replies, part, num_examples[rows], result.losses, decision, result.state),
                changed=functools.partial(changed_models, models, previous_models), run_index=runs,
                spare=None if server.view is None else server.view.spare))
        recorder.models(round_index + 1, models)
        recorder.round(latest_routes.astype(route_dtype), played, masses, probabilities, decision, rows,
                       settings.num_arms, result.losses)
    return recorder.history(provisional, clients, num_examples, state)


class _Record:
    """What :func:`simulate_batch` records, round by round (per-client rows of the clients that played)."""

    def __init__(self, num_runs: int, num_clients: int, detail: bool, kept_rounds: set[int]) -> None:
        self.num_runs, self.num_clients, self.detail, self.kept_rounds = num_runs, num_clients, detail, kept_rounds
        keys = ["cluster_models", "routes", "played", "masses", "mean_arm_probabilities", "arm_fractions",
                "entered", "released"]
        self.record: dict[str, list] = {key: [] for key in keys}
        self.detailed: dict[str, list] = {key: [] for key in (
            "train_losses", "controllers", "arms", "arm_probabilities", "entered", "released")}

    def models(self, round_number: int, models: NDArray) -> None:
        if round_number in self.kept_rounds:
            self.record["cluster_models"].append(models)

    def _full(self, rows: NDArray[np.int64], values: NDArray, fill: Any) -> NDArray:
        """Per-client values of the clients that played, ``fill`` for the others, shape (R·n, ...)."""
        full = np.full((self.num_runs * self.num_clients,) + values.shape[1:], fill, dtype=values.dtype)
        full[rows] = values
        return full

    def _per_run(self, values: NDArray, played: NDArray[np.bool_], mean: bool) -> NDArray:
        """Sum (or mean over the clients that played) of per-client values, per run."""
        shaped = values.reshape(self.num_runs, self.num_clients, *values.shape[1:])
        weight = played.reshape(self.num_runs, self.num_clients, *([1] * (values.ndim - 1)))
        total = (shaped * weight).sum(axis=1)
        return total / np.maximum(weight.sum(axis=1), 1) if mean else total

    def round(self, routes: NDArray, played: NDArray[np.bool_], masses: NDArray, probabilities: NDArray,
              decision: Any, rows: NDArray[np.int64], num_arms: int, losses: NDArray) -> None:
        arm_in_force = (decision.arm[:, None] == np.arange(num_arms)).astype(np.float64)
        for key, value in (
            ("routes", routes.reshape(self.num_runs, self.num_clients)),
            ("played", played.reshape(self.num_runs, self.num_clients)),
            ("masses", masses),
            ("mean_arm_probabilities", self._per_run(self._full(rows, probabilities, 0.0), played, True)),
            ("arm_fractions", self._per_run(self._full(rows, arm_in_force, 0.0), played, True)),
            ("entered", self._per_run(self._full(rows, decision.entered.astype(np.int64), 0), played, False)),
            ("released", self._per_run(self._full(rows, decision.released.astype(np.int64), 0), played, False)),
        ):
            self.record[key].append(value)
        if self.detail:
            for key, value, fill in (
                    ("train_losses", losses, np.nan), ("controllers", decision.controller, -1),
                    ("arms", decision.arm, -1), ("arm_probabilities", probabilities, np.nan),
                    ("entered", decision.entered, False), ("released", decision.released, False)):
                self.detailed[key].append(self._full(rows, np.asarray(value), fill))

    def history(self, provisional: Optional[NDArray], clients: ClientBatch, num_examples: NDArray,
                state: AgentState) -> BatchHistory:
        extra: dict[str, Any] = {}
        if self.detail:
            extra = {key: np.stack(values) for key, values in self.detailed.items()}
            extra["final_state"] = state
        return BatchHistory(
            **{key: np.stack(values) for key, values in self.record.items()},
            provisional_masses=provisional,
            groups=clients.groups.reshape(self.num_runs, self.num_clients),
            num_examples=num_examples.reshape(self.num_runs, self.num_clients),
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
