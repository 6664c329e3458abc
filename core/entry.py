"""Entry test of selective hysteresis and synchronized entry (docs/algorithm.md, rules §5–§6).

A client whose Greedy choice is ``r`` tests the underused clusters ``c``
(broadcast mass below ``μ_rev``, ``c ≠ r``; at most ``entry_max_candidates`` of
them, the lightest first): it applies one probe update to a copy of ``w_c`` on
its own data and measures the direction agreement
``b(c) = cos(w_c^+ - w_c, w_r - w_c)``.  It qualifies when
``min_c b(c) ≤ τ`` and then targets ``argmin_c b(c)``.  Probe updates are
discarded.  A benefit without a direction — a zero probe update, or
``w_c = w_r`` — is ``+inf``: it never qualifies, whatever ``τ``.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.settings import INCLUSIVE_SLACK

__all__ = ["LocalUpdate", "underused_clusters", "entry_candidates", "entry_benefits", "entry_decision"]

LocalUpdate = Callable[[NDArray[np.floating], NDArray[np.int64], int], NDArray[np.floating]]
"""``local_update(models (m, P), client_index (m,), round_index) -> (m, P)``: the
task's local training applied to model row ``j`` on client ``client_index[j]``."""


def underused_clusters(masses: NDArray[np.float64], mass_threshold: float, inclusive: bool = False
                       ) -> NDArray[np.bool_]:
    """Which clusters are underused: ``μ_k < threshold``, or ``μ_k ≤ threshold`` (plus
    :data:`~fedroute.core.settings.INCLUSIVE_SLACK`) when ``inclusive``; same shape as ``masses``."""
    masses = np.asarray(masses, dtype=np.float64)
    return masses <= mass_threshold + INCLUSIVE_SLACK if inclusive else masses < mass_threshold


def entry_candidates(
    masses: NDArray[np.float64], greedy_routes: NDArray[np.int64], mass_threshold: float,
    inclusive: bool = False, max_candidates: int = 0, losses: Optional[NDArray[np.float64]] = None,
) -> NDArray[np.bool_]:
    """Candidate clusters per client: underused and not the Greedy choice.

    Parameters
    ----------
    masses : ndarray, shape (K,) or (n, K)
        Broadcast routing masses ``μ^{t-1}`` (or provisional masses ``m``); one
        row per client when several runs are batched.
    greedy_routes : ndarray of int, shape (n,)
        Each client's Greedy choice ``r``.
    mass_threshold : float
        The underused mass (``RoutingSettings.underused_mass``).
    inclusive : bool, default False
        Underused is ``μ_k ≤ threshold`` (plus :data:`~fedroute.core.settings.INCLUSIVE_SLACK`)
        instead of ``μ_k < threshold``.
    max_candidates : int, default 0
        Keep at most this many candidates per client (``0`` = all): the
        smallest masses, ties to the lower loss (``losses``), then the lower index.
    losses : ndarray, shape (n, K), optional
        The clients' training losses (the second sort key; needed with ``max_candidates``).

    Returns
    -------
    ndarray of bool, shape (n, K)
    """
    masses = np.broadcast_to(np.asarray(masses, dtype=np.float64), (len(greedy_routes), np.shape(masses)[-1]))
    num_clusters = masses.shape[-1]
    candidates = underused_clusters(masses, mass_threshold, inclusive) & (np.arange(num_clusters)[None, :] != greedy_routes[:, None])
    if max_candidates <= 0 or max_candidates >= num_clusters - 1:
        return candidates
    if losses is None:
        raise ValueError("entry_candidates needs the losses to keep at most max_candidates candidates")
    index = np.broadcast_to(np.arange(num_clusters), masses.shape)
    order = np.lexsort((index, np.asarray(losses, dtype=np.float64), np.where(candidates, masses, np.inf)), axis=-1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, index, axis=-1)
    return candidates & (rank < max_candidates)


def _cosine(a: NDArray[np.floating], b: NDArray[np.floating]) -> NDArray[np.float64]:
    """Row-wise cosine similarity; ``+inf`` where either vector is zero (no direction: never qualifies)."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    dots = np.sum(a * b, axis=-1)
    return np.divide(dots, norms, out=np.full_like(dots, np.inf), where=norms > 0)


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
        ``+inf`` also where the probe update or ``w_r - w_c`` is zero.
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
