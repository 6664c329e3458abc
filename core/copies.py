"""Which cluster models are copies of each other: one definition for the server and the clients.

The server pools the clusters whose models no client's training can tell apart and parts their replies by
update direction (:func:`fedroute.core.server_step.copy_routes`, within the round's median update); a client
asks whether its routed model has a copy as far as its own update can tell (the start probe,
:func:`fedroute.core.client_step.routed_has_copy`, within its own update).  Both call :func:`identical_pools`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["identical_pools", "assigned_copies"]


def identical_pools(models: NDArray[np.floating], within: float = 0.0) -> list[list[int]]:
    """The clusters of one run whose models ``(K, P)`` are copies of each other, as lists of two or more indices.

    Two models are copies when they are equal, or (``within > 0``) closer than ``within`` in L2 norm; the
    pools are the connected groups of that relation (single linkage), each in index order.  The distances
    come from one Gram matrix (``‖a − b‖² = ‖a‖² + ‖b‖² − 2 a·b``, accurate far below any update's norm);
    equality is checked exactly.
    """
    models = np.asarray(models)
    num_clusters = len(models)
    flat = models.reshape(num_clusters, -1)
    copies = np.zeros((num_clusters, num_clusters), dtype=bool)
    first: dict[bytes, int] = {}
    for cluster in range(num_clusters):                                  # exact copies: equal bytes
        twin = first.setdefault(np.ascontiguousarray(flat[cluster]).tobytes(), cluster)
        copies[cluster, twin] = copies[twin, cluster] = twin != cluster
    if within > 0 and num_clusters > 1:
        vectors = flat.astype(np.float64)
        gram = vectors @ vectors.T
        squares = np.diag(gram)
        copies |= np.maximum(squares[:, None] + squares[None, :] - 2.0 * gram, 0.0) < within ** 2
    np.fill_diagonal(copies, False)
    parent = list(range(num_clusters))
    for j, k in zip(*np.nonzero(np.triu(copies))):
        root_j, root_k = _root(parent, int(j)), _root(parent, int(k))
        parent[max(root_j, root_k)] = min(root_j, root_k)
    pools: dict[int, list[int]] = {}
    for cluster in range(num_clusters):
        pools.setdefault(_root(parent, cluster), []).append(cluster)
    return [pool for pool in pools.values() if len(pool) > 1]


def _root(parent: list[int], node: int) -> int:
    while parent[node] != node:
        node = parent[node]
    return node


def assigned_copies(labels: NDArray[np.int64], routes: NDArray[np.int64], weights: NDArray[np.float64],
                     pool: list[int]) -> NDArray[np.int64]:
    """The copy each part trains: heaviest part first (ties to the lower part), to the free copy its members
    routed the most weight to (ties to the lower index); shape (number of parts,).  ``routes`` of ``-1`` (no
    route) count for no copy.  Used by the server's copy split and the signature start."""
    num_parts = int(labels.max()) + 1
    part_weight = np.bincount(labels, weights=weights, minlength=num_parts)
    target = np.full(num_parts, -1, dtype=np.int64)
    free = list(pool)
    for part in sorted(range(num_parts), key=lambda p: (-part_weight[p], p)):
        routed = [weights[(labels == part) & (routes == cluster)].sum() for cluster in free]
        target[part] = free.pop(int(np.argmax(routed)))
    return target
