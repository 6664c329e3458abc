"""EXP3 over routing controllers (docs/algorithm.md, rules §4), vectorised over clients."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["normalised_losses", "expected_route_loss", "arm_probabilities", "importance_weighted_update"]


def normalised_losses(losses: NDArray[np.float64]) -> NDArray[np.float64]:
    """Scale-free losses ``ℓ̃_k = ℓ_k / max_j ℓ_j`` per client (row).

    A row whose largest loss is 0 (every model perfect) maps to zeros.
    """
    row_max = losses.max(axis=-1, keepdims=True)
    return np.divide(losses, row_max, out=np.zeros_like(losses, dtype=np.float64), where=row_max > 0)


def expected_route_loss(route_distributions: NDArray[np.float64], losses: NDArray[np.float64]) -> NDArray[np.float64]:
    """One round's EXP3 feedback ``f = Σ_k π(k) ℓ̃_k`` per client, in ``[0, 1]``."""
    return np.sum(route_distributions * normalised_losses(losses), axis=-1)


def arm_probabilities(log_weights: NDArray[np.float64], exploration: float) -> NDArray[np.float64]:
    """``p = (1 - γ) softmax(v) + γ / |Π|`` per client (row)."""
    shifted = np.exp(log_weights - log_weights.max(axis=-1, keepdims=True))
    softmax = shifted / shifted.sum(axis=-1, keepdims=True)
    return (1.0 - exploration) * softmax + exploration / log_weights.shape[-1]


def importance_weighted_update(
    log_weights: NDArray[np.float64],
    arms: NDArray[np.int64],
    mean_feedback: NDArray[np.float64],
    arm_probability: NDArray[np.float64],
    learning_rate: float,
    update_mask: NDArray[np.bool_],
) -> NDArray[np.float64]:
    """Loss-based EXP3 update ``v[R] -= η · f̄ / p(R)`` for the masked clients.

    Parameters
    ----------
    log_weights : ndarray, shape (n, A)
        Current log-weights ``v``.
    arms : ndarray of int, shape (n,)
        The arm ``R`` each client played (ignored where the mask is False).
    mean_feedback : ndarray, shape (n,)
        Mean per-round feedback over the block or action.
    arm_probability : ndarray, shape (n,)
        ``p(R)`` at the time the arm was drawn.
    learning_rate : float
        ``η_EXP3``.
    update_mask : ndarray of bool, shape (n,)
        Clients whose block or action completed this round.

    Returns
    -------
    ndarray, shape (n, A)
        New log-weights (a copy; the input is not modified).
    """
    updated = log_weights.copy()
    rows = np.flatnonzero(update_mask)
    if rows.size:
        estimate = mean_feedback[rows] / arm_probability[rows]
        updated[rows, arms[rows]] -= learning_rate * estimate
    return updated
