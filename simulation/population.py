"""Population-level Greedy dynamics of clustered learning with quadratic group losses (pure numpy).

Each round every group ``g`` (proportion ``α_g``, population loss ``L_g(w) = ½‖w − θ_g‖²``) routes to
``argmin_k L_g(w_k)`` and every routed cluster steps towards the α-weighted mean of its groups'
``θ_g``; paper §2, Theorem 2 (E1, :mod:`fedroute.simulation.experiments.fig1`).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    models, theta, eta = _checked(initial_models, theta, eta, rounds)
    weights = _proportions(alpha, theta.shape[0])
    # Layout (K, d, N): every elementwise operation runs over the N starts,
    # contiguously, into preallocated buffers (no per-round allocation).
    w = np.ascontiguousarray(np.moveaxis(models, 0, -1))
    buffers = _Buffers.allocate(*models.shape, theta.shape[0])
    ever = np.zeros((models.shape[1], models.shape[0]), dtype=bool)
    theta_column = theta[None, :, :, None]                   # (1, G, d, 1)
    theta_t = np.ascontiguousarray(theta.T)                  # (d, G)
    for _ in range(rounds):
        _route_groups(w, theta_column, buffers)
        ever |= _update_clusters(w, theta_t, weights, eta, buffers)
    return np.ascontiguousarray(np.moveaxis(w, -1, 0)), np.ascontiguousarray(ever.T)


def _checked(initial_models: ArrayLike, theta: ArrayLike, eta: float, rounds: int
             ) -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
    """The inputs of :func:`greedy_population_dynamics` as float arrays; ``ValueError`` for a bad one."""
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
    return models, theta, float(eta)


@dataclass(frozen=True)
class _Buffers:
    """Preallocated work arrays of one round (K clusters, G groups, d dimensions, N starts; starts last)."""

    diff: NDArray[np.float64]       # (K, G, d, N)
    loss: NDArray[np.float64]       # (K, G, N)
    best: NDArray[np.float64]       # (G, N)
    route: NDArray[np.intp]         # (G, N)
    better: NDArray[np.bool_]       # (G, N)
    candidate: NDArray[np.intp]     # (G, N)
    share: NDArray[np.float64]      # (K, G, N)
    mass: NDArray[np.float64]       # (K, N)
    step: NDArray[np.float64]       # (K, N)
    routed: NDArray[np.bool_]       # (K, N)
    keep: NDArray[np.float64]       # (K, N)
    pull: NDArray[np.float64]       # (K, d, N)

    @classmethod
    def allocate(cls, num_starts: int, num_clusters: int, dim: int, num_groups: int) -> "_Buffers":
        clusters, groups = (num_clusters, num_starts), (num_groups, num_starts)
        return cls(diff=np.empty((num_clusters, num_groups, dim, num_starts)),
                   loss=np.empty((num_clusters, num_groups, num_starts)), best=np.empty(groups),
                   route=np.empty(groups, dtype=np.intp), better=np.empty(groups, dtype=bool),
                   candidate=np.empty(groups, dtype=np.intp), share=np.empty((num_clusters, num_groups, num_starts)),
                   mass=np.empty(clusters), step=np.empty(clusters), routed=np.empty(clusters, dtype=bool),
                   keep=np.empty(clusters), pull=np.empty((num_clusters, dim, num_starts)))


def _route_groups(w: NDArray[np.float64], theta_column: NDArray[np.float64], b: _Buffers) -> None:
    """Routing into ``b.route``: ``loss[k, g] = ‖w_k − θ_g‖²`` (= 2 L_g(w_k)); argmin over k, ties to the lowest k.

    A strict improvement at cluster k sets the route to k, which exceeds every earlier index,
    hence the running maximum.
    """
    np.subtract(w[:, None], theta_column, out=b.diff)
    np.multiply(b.diff, b.diff, out=b.diff)
    np.sum(b.diff, axis=2, out=b.loss)
    b.best[...] = b.loss[0]
    b.route.fill(0)
    for k in range(1, b.loss.shape[0]):
        np.less(b.loss[k], b.best, out=b.better)
        np.minimum(b.best, b.loss[k], out=b.best)
        np.multiply(b.better, k, out=b.candidate)
        np.maximum(b.route, b.candidate, out=b.route)


def _update_clusters(w: NDArray[np.float64], theta_t: NDArray[np.float64], weights: NDArray[np.float64],
                     eta: float, b: _Buffers) -> NDArray[np.bool_]:
    """``W^t → W^{t+1}`` in place from ``b.route``; returns which clusters were routed to, shape (K, N).

    ``w_k ← (1 − η) w_k + η Σ_{g→k} α_g θ_g / Σ_{g→k} α_g`` if routed, else ``w_k``.
    """
    np.equal(b.route[None], np.arange(w.shape[0])[:, None, None], out=b.share, casting="unsafe")
    b.share[...] *= weights[None, :, None]                   # α_g 1{g → k}
    np.sum(b.share, axis=1, out=b.mass)                      # Σ_{g→k} α_g
    np.greater(b.mass, 0.0, out=b.routed)
    np.maximum(b.mass, np.finfo(float).tiny, out=b.step)     # (unrouted: share = 0 anyway)
    np.divide(eta, b.step, out=b.step)
    b.share[...] *= b.step[:, None, :]                       # η α_g 1{g → k} / Σ α
    np.matmul(theta_t, b.share, out=b.pull)                  # η θ̄_k (0 if unrouted)
    np.multiply(b.routed, -eta, out=b.keep)
    b.keep[...] += 1.0                                       # 1 − η if routed, else 1
    w *= b.keep[:, None, :]
    w += b.pull
    return b.routed
