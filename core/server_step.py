"""The server's round, one implementation for both runtimes: models, federation estimate, health.

After a round's replies are in (validated, in client-id order), the server

1. updates the cluster models under the influence bounds
   (:func:`fedroute.core.influence.aggregate_round`: capped weights, update-norm bound,
   robust rule; a cluster whose aggregate is not finite keeps its model and its replies
   are dropped);
2. records every kept reply as its client's latest report and estimates the masses
   ``μ̂`` and preferred masses ``p̂`` from every client's latest report
   (:mod:`fedroute.core.federation`);
3. weighs the evidence of collapse — unwanted clusters, spares, duplicates — and decides
   what the clients receive next round (:mod:`fedroute.core.health`), when the routing
   reads it (``explore_on = "collapse"``, ``consolidate_duplicates`` or ``reseed_empty``);
   a re-seeded cluster's model is replaced by a copy of its source, or — with ``reseed_split`` —
   the source's replies of the round are split in two by direction (:mod:`fedroute.core.split`)
   and the source and the re-seeded cluster get one half each; with ``restart_idle_spares`` a spare
   cluster no known client's latest route lies on returns to its start model;
4. with the signature start (``signature_hold_rounds > 0``), records the replies' signatures, parts the
   clients once the first rounds' are in and places late ones (:mod:`fedroute.core.signature_start`).

:class:`ServerState` holds everything but the models, in the style of optax's states:
``server_init`` makes it, :func:`server_step` maps ``(models, state, replies)`` to the next
ones.  The Flower strategy calls it with one run's replies; the batched simulator with the
replies of ``R`` runs (``run_index``).  A run's result does not depend on its batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.federation import FederationEstimate, FederationState, estimate_federation
from fedroute.core.health import (ClusterHealth, RoutingView, crowded, duplicate_twins, idle_spares, routing_view,
                                  update_health, within_reach)
from fedroute.core.influence import InfluenceBounds, RoundAggregate, aggregate_round
from fedroute.core.participation import Participation
from fedroute.core.copies import assigned_copies, identical_pools
from fedroute.core.signature_structure import SignatureStructure, either_structure
from fedroute.core.settings import RoutingSettings
from fedroute.core.signature_start import Signatures, SignatureState, signature_step
from fedroute.core.signature_twins import twin_holds, twin_sources
from fedroute.core.split import partition, split_models

__all__ = ["ServerState", "RoundReplies", "server_init", "server_step", "reads_health", "evidence_settings",
           "copy_routes", "identical_pools"]


@dataclass(frozen=True)
class RoundReplies:
    """A round's valid replies (leading axis: replies, in the order they are summed).

    Attributes
    ----------
    rows : ndarray of int, shape (m,)
        Each reply's client row in :attr:`ServerState.federation`.
    routes, preferred : ndarray of int, shape (m,)
        Executed route and Greedy choice.
    num_examples : ndarray, shape (m,)
        Claimed sample counts.
    losses : ndarray, shape (m, K)
        Reported training losses of the ``K`` models.
    trained_models : ndarray, shape (m, P)
        ``w_i^+``.
    run_index : ndarray of int, shape (m,), optional
        The run of each reply (batched runs).
    signatures : Signatures, optional
        The signatures some replies carried (the signature start, :mod:`fedroute.core.signature_start`).
    """

    rows: NDArray[np.int64]
    routes: NDArray[np.int64]
    preferred: NDArray[np.int64]
    num_examples: NDArray[np.floating]
    losses: NDArray[np.float64]
    trained_models: NDArray[np.floating]
    run_index: Optional[NDArray[np.int64]] = None
    signatures: Optional[Signatures] = None


@dataclass(frozen=True)
class ServerState:
    """The server's state besides the models.

    Attributes
    ----------
    federation : FederationState
        Every known client's latest report.
    estimate : FederationEstimate or None
        ``μ̂``, ``p̂`` after the last round (None before any).
    health : ClusterHealth
    view : RoutingView or None
        What the clients receive next round (None when the routing does not read it, or before any round).
    signatures : SignatureState or None
        The signature start's state (None without it).
    """

    federation: FederationState
    estimate: Optional[FederationEstimate]
    health: ClusterHealth
    view: Optional[RoutingView]
    signatures: Optional[SignatureState] = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (a checkpoint's); :meth:`from_json` inverts it."""
        def arrays(value: Any) -> Optional[dict[str, list]]:
            return None if value is None else {name: np.asarray(getattr(value, name)).tolist()
                                               for name in value.__dataclass_fields__}
        return {"federation": arrays(self.federation), "estimate": arrays(self.estimate),
                "health": arrays(self.health), "view": arrays(self.view), "signatures": arrays(self.signatures)}

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "ServerState":
        """Inverse of :meth:`to_json`; raises ``KeyError``/``ValueError``/``TypeError`` on malformed input."""
        def arrays(kind: Any, stored: Optional[dict[str, list]]) -> Any:
            if stored is None:
                return None
            return kind(**{name: np.asarray(stored[name], dtype=_DTYPES[name]) for name in kind.__dataclass_fields__})
        federation, health = arrays(FederationState, values["federation"]), arrays(ClusterHealth, _with_structure(
            values["health"]))
        if federation.losses.ndim != 2:                                   # no client yet: (0,) → (0, K)
            federation = replace(federation, losses=federation.losses.reshape(len(federation.client_ids),
                                                                             health.spare.shape[1]))
        signatures = arrays(SignatureState, _with_active(values.get("signatures")))
        if signatures is not None and signatures.means.ndim != 3:          # no signature yet: (N, 0) → (N, 0, 0)
            signatures = replace(signatures, means=signatures.means.reshape(len(signatures.known), 0, 0),
                                 counts=signatures.counts.reshape(len(signatures.known), 0))
        return cls(federation=federation, estimate=arrays(FederationEstimate, values["estimate"]),
                   health=health, view=arrays(RoutingView, values["view"]), signatures=signatures)


def _with_active(stored: Optional[dict[str, list]]) -> Optional[dict[str, list]]:
    """A stored signature state with the fields it predates: its active runs (every run: the option as it was,
    ``signature_start_on = "always"``) and its copy starts (the active runs: a run the start acted in then is
    parted whatever its class counts, as it was)."""
    if stored is None:
        return stored
    active = stored.get("active", [True] * len(stored["parted_round"]))
    return {**stored, "active": active, "copy_start": stored.get("copy_start", active),
            "regrouped": stored.get("regrouped", [-1] * len(stored["known"])),
            "regroup_round": stored.get("regroup_round", [-1] * len(stored["parted_round"])),
            "twin_target": stored.get("twin_target", [-1] * len(stored["known"])),
            "twin_streak": stored.get("twin_streak", [0] * len(stored["known"]))}


def _with_structure(stored: Optional[dict[str, list]]) -> Optional[dict[str, list]]:
    """A stored health state with the structure evidence added when it predates it (no evidence yet)."""
    if stored is None or "parted_before" in stored:
        return stored
    spare = np.asarray(stored["spare"], dtype=bool)
    return {**stored, "parted_before": np.zeros_like(spare).tolist(), "read_whole": np.zeros_like(spare).tolist(),
            "apart_rounds": [0] * len(spare)}


_DTYPES = {"client_ids": np.int64, "run_index": np.int64, "last_round": np.int64, "route": np.int64,
           "preferred": np.int64, "num_examples": np.float64, "losses": np.float64, "masses": np.float64,
           "preferred_masses": np.float64, "reporting": np.int64, "unwanted_rounds": np.int64, "wanted_rounds": np.int64,
           "exploring_rounds": np.int64, "spare": bool, "known_clients": np.int64, "explore": bool,
           "merged_into": np.int64, "twin": np.int64, "twin_rounds": np.int64, "calm_rounds": np.int64,
           "settled": bool, "reseeded_from": np.int64, "reseeds": np.int64, "parted_before": bool,
           "read_whole": bool, "apart_rounds": np.int64, "means": np.float64, "counts": np.float64, "known": bool,
           "held": np.int64, "parted_round": np.int64, "active": bool, "copy_start": bool,
           "regrouped": np.int64, "regroup_round": np.int64, "twin_target": np.int64, "twin_streak": np.int64}
"""The dtype of every array field of the server state (JSON keeps numbers only)."""


def reads_health(settings: RoutingSettings) -> bool:
    """Whether the routing reads the server's health report (``explore_on = "collapse"`` or duplicate merges)."""
    return settings.explores_on_evidence or settings.consolidate_duplicates or settings.reseed_empty


def server_init(federation: FederationState, num_runs: int, num_clusters: int,
                settings: Optional[RoutingSettings] = None, participation: Optional[Participation] = None
                ) -> ServerState:
    """The state before round 0.

    With routing that reads the health report, round 0's view is the server's too: the start explores
    (``explore_at_start``) only with every client in every round.  Under partial participation a client
    plays a fraction of the rounds, so its EXP3 learns over few of its own rounds while the start's
    exploration scrambles every model; measured (``docs/algorithm.md``, "Exploration on evidence"), the
    start's exploration then harmed more runs than it recovered, and collapse signs and re-seeding do the
    recovering.
    """
    health = ClusterHealth.initial(num_runs, num_clusters)
    signatures = SignatureState.initial(len(federation.client_ids), num_runs,
                                        np.full(num_runs, settings.signature_start_on != "copies"),
                                        np.zeros(num_runs, dtype=bool)) \
        if settings is not None and settings.signature_hold_rounds > 0 else None
    if settings is None or not reads_health(settings):
        return ServerState(federation=federation, estimate=None, health=health, view=None, signatures=signatures)
    full = participation is None or participation.fraction >= 1.0
    health = replace(health, settled=np.full(num_runs, not (settings.explore_at_start and full)))
    return ServerState(federation=federation, estimate=None, health=health, view=routing_view(health, settings),
                       signatures=signatures)


def server_step(cluster_models: NDArray[np.floating], state: ServerState, replies: RoundReplies, round_index: int,
                settings: RoutingSettings, participation: Participation, influence: InfluenceBounds,
                num_runs: int = 1, start_models: Optional[NDArray[np.floating]] = None
                ) -> tuple[RoundAggregate, ServerState]:
    """One server round (module docstring).

    Parameters
    ----------
    cluster_models : ndarray, shape (K, P), or (R, K, P) for batched runs
        ``W^t``.
    state : ServerState
    replies : RoundReplies
    round_index : int
        ``t``.
    settings : RoutingSettings
    participation : Participation
        How long a report counts (``report_rounds``).
    influence : InfluenceBounds
    num_runs : int
        ``R``.
    start_models : ndarray, optional
        ``W^0``, shaped as ``cluster_models``: where ``restart_idle_spares`` returns an idle spare
        (required with it).

    Returns
    -------
    aggregate : RoundAggregate
        ``W^{t+1}`` and which replies were kept.
    state : ServerState

    Raises
    ------
    ValueError
        ``restart_idle_spares`` without ``start_models``, or start models of another shape.
    """
    if settings.restart_idle_spares and reads_health(settings) and (
            start_models is None or np.shape(start_models) != np.shape(cluster_models)):
        raise ValueError(f"server_step: restart_idle_spares needs start_models shaped as the cluster models "
                         f"{np.shape(cluster_models)}, got {None if start_models is None else np.shape(start_models)}; "
                         "pass the run's initial cluster models, or set restart_idle_spares = False")
    replies = copy_routes(cluster_models, replies, settings, num_runs)
    outcome = aggregate_round(cluster_models, replies.trained_models, replies.routes, replies.num_examples, influence,
                              replies.run_index)
    kept = outcome.kept
    federation = state.federation.record(replies.rows[kept], round_index, replies.routes[kept],
                                         replies.preferred[kept], np.asarray(replies.num_examples)[kept],
                                         np.asarray(replies.losses)[kept])
    estimate = estimate_federation(federation, round_index, participation.report_rounds,
                                   cluster_models.shape[-2], num_runs, influence.max_weight_ratio, state.estimate)
    health, view, regroups = state.health, None, None
    counted = federation.counted(round_index, participation.report_rounds)
    if reads_health(settings):
        twins = np.full(estimate.preferred_masses.shape, -1, dtype=np.int64)
        if settings.consolidate_duplicates:
            twins = duplicate_twins(federation.losses[counted], federation.preferred[counted],
                                    federation.run_index[counted], estimate.preferred_masses, num_runs,
                                    settings.consolidation_loss_ratio,
                                    state.health.spare if settings.restart_idle_spares else None)
        reach = within_reach(federation.losses[counted], federation.preferred[counted],
                             federation.run_index[counted], num_runs, cluster_models.shape[-2],
                             settings.consolidation_loss_ratio) if settings.starving_needs_reach else None
        structure = _RoundStructure(cluster_models, replies, kept, influence, settings)
        by_signature = (SignatureStructure(state.signatures, federation, counted, cluster_models.shape[-2],
                                           settings.split_silhouette) if settings.reseed_by_signature else None)
        counts = (preferred_counts(federation, counted, num_runs, cluster_models.shape[-2])
                  if settings.crowded_by_clients else None)
        busy = crowded(estimate.preferred_masses, counts, twins)
        health, view = update_health(state.health, estimate.preferred_masses, twins,
                                     federation.known_clients(num_runs), evidence_settings(settings, participation),
                                     estimate.reporting, reach,
                                     None if state.estimate is None else state.estimate.preferred_masses,
                                     either_structure(structure.structure if settings.reseed_by_structure
                                                      else None, by_signature),
                                     busy, twin_sources(state.signatures, federation, counted, num_runs,
                                                        cluster_models.shape[-2], settings.collapse_patience)
                                     if settings.merge_by_signature else None)
        outcome = _reseeded(outcome, health.reseeded_from, structure)
        if settings.restart_idle_spares:
            outcome = _restarted(outcome, idle_spares(health.spare, federation.route, federation.run_index, num_runs),
                                 start_models)
        regroups = crowded_reseeds(health.reseeded_from, busy, by_signature)
    signatures = state.signatures
    if settings.signature_hold_rounds > 0:
        signatures = signature_step(signatures or SignatureState.initial(0, num_runs), federation, replies.rows,
                                    replies.signatures, round_index, cluster_models, num_runs, settings,
                                    participation, regroups)
        if settings.merge_by_signature and estimate is not None:
            signatures = twin_holds(signatures, federation, counted, estimate.preferred_masses,
                                    settings.split_silhouette)
    return outcome, ServerState(federation=federation, estimate=estimate, health=health, view=view,
                                signatures=signatures)


def crowded_reseeds(reseeded_from: NDArray[np.int64], crowded_clusters: NDArray[np.bool_],
                    by_signature: Optional[SignatureStructure] = None) -> NDArray[np.int64]:
    """The round's re-seeds (``reseeded_from``, (R, K)) whose source is crowded (``crowded_clusters``, (R, K): the
    round's :func:`~fedroute.core.health.crowded`, the verdict :func:`~fedroute.core.health.update_health` read): the
    count of clients says it holds more than one group — or whose signed own clients part in two groups
    (``by_signature``, :mod:`fedroute.core.signature_structure`); ``-1`` elsewhere."""
    sources = np.asarray(reseeded_from)
    runs = np.arange(len(sources))[:, None]
    busy = np.asarray(crowded_clusters, dtype=bool)[runs, np.maximum(sources, 0)]
    if by_signature is not None:
        for run, target in zip(*np.nonzero(sources >= 0)):
            busy[run, target] |= bool(by_signature(int(run))[1][sources[run, target]])
    return np.where((sources >= 0) & busy, sources, -1)


def preferred_counts(federation: FederationState, counted: NDArray[np.bool_], num_runs: int,
                     num_clusters: int) -> NDArray[np.int64]:
    """Per run and cluster, the counted clients whose latest Greedy choice it is, shape (R, K)."""
    runs, preferred = federation.run_index[counted], federation.preferred[counted]
    valid = preferred >= 0
    return np.bincount(runs[valid] * num_clusters + preferred[valid],
                       minlength=num_runs * num_clusters).reshape(num_runs, num_clusters).astype(np.int64)


def copy_routes(cluster_models: NDArray[np.floating], replies: RoundReplies, settings: RoutingSettings,
                num_runs: int = 1) -> RoundReplies:
    """The replies with the routes into copies of one model re-assigned by update direction (``split_copies``).

    Clusters that entered the round with the same model — ``K`` copies of a warm start, a cluster re-seeded
    with a copy — are one model in several places: a client's route among them was a tie broken at random.
    With ``split_near_copies``, models closer to each other than the round's median update
    ``‖w_i^+ − W_{r_i}‖`` (of the run's replies) count as copies too (a warm start with a little noise).
    Their replies are parted by the direction of their updates ``w_i^+ − W_{r_i}``
    (:func:`fedroute.core.split.partition`, at most one part per copy, a part only where the silhouette
    reaches ``settings.split_silhouette``) and each part is routed to one copy, so that each copy is trained by
    clients that move it the same way — the groups sharing the model separate in one round, where a random
    split of their clients mixes them again.  Parts go to copies heaviest part first (total ``num-examples``,
    ties to the lower part), each to the free copy its clients had routed the most weight to (ties to the
    lower index); copies left without a part keep their model; a reply whose Greedy choice was in the pool is
    counted as preferring its part's copy.  Without structure the replies stay as routed.  Deterministic.
    """
    if not settings.split_copies:
        return replies
    routed = np.asarray(replies.routes)
    routes, preferred = routed.copy(), np.array(replies.preferred, copy=True)
    weights = np.asarray(replies.num_examples, dtype=np.float64)
    trained = np.asarray(replies.trained_models)
    for run in range(num_runs if np.ndim(cluster_models) == 3 else 1):
        models = np.asarray(_run_models(cluster_models, run))
        in_run = np.flatnonzero(_in_run(replies, run))
        if not len(in_run):
            continue
        within = 0.0                                                      # equal models only, unless near copies
        if settings.split_near_copies:
            steps = np.linalg.norm(trained[in_run].astype(np.float64) - models[routed[in_run]], axis=1)
            within = float(np.median(steps))
        for pool in identical_pools(models, within):
            rows = in_run[np.isin(routed[in_run], pool)]
            updates = trained[rows].astype(np.float64) - models[routed[rows]]
            labels = partition(updates, len(pool), settings.split_silhouette)
            if not labels.any():
                continue
            target = assigned_copies(labels, routed[rows], weights[rows], pool)
            routes[rows] = target[labels]
            chose_pool = np.isin(preferred[rows], pool)
            preferred[rows[chose_pool]] = routes[rows[chose_pool]]
    if np.array_equal(routes, routed):
        return replies
    return replace(replies, routes=routes, preferred=preferred)


def evidence_settings(settings: RoutingSettings, participation: Participation) -> RoutingSettings:
    """The settings the health evidence is weighed with: ``duplicate_patience`` counted in the clients' reports.

    Two clusters must stay duplicates for ``duplicate_patience`` rounds before the smaller is merged: the
    time a re-seeded copy or a cluster a group has just won back needs to train apart from its twin.  A
    model trains apart only in the rounds its clients play, so under partial participation the patience is
    :meth:`Participation.evidence_rounds` of it (``⌈20 / f⌉``: 80 rounds at ``f = 0.25``); with every client
    in every round the settings are returned unchanged.
    """
    patience = participation.evidence_rounds(settings.duplicate_patience)
    return settings if patience == settings.duplicate_patience else replace(settings, duplicate_patience=patience)


class _RoundStructure:
    """The round's evidence of groups inside a cluster: its own clients' update directions (computed on demand).

    A cluster's *own* replies are the kept replies of the clients that prefer it and were routed to it: the
    clients a Greedy federation gives it.  Replies routed to it by exploration (Rank Hedge) mix groups by
    design, so they would show "groups inside the cluster" in a federation that is already separated; its
    own clients part only where groups share its model.  ``structure(run)`` gives, per cluster, whether it
    was *evaluated* (at least :data:`MIN_STRUCTURE_REPLIES` own replies) and whether those *part in two*
    by direction (:func:`fedroute.core.split.partition` at ``split_silhouette``, each side at least
    :data:`MIN_SIDE_REPLIES` replies: one client whose update points elsewhere is not a group);
    ``halves(run, source)`` aggregates the two sides of a re-seed's source — its own replies' sides where
    they part, the unconditional bisection of all its replies with ``reseed_split`` otherwise — or gives
    ``None`` (a copy).
    """

    def __init__(self, cluster_models: NDArray[np.floating], replies: RoundReplies, kept: NDArray[np.bool_],
                 influence: InfluenceBounds, settings: RoutingSettings) -> None:
        self.cluster_models, self.replies, self.kept = cluster_models, replies, kept
        self.influence, self.settings = influence, settings
        self._sides: dict[tuple[int, int], Optional[NDArray[np.bool_]]] = {}
        self._own: dict[tuple[int, int], NDArray[np.int64]] = {}

    def _rows(self, run: int, cluster: int, own: bool) -> NDArray[np.int64]:
        """The cluster's kept replies in ``run`` (``own``: of the clients that prefer it), computed once."""
        if own and (run, cluster) in self._own:
            return self._own[(run, cluster)]
        rows = self.kept & (np.asarray(self.replies.routes) == cluster) & _in_run(self.replies, run)
        if own:
            rows &= np.asarray(self.replies.preferred) == cluster
            self._own[(run, cluster)] = np.flatnonzero(rows)
            return self._own[(run, cluster)]
        return np.flatnonzero(rows)

    def sides(self, run: int, cluster: int) -> Optional[NDArray[np.bool_]]:
        """The two sides of the cluster's own replies where their directions part in two, else ``None``."""
        key = (run, cluster)
        if key not in self._sides:
            rows = self._rows(run, cluster, own=True)
            updates = (np.asarray(self.replies.trained_models)[rows].astype(np.float64)
                       - _run_models(self.cluster_models, run)[cluster])
            side = partition(updates, 2, self.settings.split_silhouette).astype(bool)
            self._sides[key] = side if min(side.sum(), (~side).sum()) >= MIN_SIDE_REPLIES else None
        return self._sides[key]

    def structure(self, run: int) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        """Per cluster of ``run``, shape (K,) each: evaluated (enough own replies) and parted in two."""
        clusters = range(np.shape(self.cluster_models)[-2])
        evaluated = np.array([len(self._rows(run, cluster, own=True)) >= MIN_STRUCTURE_REPLIES for cluster in clusters])
        parted = np.array([bool(evaluated[cluster]) and self.sides(run, cluster) is not None for cluster in clusters])
        return evaluated, parted

    def halves(self, run: int, source: int) -> Optional[tuple[NDArray[np.floating], NDArray[np.floating]]]:
        """``(kept half, re-seeded half)`` of a re-seed's source, or ``None`` for a copy."""
        side = self.sides(run, source) if self.settings.reseed_by_structure else None
        if side is None and not self.settings.reseed_split:
            return None
        rows = self._rows(run, source, own=side is not None)
        return split_models(_run_models(self.cluster_models, run)[source],
                            np.asarray(self.replies.trained_models)[rows], np.asarray(self.replies.num_examples)[rows],
                            self.influence, side)


def _restarted(outcome: RoundAggregate, idle: NDArray[np.bool_], start_models: NDArray[np.floating]
               ) -> RoundAggregate:
    """The round's models with every idle spare (``idle``, (R, K): :func:`~fedroute.core.health.idle_spares`)
    returned to its start model (``restart_idle_spares``); the models are copied only when one changes."""
    idle = np.asarray(idle).reshape(-1, np.shape(idle)[-1])
    changed = [(int(run), int(cluster)) for run, cluster in zip(*np.nonzero(idle))
               if not np.array_equal(_run_models(outcome.models, int(run))[cluster],
                                     _run_models(start_models, int(run))[cluster])]
    if not changed:
        return outcome
    models = np.array(outcome.models, copy=True)
    restarted = np.zeros(idle.shape, dtype=bool)
    for run, cluster in changed:
        _run_models(models, run)[cluster] = _run_models(start_models, run)[cluster]
        restarted[run, cluster] = True
    return replace(outcome, models=models, restarted=restarted.reshape(np.shape(outcome.non_finite_clusters)))


def _run_models(models: NDArray[np.floating], run: int) -> NDArray[np.floating]:
    """Run ``run``'s ``(K, P)`` models: a view into batched ``(R, K, P)`` models, or the one run's models."""
    return models[run] if np.ndim(models) == 3 else models


def _in_run(replies: RoundReplies, run: int) -> NDArray[np.bool_]:
    """Which replies belong to ``run`` (all of them when the replies carry no ``run_index``: one run)."""
    if replies.run_index is None:
        return np.ones(len(replies.routes), dtype=bool)
    return np.asarray(replies.run_index) == run


MIN_STRUCTURE_REPLIES = 3
"""Own replies a cluster needs in a round for its structure to be read (two directions always part in two)."""

MIN_SIDE_REPLIES = 2
"""Replies on each side of a structure: a group is seen when at least two of its clients agree."""


def _reseeded(outcome: RoundAggregate, sources: NDArray[np.int64], structure: _RoundStructure) -> RoundAggregate:
    """The round's models with each re-seeded cluster seeded from its source (:func:`~fedroute.core.health.reseeding`).

    The re-seeded cluster gets a copy of its source's new model, or — where its source's kept replies of the
    round part in two by direction (``reseed_by_structure``), or always with ``reseed_split`` — the two halves
    of that round (:func:`fedroute.core.split.split_models`): the source keeps the heavier half, the re-seeded
    cluster gets the other; with fewer than two such replies it is a copy.
    """
    if not np.any(sources >= 0):
        return outcome
    models = np.array(outcome.models, copy=True)
    for run, cluster in zip(*np.nonzero(sources >= 0)):
        source = int(sources[run, cluster])
        halves = structure.halves(int(run), source)
        run_models = _run_models(models, int(run))                       # (K, P), a view into models
        if halves is None:
            run_models[cluster] = run_models[source]
        else:
            run_models[source], run_models[cluster] = halves
    return replace(outcome, models=models)
