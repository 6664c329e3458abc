"""Per-cluster hard update and routing masses (ALGORITHM.md §2, steps 3–4).

Both take an optional ``run_index`` so that the batched simulator can update
many independent runs at once: run ``r``'s cluster ``k`` is row ``r·K + k``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from numpy.typing import NDArray

__all__ = ["hard_update", "routing_masses", "cluster_route_counts"]


def _global_routes(routes: NDArray[np.int64], num_clusters: int, run_index: Optional[NDArray[np.int64]]) -> NDArray[np.int64]:
    routes = np.asarray(routes, dtype=np.int64)
    return routes if run_index is None else np.asarray(run_index, dtype=np.int64) * num_clusters + routes


def hard_update(
    cluster_models: NDArray[np.floating],
    client_models: NDArray[np.floating],
    routes: NDArray[np.int64],
    num_examples: NDArray[np.floating],
    run_index: Optional[NDArray[np.int64]] = None,
) -> NDArray[np.floating]:
    """Sample-weighted FedAvg per cluster; a cluster nobody routed to is kept.

    Parameters
    ----------
    cluster_models : ndarray, shape (K, P), or (R, K, P) with ``run_index``
        ``W^t`` as flat parameter vectors.
    client_models : ndarray, shape (m, P)
        Trained models ``w_i^+`` returned by the clients.
    routes : ndarray of int, shape (m,)
        The cluster each returned model belongs to.
    num_examples : ndarray, shape (m,)
        ``n_i`` (> 0).
    run_index : ndarray of int, shape (m,), optional
        The run each reply belongs to (batched runs).

    Returns
    -------
    ndarray, same shape and dtype as ``cluster_models``
        ``W^{t+1}``.  Replies are summed in their given order.
    """
    shape = cluster_models.shape
    num_clusters = shape[-2]
    flat = cluster_models.reshape(-1, shape[-1])
    targets = _global_routes(routes, num_clusters, run_index)
    weights = np.asarray(num_examples, dtype=np.float64)
    totals = np.bincount(targets, weights=weights, minlength=flat.shape[0])
    routed = totals > 0
    updated = flat.copy()
    if routed.any():
        # Segment sums over the replies grouped by cluster (stable sort: reply order kept within a
        # cluster); much faster than an unbuffered ``np.add.at`` over (replies, P) rows.
        order = np.argsort(targets, kind="stable")
        weighted = weights[order, None] * np.asarray(client_models, dtype=np.float64)[order]
        starts = np.searchsorted(targets[order], np.flatnonzero(routed))
        sums = np.add.reduceat(weighted, starts, axis=0)
        updated[routed] = (sums / totals[routed, None]).astype(flat.dtype)
    return updated.reshape(shape)


def routing_masses(
    routes: NDArray[np.int64],
    num_examples: NDArray[np.floating],
    num_clusters: int,
    run_index: Optional[NDArray[np.int64]] = None,
    num_runs: int = 1,
) -> NDArray[np.float64]:
    """``μ_k = Σ_{i: r_i = k} n_i / Σ_i n_i`` (executed routes, sample weighted).

    Returns shape (K,), or (R, K) when ``run_index`` is given (``num_runs = R``).
    A run without any reply gets zero masses.
    """
    targets = _global_routes(routes, num_clusters, run_index)
    totals = np.bincount(targets, weights=np.asarray(num_examples, dtype=np.float64),
                         minlength=num_clusters * (num_runs if run_index is not None else 1))
    totals = totals.astype(np.float64).reshape(-1, num_clusters)
    grand = totals.sum(axis=1, keepdims=True)
    masses = np.divide(totals, grand, out=np.zeros_like(totals), where=grand > 0)
    return masses if run_index is not None else masses[0]


def cluster_route_counts(routes: NDArray[np.int64], num_clusters: int) -> NDArray[np.int64]:
    """Number of clients routed to each cluster."""
    return np.bincount(routes, minlength=num_clusters).astype(np.int64)
