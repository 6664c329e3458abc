"""Entry test of selective hysteresis and synchronized entry (ALGORITHM.md §5–§6).

A client whose Greedy choice is ``r`` tests every underused cluster ``c``
(broadcast mass below ``μ_rev``, ``c ≠ r``): it applies one probe update to a
copy of ``w_c`` on its own data and measures the direction agreement
``b(c) = cos(w_c^+ - w_c, w_r - w_c)``.  It qualifies when
``min_c b(c) ≤ τ`` and then targets ``argmin_c b(c)``.  Probe updates are
discarded.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numpy.typing import NDArray

__all__ = ["LocalUpdate", "entry_candidates", "entry_benefits", "entry_decision"]

LocalUpdate = Callable[[NDArray[np.floating], NDArray[np.int64], int], NDArray[np.floating]]
"""``local_update(models (m, P), client_index (m,), round_index) -> (m, P)``: the
task's local training applied to model row ``j`` on client ``client_index[j]``."""


def entry_candidates(
    masses: NDArray[np.float64], greedy_routes: NDArray[np.int64], mass_threshold: float
) -> NDArray[np.bool_]:
    """Candidate clusters per client: mass ``< μ_rev`` and not the Greedy choice.

    Parameters
    ----------
    masses : ndarray, shape (K,) or (n, K)
        Broadcast routing masses ``μ^{t-1}`` (or provisional masses ``m``); one
        row per client when several runs are batched.
    greedy_routes : ndarray of int, shape (n,)
        Each client's Greedy choice ``r``.
    mass_threshold : float
        ``μ_rev``.

    Returns
    -------
    ndarray of bool, shape (n, K)
    """
    masses = np.broadcast_to(np.asarray(masses), (len(greedy_routes), np.shape(masses)[-1]))
    num_clusters = masses.shape[-1]
    underused = masses < mass_threshold
    return underused & (np.arange(num_clusters)[None, :] != greedy_routes[:, None])


def _cosine(a: NDArray[np.floating], b: NDArray[np.floating]) -> NDArray[np.float64]:
    """Row-wise cosine similarity; 0 where either vector is zero (no direction)."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    dots = np.sum(a * b, axis=-1)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def entry_benefits(
    cluster_models: NDArray[np.floating],
    candidate_mask: NDArray[np.bool_],
    greedy_routes: NDArray[np.int64],
    local_update: LocalUpdate,
    round_index: int,
) -> NDArray[np.float64]:
    """Benefit ``b_i(c)`` of every candidate, ``+inf`` where ``c`` is not a candidate.

    Parameters
    ----------
    cluster_models : ndarray, shape (K, P) or (n, K, P)
        Current cluster models as flat parameter vectors (one set per client
        when several runs are batched).
    candidate_mask : ndarray of bool, shape (n, K)
        Which (client, cluster) pairs to probe.
    greedy_routes : ndarray of int, shape (n,)
        Each client's Greedy choice ``r`` (the reference direction ``w_r - w_c``).
    local_update : LocalUpdate
        The task's local training (the same update as a round).
    round_index : int
        Round ``t`` of the probe.

    Returns
    -------
    ndarray, shape (n, K)
    """
    benefits = np.full(candidate_mask.shape, np.inf)
    clients, candidates = np.nonzero(candidate_mask)
    if clients.size == 0:
        return benefits
    if cluster_models.ndim == 3:  # one set of K models per client (batched runs)
        start = cluster_models[clients, candidates]
        current = cluster_models[clients, greedy_routes[clients]]
    else:
        start = cluster_models[candidates]
        current = cluster_models[greedy_routes[clients]]
    probed = local_update(start.copy(), clients.astype(np.int64), round_index)
    towards_current = current - start
    benefits[clients, candidates] = _cosine(probed - start, towards_current)
    return benefits


def entry_decision(
    benefits: NDArray[np.float64], threshold: float
) -> tuple[NDArray[np.bool_], NDArray[np.int64]]:
    """Who enters and where: ``min_c b(c) ≤ τ`` and target ``argmin_c b(c)``.

    Parameters
    ----------
    benefits : ndarray, shape (n, K)
        From :func:`entry_benefits` (``+inf`` for non-candidates).
    threshold : float
        ``τ``.

    Returns
    -------
    qualifies : ndarray of bool, shape (n,)
    targets : ndarray of int, shape (n,)
        ``argmin_c b(c)`` (ties to the lowest index); ``-1`` where not qualifying.
    """
    best = np.argmin(benefits, axis=-1)
    smallest = np.take_along_axis(benefits, best[:, None], axis=-1)[:, 0]
    qualifies = np.isfinite(smallest) & (smallest <= threshold)
    return qualifies, np.where(qualifies, best, -1).astype(np.int64)
