"""Per-cluster hard update and routing masses (ALGORITHM.md §2, steps 3–4)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["hard_update", "routing_masses", "cluster_route_counts"]


def hard_update(
    cluster_models: NDArray[np.floating],
    client_models: NDArray[np.floating],
    routes: NDArray[np.int64],
    num_examples: NDArray[np.floating],
) -> NDArray[np.floating]:
    """Sample-weighted FedAvg per cluster; a cluster nobody routed to is kept.

    Parameters
    ----------
    cluster_models : ndarray, shape (K, P)
        ``W^t`` as flat parameter vectors.
    client_models : ndarray, shape (m, P)
        Trained models ``w_i^+`` returned by the clients.
    routes : ndarray of int, shape (m,)
        The cluster each returned model belongs to.
    num_examples : ndarray, shape (m,)
        ``n_i`` (> 0).

    Returns
    -------
    ndarray, shape (K, P)
        ``W^{t+1}`` (same dtype as ``cluster_models``).
    """
    num_clusters = cluster_models.shape[0]
    weights = np.zeros((num_clusters, len(routes)))
    weights[routes, np.arange(len(routes))] = np.asarray(num_examples, dtype=np.float64)
    totals = weights.sum(axis=1, keepdims=True)
    routed = totals[:, 0] > 0
    updated = cluster_models.copy()
    if routed.any():
        averaged = (weights[routed] / totals[routed]) @ client_models.astype(np.float64)
        updated[routed] = averaged.astype(cluster_models.dtype)
    return updated


def routing_masses(routes: NDArray[np.int64], num_examples: NDArray[np.floating], num_clusters: int) -> NDArray[np.float64]:
    """``μ_k = Σ_{i: r_i = k} n_i / Σ_i n_i`` (executed routes, sample weighted)."""
    totals = np.bincount(routes, weights=np.asarray(num_examples, dtype=np.float64), minlength=num_clusters)
    grand_total = totals.sum()
    return totals / grand_total if grand_total > 0 else np.zeros(num_clusters)


def cluster_route_counts(routes: NDArray[np.int64], num_clusters: int) -> NDArray[np.int64]:
    """Number of clients routed to each cluster."""
    return np.bincount(routes, minlength=num_clusters).astype(np.int64)
