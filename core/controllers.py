"""Routing controllers (docs/algorithm.md, rules §3): loss vectors to route distributions.

Every function is vectorised over a leading axis of clients: ``losses`` has
shape ``(n, K)``.  The controllers (:func:`rank_hedge`, :func:`reversal`,
:func:`commitment`) return ``(n, K)``, one distribution per client; Greedy is
:func:`greedy_routes` (the ``(n,)`` routes; :func:`one_hot` makes them distributions).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "CONTROLLER_IDS",
    "GREEDY",
    "RANK_HEDGE",
    "REVERSAL",
    "COMMITMENT",
    "HYSTERESIS",
    "greedy_routes",
    "consolidating_greedy_routes",
    "close_twin",
    "nearest_third",
    "one_hot",
    "rank_hedge",
    "reversal",
    "commitment",
]

GREEDY, RANK_HEDGE, REVERSAL, COMMITMENT, HYSTERESIS = "gr", "rh", "rev", "com", "hys"
CONTROLLER_IDS = (GREEDY, RANK_HEDGE, REVERSAL, COMMITMENT, HYSTERESIS)


def greedy_routes(losses: NDArray[np.float64], tie_uniforms: Optional[NDArray[np.float64]] = None
                  ) -> NDArray[np.int64]:
    """Lowest-loss cluster per client.

    Parameters
    ----------
    losses : ndarray, shape (n, K)
    tie_uniforms : ndarray, shape (n,), optional
        Without it, ties go to the lowest index (``np.argmin``).  With it, a
        client whose smallest loss is shared *exactly* by ``m`` clusters takes
        the ``⌊u·m⌋``-th of them (in index order): uniform among the tied.

    Returns
    -------
    ndarray of int, shape (n,)
    """
    if tie_uniforms is None:
        return np.argmin(losses, axis=-1).astype(np.int64)
    is_lowest = losses == losses.min(axis=-1, keepdims=True)
    tied = is_lowest.sum(axis=-1)
    pick = np.floor(np.asarray(tie_uniforms) * tied).astype(np.int64)
    chosen = np.argmax(np.cumsum(is_lowest, axis=-1) > pick[..., None], axis=-1)
    return np.where(tied > 0, chosen, np.argmin(losses, axis=-1)).astype(np.int64)  # a NaN row: np.argmin


def consolidating_greedy_routes(
    losses: NDArray[np.float64], spare: NDArray[np.bool_], tie_uniforms: Optional[NDArray[np.float64]] = None,
    loss_ratio: float = float("inf"), relative: bool = False, not_third: Optional[NDArray[np.bool_]] = None,
) -> NDArray[np.int64]:
    """Greedy that skips the *spare* clusters, for the clients that have a close alternative.

    The exploitation phase's consolidation (``exploitation_consolidates``): a client
    does not pick a cluster that was underused in the previous round, so the few
    clients left on a spare model join the model their group trains.  A client keeps
    plain Greedy when every cluster is spare, or when its best non-spare loss exceeds
    ``loss_ratio ×`` its best loss (the spare model is the only one that serves it).

    With ``relative`` (the clusters merged into a duplicate twin) a client also skips them when its best
    non-spare loss is close *relative to the nearest third cluster*: ``log(ℓ_alt/ℓ_best) ≤ ½ log(ℓ_third/ℓ_best)``
    with ``ℓ_third ≥ loss_ratio · ℓ_best`` — the test that found the pair to be duplicates
    (:func:`fedroute.core.health.duplicate_twins`), for the one client.  A model trained on half of a group
    memorises its few clients: their training loss on the other half's model is several times their own
    (4–8× measured, ``docs/algorithm.md``), above ``loss_ratio``, while another group's model is worse by
    orders of magnitude; the absolute guard alone would keep each half's clients on their half for good.

    Parameters
    ----------
    losses : ndarray, shape (n, K)
    spare : ndarray of bool, shape (n, K) or (K,)
        Clusters to skip (the previous round's underused clusters, or the merged ones).
    tie_uniforms : ndarray, shape (n,), optional
        As in :func:`greedy_routes`, over the clusters that remain.
    loss_ratio : float
        ``ρ ≥ 1`` (default: no guard).
    relative : bool
        Also skip where the alternative is close relative to the third cluster (above).
    not_third : ndarray of bool, shape (n, K) or (K,), optional
        Clusters that are not the third cluster while another one is (the spares, with
        ``restart_idle_spares``; as in :func:`fedroute.core.health.duplicate_twins`).

    Returns
    -------
    ndarray of int, shape (n,)
    """
    losses = np.asarray(losses, dtype=np.float64)
    spare = np.broadcast_to(np.asarray(spare, dtype=bool), losses.shape)
    best = losses.min(axis=-1, keepdims=True)
    remaining = np.where(spare, np.inf, losses)
    alternative = remaining.min(axis=-1, keepdims=True)                  # +inf when every cluster is spare
    close = alternative <= loss_ratio * best
    if relative and losses.shape[-1] >= 3:
        close |= _close_relative_to_third(losses, remaining, loss_ratio, not_third)
    skipped = spare & np.isfinite(alternative) & close
    return greedy_routes(np.where(skipped, np.inf, losses), tie_uniforms)


def _close_relative_to_third(losses: NDArray[np.float64], remaining: NDArray[np.float64],
                             loss_ratio: float, not_third: Optional[NDArray[np.bool_]] = None) -> NDArray[np.bool_]:
    """Per client ``(n, 1)``: :func:`close_twin` for its best remaining cluster, against the nearest cluster that
    is neither that one nor its best (nor ``not_third``, while another one is left)."""
    tiny = np.finfo(np.float64).tiny
    logs = np.log(np.maximum(losses, tiny))
    rows = np.arange(len(logs))
    own = logs.min(axis=-1, keepdims=True)
    alternative = np.log(np.maximum(remaining.min(axis=-1, keepdims=True), tiny))
    pair = np.zeros(logs.shape, dtype=bool)
    pair[rows, logs.argmin(axis=-1)] = True
    pair[rows, remaining.argmin(axis=-1)] = True
    return close_twin(alternative - own, nearest_third(logs, pair, not_third)[:, None] - own, loss_ratio)


def nearest_third(logs: NDArray[np.float64], pair: NDArray[np.bool_],
                  not_third: Optional[NDArray[np.bool_]] = None) -> NDArray[np.float64]:
    """Per client, its smallest log loss over the clusters outside its ``pair`` (``logs``, ``pair``: (n, K)) —
    the duplicate test's third cluster — skipping the ``not_third`` clusters ((K,) or (n, K)) while another is
    left.  Shared by :func:`fedroute.core.health.duplicate_twins` and :func:`consolidating_greedy_routes`."""
    candidates = ~np.asarray(pair, dtype=bool)
    if not_third is not None:
        preferred = candidates & ~np.broadcast_to(np.asarray(not_third, dtype=bool), candidates.shape)
        candidates = np.where(preferred.any(axis=-1, keepdims=True), preferred, candidates)
    return np.where(candidates, logs, np.inf).min(axis=-1)


def close_twin(twin: NDArray[np.float64] | float, third: NDArray[np.float64] | float,
               loss_ratio: float) -> NDArray[np.bool_] | bool:
    """The duplicate test, in log loss ratios to the clients' own model: the twin at most half as far as the
    nearest third cluster (``log(ℓ_twin/ℓ_own) ≤ ½ log(ℓ_third/ℓ_own)``), and that third far
    (``ℓ_third ≥ ρ · ℓ_own``).  Shared by :func:`fedroute.core.health.duplicate_twins` (medians over a
    cluster's clients) and :func:`consolidating_greedy_routes` (one client)."""
    return (twin <= 0.5 * third) & (third >= np.log(loss_ratio))


def one_hot(routes: NDArray[np.int64], num_clusters: int) -> NDArray[np.float64]:
    """Point-mass distributions ``e_r`` for integer routes ``(n,)``."""
    return np.eye(num_clusters, dtype=np.float64)[routes]


def rank_hedge(losses: NDArray[np.float64], temperature: float) -> NDArray[np.float64]:
    """Rank Hedge: ``π(k) ∝ exp(-β · rank(k))``, rank 0 = lowest loss.

    Ties in loss are ranked by cluster index (stable sort), so the result is
    deterministic.  ``temperature = 0`` gives the uniform distribution.
    """
    order = np.argsort(losses, axis=-1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(losses.shape[-1])[None, :].repeat(len(losses), 0), axis=-1)
    weights = np.exp(-temperature * ranks.astype(np.float64))
    return weights / weights.sum(axis=-1, keepdims=True)


def reversal(losses: NDArray[np.float64], masses: NDArray[np.float64]) -> NDArray[np.float64]:
    """Reversal: route to the cluster with the smallest broadcast mass.

    Ties in mass go to the lower loss, then to the lower index.  ``masses`` is
    ``(K,)`` (broadcast to all clients) or ``(n, K)``.
    """
    masses = np.broadcast_to(masses, losses.shape)
    is_lightest = masses <= masses.min(axis=-1, keepdims=True)
    tie_broken = np.where(is_lightest, losses, np.inf)
    return one_hot(greedy_routes(tie_broken), losses.shape[-1])


def commitment(
    losses: NDArray[np.float64], previous_routes: NDArray[np.int64], margin: float,
    tie_uniforms: Optional[NDArray[np.float64]] = None,
) -> NDArray[np.float64]:
    """Commitment: keep the previous route unless another is better by ``margin``.

    Switch to ``argmin ℓ`` only if ``min ℓ < (1 - δ) ℓ_prev``; a client with no
    previous route (``-1``) acts greedily (ties as in :func:`greedy_routes`).
    """
    best = greedy_routes(losses, tie_uniforms)
    has_previous = previous_routes >= 0
    safe_previous = np.where(has_previous, previous_routes, 0)
    previous_loss = np.take_along_axis(losses, safe_previous[:, None], axis=-1)[:, 0]
    switch = losses.min(axis=-1) < (1.0 - margin) * previous_loss
    routes = np.where(has_previous & ~switch, safe_previous, best)
    return one_hot(routes, losses.shape[-1])
