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
                 num_examples: NDArray[np.floating], bounds: InfluenceBounds
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
    side = bipartition(client_models - start[None, :])
    routes = side.astype(np.int64)
    outcome = aggregate_round(np.stack([start, start]), client_models, routes, np.asarray(num_examples), bounds)
    if np.any(outcome.non_finite_clusters):
        return None
    weight = np.bincount(routes, weights=outcome.weights, minlength=2)
    kept = 0 if weight[0] > weight[1] or (weight[0] == weight[1] and not side[0]) else 1
    return outcome.models[kept], outcome.models[1 - kept]
