"""Per-cluster hard update and routing masses (docs/algorithm.md, rules §2, steps 3–4).

Both take an optional ``run_index`` so that the batched simulator can update
many independent runs at once: run ``r``'s cluster ``k`` is row ``r·K + k``.

The hard update never commits a non-finite model: a cluster whose weighted
sum overflows is averaged again with normalised weights (a convex combination
of finite values is finite), and a cluster whose average is still not finite
(a non-finite reply, possible in the simulator only: the strategies validate
replies) keeps its model; :func:`hard_update_checked` says which.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from numpy.typing import NDArray

__all__ = ["hard_update", "hard_update_checked", "routing_masses", "SERVER_UPDATES", "ifca_gradient_step"]

SERVER_UPDATES = ("average", "ifca-gradient")
"""How a cluster takes its routed clients' trained models.  ``average`` (the paper's hard update, and our
Greedy's: IFCA's *model-averaging* variant): ``W_k ← Σ_{i→k} n_i w_i / Σ_{i→k} n_i``.  ``ifca-gradient``
(IFCA's published gradient step, Ghosh et al. 2020, Algorithm 1 with gradient averaging):
``W_k ← W_k + Σ_{i→k} n_i (w_i − W_k) / Σ_i n_i``, the sum over the clients routed to ``k`` divided by
*all* the round's clients (``Σ∇/m`` with equal ``n_i``, ``w_i − W_k = −η ∇_i``): a cluster few clients
chose moves little."""


def _global_routes(routes: NDArray[np.int64], num_clusters: int, run_index: Optional[NDArray[np.int64]]) -> NDArray[np.int64]:
    routes = np.asarray(routes, dtype=np.int64)
    return routes if run_index is None else np.asarray(run_index, dtype=np.int64) * num_clusters + routes


_BLOCK_VALUES = 1 << 16
"""Reply values per column block of :func:`_segment_weighted_sums` (512 KiB of float64: cache sized)."""


def _segment_weighted_sums(client_models: NDArray[np.floating], order: NDArray[np.int64],
                           ordered_weights: NDArray[np.float64], starts: NDArray[np.int64]) -> NDArray[np.float64]:
    """``Σ n_i w_i`` per segment of the replies taken in ``order`` (segments begin at ``starts``), in float64.

    Each value is the float64 product of a reply's value (widened exactly
    from its own dtype) and its weight, summed over the segment's replies in
    their order: the same operations, in the same order, for every column,
    whatever the blocking.  Columns go in cache-sized blocks, so no
    ``(replies, P)`` float64 temporary is allocated (stable sort, segment sums:
    much faster than an unbuffered ``np.add.at``).  Overflow gives ``inf``
    silently; the caller checks.
    """
    num_replies, num_values = client_models.shape
    sums = np.empty((len(starts), num_values))
    block = max(256, _BLOCK_VALUES // max(num_replies, 1))
    weights = ordered_weights[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        for begin in range(0, num_values, block):
            columns = slice(begin, begin + block)
            weighted = np.multiply(client_models[order, columns], weights, dtype=np.float64)
            sums[:, columns] = np.add.reduceat(weighted, starts, axis=0)
    return sums


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
        ``W^{t+1}``.  Replies are summed in their given order; a cluster whose
        average would not be finite keeps its model (see :func:`hard_update_checked`).
    """
    return hard_update_checked(cluster_models, client_models, routes, num_examples, run_index)[0]


def hard_update_checked(
    cluster_models: NDArray[np.floating],
    client_models: NDArray[np.floating],
    routes: NDArray[np.int64],
    num_examples: NDArray[np.floating],
    run_index: Optional[NDArray[np.int64]] = None,
) -> tuple[NDArray[np.floating], NDArray[np.bool_]]:
    """:func:`hard_update`, and which clusters kept their model because their average was not finite.

    ``Σ n_i w_i / Σ n_i`` is computed as before (bit for bit) whenever it is
    finite; only a cluster whose weighted sum overflowed is recomputed as
    ``Σ (n_i / Σ n) w_i``.

    Returns
    -------
    updated : ndarray, same shape and dtype as ``cluster_models``
    non_finite : ndarray of bool, shape (K,) or (R, K)
        ``True`` where the replies' average was not finite: that cluster kept its model.
    """
    shape = cluster_models.shape
    num_clusters = shape[-2]
    flat = cluster_models.reshape(-1, shape[-1])
    targets = _global_routes(routes, num_clusters, run_index)
    weights = np.asarray(num_examples, dtype=np.float64)
    totals = np.bincount(targets, weights=weights, minlength=flat.shape[0])
    routed = totals > 0
    updated = flat.copy()
    non_finite = np.zeros(flat.shape[0], dtype=bool)
    if routed.any():
        order = np.argsort(targets, kind="stable")
        starts = np.searchsorted(targets[order], np.flatnonzero(routed))
        sums = _segment_weighted_sums(np.asarray(client_models), order, weights[order], starts)
        with np.errstate(over="ignore", invalid="ignore"):
            averaged = (sums / totals[routed, None]).astype(flat.dtype)
        bad = ~np.isfinite(averaged).all(axis=1)
        if bad.any():  # overflow of n·w or of the sum: average the convex combination instead
            models = np.asarray(client_models, dtype=np.float64)[order]  # rare: the unweighted replies again
            shares = weights[order] / totals[targets[order]]
            with np.errstate(over="ignore", invalid="ignore"):
                rescued = np.add.reduceat(shares[:, None] * models, starts, axis=0)[bad].astype(flat.dtype)
            averaged[bad] = rescued
            still = ~np.isfinite(rescued).all(axis=1)
            kept = np.flatnonzero(routed)[np.flatnonzero(bad)[still]]
            non_finite[kept] = True
            averaged[np.flatnonzero(bad)[still]] = flat[kept]
        updated[routed] = averaged
    return updated.reshape(shape), non_finite.reshape(shape[:-1])


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


def ifca_gradient_step(
    cluster_models: NDArray[np.floating],
    averaged: NDArray[np.floating],
    routes: NDArray[np.int64],
    weights: NDArray[np.floating],
    run_index: Optional[NDArray[np.int64]] = None,
) -> NDArray[np.floating]:
    """IFCA's gradient step from the per-cluster averages of :func:`hard_update_checked`.

    ``W_k + (S_k / S)(avg_k − W_k) = W_k + Σ_{i→k} n_i (w_i − W_k) / Σ_i n_i``, with ``S_k`` the weight
    routed to ``k`` and ``S`` the weight of all the round's replies (of the reply's run, batched).

    Parameters
    ----------
    cluster_models : ndarray, shape (K, P), or (R, K, P) with ``run_index``
        ``W^t``.
    averaged : ndarray, same shape
        The per-cluster weighted averages (clusters nobody chose: ``W^t`` itself).
    routes, weights : ndarray, shape (m,)
        The replies' clusters and weights.
    run_index : ndarray of int, shape (m,), optional
        The run of each reply.

    Returns
    -------
    ndarray, same shape and dtype as ``cluster_models``
    """
    shape = cluster_models.shape
    num_clusters = shape[-2]
    rows = int(np.prod(shape[:-1]))
    share = routing_masses(routes, weights, num_clusters, run_index, rows // num_clusters).reshape(-1)  # S_k / S
    start = cluster_models.reshape(rows, -1).astype(np.float64)
    step = start + share[:, None] * (averaged.reshape(rows, -1).astype(np.float64) - start)
    return step.astype(cluster_models.dtype).reshape(shape)
