"""Population-level Greedy dynamics of clustered learning with quadratic group losses (pure numpy).

Each round every group ``g`` (proportion ``α_g``, population loss ``L_g(w) = ½‖w − θ_g‖²``) routes to
``argmin_k L_g(w_k)`` and every routed cluster steps towards the α-weighted mean of its groups'
``θ_g``; paper §2, Theorem 2 (E1, :mod:`fedroute.simulation.experiments.fig1`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["greedy_population_dynamics"]


def _proportions(alpha: ArrayLike, num_groups: int) -> NDArray[np.float64]:
    weights = np.atleast_1d(np.asarray(alpha, dtype=float))
    if weights.shape == (1,):
        if num_groups != 2:
            raise ValueError(f"a scalar alpha needs two groups, got G={num_groups}")
        weights = np.array([weights[0], 1.0 - weights[0]])
    if weights.shape != (num_groups,):
        raise ValueError(f"alpha must be a scalar (two groups) or have shape ({num_groups},), got {weights.shape}")
    if (not np.all(np.isfinite(weights)) or np.any(weights < 0)
            or np.any((weights > 0) & (weights < np.finfo(float).tiny))):
        raise ValueError(f"group proportions must be finite, ≥ 0 and not subnormal, got {weights.tolist()}")
    return weights


def greedy_population_dynamics(
    initial_models: ArrayLike, theta: ArrayLike, alpha: ArrayLike, eta: float, rounds: int
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Population-level Greedy CFL with ``L_g(w) = ½‖w − θ_g‖²``, for many starts at once.

    Each round, every group ``g`` routes to ``argmin_k ½‖w_k − θ_g‖²`` (ties to the
    lowest index) and every cluster with routed mass ``Σ_{g→k} α_g > 0`` moves to
    ``w_k − η Σ_{g→k} α_g (w_k − θ_g) / Σ_{g→k} α_g``, i.e. (computed as)
    ``(1 − η) w_k + η θ̄_k`` with ``θ̄_k`` the α-weighted mean of its groups' ``θ_g``;
    other clusters are unchanged.  All starts are advanced together; the only
    Python loops are over rounds and over the (few) clusters.

    Parameters
    ----------
    initial_models : array_like, shape (N, K, d)
        ``N`` independent starts ``W^0`` of ``K`` cluster models (``K = 2`` in E1).
    theta : array_like, shape (G, d)
        Group parameters.
    alpha : float or array_like of shape (G,)
        Group proportions; a scalar means ``(α, 1 − α)`` (two groups).  A group
        with proportion 0 routes but carries no mass.
    eta : float
        Step ``η`` in ``(0, 1]``.
    rounds : int
        Number of rounds ``T`` (≥ 0).

    Returns
    -------
    final_models : numpy.ndarray, shape (N, K, d)
        ``W^T``.
    ever_updated : numpy.ndarray of bool, shape (N, K)
        Whether cluster ``k`` received routed mass in any of the ``T`` rounds.
    """
    models = np.asarray(initial_models, dtype=float)
    theta = np.asarray(theta, dtype=float)
    if models.ndim != 3 or models.shape[1] < 1:
        raise ValueError(f"initial_models must have shape (N, K, d), got {models.shape}")
    if theta.ndim != 2 or theta.shape[0] < 1 or theta.shape[1] != models.shape[2]:
        raise ValueError(f"theta must have shape (G, {models.shape[2]}), got {theta.shape}")
    if not (np.all(np.isfinite(models)) and np.all(np.isfinite(theta))):
        raise ValueError("initial_models and theta must be finite")
    if not 0.0 < float(eta) <= 1.0:
        raise ValueError(f"eta must lie in (0, 1], got {eta!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 0:
        raise ValueError(f"rounds must be an integer ≥ 0, got {rounds!r}")
    num_starts, num_clusters, dim = models.shape
    num_groups = theta.shape[0]
    weights = _proportions(alpha, num_groups)
    eta = float(eta)

    # Layout (K, d, N): every elementwise operation runs over the N starts,
    # contiguously, into preallocated buffers (no per-round allocation).
    w = np.ascontiguousarray(np.moveaxis(models, 0, -1))
    ever = np.zeros((num_clusters, num_starts), dtype=bool)
    theta_column = theta[None, :, :, None]                   # (1, G, d, 1)
    theta_t = np.ascontiguousarray(theta.T)                  # (d, G)
    weight_column = weights[None, :, None]                   # (1, G, 1)
    cluster_column = np.arange(num_clusters)[:, None, None]  # (K, 1, 1)
    diff = np.empty((num_clusters, num_groups, dim, num_starts))
    loss = np.empty((num_clusters, num_groups, num_starts))
    best = np.empty((num_groups, num_starts))
    route = np.empty((num_groups, num_starts), dtype=np.intp)
    better = np.empty((num_groups, num_starts), dtype=bool)
    candidate = np.empty((num_groups, num_starts), dtype=np.intp)
    share = np.empty((num_clusters, num_groups, num_starts))
    mass = np.empty((num_clusters, num_starts))
    step = np.empty((num_clusters, num_starts))
    routed = np.empty((num_clusters, num_starts), dtype=bool)
    keep = np.empty((num_clusters, num_starts))
    pull = np.empty((num_clusters, dim, num_starts))
    tiny = np.finfo(float).tiny
    for _ in range(rounds):
        # Routing: loss[k, g] = ‖w_k − θ_g‖² (= 2 L_g(w_k)); argmin over k with ties
        # to the lowest k.  A strict improvement at cluster k sets the route to k,
        # which exceeds every earlier index, hence the running maximum.
        np.subtract(w[:, None], theta_column, out=diff)
        np.multiply(diff, diff, out=diff)
        np.sum(diff, axis=2, out=loss)
        best[...] = loss[0]
        route.fill(0)
        for k in range(1, num_clusters):
            np.less(loss[k], best, out=better)
            np.minimum(best, loss[k], out=best)
            np.multiply(better, k, out=candidate)
            np.maximum(route, candidate, out=route)
        # Update every cluster from this round's routing (W^t -> W^{t+1}):
        # w_k <- (1 - η) w_k + η Σ_{g→k} α_g θ_g / Σ_{g→k} α_g if routed, else w_k.
        np.equal(route[None], cluster_column, out=share, casting="unsafe")
        share *= weight_column                               # α_g 1{g → k}
        np.sum(share, axis=1, out=mass)                      # Σ_{g→k} α_g
        np.greater(mass, 0.0, out=routed)
        ever |= routed
        np.maximum(mass, tiny, out=step)                     # (unrouted: share = 0 anyway)
        np.divide(eta, step, out=step)
        share *= step[:, None, :]                            # η α_g 1{g → k} / Σ α
        np.matmul(theta_t, share, out=pull)                  # η θ̄_k (0 if unrouted)
        np.multiply(routed, -eta, out=keep)
        keep += 1.0                                          # 1 − η if routed, else 1
        w *= keep[:, None, :]
        w += pull
    return np.ascontiguousarray(np.moveaxis(w, -1, 0)), np.ascontiguousarray(ever.T)

