"""Duplicates by signature: two clusters whose own clients are one group by their class signatures.

With more clusters than groups (``K > G``) a group can end split over two clusters — a spare cluster that a few of
its clients reached early, trained on them alone.  A model trained on a few clients memorises them: their training
loss on it is several times their loss on their group's model (4–15× measured, ``docs/algorithm.md``), so neither
the loss-based duplicate test (:func:`fedroute.core.health.duplicate_twins`) nor the clients' consolidation guard
sees one group, and the piece's model — its clients' only model — generalises worst of all.  What the clients' class
signatures show (:mod:`fedroute.core.signatures`: each class's mean input, sketched) does not depend on any model:
the pieces of one group look alike, two groups do not.

Two clusters ``j`` and ``k`` of a run are *signature twins* when

* each has at least one own client (a counted client whose latest Greedy choice it is) that sent a signature, and
  together at least three;
* together they are one group on their own: no 2-way partition of them, centred over them, shows two groups
  (:func:`fedroute.core.signature_start.two_groups`), so a cluster two groups share is never anyone's twin;
* and the two clusters do not separate them: the silhouette of the labelling ``{j, k}`` of their signed own
  clients, under the similarity centred over every signed client of the run, is below ``split_silhouette``
  (the threshold that reads two groups everywhere else; 0.82–0.98 between two groups, about 0 between the pieces
  of one on the traced runs).

Pairs are taken closest first, the cluster fewer clients prefer (by ``p̂``, ties to the higher index) being the
smaller, at most one twin each (:func:`fedroute.core.health.twin_pairs`, the loss-based duplicates' own assignment).
A *signed* client whose own cluster has been the smaller twin of the same cluster for ``collapse_patience`` rounds
in a row (:func:`twin_holds`; the first rounds' clusters of one to three clients make the test weak, and a wrong
pairing there lasts a round or two) is *held* on the larger one for as long as the pair stands
(:func:`fedroute.core.signature_start.held_routes`): its signature, not its loss on a model that memorised it,
places it — a merge flag its loss guard could refuse would not end the split.  A cluster every counted own client
of which is held is spare (:func:`twin_sources`, :func:`fedroute.core.health.update_health`).  A client's
signature only places that client; a client without one keeps the loss rules.  Pure functions; both runtimes
call them from :func:`fedroute.core.server_step.server_step`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.federation import FederationState
from fedroute.core.health import twin_pairs
from fedroute.core.signature_start import (SignatureState, in_client_order, signature_parts_of, signed_own_clients,
                                          two_groups)
from fedroute.core.signatures import shared_class_similarity
from fedroute.core.split import silhouette

__all__ = ["signature_twins", "twin_holds", "twin_sources", "twin_report", "MIN_TWIN_CLIENTS"]

MIN_TWIN_CLIENTS = 3
"""Signed own clients two clusters need between them to be read as one group (two clients always tie)."""


def signature_twins(signatures: SignatureState, federation: FederationState, counted: NDArray[np.bool_],
                    preferred_masses: NDArray[np.float64], min_silhouette: float) -> NDArray[np.int64]:
    """The twin each cluster is merged into by signature, per run (module docstring).

    Parameters
    ----------
    signatures : SignatureState
        Every known client's signature (rows of ``federation``).
    federation : FederationState
    counted : ndarray of bool, shape (m,)
        The clients whose latest report counts (:meth:`FederationState.counted`).
    preferred_masses : ndarray, shape (R, K)
        ``p̂`` (the larger twin keeps its clients).
    min_silhouette : float
        ``split_silhouette``.

    Returns
    -------
    ndarray of int, shape (R, K)
        The twin of each cluster that is the smaller of a pair, ``-1`` for none.  A cluster has at most one twin
        and a twin has none itself.
    """
    num_runs, num_clusters = preferred_masses.shape
    merged = np.full((num_runs, num_clusters), -1, dtype=np.int64)
    signed = signed_own_clients(signatures, federation, counted)
    for run in np.unique(federation.run_index[signed]):
        members = in_client_order(federation, np.flatnonzero(signed & (federation.run_index == run)))
        for small, large in twin_pairs(_twin_pairs(signatures, members, federation.preferred[members],
                                                   num_clusters, min_silhouette), preferred_masses[run]):
            merged[run, small] = large
    return merged


def twin_holds(signatures: SignatureState, federation: FederationState, counted: NDArray[np.bool_],
               preferred_masses: NDArray[np.float64], min_silhouette: float) -> SignatureState:
    """``signatures`` with the round's twin targets: each signed, counted client whose own cluster is the smaller
    of a pair of :func:`signature_twins` targets the larger, its streak counting the rounds in a row it has
    (:func:`fedroute.core.signature_start.held_routes` holds it from ``collapse_patience`` on)."""
    twins = signature_twins(signatures, federation, counted, preferred_masses, min_silhouette)
    rows = len(signatures.known)
    preferred, runs = federation.preferred[:rows], federation.run_index[:rows]
    eligible = signatures.known & np.asarray(counted, dtype=bool)[:rows] & (preferred >= 0)
    target = np.full(rows, -1, dtype=np.int64)
    target[eligible] = twins[runs[eligible], preferred[eligible]]
    streak = np.where((target >= 0) & (target == signatures.twin_target), signatures.twin_streak + 1,
                      (target >= 0).astype(np.int64))
    return replace(signatures, twin_target=target, twin_streak=streak)


def twin_sources(signatures: Optional[SignatureState], federation: FederationState, counted: NDArray[np.bool_],
                 num_runs: int, num_clusters: int, patience: int) -> NDArray[np.bool_]:
    """Per run, the clusters every counted own client of which is held on a signature twin (streak ≥ ``patience``;
    a client without a signature is never held): shape (R, K).  The server counts them as spare
    (:func:`fedroute.core.health.update_health`): a piece of a group whose clients train their group's model is not
    a starving cluster; one that also serves clients the merge does not hold is not spare."""
    sources = np.zeros((num_runs, num_clusters), dtype=bool)
    if signatures is None:
        return sources
    own = np.asarray(counted, dtype=bool) & (federation.preferred >= 0)
    held = np.zeros(len(own), dtype=bool)
    held[:len(signatures.known)] = signatures.twin_streak >= patience
    cells = federation.run_index * num_clusters + federation.preferred
    sources.reshape(-1)[cells[own & held]] = True
    sources.reshape(-1)[cells[own & ~held]] = False
    return sources


def _twin_pairs(signatures: SignatureState, members: NDArray[np.int64], preferred: NDArray[np.int64],
                num_clusters: int, min_silhouette: float) -> list[tuple[float, int, int]]:
    """``(silhouette, j, k)`` for every pair of clusters whose signed own clients are one group (one run)."""
    similarity = shared_class_similarity(signatures.means[members], signatures.counts[members])
    pairs = []
    for j in range(num_clusters):
        for k in range(j + 1, num_clusters):
            rows = np.flatnonzero((preferred == j) | (preferred == k))
            labels = (preferred[rows] == k).astype(np.int64)
            if len(rows) < MIN_TWIN_CLIENTS or labels.all() or not labels.any():
                continue
            score = silhouette(similarity[np.ix_(rows, rows)], labels)
            if score < min_silhouette and _one_group(signatures, members[rows], min_silhouette):
                pairs.append((score, j, k))
    return pairs


def _one_group(signatures: SignatureState, rows: NDArray[np.int64], min_silhouette: float) -> bool:
    """Whether clients (``rows``) are one group on their own: no 2-way partition of their similarity, centred over
    them, shows two groups (:func:`~fedroute.core.signature_start.two_groups`)."""
    return not two_groups(*signature_parts_of(signatures, rows, 2), min_silhouette)


def twin_report(before: Optional[SignatureState], after: Optional[SignatureState], patience: int,
                federation: FederationState, run: int = 0) -> Optional[str]:
    """A line for the log when signed clients of ``run`` start or stop being held on a signature twin (their hold
    begins once the pair has lasted ``patience`` rounds): which clusters' clients, on which cluster; else None."""
    if after is None:
        return None
    def targets(state: Optional[SignatureState]) -> set[int]:
        if state is None:
            return set()
        rows = (state.twin_streak >= patience) & (federation.run_index[:len(state.known)] == run)
        return set(state.twin_target[rows].tolist())
    now, then = targets(after), targets(before)
    lines = []
    for large in sorted(now - then):
        rows = np.flatnonzero((after.twin_streak >= patience) & (after.twin_target == large)
                              & (federation.run_index[:len(after.known)] == run))
        sources = sorted(set(federation.preferred[rows].tolist()))
        lines.append(f"merge by signature: the class signatures of cluster(s) {sources}' clients show one group with "
                     f"cluster {large}'s; {len(rows)} signed client(s) held on cluster {large} while they do")
    lines += [f"merge by signature onto cluster {large} ended (the clients' signatures no longer show one group "
              "with it, or they now prefer it)" for large in sorted(then - now)]
    return "; ".join(lines) or None
