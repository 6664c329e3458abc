"""The signature start: the clients parted on the classes they share, each part held on one cluster at first.

From a warm start (``K`` copies of one model) under label skew inside groups, every signal the routing reads —
losses, update directions — follows a client's label mix more than its group, and the runs freeze mixed
(``docs/algorithm.md``, "The signature start").  What a group shares is what each class looks like.  With
``signature_hold_rounds = h > 0``, in every run whose ``K`` start models are exact copies of one model, and in
the other runs whose clients' class counts show label skew (``signature_start_on = "copies-or-skew"``, the default;
``"copies"``: copy starts only; ``"always"``: every run; :func:`active_runs`, :mod:`fedroute.core.label_skew`):

1. **Collect.**  A client the server has no signature of sends one with its reply
   (:func:`fedroute.core.signatures.sketched_signatures`: its class counts and each class's mean input on
   ``signature_dim`` random directions).
2. **Part.**  After the first ``⌈1/f⌉`` rounds (:func:`collect_rounds`; one with every client every round),
   once at least ``K`` clients have sent one, the server parts the run's clients on the classes they share
   (:func:`~fedroute.core.signatures.shared_class_similarity`, :func:`~fedroute.core.signatures.spectral_parts`
   refined client by client, :func:`~fedroute.core.signatures.refined_parts`, then pair of parts by pair, each
   pair compared on its own clients, :func:`~fedroute.core.signatures.pairwise_refined_parts`; clients in id
   order) and gives each part a cluster: heaviest part first, to the free cluster its clients' latest routes
   carry the most weight to (:func:`fedroute.core.copies.assigned_copies`).  A run from other start models is
   parted only when, at that first chance, at least ``K`` clients have sent one and their class counts show label skew
   (:func:`~fedroute.core.label_skew.label_skew`); otherwise the start *declines* it for good: its clients are
   not asked again and nobody is held (the losses carry the groups there).
3. **Hold.**  For the next ``⌈h/f⌉`` rounds (:func:`hold_rounds`: about ``h`` rounds of each client) a client
   with a part is *held*: it trains its part's cluster (:func:`held_routes`; the agent's exploitation step
   on that route, no EXP3 update).  A client whose first signature arrives after the parting joins the part
   whose clients it is most similar to on average (ties to the lower cluster); it is held from its next
   round.  After the hold every client routes as its method says.

The state is per client row of the server's :class:`~fedroute.core.federation.FederationState` (the Flower
strategy adds rows as clients appear; :meth:`SignatureState.grown`) and per run.  Pure functions: the Flower
strategy and the batched simulator call the same ones, in the same order, so they part and hold alike.
A node is not trusted: a signature is validated (finite, ``C`` classes of ``d`` numbers, counts ≥ 0) and only
places its own client; one client's wrong signature can move it to another part, not move the others.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.copies import assigned_copies, identical_pools
from fedroute.core.federation import FederationState
from fedroute.core.label_skew import LabelSkew, label_skew
from fedroute.core.participation import Participation
from fedroute.core.settings import RoutingSettings
from fedroute.core.split import silhouette
from fedroute.core.signatures import (batch_class_means, has_class_samples, pairwise_refined_parts, refined_parts,
                                      shared_class_similarity, sketched_signatures, spectral_parts)

__all__ = ["Signatures", "SignatureState", "SignatureOrders", "active_runs", "copy_starts", "collect_rounds",
           "hold_rounds", "signature_step", "held_routes", "wants_signature", "signature_orders", "sent_signatures",
           "parting_report", "regroup_report", "regrouped_state", "two_groups", "signature_parts_of",
           "in_client_order", "signed_own_clients"]


@dataclass(frozen=True)
class Signatures:
    """The signatures a round's replies carried (leading axis: those replies).

    Attributes
    ----------
    index : ndarray of int, shape (s,)
        Which of the round's replies carried one (positions in :class:`~fedroute.core.server_step.RoundReplies`).
    means : ndarray, shape (s, C, d)
        Sketched class means.
    counts : ndarray, shape (s, C)
        Samples of each class.
    """

    index: NDArray[np.int64]
    means: NDArray[np.float64]
    counts: NDArray[np.float64]


@dataclass(frozen=True)
class SignatureState:
    """Every known client's signature, its held cluster, and when each run was parted.

    Attributes
    ----------
    means : ndarray, shape (N, C, d)
        Latest sketched class means per federation row (``C = d = 0`` before any signature).
    counts : ndarray, shape (N, C)
    known : ndarray of bool, shape (N,)
        Rows whose signature arrived.
    held : ndarray of int, shape (N,)
        The cluster each client is held on (``-1``: none yet).
    parted_round : ndarray of int, shape (R,)
        ``t`` of the round after which each run was parted (``-1``: not yet).
    active : ndarray of bool, shape (R,)
        The runs the signature start acts in (:func:`active_runs`; a run it declines turns False); a client of
        another run is not asked.
    copy_start : ndarray of bool, shape (R,)
        The runs whose ``K`` start models are copies of one model (:func:`copy_starts`): parted whatever the counts.
    regrouped : ndarray of int, shape (N,)
        The cluster each client is held on after its run's latest re-seed by signature (``-1``: none;
        ``reseed_by_signature``, :func:`regrouped_state`).
    regroup_round : ndarray of int, shape (R,)
        ``t`` of the round after which each run's latest re-seed parted its source's clients (``-1``: none).
    twin_target : ndarray of int, shape (N,)
        The cluster each signed client's own cluster is a signature twin of this round (``-1``: none;
        ``merge_by_signature``, :mod:`fedroute.core.signature_twins`).
    twin_streak : ndarray of int, shape (N,)
        Consecutive rounds it has had that target; held on it from ``collapse_patience`` on.
    """

    means: NDArray[np.float64]
    counts: NDArray[np.float64]
    known: NDArray[np.bool_]
    held: NDArray[np.int64]
    parted_round: NDArray[np.int64]
    active: NDArray[np.bool_]
    copy_start: NDArray[np.bool_]
    regrouped: NDArray[np.int64]
    regroup_round: NDArray[np.int64]
    twin_target: NDArray[np.int64]
    twin_streak: NDArray[np.int64]

    @classmethod
    def initial(cls, num_rows: int, num_runs: int, active: Optional[NDArray[np.bool_]] = None,
                copy_start: Optional[NDArray[np.bool_]] = None) -> "SignatureState":
        """No signature yet; ``active`` and ``copy_start`` (default: every run) as :func:`active_runs` and
        :func:`copy_starts` give them (both runtimes read them from ``W^0`` in round 0)."""
        every = np.ones(num_runs, dtype=bool)
        return cls(means=np.zeros((num_rows, 0, 0)), counts=np.zeros((num_rows, 0)),
                   known=np.zeros(num_rows, dtype=bool), held=np.full(num_rows, -1, dtype=np.int64),
                   parted_round=np.full(num_runs, -1, dtype=np.int64),
                   regrouped=np.full(num_rows, -1, dtype=np.int64),
                   regroup_round=np.full(num_runs, -1, dtype=np.int64),
                   twin_target=np.full(num_rows, -1, dtype=np.int64), twin_streak=np.zeros(num_rows, dtype=np.int64),
                   active=every if active is None else np.asarray(active, dtype=bool),
                   copy_start=every.copy() if copy_start is None else np.asarray(copy_start, dtype=bool))

    @property
    def shape(self) -> tuple[int, int]:
        """``(C, d)`` of the signatures (``(0, 0)`` before any)."""
        return int(self.means.shape[1]), int(self.means.shape[2])

    def grown(self, num_rows: int) -> "SignatureState":
        """The state with rows added for clients the federation learnt of since (no signature, not held)."""
        extra = num_rows - len(self.known)
        if extra <= 0:
            return self
        return replace(self, means=np.concatenate([self.means, np.zeros((extra, *self.means.shape[1:]))]),
                       counts=np.concatenate([self.counts, np.zeros((extra, self.counts.shape[1]))]),
                       known=np.concatenate([self.known, np.zeros(extra, dtype=bool)]),
                       held=np.concatenate([self.held, np.full(extra, -1, dtype=np.int64)]),
                       regrouped=np.concatenate([self.regrouped, np.full(extra, -1, dtype=np.int64)]),
                       twin_target=np.concatenate([self.twin_target, np.full(extra, -1, dtype=np.int64)]),
                       twin_streak=np.concatenate([self.twin_streak, np.zeros(extra, dtype=np.int64)]))

    def recorded(self, rows: NDArray[np.int64], means: NDArray[np.floating],
                 counts: NDArray[np.floating]) -> "SignatureState":
        """The state with the signatures of ``rows``; the first signature fixes ``(C, d)``.

        Raises
        ------
        ValueError
            A signature of another shape than the ones recorded (the strategy rejects such a reply first).
        """
        means, counts = np.asarray(means, dtype=np.float64), np.asarray(counts, dtype=np.float64)
        state = self
        if not len(rows):
            return state
        if state.shape == (0, 0):
            state = replace(state, means=np.zeros((len(state.known), *means.shape[1:])),
                            counts=np.zeros((len(state.known), means.shape[1])))
        if means.shape[1:] != state.means.shape[1:] or counts.shape[1:] != state.counts.shape[1:]:
            raise ValueError(f"signatures of shape {means.shape[1:]} do not match the recorded {state.shape}")
        updated_means, updated_counts, known = state.means.copy(), state.counts.copy(), state.known.copy()
        updated_means[rows], updated_counts[rows], known[rows] = means, counts, True
        return replace(state, means=updated_means, counts=updated_counts, known=known)


def copy_starts(start_models: NDArray[np.floating], num_runs: int) -> NDArray[np.bool_]:
    """The runs whose ``K`` start models ``W^0`` are exact copies of one model (equal bytes,
    :func:`fedroute.core.copies.identical_pools`): shape (R,).

    Parameters
    ----------
    start_models : ndarray, shape (K, P) or (R, K, P)
    num_runs : int
        ``R``.
    """
    models = np.asarray(start_models)
    models = models.reshape(num_runs, models.shape[-2], -1)
    return np.array([[len(pool) for pool in identical_pools(run_models)] == [len(run_models)]
                     for run_models in models], dtype=bool)


def active_runs(start_models: NDArray[np.floating], settings: RoutingSettings,
                num_runs: int) -> NDArray[np.bool_]:
    """The runs the signature start acts in from round 0, from their start models ``W^0``: shape (R,).

    ``signature_start_on = "always"`` and ``"copies-or-skew"``: every run (the latter declines, at its parting
    round, a run that is not a copy start and whose clients' class counts show no label skew:
    :func:`signature_step`).  ``"copies"``: the copy starts only (:func:`copy_starts`) — a warm start, where no
    client's loss can tell the clusters apart and the routing has nothing to part the groups on.  From other
    starts without label skew the losses carry that signal, and on the suite the held parts then harmed more runs
    than they recovered (``docs/algorithm.md``, "The signature start").  Both runtimes read it in round 0
    (:func:`signature_step` and :func:`signature_orders` at ``t = 0``, whose cluster models are ``W^0``) and keep
    it in :attr:`SignatureState.active`.

    Parameters
    ----------
    start_models : ndarray, shape (K, P) or (R, K, P)
    settings : RoutingSettings
    num_runs : int
        ``R``.
    """
    if settings.signature_start_on == "copies":
        return copy_starts(start_models, num_runs)
    return np.ones(num_runs, dtype=bool)


def _started(state: SignatureState, cluster_models: Optional[NDArray[np.floating]], round_index: int,
             settings: RoutingSettings) -> SignatureState:
    """``state`` with its active runs and copy starts read from ``W^0`` in round 0 (:func:`active_runs`,
    :func:`copy_starts`); as is after (where ``cluster_models`` may be None: it is not read)."""
    if round_index != 0:
        return state
    if cluster_models is None:
        raise ValueError("the signature start reads the start models W^0 in round 0: pass cluster_models")
    num_runs = len(state.parted_round)
    return replace(state, active=active_runs(cluster_models, settings, num_runs),
                   copy_start=copy_starts(cluster_models, num_runs))


def collect_rounds(participation: Participation) -> int:
    """Rounds whose signatures the parting waits for: ``⌈1/f⌉`` (each client sampled about once; 1 at ``f = 1``)."""
    return participation.evidence_rounds(1)


def hold_rounds(settings: RoutingSettings, participation: Participation) -> int:
    """Server rounds a part is held: ``⌈h/f⌉`` (about ``h = signature_hold_rounds`` rounds of each client)."""
    return participation.evidence_rounds(settings.signature_hold_rounds)


def signature_step(state: SignatureState, federation: FederationState, rows: NDArray[np.int64],
                   signatures: Optional[Signatures], round_index: int, cluster_models: NDArray[np.floating],
                   num_runs: int, settings: RoutingSettings, participation: Participation,
                   reseeded_from: Optional[NDArray[np.int64]] = None) -> SignatureState:
    """The signature start after round ``t`` (module docstring): in round 0 read which runs it acts in, then
    record, part the active runs due (or decline those from other starts without label skew), place late clients.

    Parameters
    ----------
    state : SignatureState
    federation : FederationState
        After the round's reports (its rows, runs, client ids, latest routes and claimed sample counts).
    rows : ndarray of int, shape (m,)
        The federation row of each of the round's replies.
    signatures : Signatures or None
        The signatures the replies carried.
    round_index : int
        ``t``.
    cluster_models : ndarray, shape (K, P) or (R, K, P)
        ``W^t`` (the round's start; read in round 0 only).
    num_runs : int
    settings : RoutingSettings
    participation : Participation
    reseeded_from : ndarray of int, shape (R, K), optional
        The round's re-seeds (:attr:`fedroute.core.health.ClusterHealth.reseeded_from`): with
        ``reseed_by_signature`` each one parts its source's clients in two (:func:`regrouped_state`).

    Returns
    -------
    SignatureState
    """
    num_clusters = int(np.shape(cluster_models)[-2])
    state = _started(state, cluster_models, round_index, settings).grown(len(federation.client_ids))
    if signatures is not None and len(signatures.index):
        state = state.recorded(np.asarray(rows)[signatures.index], signatures.means, signatures.counts)
    for run in np.flatnonzero(state.active):
        in_run = federation.run_index == run
        if state.parted_round[run] < 0:
            if round_index < collect_rounds(participation) - 1:
                continue
            if not (state.copy_start[run] or settings.signature_start_on == "always"):
                skew = _signed_skew(state.counts[_members(state, federation, run)], num_clusters)
                if skew is None or not skew.skewed:                                 # declined for good
                    active = state.active.copy()
                    active[run] = False
                    state = replace(state, active=active)
                    continue
            if np.sum(state.known & in_run) >= num_clusters:
                state = _parted(state, federation, run, round_index, num_clusters)
        elif np.any(state.known & in_run & (state.held < 0)):
            state = _joined(state, federation, run)
    if settings.reseed_by_signature and reseeded_from is not None:
        for run, target in zip(*np.nonzero(np.asarray(reseeded_from) >= 0)):
            state = regrouped_state(state, federation, int(run), int(reseeded_from[run, target]), int(target),
                                    round_index, settings.split_silhouette)
    return state


def regrouped_state(state: SignatureState, federation: FederationState, run: int, source: int, target: int,
                    round_index: int, min_silhouette: float) -> SignatureState:
    """``state`` after cluster ``target`` of ``run`` was re-seeded from ``source``: the signed clients whose latest
    Greedy choice is ``source`` parted in two on the classes they share, the heavier part held on ``source`` and
    the other on ``target`` (:func:`fedroute.core.copies.assigned_copies`) for the next ``⌈h/f⌉`` rounds; as is
    when fewer than two of them signed or their parts do not show two groups (:func:`two_groups` at
    ``min_silhouette``)."""
    members = _members(state, federation, run)
    members = members[federation.preferred[members] == source]
    if len(members) < 2:
        return state
    similarity, labels = signature_parts_of(state, members, 2)
    if not two_groups(similarity, labels, min_silhouette):
        return state
    clusters = assigned_copies(labels, federation.route[members], federation.num_examples[members].astype(np.float64),
                               [source, target])
    regrouped, rounds = state.regrouped.copy(), state.regroup_round.copy()
    regrouped[federation.run_index == run] = -1
    regrouped[members], rounds[run] = clusters[labels], round_index
    return replace(state, regrouped=regrouped, regroup_round=rounds)


def signature_parts_of(state: SignatureState, members: NDArray[np.int64],
                     num_parts: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """The similarity of ``members``' signatures on the classes they share and its ``num_parts``-way spectral
    partition, refined client by client (:func:`~fedroute.core.signatures.refined_parts`)."""
    similarity = shared_class_similarity(state.means[members], state.counts[members])
    return similarity, refined_parts(similarity, spectral_parts(similarity, num_parts))


def _signed_skew(counts: NDArray[np.float64], num_clusters: int) -> Optional[LabelSkew]:
    """:func:`~fedroute.core.label_skew.label_skew` of the class counts a run's clients sent with their signatures
    (one row each); None with fewer than ``K`` of them (too few to part on)."""
    return label_skew(counts) if len(counts) >= num_clusters else None


def _members(state: SignatureState, federation: FederationState, run: int) -> NDArray[np.int64]:
    """The rows of ``run`` with a signature, in client-id order (both runtimes part the same sequence)."""
    return in_client_order(federation, np.flatnonzero(state.known & (federation.run_index == run)))


def in_client_order(federation: FederationState, rows: NDArray[np.int64]) -> NDArray[np.int64]:
    """``rows`` sorted by client id (stable): the order both runtimes part clients in, whatever their row order."""
    return rows[np.argsort(federation.client_ids[rows], kind="stable")]


def signed_own_clients(state: Optional[SignatureState], federation: FederationState,
                       counted: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Per federation row: a counted client (:meth:`FederationState.counted`) with a Greedy choice that sent a
    signature — the clients the merge and the structure by signature read (``state`` None: nobody)."""
    signed = np.zeros(len(federation.client_ids), dtype=bool)
    if state is not None:
        signed[:len(state.known)] = state.known
    return signed & np.asarray(counted, dtype=bool) & (federation.preferred >= 0)


def _parted(state: SignatureState, federation: FederationState, run: int, round_index: int,
            num_clusters: int) -> SignatureState:
    """``run`` parted into ``K`` parts, each part held on its cluster."""
    members = _members(state, federation, run)
    labels = pairwise_refined_parts(state.means[members], state.counts[members],
                                    signature_parts_of(state, members, num_clusters)[1])
    target = assigned_copies(labels, federation.route[members], federation.num_examples[members].astype(np.float64),
                             list(range(num_clusters)))
    held, parted = state.held.copy(), state.parted_round.copy()
    held[members], parted[run] = target[labels], round_index
    return replace(state, held=held, parted_round=parted)


def _joined(state: SignatureState, federation: FederationState, run: int) -> SignatureState:
    """The clients of ``run`` with a signature but no part placed with the part they are most similar to."""
    members = _members(state, federation, run)
    similarity = shared_class_similarity(state.means[members], state.counts[members])
    clusters = state.held[members]
    held = state.held.copy()
    for position in np.flatnonzero(clusters < 0):
        mean = np.array([similarity[position, clusters == cluster].mean() if np.any(clusters == cluster) else -np.inf
                         for cluster in range(int(clusters.max()) + 1)])
        held[members[position]] = int(np.argmax(mean))
    return replace(state, held=held)


def two_groups(similarity: NDArray[np.float64], labels: NDArray[np.int64], min_silhouette: float) -> bool:
    """Whether a 2-way partition of clients by their signatures shows two groups: its mean silhouette under the
    distance ``1 − similarity`` (:func:`fedroute.core.split.silhouette`) reaches ``min_silhouette``
    (``split_silhouette``, the threshold the split by update direction uses: Kaufman and Rousseeuw's "weak
    structure" at 0.25).

    The similarity (:func:`~fedroute.core.signatures.shared_class_similarity`) is a cosine of class means centred
    over the clients compared: clients of one group differ from their centre by noise, and a partition of noise
    stays under 0.25 in 99 % of draws from 8 clients up (4 classes of 8 numbers; 10 classes of 16 never reach
    0.21), while two groups sit on opposite sides of the centre (0.67–0.95 on the traced ``digits`` sources that
    held two groups, 0.09–0.19 on those that held one)."""
    labels = np.asarray(labels)
    if len(np.unique(labels)) < 2:
        return False
    return silhouette(np.asarray(similarity, dtype=np.float64), labels) >= min_silhouette


def held_routes(state: Optional[SignatureState], rows: NDArray[np.int64], runs: NDArray[np.int64], round_index: int,
                settings: RoutingSettings, participation: Participation) -> Optional[NDArray[np.int64]]:
    """The cluster each of ``rows`` is held on in round ``t`` (``-1``: free), or None when nobody is held.

    A run parted after round ``p`` holds its clients in rounds ``p < t ≤ p + ⌈h/f⌉`` (:func:`hold_rounds`); a
    re-seed by signature holds the clients it parted for as long.  With ``merge_by_signature`` a client otherwise free
    is held on the cluster its own cluster has been a signature twin of for ``collapse_patience`` rounds in a row
    (:mod:`fedroute.core.signature_twins`), for as long as it is.  ``rows`` of ``-1`` (a client the server does
    not know yet) are free.
    """
    if state is None or settings.signature_hold_rounds <= 0:
        return None
    rows, runs = np.asarray(rows, dtype=np.int64), np.asarray(runs, dtype=np.int64)
    parted = state.parted_round[runs]
    known = (rows >= 0) & (rows < len(state.held))
    in_hold = known & (parted >= 0) & (round_index > parted) & (round_index <= parted + hold_rounds(settings,
                                                                                                    participation))
    routes = np.full(len(rows), -1, dtype=np.int64)
    routes[in_hold] = state.held[rows[in_hold]]
    regrouped = state.regroup_round[runs]
    in_regroup = known & ~in_hold & (regrouped >= 0) & (round_index > regrouped) & (
        round_index <= regrouped + hold_rounds(settings, participation))
    routes[in_regroup] = state.regrouped[rows[in_regroup]]
    if settings.merge_by_signature:                                  # a piece of a group on its twin's cluster
        twinned = known & (routes < 0)
        twinned[twinned] = state.twin_streak[rows[twinned]] >= settings.collapse_patience
        routes[twinned] = state.twin_target[rows[twinned]]
    return routes if np.any(routes >= 0) else None


def wants_signature(state: Optional[SignatureState], rows: NDArray[np.int64], runs: NDArray[np.int64],
                    round_index: int, settings: RoutingSettings, participation: Participation) -> NDArray[np.bool_]:
    """Which of ``rows`` send their signature in round ``t``: those the server has none of, until the hold ends.

    ``rows`` of ``-1`` (not known yet) are asked.  Shape (m,); all False without the signature start.
    """
    rows, runs = np.asarray(rows, dtype=np.int64), np.asarray(runs, dtype=np.int64)
    if settings.signature_hold_rounds <= 0:
        return np.zeros(len(rows), dtype=bool)
    if state is None:
        return np.ones(len(rows), dtype=bool)
    parted = state.parted_round[runs]
    open_window = (parted < 0) | (round_index <= parted + hold_rounds(settings, participation))
    known = (rows >= 0) & (rows < len(state.known))
    signed = np.zeros(len(rows), dtype=bool)
    signed[known] = state.known[rows[known]]
    return open_window & ~signed & state.active[runs]


@dataclass(frozen=True)
class SignatureOrders:
    """What the signature start asks of a round's clients (leading axis: those clients).

    Attributes
    ----------
    held : ndarray of int, shape (m,), or None
        The cluster each is held on (``-1``: free); None when nobody is.
    wanted : ndarray of bool, shape (m,)
        Whether each sends its signature with its reply.
    """

    held: Optional[NDArray[np.int64]]
    wanted: NDArray[np.bool_]


def signature_orders(state: Optional[SignatureState], rows: NDArray[np.int64], runs: NDArray[np.int64],
                     round_index: int, settings: RoutingSettings, participation: Participation,
                     cluster_models: Optional[NDArray[np.floating]]) -> Optional[SignatureOrders]:
    """:func:`held_routes` and :func:`wants_signature` of the round's clients (``cluster_models``: ``W^t``, read in
    round 0 for the runs the start acts in, as :func:`signature_step` reads them; None is allowed after round 0);
    None without the signature start."""
    if settings.signature_hold_rounds <= 0:
        return None
    if state is not None:
        state = _started(state, cluster_models, round_index, settings)
    return SignatureOrders(held=held_routes(state, rows, runs, round_index, settings, participation),
                           wanted=wants_signature(state, rows, runs, round_index, settings, participation))


def sent_signatures(clients: object, wanted: NDArray[np.bool_], seeds: NDArray[np.int64],
                    dim: int) -> Optional[Signatures]:
    """The signatures a batch of clients sends (:func:`~fedroute.core.signatures.batch_class_means` of the wanted
    ones, sketched with their run's seed); None when none is wanted, or when the clients carry no class samples
    (a regression task: they cannot send one, and are not held).  The Flower ClientApp sends its own with a
    batch of one, the batched simulator the round's batch."""
    index = np.flatnonzero(np.asarray(wanted, dtype=bool))
    if not len(index) or not has_class_samples(clients):
        return None
    seeds = np.broadcast_to(np.asarray(seeds, dtype=np.int64), np.shape(wanted))[index]
    class_means, class_counts = batch_class_means(clients)
    means = np.zeros((len(index), class_means.shape[1], dim))
    for seed in np.unique(seeds):
        chosen = seeds == seed
        means[chosen] = sketched_signatures(class_means[index[chosen]], class_counts[index[chosen]], dim, int(seed))[0]
    return Signatures(index=index, means=means, counts=class_counts[index].astype(np.float64))


def parting_report(before: Optional[SignatureState], after: Optional[SignatureState], settings: RoutingSettings,
                   participation: Participation, round_index: int, run: int = 0) -> Optional[str]:
    """A line for the log after round ``t`` (else None): when ``run`` was parted in that round, how many clients,
    the part sizes per cluster and how long they are held; when the start should have parted it then but fewer
    than ``K`` clients had sent a signature, that it waits (clients without class labels send none); when it
    declined the run then (other start models, no label skew), why."""
    if after is None:
        return None
    if not after.active[run]:
        if before is None or not before.active[run]:
            return None
        signed = int(np.sum(after.known))
        skew = _signed_skew(after.counts[after.known], settings.num_clusters)
        if not signed:
            evidence = "no client sent a class signature (clients without class labels send none)"
        elif skew is None:
            evidence = f"only {signed} clients sent a class signature, fewer than K = {settings.num_clusters}"
        else:
            evidence = (f"the class counts of {signed} clients show no label skew (effect w = {skew.effect:.2f}, "
                        f"p = {skew.p_value:.2g})")
        return (f"signature start: not used after round {round_index}: the start models are not copies of one "
                f"model and {evidence}; the clients' losses on the models part them (no client is held or asked "
                "again)")
    if after.parted_round[run] < 0:
        if round_index != collect_rounds(participation) - 1:
            return None
        return (f"signature start: after round {round_index} only {int(np.sum(after.known))} clients sent a class "
                f"signature, fewer than K = {settings.num_clusters}; it parts once K have (a torch client sends one "
                "when routing_train has signature_data and num_classes); the routing goes on meanwhile")
    if before is not None and before.parted_round[run] >= 0:
        return None
    held = after.held[after.held >= 0]
    sizes = np.bincount(held, minlength=settings.num_clusters)
    return (f"signature start: {len(held)} clients parted on the classes they share after round "
            f"{int(after.parted_round[run])}, clients per cluster {sizes.tolist()}; each is held on its cluster for "
            f"{hold_rounds(settings, participation)} rounds")


def regroup_report(before: Optional[SignatureState], after: Optional[SignatureState], settings: RoutingSettings,
                   participation: Participation, round_index: int, run: int = 0) -> Optional[str]:
    """A line for the log after round ``t`` when a re-seed parted its source's clients on their signatures then
    (``reseed_by_signature``): how many on which cluster, and for how long; else None."""
    if after is None or after.regroup_round[run] != round_index:
        return None
    if before is not None and before.regroup_round[run] == round_index:
        return None
    clusters, sizes = np.unique(after.regrouped[after.regrouped >= 0], return_counts=True)
    placed = ", ".join(f"{int(size)} on cluster {int(cluster)}" for cluster, size in zip(clusters, sizes))
    return (f"re-seed by signature: after round {round_index} the clients of the re-seed's source (crowded, or two "
            f"groups by their signatures) parted in two on the classes they share ({placed}); each is held on its copy "
            f"for {hold_rounds(settings, participation)} rounds")
