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
   and the source and the re-seeded cluster get one half each.

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
from fedroute.core.health import ClusterHealth, RoutingView, duplicate_twins, routing_view, update_health, within_reach
from fedroute.core.influence import InfluenceBounds, RoundAggregate, aggregate_round
from fedroute.core.participation import Participation
from fedroute.core.settings import RoutingSettings
from fedroute.core.split import split_models

__all__ = ["ServerState", "RoundReplies", "server_init", "server_step", "reads_health", "evidence_settings"]


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
    """

    rows: NDArray[np.int64]
    routes: NDArray[np.int64]
    preferred: NDArray[np.int64]
    num_examples: NDArray[np.floating]
    losses: NDArray[np.float64]
    trained_models: NDArray[np.floating]
    run_index: Optional[NDArray[np.int64]] = None


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
    """

    federation: FederationState
    estimate: Optional[FederationEstimate]
    health: ClusterHealth
    view: Optional[RoutingView]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (a checkpoint's); :meth:`from_json` inverts it."""
        def arrays(value: Any) -> Optional[dict[str, list]]:
            return None if value is None else {name: np.asarray(getattr(value, name)).tolist()
                                               for name in value.__dataclass_fields__}
        return {"federation": arrays(self.federation), "estimate": arrays(self.estimate),
                "health": arrays(self.health), "view": arrays(self.view)}

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "ServerState":
        """Inverse of :meth:`to_json`; raises ``KeyError``/``ValueError``/``TypeError`` on malformed input."""
        def arrays(kind: Any, stored: Optional[dict[str, list]]) -> Any:
            if stored is None:
                return None
            return kind(**{name: np.asarray(stored[name], dtype=_DTYPES[name]) for name in kind.__dataclass_fields__})
        federation, health = arrays(FederationState, values["federation"]), arrays(ClusterHealth, values["health"])
        if federation.losses.ndim != 2:                                   # no client yet: (0,) → (0, K)
            federation = replace(federation, losses=federation.losses.reshape(len(federation.client_ids),
                                                                             health.spare.shape[1]))
        return cls(federation=federation, estimate=arrays(FederationEstimate, values["estimate"]),
                   health=health, view=arrays(RoutingView, values["view"]))


_DTYPES = {"client_ids": np.int64, "run_index": np.int64, "last_round": np.int64, "route": np.int64,
           "preferred": np.int64, "num_examples": np.float64, "losses": np.float64, "masses": np.float64,
           "preferred_masses": np.float64, "reporting": np.int64, "unwanted_rounds": np.int64, "wanted_rounds": np.int64,
           "exploring_rounds": np.int64, "spare": bool, "known_clients": np.int64, "explore": bool,
           "merged_into": np.int64, "twin": np.int64, "twin_rounds": np.int64, "calm_rounds": np.int64,
           "settled": bool, "reseeded_from": np.int64, "reseeds": np.int64}
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
    if settings is None or not reads_health(settings):
        return ServerState(federation=federation, estimate=None, health=health, view=None)
    full = participation is None or participation.fraction >= 1.0
    health = replace(health, settled=np.full(num_runs, not (settings.explore_at_start and full)))
    return ServerState(federation=federation, estimate=None, health=health, view=routing_view(health, settings))


def server_step(cluster_models: NDArray[np.floating], state: ServerState, replies: RoundReplies, round_index: int,
                settings: RoutingSettings, participation: Participation, influence: InfluenceBounds,
                num_runs: int = 1) -> tuple[RoundAggregate, ServerState]:
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

    Returns
    -------
    aggregate : RoundAggregate
        ``W^{t+1}`` and which replies were kept.
    state : ServerState
    """
    outcome = aggregate_round(cluster_models, replies.trained_models, replies.routes, replies.num_examples, influence,
                              replies.run_index)
    kept = outcome.kept
    federation = state.federation.record(replies.rows[kept], round_index, replies.routes[kept],
                                         replies.preferred[kept], np.asarray(replies.num_examples)[kept],
                                         np.asarray(replies.losses)[kept])
    estimate = estimate_federation(federation, round_index, participation.report_rounds,
                                   cluster_models.shape[-2], num_runs, influence.max_weight_ratio, state.estimate)
    health, view = state.health, None
    if reads_health(settings):
        counted = federation.counted(round_index, participation.report_rounds)
        twins = np.full(estimate.preferred_masses.shape, -1, dtype=np.int64)
        if settings.consolidate_duplicates:
            twins = duplicate_twins(federation.losses[counted], federation.preferred[counted],
                                    federation.run_index[counted], estimate.preferred_masses, num_runs,
                                    settings.consolidation_loss_ratio)
        reach = within_reach(federation.losses[counted], federation.preferred[counted],
                             federation.run_index[counted], num_runs, cluster_models.shape[-2],
                             settings.consolidation_loss_ratio) if settings.starving_needs_reach else None
        health, view = update_health(state.health, estimate.preferred_masses, twins,
                                     federation.known_clients(num_runs), evidence_settings(settings, participation),
                                     estimate.reporting, reach,
                                     None if state.estimate is None else state.estimate.preferred_masses)
        outcome = _reseeded(outcome, health.reseeded_from,
                            _SplitInputs(cluster_models, replies, influence) if settings.reseed_split else None)
    return outcome, ServerState(federation=federation, estimate=estimate, health=health, view=view)


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


@dataclass(frozen=True)
class _SplitInputs:
    """What splitting a re-seed's source needs: the models before the round, the round's replies, the bounds."""

    cluster_models: NDArray[np.floating]
    replies: RoundReplies
    influence: InfluenceBounds


def _reseeded(outcome: RoundAggregate, sources: NDArray[np.int64], split: Optional[_SplitInputs] = None
              ) -> RoundAggregate:
    """The round's models with each re-seeded cluster seeded from its source (:func:`~fedroute.core.health.reseeding`).

    Without ``split`` (``reseed_split`` off) the re-seeded cluster gets a copy of its source's new model.
    With it, the source's kept replies of the round are split in two by the direction of their updates
    (:func:`fedroute.core.split.split_models`): the source keeps the heavier half, the re-seeded cluster gets
    the other; with fewer than two such replies it is a copy.
    """
    if not np.any(sources >= 0):
        return outcome
    models = np.array(outcome.models, copy=True)
    batched = models.ndim == 3
    for run, cluster in zip(*np.nonzero(sources >= 0)):
        source = int(sources[run, cluster])
        halves = None if split is None else _split_halves(split, outcome.kept, int(run), source, batched)
        run_models = models[run] if batched else models                  # (K, P), a view into models
        if halves is None:
            run_models[cluster] = run_models[source]
        else:
            run_models[source], run_models[cluster] = halves
    return replace(outcome, models=models)


def _split_halves(split: _SplitInputs, kept: NDArray[np.bool_], run: int, source: int, batched: bool
                  ) -> Optional[tuple[NDArray[np.floating], NDArray[np.floating]]]:
    """The two halves of ``source``'s kept replies of the round in ``run`` (None: copy instead)."""
    replies = split.replies
    rows = kept & (np.asarray(replies.routes) == source)
    if batched:
        rows &= np.asarray(replies.run_index) == run
    start = split.cluster_models[run, source] if batched else split.cluster_models[source]
    return split_models(start, np.asarray(replies.trained_models)[rows], np.asarray(replies.num_examples)[rows],
                        split.influence)
