"""Is the federation collapsing?  The evidence that turns exploration on and off, and finds spare clusters.

The generic default explores (EXP3 over Greedy and Rank Hedge) only while the federation
shows a collapse sign, and is Greedy otherwise (``explore_on = "collapse"``; the paper's
presets explore always).  After every round the server reads the federation estimate
(:mod:`fedroute.core.federation`: every client's latest report) and keeps, per cluster:

* **unwanted** — its preferred share is at most the underused threshold (``p̂_k ≤ c/K``):
  too few clients find it their best model to train it — and it could serve more: nobody
  prefers it, or some client that prefers another cluster finds it within ``ρ`` of its best
  loss (:func:`within_reach`).  A small group's own model, far worse for everyone else, is
  not unwanted however small the group;  A cluster unwanted for
  ``collapse_patience`` rounds in a row is a *collapse sign* (Greedy successes settle
  within a few rounds; a collapse stays);
* **spare** — a cluster that stayed a collapse sign through ``spare_patience`` rounds of
  exploration on its account, or a duplicate whose clients were consolidated onto its
  twin: nobody needs it, so it no longer triggers exploration (its users, if any, keep
  using it).  A cluster wanted for ``collapse_patience`` rounds in a row is no longer
  spare and gets its budget back; every spare is reconsidered when clients join the
  federation (new evidence);
* **spare on evidence** (``reseed_by_structure``) — a collapse sign nobody prefers is spare
  at once when every cluster serves one group: for ``collapse_patience`` rounds in a row the
  clusters' own clients were read and parted in none (:func:`read_structure`), and no cluster
  is crowded.  When a cluster's own clients part in two readings in a row, the run's spares
  are reconsidered (two groups share a model: a spare is where one of them can go);
* **re-seeding** (``reseed_empty``) — a collapse sign that no client prefers at all (with
  ``reseed_unwanted``: any collapse sign, so that a few stragglers within the crowd's reach do
  not block it), or a duplicate merged into its twin, is seeded at the end of the round from
  the cluster whose own clients part in two by direction in two readings in a row, else
  the most crowded cluster (when that one holds at least two fair shares, :func:`reseeding`):
  with a copy of its model, whose clients split at random between the two copies and train
  them apart, or — ``reseed_split`` — with one half of the crowded cluster's round, its
  replies split in two by update direction (:mod:`fedroute.core.split`), the crowded cluster
  keeping the other half;
* **idle spares** (``restart_idle_spares``) — a spare on which no known client's latest route lies
  (every client that trained it has left it, however long ago it last reported: :func:`idle_spares`)
  returns to its start model in the server step, ready for a group that needs a cluster; and a spare
  is not the duplicate test's third cluster while another one is;
* **duplicates** (``consolidate_duplicates``) — two clusters that serve the same clients:
  for each one's clients the other is at most half as far (in log loss ratio, medians) as
  the nearest third cluster, which is at least ``ρ`` times worse than their own.  The smaller one is
  merged into the larger — clients skip it in their Greedy choice (unless, for that client,
  the twin is more than ``ρ`` × its best loss and not close relative to its nearest third
  cluster: :func:`fedroute.core.controllers.consolidating_greedy_routes`, ``relative``) — at
  once when it is spare already, else once
  the pair has been duplicates for ``duplicate_patience`` rounds in a row (it is then spare).
  The wait is the evidence: a
  cluster that a group has just recovered from a shared model starts as a near copy of it
  and looks like a duplicate until the two models have trained apart (merging it at once
  undid recoveries), while true duplicates — two models trained on the same group — stay
  duplicates.  A real small group is never merged: the majority's clients find the small
  group's model far worse than their own.

Exploration is on at the start of a run, until the federation has been calm (no cluster that
is not spare unwanted; with ``calm_when_stable``, also a round whose routes are stable and
healthy: ``p̂`` unchanged, no collapse sign, every cluster that is not spare some client's best)
for ``collapse_patience`` rounds in a row — the start is when clusters are still fluid and
exploring costs least — and afterwards while some cluster is a collapse sign and not spare.
Stability is the evidence that separates a small group's model from a starving one while
exploring: Rank Hedge's random routes train every model a little on every group, so the model of
a 10 % minority with noisy labels drifts in and out of the majority's reach and is unwanted every
few rounds, which kept the start exploring to the end of the run (``boundaries-minority-noisy``);
its clients' choices, though, stay the same round after round.  Nothing
here depends on which clients were sampled in a round: it reads the estimate.  One
implementation serves both runtimes (the strategy with one run, the simulator with ``R``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.controllers import close_twin, nearest_third
from fedroute.core.settings import INCLUSIVE_SLACK, RoutingSettings

__all__ = ["ClusterHealth", "RoutingView", "duplicate_twins", "twin_pairs", "within_reach", "update_health",
           "routing_view", "reseeding", "read_structure", "idle_spares"]


@dataclass(frozen=True)
class ClusterHealth:
    """The server's per-cluster evidence, one row per run.

    Attributes
    ----------
    unwanted_rounds, wanted_rounds : ndarray of int, shape (R, K)
        Consecutive rounds the cluster has been unwanted / wanted.
    exploring_rounds : ndarray of int, shape (R, K)
        Rounds of exploration the cluster has triggered since it was last wanted for
        ``collapse_patience`` rounds in a row.
    spare : ndarray of bool, shape (R, K)
    known_clients : ndarray of int, shape (R,)
        Clients known when the spares were last reconsidered.
    twin : ndarray of int, shape (R, K)
        The cluster's duplicate twin this round (``-1``: none).
    twin_rounds : ndarray of int, shape (R, K)
        Consecutive rounds it has had that twin.
    calm_rounds : ndarray of int, shape (R,)
        Consecutive rounds in which no cluster that is not spare was unwanted.
    settled : ndarray of bool, shape (R,)
        The run has been calm for ``collapse_patience`` rounds in a row once: its start is over.
    reseeded_from : ndarray of int, shape (R, K)
        The cluster whose model the server copied into this one after the round (``-1``: none).
    reseeds : ndarray of int, shape (R, K)
        Times the cluster was re-seeded (at most :data:`MAX_RESEEDS`; reset when clients join).
    parted_before : ndarray of bool, shape (R, K)
        The cluster's own replies parted in two by direction the last time they were read
        (``reseed_by_structure``; :func:`read_structure`).
    read_whole : ndarray of bool, shape (R, K)
        The cluster's own replies were last read whole (a reading that did not part; a persistent parting
        clears it, a single one leaves it).
    apart_rounds : ndarray of int, shape (R,)
        Consecutive rounds, with some cluster read, in which every preferred cluster is whole and none
        parted persistently: every cluster's own clients are one group.
    """

    unwanted_rounds: NDArray[np.int64]
    wanted_rounds: NDArray[np.int64]
    exploring_rounds: NDArray[np.int64]
    spare: NDArray[np.bool_]
    known_clients: NDArray[np.int64]
    twin: NDArray[np.int64]
    twin_rounds: NDArray[np.int64]
    calm_rounds: NDArray[np.int64]
    settled: NDArray[np.bool_]
    reseeded_from: NDArray[np.int64]
    reseeds: NDArray[np.int64]
    parted_before: NDArray[np.bool_]
    read_whole: NDArray[np.bool_]
    apart_rounds: NDArray[np.int64]

    @classmethod
    def initial(cls, num_runs: int, num_clusters: int) -> "ClusterHealth":
        zeros = np.zeros((num_runs, num_clusters), dtype=np.int64)
        return cls(unwanted_rounds=zeros, wanted_rounds=zeros.copy(), exploring_rounds=zeros.copy(),
                   spare=np.zeros((num_runs, num_clusters), dtype=bool), known_clients=np.zeros(num_runs, np.int64),
                   twin=np.full((num_runs, num_clusters), -1, dtype=np.int64), twin_rounds=zeros.copy(),
                   calm_rounds=np.zeros(num_runs, np.int64), settled=np.zeros(num_runs, dtype=bool),
                   reseeded_from=np.full((num_runs, num_clusters), -1, dtype=np.int64), reseeds=zeros.copy(),
                   parted_before=np.zeros((num_runs, num_clusters), dtype=bool),
                   read_whole=np.zeros((num_runs, num_clusters), dtype=bool),
                   apart_rounds=np.zeros(num_runs, np.int64))


@dataclass(frozen=True)
class RoutingView:
    """What the clients of one run receive besides the masses: ``explore`` and ``merged_into``.

    Attributes
    ----------
    explore : ndarray of bool, shape (R,)
        Whether exploration is on in each run.
    merged_into : ndarray of int, shape (R, K)
        The twin a duplicate cluster is merged into (``-1``: none).
    spare : ndarray of bool, shape (R, K)
        Spare clusters (for reports).
    """

    explore: NDArray[np.bool_]
    merged_into: NDArray[np.int64]
    spare: NDArray[np.bool_]


def duplicate_twins(losses: NDArray[np.float64], preferred: NDArray[np.int64], run_index: NDArray[np.int64],
                    preferred_masses: NDArray[np.float64], num_runs: int, ratio: float,
                    not_third: Optional[NDArray[np.bool_]] = None) -> NDArray[np.int64]:
    """Which clusters are duplicates of another, per run (module docstring).

    Parameters
    ----------
    losses : ndarray, shape (m, K)
        The counted clients' latest training losses of every cluster.
    preferred : ndarray of int, shape (m,)
        Their latest Greedy choices.
    run_index : ndarray of int, shape (m,)
    preferred_masses : ndarray, shape (R, K)
        ``p̂`` (the larger twin keeps its clients; ties to the lower index).
    num_runs : int
    ratio : float
        ``ρ ≥ 1``.
    not_third : ndarray of bool, shape (R, K), optional
        Clusters that are not a pair's third cluster while another one is (``restart_idle_spares``: the
        spares — a start model, or a stale piece of a group, says nothing about how far another group is).

    Returns
    -------
    ndarray of int, shape (R, K)
        The twin of each cluster that is the smaller of a duplicate pair this round, ``-1`` for
        none.  A cluster has at most one twin and a twin has none itself.
    """
    num_clusters = preferred_masses.shape[1]
    merged = np.full((num_runs, num_clusters), -1, dtype=np.int64)
    if not np.isfinite(ratio) or num_clusters < 3 or len(preferred) == 0:
        return merged                                                    # ρ = inf: every pair would be "close"
    safe = np.maximum(losses, np.finfo(np.float64).tiny)
    for run in np.unique(run_index):
        rows = run_index == run
        skipped = None if not_third is None else np.asarray(not_third, dtype=bool)[run]
        for small, large in twin_pairs(_close_pairs(safe[rows], preferred[rows], num_clusters, ratio, skipped),
                                       preferred_masses[run]):
            merged[run, small] = large
    return merged


def twin_pairs(pairs: list[tuple[float, int, int]], preferred_masses: NDArray[np.float64]) -> list[tuple[int, int]]:
    """``(small, large)`` twins from scored pairs of one run, closest first: the cluster fewer clients prefer (``p̂``,
    ties to the higher index) is the smaller; a cluster has at most one twin and a twin has none itself."""
    taken: set[int] = set()
    chosen = []
    for _, small, large in sorted((score, *sorted((j, k), key=lambda c: (preferred_masses[c], -c)))
                                  for score, j, k in pairs):
        if small in taken or large in taken:
            continue
        chosen.append((small, large))
        taken.update((small, large))
    return chosen


def _close_pairs(losses: NDArray[np.float64], preferred: NDArray[np.int64], num_clusters: int, ratio: float,
                 not_third: Optional[NDArray[np.bool_]] = None) -> list[tuple[float, int, int]]:
    """``(score, j, k)`` for every pair of clusters that serve the same clients (one run; module docstring).

    Per side, in log loss ratios over the side's clients (medians): the twin must be at most half as
    far as the nearest third cluster (``log(ℓ_twin/ℓ_own) ≤ ½ log(ℓ_third/ℓ_own)``), and the third must
    be far (``ℓ_third ≥ ρ · ℓ_own``).  Relative, because a model trained on half of a group fits its
    own clients' training data several times better than the other half does (an over-parameterised
    network memorises its clients), while other groups' models are worse by orders of magnitude.
    """
    pairs = []
    logs = np.log(losses)
    for j in range(num_clusters):
        own_j = logs[preferred == j]
        if not len(own_j):
            continue
        for k in range(j + 1, num_clusters):
            own_k = logs[preferred == k]
            if not len(own_k):
                continue
            sides = [_side(own_j, j, k, not_third), _side(own_k, k, j, not_third)]
            if all(close_twin(twin, third, ratio) for twin, third in sides):
                pairs.append((max(twin for twin, _ in sides), j, k))
    return pairs


def within_reach(losses: NDArray[np.float64], preferred: NDArray[np.int64], run_index: NDArray[np.int64],
                 num_runs: int, num_clusters: int, ratio: float) -> NDArray[np.bool_]:
    """Clusters that some client who does not prefer them finds within ``ρ`` of its best loss, per run.

    A cluster few clients prefer is starving only if it could serve more of them: some client
    elsewhere finds it close (``ℓ_k ≤ ρ · min_j ℓ_j``).  A small group's own model — a minority, a
    noisy or data-poor group — is far worse for every other client (they are other groups), so it
    is not a collapse sign however small its share; the model a collapse leaves with a few
    stragglers of a crowded group is close for the rest of that group.

    Parameters
    ----------
    losses : ndarray, shape (m, K)
        The counted clients' latest training losses of every cluster.
    preferred : ndarray of int, shape (m,)
    run_index : ndarray of int, shape (m,)
    num_runs, num_clusters : int
    ratio : float
        ``ρ ≥ 1`` (``consolidation_loss_ratio``).

    Returns
    -------
    ndarray of bool, shape (R, K)
    """
    reach = np.zeros((num_runs, num_clusters), dtype=bool)
    if len(preferred) == 0:
        return reach
    losses = np.asarray(losses, dtype=np.float64)
    close = losses <= ratio * losses.min(axis=1, keepdims=True)                   # (m, K)
    close[np.arange(len(preferred)), np.asarray(preferred)] = False              # not its own choice
    np.logical_or.at(reach, np.asarray(run_index), close)
    return reach


def _side(own: NDArray[np.float64], cluster: int, twin: int, not_third: Optional[NDArray[np.bool_]] = None
          ) -> tuple[float, float]:
    """Median log ratio of a cluster's clients to the twin and to the nearest third cluster (one that is not
    ``not_third``, (K,), when there is one)."""
    pair = np.zeros(own.shape, dtype=bool)
    pair[:, [cluster, twin]] = True
    third = nearest_third(own, pair, not_third)
    return float(np.median(own[:, twin] - own[:, cluster])), float(np.median(third - own[:, cluster]))


def update_health(health: ClusterHealth, preferred_masses: NDArray[np.float64], twins: NDArray[np.int64],
                  known_clients: NDArray[np.int64], settings: RoutingSettings,
                  reporting: Optional[NDArray[np.int64]] = None,
                  reach: Optional[NDArray[np.bool_]] = None,
                  previous_preferred: Optional[NDArray[np.float64]] = None,
                  structured: Optional[Callable[[int], tuple[NDArray[np.bool_], NDArray[np.bool_]]]] = None,
                  crowded_clusters: Optional[NDArray[np.bool_]] = None,
                  merged_by_signature: Optional[NDArray[np.bool_]] = None
                  ) -> tuple[ClusterHealth, RoutingView]:
    """One round of evidence: unwanted streaks, exploration budgets, duplicates, spares; what clients receive.

    Parameters
    ----------
    health : ClusterHealth
        Before the round.
    preferred_masses : ndarray, shape (R, K)
        ``p̂`` after the round.
    twins : ndarray of int, shape (R, K)
        :func:`duplicate_twins` after the round (all ``-1`` without ``consolidate_duplicates``).
    known_clients : ndarray of int, shape (R,)
        Clients the federation has heard of (a rise means clients joined).
    settings : RoutingSettings
    reporting : ndarray of int, shape (R,), optional
        Clients counted in the estimate; a run without any keeps its evidence.
    reach : ndarray of bool, shape (R, K), optional
        :func:`within_reach`: a cluster that some clients prefer but no other client finds close
        serves a small group and is not unwanted (``None``: every cluster counts as within reach).
    previous_preferred : ndarray, shape (R, K), optional
        ``p̂`` of the round before (the previous federation estimate's; ``None`` before any): with
        ``calm_when_stable`` routes are *stable* when ``p̂`` is unchanged from it.
    structured : callable, optional
        ``structured(run) -> (evaluated, parted)``, each ``(K,) bool``: the clusters whose own replies of the
        round could be read, and those that part in two by direction (``reseed_by_structure``;
        :func:`read_structure`).  ``None``: no structure evidence.
    crowded_clusters : ndarray of bool, shape (R, K), optional
        :func:`crowded` of the round, computed once by the caller (with ``crowded_by_clients``, from the client
        counts and ``twins``); ``None``: crowded by mass alone.
    merged_by_signature : ndarray of bool, shape (R, K), optional
        Clusters whose signed clients are held on a signature twin (``merge_by_signature``,
        :func:`fedroute.core.signature_twins.twin_sources`): a piece of a group, spare.

    Returns
    -------
    health : ClusterHealth
    view : RoutingView
        ``explore`` and ``merged_into`` for the next round.
    """
    threshold = settings.underused_mass + (INCLUSIVE_SLACK if settings.mass_threshold_inclusive else 0.0)
    unwanted = (preferred_masses <= threshold) if settings.mass_threshold_inclusive else (preferred_masses < threshold)
    if reach is not None:
        unwanted &= reach | (preferred_masses <= 0.0)                   # a small group's own model is wanted
    joined = (known_clients > health.known_clients)[:, None]
    twin_rounds = np.where((twins >= 0) & (twins == health.twin), health.twin_rounds + 1, (twins >= 0).astype(int))
    merged = (twins >= 0) & (health.spare | (twin_rounds >= settings.duplicate_patience))
    streak = np.where(unwanted, health.unwanted_rounds + 1, 0)
    wanted = np.where(unwanted, 0, health.wanted_rounds + 1)
    sign = streak >= settings.collapse_patience
    recovered = wanted >= settings.collapse_patience                     # wanted long enough: budget refilled
    persistent, parted_before, read_whole, apart_rounds = read_structure(
        health, structured, sign.any(axis=1) | health.spare.any(axis=1), preferred_masses)
    shared = persistent.any(axis=1, keepdims=True)                       # two groups on one cluster, seen twice
    still_spare = health.spare & ~recovered & ~joined & ~shared          # or new evidence: reconsidered
    explored = routing_view(health, settings).explore[:, None]           # this round ran exploration
    budget = np.where(recovered | joined, 0,
                      health.exploring_rounds + (unwanted & explored & ~still_spare & ~merged))
    busy = crowded(preferred_masses) if crowded_clusters is None else np.asarray(crowded_clusters, dtype=bool)
    uncrowded = ~busy.any(axis=1)
    apart = ((apart_rounds >= settings.collapse_patience) & uncrowded)[:, None]   # every cluster serves one group
    spare = (still_spare | merged | (unwanted & (budget >= settings.spare_patience))
             | (sign & (preferred_masses <= 0.0) & apart))
    if merged_by_signature is not None:
        spare |= np.asarray(merged_by_signature, dtype=bool)
    quiet = ~(unwanted & ~spare).any(axis=1)
    if settings.calm_when_stable:                                        # stable, healthy routes are calm too
        stable = (np.zeros(len(preferred_masses), dtype=bool) if previous_preferred is None else
                  np.all(np.abs(preferred_masses - previous_preferred) <= INCLUSIVE_SLACK, axis=1))
        healthy = ~(sign & ~spare).any(axis=1) & ~((preferred_masses <= 0.0) & ~spare).any(axis=1)
        quiet |= stable & healthy
    calm = np.where(quiet, health.calm_rounds + 1, 0)
    reseeds = np.where(joined, 0, health.reseeds)
    vacant = np.ones_like(sign) if settings.reseed_unwanted else preferred_masses <= 0.0
    targets = ((sign & vacant & ~spare) | merged) & (reseeds < MAX_RESEEDS)
    source = reseeding(preferred_masses, targets, settings, None if structured is None else persistent, busy)
    fresh = source >= 0                                                  # a new model: fresh evidence about it
    renewed = fresh.copy()                                               # the re-seeded clusters and their sources
    renewed[np.nonzero(fresh)[0], source[fresh]] = True
    updated = ClusterHealth(unwanted_rounds=np.where(fresh, 0, streak), wanted_rounds=wanted,
                            exploring_rounds=budget, spare=spare & ~fresh,
                            known_clients=np.maximum(known_clients, health.known_clients),
                            twin=np.where(fresh, -1, twins), twin_rounds=np.where(fresh, 0, twin_rounds),
                            calm_rounds=calm, settled=health.settled | (calm >= settings.collapse_patience),
                            reseeded_from=source, reseeds=reseeds + fresh,
                            parted_before=parted_before & ~renewed, read_whole=read_whole & ~renewed,
                            apart_rounds=apart_rounds)
    if reporting is not None and np.any(silent := np.asarray(reporting) == 0):
        updated = ClusterHealth(**{name: np.where(silent.reshape((-1,) + (1,) * (value.ndim - 1)),
                                                  getattr(health, name), value)
                                   for name, value in ((name, getattr(updated, name))
                                                       for name in ClusterHealth.__dataclass_fields__)})
    return updated, routing_view(updated, settings)


def idle_spares(spare: NDArray[np.bool_], latest_routes: NDArray[np.int64], run_index: NDArray[np.int64],
                num_runs: int) -> NDArray[np.bool_]:
    """Per run and cluster, a spare cluster on which no known client's latest route lies (``restart_idle_spares``).

    Every client that trained such a cluster has since moved to another one, however long ago it last
    reported: a cluster whose group is only absent from the recent rounds (partial participation, clients
    that return) still carries their latest routes and is never idle.

    Parameters
    ----------
    spare : ndarray of bool, shape (R, K)
        :attr:`ClusterHealth.spare` after the round.
    latest_routes : ndarray of int, shape (n,)
        Every client's latest route (``-1``: the client has not reported yet).
    run_index : ndarray of int, shape (n,)
        Each client's run.
    num_runs : int
        ``R``.

    Returns
    -------
    ndarray of bool, shape (R, K)
    """
    spare = np.asarray(spare, dtype=bool)
    latest_routes = np.asarray(latest_routes, dtype=np.int64)
    known = latest_routes >= 0
    used = np.zeros((num_runs, spare.shape[-1]), dtype=bool)
    used[np.asarray(run_index, dtype=np.int64)[known], latest_routes[known]] = True
    return spare & ~used


def reseeding(preferred_masses: NDArray[np.float64], targets: NDArray[np.bool_], settings: RoutingSettings,
              structured: Optional[NDArray[np.bool_]] = None,
              crowded_clusters: Optional[NDArray[np.bool_]] = None) -> NDArray[np.int64]:
    """Per run and cluster, the cluster whose model to copy into it (``-1``: none): ``reseed_empty``.

    A target — a collapse sign that no client prefers at all (``p̂_s = 0``; any collapse sign with
    ``reseed_unwanted``: a collapse sign's few clients find the crowded model within reach), or a
    duplicate merged into its twin (its clients have the twin) — is seeded from the most preferred
    cluster whose own clients part in two by direction in two readings in a row (``structured``, its
    two parts: :func:`read_structure`), else from the most *crowded*
    cluster (a copy of its model, or with ``reseed_split`` one half of its round, the server step's
    :func:`fedroute.core.split.split_models`):
    one that holds at least two fair shares (``p̂_c ≥ 2/K``, more clients than one group of a
    federation with ``K`` groups has on average; ``crowded_clusters``, (R, K): the round's :func:`crowded`
    with the client counts, when the caller has it).  Two copies tie for exactly the crowded
    cluster's clients, who split between them at random (random tie-breaking) and train them apart;
    two halves are each closer to the clients whose updates made it: the groups that shared a model
    separate, as k-means re-seeds an empty centroid from its largest cluster (by splitting it).  With more clusters than groups a cluster that serves one group is not crowded, so spare
    clusters are not re-seeded.  No group loses its own model: a collapse sign is within the reach of
    the crowd (or empty), and a small group's own model is never one (:func:`within_reach`); a
    straggler on a re-seeded cluster chooses again among the new models.  One cluster per run and round, the
    lowest index.
    """
    num_runs, num_clusters = preferred_masses.shape
    source = np.full((num_runs, num_clusters), -1, dtype=np.int64)
    if not settings.reseed_empty or settings.tie_breaking != "random":
        return source
    busy = crowded(preferred_masses) if crowded_clusters is None else np.asarray(crowded_clusters, dtype=bool)
    for run in np.flatnonzero(targets.any(axis=1)):
        origin = _reseed_source(preferred_masses[run], targets[run], None if structured is None else structured[run],
                                busy[run])
        if origin < 0:
            continue
        candidates = np.flatnonzero(targets[run] & (np.arange(num_clusters) != origin))
        if len(candidates):
            source[run, int(candidates[0])] = origin
    return source


def _reseed_source(preferred_masses: NDArray[np.float64], targets: NDArray[np.bool_],
                   structured: Optional[NDArray[np.bool_]], busy: NDArray[np.bool_]) -> int:
    """The cluster a run's re-seed copies or splits (``-1``: none): among the clusters that are not targets, the
    most preferred one whose own replies part in two by direction (seen twice: ``structured``), else the most
    preferred one if it is crowded (``busy``, :func:`crowded`)."""
    if structured is not None and np.any(eligible := structured & ~targets):
        return int(np.flatnonzero(eligible)[np.argmax(preferred_masses[eligible])])
    most = int(preferred_masses.argmax())
    return most if busy[most] else -1


CROWDED_SHARES = 2.0
"""A cluster preferred by at least this many fair shares (``p̂_c ≥ 2/K``) is *crowded*: more clients than one group
of a federation with ``K`` groups has on average."""


CROWDED_TYPICAL = 1.5
"""With ``crowded_by_clients``, a cluster preferred by at least this many times the clients of the median cluster in
use is crowded too: closer to two typical clusters' clients than to one."""


def crowded(preferred_masses: NDArray[np.float64], preferred_counts: Optional[NDArray[np.int64]] = None,
            twins: Optional[NDArray[np.int64]] = None) -> NDArray[np.bool_]:
    """Which clusters are crowded, for ``p̂`` of shape (K,) or (R, K): at least two fair shares of the preferred mass
    (:data:`CROWDED_SHARES`), or — given ``preferred_counts``, the clients whose latest Greedy choice each cluster
    is (same shape) — at least :data:`CROWDED_TYPICAL` times the clients of the median cluster some client prefers.
    A pair of duplicates (``twins``, :func:`duplicate_twins`) serves one group: it counts as one cluster, with the
    clients of both, in that median."""
    preferred_masses = np.asarray(preferred_masses)
    by_mass = preferred_masses >= CROWDED_SHARES / preferred_masses.shape[-1] - INCLUSIVE_SLACK
    if preferred_counts is None:
        return by_mass
    counts = np.asarray(preferred_counts, dtype=np.float64)
    rows = counts.reshape(-1, counts.shape[-1])
    pairs = (np.full(rows.shape, -1, dtype=np.int64) if twins is None
             else np.asarray(twins, dtype=np.int64).reshape(rows.shape))
    typical = np.array([_typical_count(row, twin) for row, twin in zip(rows, pairs)])
    return by_mass | (counts >= CROWDED_TYPICAL * typical.reshape(counts.shape[:-1] + (1,)))


def _typical_count(counts: NDArray[np.float64], twins: NDArray[np.int64]) -> float:
    """The median clients of the clusters some client prefers, a pair of duplicates (``twins[small] = large``)
    counted once with both clusters' clients (``inf`` when nobody prefers any)."""
    totals = np.asarray(counts, dtype=np.float64).copy()
    for small in np.flatnonzero(np.asarray(twins) >= 0):
        totals[twins[small]] += totals[small]
        totals[small] = 0.0
    served = totals[totals > 0]
    return float(np.median(served)) if len(served) else float("inf")


def read_structure(health: ClusterHealth, structured: Optional[Callable[[int], tuple[NDArray[np.bool_], NDArray[np.bool_]]]],
                   reading: NDArray[np.bool_], preferred_masses: NDArray[np.float64]
                   ) -> tuple[NDArray[np.bool_], NDArray[np.bool_], NDArray[np.bool_], NDArray[np.int64]]:
    """The round's structure evidence: ``(persistent, parted_before, read_whole, apart_rounds)`` (``reseed_by_structure``).

    A cluster's *own* clients (those that prefer it) whose updates part in two by direction are two groups
    sharing its model.  One round's parting can be chance — a cluster's few clients of one group part now and
    then by noise (about 1 % of the readings on the development runs) — but groups that share a model part in
    every round they are read, so a parting counts when it is seen in two readings of the cluster in a row
    (*persistent*).  The structure is read only in runs that need it (``reading``: a collapse sign or a spare),
    each cluster where it had enough own replies (``structured(run)``).  A reading that does not part makes the
    cluster *whole*, a persistent parting not whole; a single parting leaves it as it was (chance, until seen
    again).  ``apart_rounds`` counts the rounds with a reading in which every cluster some client prefers is
    whole (every cluster serves one group); a persistent parting, or a preferred cluster not yet read whole,
    resets it — under partial participation a cluster is read only in rounds that sample enough of its
    clients, and until it is, nothing is known of it.

    Returns
    -------
    persistent : ndarray of bool, shape (R, K)
        Parted in this reading and the one before.
    parted_before, read_whole : ndarray of bool, shape (R, K)
        The latest reading of each cluster: parted / whole (both kept where it was not read).
    apart_rounds : ndarray of int, shape (R,)
    """
    evaluated = np.zeros(health.parted_before.shape, dtype=bool)
    parted = np.zeros(health.parted_before.shape, dtype=bool)
    if structured is not None:
        for run in np.flatnonzero(reading):
            evaluated[run], parted[run] = structured(int(run))
    persistent = parted & health.parted_before
    read_whole = np.where(evaluated & ~parted, True, np.where(persistent, False, health.read_whole))
    covered = np.all(read_whole | (preferred_masses <= 0.0), axis=1)
    apart_rounds = np.where(persistent.any(axis=1) | ~covered, 0,
                            np.where(evaluated.any(axis=1), health.apart_rounds + 1, health.apart_rounds))
    return persistent, np.where(evaluated, parted, health.parted_before), read_whole, apart_rounds


MAX_RESEEDS = 2
"""Re-seeds per cluster (until clients join): a cluster re-seeded twice without a lasting group is left to its budget."""


def routing_view(health: ClusterHealth, settings: RoutingSettings) -> RoutingView:
    """What the clients receive from a health state: exploration on or off, the merged duplicates, the spares."""
    sign = health.unwanted_rounds >= settings.collapse_patience
    merged = (health.twin >= 0) & (health.spare | (health.twin_rounds >= settings.duplicate_patience))
    explore = (~health.settled & settings.explore_at_start) | (sign & ~health.spare).any(axis=1)
    return RoutingView(explore=explore, merged_into=np.where(merged, health.twin, -1), spare=health.spare)
