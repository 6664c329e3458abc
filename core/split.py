"""Splitting a crowded cluster in two: the replies' update directions, bipartitioned.

When the server re-seeds a cluster from a crowded one (:func:`fedroute.core.health.reseeding`),
a plain copy ties the two models exactly: the crowded cluster's clients then split between
the copies at random, and the groups that shared the model separate only if chance puts
more of one group on one side — with few clients a round (partial participation) the random
split often mixes them again.  The replies routed to the crowded cluster in the round carry
the evidence of who belongs together: clients of the same group move the shared model in
the same direction.  :func:`bipartition` splits those replies by the direction of their
updates ``w_i^+ - W_c`` (spherical 2-means), and :func:`split_models` aggregates each side
under the same influence bounds as any cluster (:func:`fedroute.core.influence.aggregate_round`):
the source keeps one half, the re-seeded cluster gets the other, and each group finds the
half its own clients trained closer to its data.

Pure functions of the round's replies: deterministic (no random draw), so both runtimes
give the same models.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.influence import InfluenceBounds, aggregate_round

__all__ = ["bipartition", "split_models", "MAX_ITERATIONS"]

MAX_ITERATIONS = 20
"""Assignment/centroid iterations of the spherical 2-means (it settles in a few)."""


def bipartition(updates: NDArray[np.floating]) -> NDArray[np.bool_]:
    """Two sides of the updates ``(m, P)`` by direction: spherical 2-means, deterministic.

    The two centroids start at the least similar pair of updates (lowest cosine, ties to the
    lowest indices); each update joins the centroid it is most similar to (ties to side
    ``False``), and the centroids become their sides' normalised mean directions, until the
    sides stop changing (at most :data:`MAX_ITERATIONS` times).  A zero update has no
    direction and joins side ``False``.

    Parameters
    ----------
    updates : ndarray, shape (m, P), m ≥ 2

    Returns
    -------
    ndarray of bool, shape (m,)
        ``True`` for the second side.  Both sides are non-empty: the two seeds stay apart.
    """
    updates = np.asarray(updates, dtype=np.float64)
    if updates.ndim != 2 or len(updates) < 2:
        raise ValueError(f"bipartition needs at least 2 updates of shape (m, P), got shape {updates.shape}")
    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    directions = np.divide(updates, norms, out=np.zeros_like(updates), where=norms > 0)
    similarity = directions @ directions.T
    np.fill_diagonal(similarity, np.inf)
    first, second = np.unravel_index(int(np.argmin(similarity)), similarity.shape)
    centroids = directions[[first, second]]
    side = np.zeros(len(updates), dtype=bool)
    for _ in range(MAX_ITERATIONS):
        scores = directions @ centroids.T                                    # (m, 2)
        assigned = scores[:, 1] > scores[:, 0]
        assigned[first], assigned[second] = False, True                      # the seeds keep their sides
        if np.array_equal(assigned, side):
            break
        side = assigned
        for index, members in enumerate((~side, side)):
            mean = directions[members].sum(axis=0)
            length = np.linalg.norm(mean)
            centroids[index] = mean / length if length > 0 else directions[[first, second][index]]
    return side


def split_models(start: NDArray[np.floating], client_models: NDArray[np.floating],
                 num_examples: NDArray[np.floating], bounds: InfluenceBounds,
                 side: Optional[NDArray[np.bool_]] = None
                 ) -> Optional[tuple[NDArray[np.floating], NDArray[np.floating]]]:
    """The crowded cluster's round, aggregated as two halves: ``(kept half, re-seeded half)``.

    Parameters
    ----------
    start : ndarray, shape (P,)
        The crowded cluster's model before the round (``W_c^t``).
    client_models : ndarray, shape (m, P)
        The round's kept replies routed to it (``w_i^+``), in the order they are summed.
    num_examples : ndarray, shape (m,)
        Their claimed sample counts.
    bounds : InfluenceBounds
        The same bounds as every cluster's update (weight cap, update-norm bound, robust rule).
    side : ndarray of bool, shape (m,), optional
        The sides (e.g. a :func:`partition` in two); default :func:`bipartition` of the updates.

    Returns
    -------
    tuple of ndarray, shape (P,), or None
        The side with more weight (ties: the side of the first reply) stays with the crowded
        cluster; the other seeds the re-seeded one.  ``None`` (copy instead) with fewer than
        two replies or a side whose aggregate is not finite.
    """
    client_models = np.asarray(client_models)
    if len(client_models) < 2:
        return None
    start = np.asarray(start)
    if side is None:
        side = bipartition(client_models - start[None, :])
    routes = side.astype(np.int64)
    outcome = aggregate_round(np.stack([start, start]), client_models, routes, np.asarray(num_examples), bounds)
    if np.any(outcome.non_finite_clusters):
        return None
    weight = np.bincount(routes, weights=outcome.weights, minlength=2)
    kept = 0 if weight[0] > weight[1] or (weight[0] == weight[1] and not side[0]) else 1
    return outcome.models[kept], outcome.models[1 - kept]


def silhouette(similarity: NDArray[np.float64], labels: NDArray[np.int64]) -> float:
    """Mean silhouette of a partition under the cosine distance ``1 − cos``, from the cosines ``(m, m)``.

    For each direction, ``a`` is its mean distance to the other members of its part and ``b`` the smallest
    mean distance to another part; its silhouette is ``(b − a) / max(a, b)`` (0 for a part of one, and where
    both distances are 0).  Kaufman and Rousseeuw's reading of the mean: above 0.5 a reasonable structure,
    0.25–0.5 a weak one, below 0.25 none.
    """
    labels = np.asarray(labels)
    parts = np.unique(labels)
    if len(parts) < 2:
        return 0.0
    rows = np.arange(len(labels))
    members = labels[None, :] == parts[:, None]                                   # (k, m)
    sums = (1.0 - similarity) @ members.T                                         # (m, k)
    counts = members.sum(axis=1).astype(np.float64)                              # (k,)
    own = np.searchsorted(parts, labels)
    own_count = counts[own] - 1
    a = np.divide(sums[rows, own], own_count, out=np.zeros(len(labels)), where=own_count > 0)
    means = sums / counts[None, :]
    means[rows, own] = np.inf
    b = means.min(axis=1)
    scale = np.maximum(a, b)
    values = np.divide(b - a, scale, out=np.zeros(len(labels)), where=(scale > 0) & (own_count > 0))
    return float(values.mean())


def spherical_kmeans(similarity: NDArray[np.float64], num_parts: int) -> NDArray[np.int64]:
    """``num_parts`` parts of unit directions given by their cosines ``(m, m)``: spherical k-means, deterministic.

    The first centre is the medoid (the direction most similar to all others, ties to the lowest index), each
    next one the direction least similar to the centres so far (farthest-first); each direction joins its most
    similar centre (ties to the lower part) and the centres become their parts' mean directions, until the
    parts stop changing (at most :data:`MAX_ITERATIONS` times).  Seeds keep their parts, so none is empty.
    The centres are never formed: a direction's cosine with a part's mean direction is its summed cosine with
    the part's members over the norm of their sum, so the cost is that of the cosines, whatever ``P``.
    """
    seeds = [int(np.argmax(similarity.sum(axis=1)))]
    while len(seeds) < num_parts:
        closest = similarity[:, seeds].max(axis=1)
        closest[seeds] = np.inf
        seeds.append(int(np.argmin(closest)))
    scores = similarity[:, seeds]                                                 # cosines with the seed centres
    labels = np.full(len(similarity), -1, dtype=np.int64)
    for _ in range(MAX_ITERATIONS):
        assigned = np.argmax(scores, axis=1)
        assigned[seeds] = np.arange(num_parts)
        if np.array_equal(assigned, labels):
            break
        labels = assigned
        members = (labels[None, :] == np.arange(num_parts)[:, None]).astype(np.float64)   # (k, m)
        sums = similarity @ members.T                                             # (m, k): Σ_{j ∈ p} cos(i, j)
        lengths = np.sqrt(np.maximum(np.einsum("pm,mn,pn->p", members, similarity, members), 0.0))
        scores = np.divide(sums, lengths[None, :], out=np.zeros_like(sums), where=lengths[None, :] > 0)
    return labels


def partition(updates: NDArray[np.floating], max_parts: int, min_silhouette: float) -> NDArray[np.int64]:
    """Parts of the updates ``(m, P)`` by direction, as many as the structure shows (at most ``max_parts``).

    :func:`spherical_kmeans` for every number of parts ``k = 2 … min(max_parts, m − 1)``; the ``k`` whose
    partition has the largest mean :func:`silhouette` (the smaller ``k`` on ties) is taken if that silhouette
    is at least ``min_silhouette``, else one part.  Zero updates have no direction and join the part of the
    first moving update.  Everything after the cosines ``(m, m)`` costs ``O(m²)``.  Deterministic.

    Returns
    -------
    ndarray of int, shape (m,)
        Part of each update, numbered in order of first appearance (part 0 holds update 0).
    """
    updates = np.asarray(updates, dtype=np.float64)
    labels = np.zeros(len(updates), dtype=np.int64)
    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    moving = norms[:, 0] > 0
    if moving.sum() < 3 or max_parts < 2:
        return labels
    directions = updates[moving] / norms[moving]
    similarity = np.clip(directions @ directions.T, -1.0, 1.0)
    best_score, best = -np.inf, None
    for num_parts in range(2, min(max_parts, int(moving.sum()) - 1) + 1):
        candidate = spherical_kmeans(similarity, num_parts)
        score = silhouette(similarity, candidate)
        if score > best_score:
            best_score, best = score, candidate
    if best is None or best_score < min_silhouette:
        return labels
    labels[moving] = best
    labels[~moving] = labels[moving][0]
    _, first = np.unique(labels, return_index=True)
    order = np.argsort(first)
    renumber = np.empty(len(order), dtype=np.int64)
    renumber[order] = np.arange(len(order))
    return renumber[labels]
