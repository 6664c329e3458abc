"""FedCAM (Clustered Additive Modeling; Ma et al., NeurIPS 2023), client side.

Client ``i`` predicts with ``h(x; Θ_glob) + f(x; Θ_{c(i)})``.  Each round it
picks ``c(i) = argmin_k L̂_i(Θ_glob + Θ_k)`` (Greedy on the combined predictor)
and trains both parts.  Our tasks' predictors are linear in their parameters
(linear regression, multinomial logistic regression), so the combined
predictor is the model with parameters ``Θ_glob + Θ_k`` and both parts receive
the same gradient.  We give the combined parameters the task's own local
update (the same budget and step as every other method) and split the
displacement equally between the two parts; for one gradient step this is
joint gradient descent on ``(Θ_glob, Θ_k)`` with each part's learning rate
halved.  ``docs/algorithm.md`` records this and the other deviations from the
CAM paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedroute.client.controllers import greedy_routes
from fedroute.tasks.base import ClientBatch

__all__ = ["FedCAMRound", "fedcam_client_round", "combined_models"]


@dataclass(frozen=True)
class FedCAMRound:
    """One FedCAM round of a batch of clients."""

    routes: NDArray[np.int64]
    """``c(i)``, shape (n,)."""
    losses: NDArray[np.float64]
    """Combined-predictor losses ``L̂_i(Θ_glob + Θ_k)``, shape (n, K)."""
    global_models: NDArray[np.floating]
    """Each client's trained ``Θ_glob⁺``, shape (n, P)."""
    cluster_models: NDArray[np.floating]
    """Each client's trained ``Θ_{c(i)}⁺``, shape (n, P)."""


def combined_models(global_model: NDArray[np.floating], cluster_models: NDArray[np.floating]) -> NDArray[np.floating]:
    """``Θ_glob + Θ_k`` for every cluster: ``(P,) + (K, P)`` or ``(n, P) + (n, K, P)``."""
    return cluster_models + np.asarray(global_model)[..., None, :]


def fedcam_client_round(
    clients: ClientBatch,
    global_model: NDArray[np.floating],
    cluster_models: NDArray[np.floating],
    round_index: int,
) -> FedCAMRound:
    """Assignment by the combined predictor, then one local update of both parts.

    Parameters
    ----------
    clients : ClientBatch
        The clients' data.
    global_model : ndarray, shape (P,) or (n, P)
        ``Θ_glob`` (one per client when several runs are batched).
    cluster_models : ndarray, shape (K, P) or (n, K, P)
        ``Θ_1 … Θ_K``.
    round_index : int
        ``t``.

    Returns
    -------
    FedCAMRound
    """
    combined = combined_models(global_model, cluster_models)
    losses = clients.losses(combined)
    routes = greedy_routes(losses)
    rows = np.arange(len(routes))
    routed_combined = combined[rows, routes] if combined.ndim == 3 else combined[routes]
    displacement = clients.local_update(routed_combined, rows, round_index) - routed_combined
    own_global = np.broadcast_to(global_model, routed_combined.shape)
    own_cluster = cluster_models[rows, routes] if cluster_models.ndim == 3 else cluster_models[routes]
    return FedCAMRound(
        routes=routes,
        losses=losses,
        global_models=own_global + 0.5 * displacement,
        cluster_models=own_cluster + 0.5 * displacement,
    )
