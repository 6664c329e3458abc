"""The batched simulator's one round loop, for every algorithm (routing and FedCAM).

:func:`run_rounds` drives an algorithm object in core's init/step style — a client
side (:meth:`RoundAlgorithm.client_step`, the function the Flower ClientApp runs) and
the server side the Flower strategy runs: :func:`fedroute.core.server_step.server_step`
(the cluster models under the influence bounds, the federation estimate, the health
view), then the algorithm's own :meth:`RoundAlgorithm.server_update` (FedCAM: its
global part, under the same bounds).  The loop samples who plays
(:func:`fedroute.core.participation.participating`), calls the observer and records
what every algorithm records; an algorithm adds its own per-round detail.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np
from numpy.typing import NDArray

from fedroute.core.federation import FederationState
from fedroute.core.health import RoutingView
from fedroute.core.influence import InfluenceBounds, RoundAggregate
from fedroute.core.participation import Participation, participating
from fedroute.core.server_step import RoundReplies, ServerState, server_init, server_step
from fedroute.core.settings import RoutingSettings
from fedroute.core.signature_start import SignatureOrders, Signatures, signature_orders
from fedroute.core.task import ClientBatch, Task
from fedroute.monitoring.telemetry import ClientReplies

__all__ = ["Federation", "ClientStep", "RoundAlgorithm", "SimulatedRound", "OnRound", "run_rounds",
           "concatenate_clients", "select_clients", "changed_models", "kept_model_rounds", "fill_rows"]


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


def kept_model_rounds(num_rounds: int, model_rounds: Optional[Sequence[int]]) -> set[int]:
    """The rounds ``t ∈ 0..T`` whose models a history records (all when ``model_rounds`` is None)."""
    kept = set(range(num_rounds + 1)) if model_rounds is None else {int(t) for t in model_rounds}
    if any(not 0 <= t <= num_rounds for t in kept):
        raise ValueError(f"model_rounds must lie in [0, {num_rounds}]")
    return kept


def changed_models(models: NDArray, previous: NDArray) -> NDArray[np.bool_]:
    """Which cluster models of which runs changed, shape (R, K)."""
    return np.any(models != previous, axis=-1)


def fill_rows(rows: NDArray[np.int64], values: NDArray, fill: Any, size: int) -> NDArray:
    """Per-client ``values`` of the clients ``rows``, ``fill`` for the others, shape (size, ...)."""
    values = np.asarray(values)
    full = np.full((size,) + values.shape[1:], fill, dtype=values.dtype)
    full[rows] = values
    return full


@dataclass(frozen=True)
class Federation:
    """The clients of ``R`` runs as one federation (client axis run-major: run ``r``'s ``n`` clients in order).

    Attributes
    ----------
    clients : ClientBatch
        Every client of every run.
    num_runs, num_clients : int
        ``R`` and ``n`` per run.
    run_of_client, seed_of_client, client_ids, join_rounds : ndarray of int, shape (R·n,)
        Each client's run, run seed, global id and first round it can be sampled in.
    num_examples : ndarray, shape (R·n,)
        ``n_i``.
    """

    clients: ClientBatch
    num_runs: int
    num_clients: int
    run_of_client: NDArray[np.int64]
    seed_of_client: NDArray[np.int64]
    client_ids: NDArray[np.int64]
    join_rounds: NDArray[np.int64]
    num_examples: NDArray

    @classmethod
    def of_tasks(cls, tasks: Sequence[Task], seeds: Sequence[int],
                 join_rounds: Optional[NDArray[np.int64]] = None) -> "Federation":
        """The federation of one task per run (equal ``num_clients``; one seed per task)."""
        if len(tasks) != len(seeds) or not tasks:
            raise ValueError(f"need one seed per task; got {len(tasks)} tasks and {len(seeds)} seeds")
        num_runs, num_clients = len(tasks), tasks[0].num_clients
        if any(task.num_clients != num_clients for task in tasks):
            raise ValueError("every run of a batch needs the same num_clients")
        clients = concatenate_clients([task.clients(np.arange(num_clients)) for task in tasks])
        run_of_client = np.repeat(np.arange(num_runs), num_clients)
        joins = np.zeros(num_runs * num_clients, np.int64) if join_rounds is None else \
            np.broadcast_to(np.asarray(join_rounds, dtype=np.int64), (num_runs, num_clients)).reshape(-1)
        return cls(clients=clients, num_runs=num_runs, num_clients=num_clients, run_of_client=run_of_client,
                   seed_of_client=np.asarray(seeds, dtype=np.int64)[run_of_client],
                   client_ids=np.asarray(clients.client_ids, dtype=np.int64), join_rounds=joins,
                   num_examples=clients.num_examples)

    def playing(self, round_index: int, participation: Participation) -> NDArray[np.bool_]:
        """Which clients play round ``t`` (the Flower strategy's sample; joined clients only)."""
        return participating(self.client_ids, self.run_of_client, self.seed_of_client, self.num_runs, round_index,
                             participation, self.join_rounds <= round_index)

    def part(self, rows: NDArray[np.int64]) -> ClientBatch:
        """The client batch of the clients ``rows`` (the whole batch when everyone plays)."""
        return self.clients if len(rows) == len(self.run_of_client) else select_clients(self.clients, rows)


@dataclass(frozen=True)
class ClientStep:
    """What the clients that played sent back in one round (leading axis: those clients, in row order).

    Attributes
    ----------
    routes, preferred : ndarray of int, shape (m,)
        Executed route and Greedy choice.
    losses : ndarray, shape (m, K)
        Training losses of the ``K`` models the clients received.
    trained_models : ndarray, shape (m, P)
        The trained cluster parts ``w_i^+`` the server step aggregates.
    arm : ndarray of int, shape (m,)
        EXP3 arm in force (``-1`` for none).
    arm_probabilities : ndarray, shape (m, A)
        EXP3 probabilities at the start of the round (``A = 0`` without arms).
    entered, released : ndarray of bool, shape (m,)
        Hysteresis episode events.
    signatures : Signatures, optional
        The signatures sent (the signature start).
    extra : Any
        The algorithm's own (its replies, detail and server update read it).
    """

    routes: NDArray[np.int64]
    preferred: NDArray[np.int64]
    losses: NDArray[np.float64]
    trained_models: NDArray[np.floating]
    arm: NDArray[np.int64]
    arm_probabilities: NDArray[np.float64]
    entered: NDArray[np.bool_]
    released: NDArray[np.bool_]
    signatures: Optional[Signatures] = None
    extra: Any = None


class RoundAlgorithm(Protocol):
    """An algorithm as :func:`run_rounds` drives it (pure: every state in, every state out)."""

    settings: RoutingSettings

    def init(self, tasks: Sequence[Task], federation: Federation) -> tuple[Any, Any]:
        """``(models, client_state)`` before round 0."""

    def provisional_masses(self, models: Any, client_state: Any, federation: Federation,
                           participation: Participation, influence: InfluenceBounds) -> Optional[NDArray]:
        """The masses round 0's clients receive (synchronized entry's provisional masses), or None."""

    def cluster_parts(self, models: Any) -> NDArray[np.floating]:
        """The ``(R, K, P)`` cluster models the server step updates."""

    def client_step(self, models: Any, client_state: Any, federation: Federation, rows: NDArray[np.int64],
                    masses: Optional[NDArray], view: Optional[RoutingView], round_index: int, num_rounds: int,
                    orders: Optional[SignatureOrders] = None) -> tuple[Any, ClientStep]:
        """Round ``t`` of the clients ``rows``: the next client state and their replies (``orders``: the signature
        start's holds and requests, :mod:`fedroute.core.signature_start`)."""

    def server_update(self, models: Any, aggregate: RoundAggregate, step: ClientStep, replies: RoundReplies,
                      influence: InfluenceBounds) -> Any:
        """The next models, given the server step's aggregate of the cluster parts (of ``replies``)."""

    def recorded_models(self, models: Any, federation: Federation) -> NDArray[np.floating]:
        """What a history records as ``W^t``, shape (R, K, ·)."""

    def replies(self, step: ClientStep, part: ClientBatch, num_examples: NDArray) -> ClientReplies:
        """The round as the replies the Flower strategy validates (for ``on_round``)."""

    def detail(self, models: Any, step: Optional[ClientStep], federation: Federation,
               rows: NDArray[np.int64]) -> dict[str, NDArray]:
        """Per-round detail (``step`` None: before round 0); stacked over the rounds."""

    def final_detail(self, models: Any, client_state: Any) -> dict[str, Any]:
        """Detail of the end of the run."""


@dataclass(frozen=True)
class LoopResult:
    """What :func:`run_rounds` returns: the records (lists per key, one entry per round) and final states."""

    record: dict[str, list]
    detail: dict[str, Any]
    provisional_masses: Optional[NDArray[np.float64]]
    models: Any
    client_state: Any


def run_rounds(algorithm: RoundAlgorithm, tasks: Sequence[Task], federation: Federation, num_rounds: int,
               detail: bool, kept_rounds: set[int], on_round: Optional[OnRound], participation: Participation,
               influence: InfluenceBounds) -> LoopResult:
    """The round loop of every algorithm (module docstring); :class:`LoopResult` holds what it recorded."""
    settings, num_runs = algorithm.settings, federation.num_runs
    models, client_state = algorithm.init(tasks, federation)
    server = server_init(FederationState.of_clients(federation.client_ids, settings.num_clusters,
                                                    federation.run_of_client),
                         num_runs, settings.num_clusters, settings, participation)
    start = np.array(algorithm.cluster_parts(models), copy=True) if settings.restart_idle_spares else None
    provisional = algorithm.provisional_masses(models, client_state, federation, participation, influence)
    masses = provisional
    recorder = _Record(federation, detail, kept_rounds, algorithm)
    recorder.start(models)
    latest_routes = np.full(len(federation.run_of_client), -1, dtype=np.int64)
    for round_index in range(num_rounds):
        played = federation.playing(round_index, participation)
        rows = np.flatnonzero(played)
        runs = federation.run_of_client[rows]
        orders = signature_orders(server.signatures, rows, runs, round_index, settings, participation,
                                  algorithm.cluster_parts(models) if round_index == 0 else None)
        client_state, step = algorithm.client_step(models, client_state, federation, rows, masses,
                                                   _view_of(server, runs), round_index, num_rounds, orders)
        previous = models
        models, server = _server_round(algorithm, models, server, step, rows, runs, federation, round_index,
                                       participation, influence, start)
        masses = server.estimate.masses
        latest_routes[rows] = step.routes
        if on_round is not None:
            on_round(_observed(algorithm, round_index, masses, federation, rows, runs, step, models, previous,
                               server))
        recorder.round(round_index, models, latest_routes, played, masses, step, rows)
    return LoopResult(record=recorder.record, detail=recorder.finish(models, client_state),
                      provisional_masses=provisional, models=models, client_state=client_state)


def _view_of(server: ServerState, runs: NDArray[np.int64]) -> Optional[RoutingView]:
    """The server's health view, one row per playing client (None when the routing does not read it)."""
    if server.view is None:
        return None
    view = server.view
    return RoutingView(explore=view.explore[runs], merged_into=view.merged_into[runs], spare=view.spare[runs])


def _server_round(algorithm: RoundAlgorithm, models: Any, server: ServerState, step: ClientStep,
                  rows: NDArray[np.int64], runs: NDArray[np.int64], federation: Federation, round_index: int,
                  participation: Participation, influence: InfluenceBounds,
                  start_models: Optional[NDArray[np.floating]] = None) -> tuple[Any, ServerState]:
    """The strategy's server side: :func:`~fedroute.core.server_step.server_step`, then the algorithm's update
    (``start_models``: the cluster models ``W^0``, where ``restart_idle_spares`` returns an idle spare)."""
    replies = RoundReplies(rows=rows, routes=step.routes, preferred=step.preferred,
                           num_examples=federation.num_examples[rows], losses=step.losses,
                           trained_models=step.trained_models, run_index=runs, signatures=step.signatures)
    aggregate, server = server_step(algorithm.cluster_parts(models), server, replies, round_index,
                                    algorithm.settings, participation, influence, federation.num_runs, start_models)
    return algorithm.server_update(models, aggregate, step, replies, influence), server


def _observed(algorithm: RoundAlgorithm, round_index: int, masses: NDArray, federation: Federation,
              rows: NDArray[np.int64], runs: NDArray[np.int64], step: ClientStep, models: Any, previous: Any,
              server: ServerState) -> SimulatedRound:
    """The round as its observer sees it (replies and changed flags built when asked for)."""
    return SimulatedRound(
        round_index, masses, federation.num_clients,
        replies=functools.partial(algorithm.replies, step, federation.part(rows), federation.num_examples[rows]),
        changed=functools.partial(changed_models, algorithm.cluster_parts(models), algorithm.cluster_parts(previous)),
        run_index=runs, spare=None if server.view is None else server.view.spare)


class _Record:
    """What :func:`run_rounds` records, round by round (per-client rows of the clients that played)."""

    KEYS = ("cluster_models", "routes", "played", "masses", "mean_arm_probabilities", "arm_fractions",
            "entered", "released")

    def __init__(self, federation: Federation, detail: bool, kept_rounds: set[int], algorithm: RoundAlgorithm
                 ) -> None:
        self.federation, self.detail, self.kept_rounds, self.algorithm = federation, detail, kept_rounds, algorithm
        self.num_runs, self.num_clients = federation.num_runs, federation.num_clients
        self.route_dtype = np.int8 if algorithm.settings.num_clusters < 127 else np.int16
        self.record: dict[str, list] = {key: [] for key in self.KEYS}
        self.detailed: dict[str, list] = {}

    def _models(self, round_number: int, models: Any) -> None:
        if round_number in self.kept_rounds:
            self.record["cluster_models"].append(self.algorithm.recorded_models(models, self.federation))

    def _add_detail(self, values: dict[str, NDArray]) -> None:
        for key, value in values.items():
            self.detailed.setdefault(key, []).append(value)

    def start(self, models: Any) -> None:
        self._models(0, models)
        if self.detail:
            self._add_detail(self.algorithm.detail(models, None, self.federation, np.zeros(0, np.int64)))

    def _per_run(self, rows: NDArray[np.int64], values: NDArray, fill: Any, played: NDArray[np.bool_],
                 mean: bool) -> NDArray:
        """Sum (or mean over the clients that played) of per-client values, per run."""
        values = fill_rows(rows, values, fill, self.num_runs * self.num_clients)
        shaped = values.reshape(self.num_runs, self.num_clients, *values.shape[1:])
        weight = played.reshape(self.num_runs, self.num_clients, *([1] * (values.ndim - 1)))
        total = (shaped * weight).sum(axis=1)
        return total / np.maximum(weight.sum(axis=1), 1) if mean else total

    def round(self, round_index: int, models: Any, routes: NDArray, played: NDArray[np.bool_], masses: NDArray,
              step: ClientStep, rows: NDArray[np.int64]) -> None:
        self._models(round_index + 1, models)
        num_arms = step.arm_probabilities.shape[1]
        arm_in_force = (step.arm[:, None] == np.arange(num_arms)).astype(np.float64)
        for key, value in (
            ("routes", routes.astype(self.route_dtype).reshape(self.num_runs, self.num_clients)),
            ("played", played.reshape(self.num_runs, self.num_clients)),
            ("masses", masses),
            ("mean_arm_probabilities", self._per_run(rows, step.arm_probabilities, 0.0, played, True)),
            ("arm_fractions", self._per_run(rows, arm_in_force, 0.0, played, True)),
            ("entered", self._per_run(rows, step.entered.astype(np.int64), 0, played, False)),
            ("released", self._per_run(rows, step.released.astype(np.int64), 0, played, False)),
        ):
            self.record[key].append(value)
        if self.detail:
            self._add_detail(self.algorithm.detail(models, step, self.federation, rows))

    def finish(self, models: Any, client_state: Any) -> dict[str, Any]:
        if not self.detail:
            return {}
        return {**{key: np.stack(values) for key, values in self.detailed.items()},
                **self.algorithm.final_detail(models, client_state)}
