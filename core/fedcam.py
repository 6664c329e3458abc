"""FedCAM (Clustered Additive Modeling; Ma et al., NeurIPS 2023), client side — one implementation.

Client ``i`` predicts with ``h(x; Θ_glob) + f(x; Θ_{c(i)})``: the sum of the
*outputs* (logits, for a classifier) of a global network and of its cluster's
network.  Each round it picks ``c(i) = argmin_k L̂_i(h + f_k)`` (Greedy on the
combined predictor) and trains both parts jointly with the task's local budget:
``E`` gradient steps on ``(Θ_glob, Θ_k)`` of the loss of the summed outputs,
each part with half the task's learning rate ``η_loc / 2``.

Two forms, chosen by what the client batch offers:

* **output sum** — the batch implements :class:`OutputSumClients`
  (``output_sum_losses`` and ``output_sum_update``; e.g. the characters MLP):
  the two networks are evaluated and trained as two networks.
* **additive** — every other batch.  For a predictor that is linear in its
  parameters (linear and multinomial-logistic regression, and any user model
  without the two methods) ``h(x; Θ_glob) + f(x; Θ_k)`` *is* the model with
  parameters ``Θ_glob + Θ_k`` and both parts receive the same gradient, so the
  combined parameters take the task's own local update and the displacement is
  split equally between the parts.  For any number of steps this equals the
  joint gradient descent above (each part moves half the combined step); a test
  checks that the output-sum machinery on the linear model gives exactly this.

``docs/algorithm.md`` (FedCAM section) records the choices and the deviations
from the CAM paper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from fedroute.core.controllers import greedy_routes
from fedroute.core.influence import InfluenceBounds, aggregate_round
from fedroute.core.task import ClientBatch

__all__ = [
    "FedCAMRound",
    "OutputSumClients",
    "combined_models",
    "fedcam_client_round",
    "fedcam_global_update",
    "fedcam_losses",
    "initial_global_model",
    "task_uses_output_sum",
    "uses_output_sum",
]


@runtime_checkable
class OutputSumClients(Protocol):
    """What a client batch offers for FedCAM's output-sum form (optional; see the module docstring)."""

    def output_sum_losses(self, global_models: NDArray[np.floating], cluster_models: NDArray[np.floating],
                          split: str = "train") -> NDArray[np.float64]:
        """Mean loss of ``h(x; Θ_glob) + f(x; Θ_k)`` for every client and ``k``, shape (n, K).

        ``global_models`` is ``(P,)`` or ``(n, P)``; ``cluster_models`` ``(K, P)`` or ``(n, K, P)``.
        """

    def output_sum_update(self, global_models: NDArray[np.floating], cluster_models: NDArray[np.floating],
                          client_index: NDArray[np.int64], round_index: int
                          ) -> tuple[NDArray[np.floating], NDArray[np.floating]]:
        """Row ``j``: the task's ``E`` local steps of joint gradient descent on ``(Θ_glob, Θ_k)`` =
        ``(global_models[j], cluster_models[j])`` (both ``(m, P)``) on client ``client_index[j]``,
        each part with learning rate ``η_loc / 2``; returns the trained ``(Θ_glob⁺, Θ_k⁺)``."""


def uses_output_sum(clients: Any) -> bool:
    """Whether FedCAM runs the output-sum form on these clients (else the additive form)."""
    return isinstance(clients, OutputSumClients)


def task_uses_output_sum(task: Any) -> bool:
    """Whether a task's clients run the output-sum form: such a task provides ``initial_global_model()``
    (the zero-output start of ``Θ_glob``) and client batches that are :class:`OutputSumClients`."""
    return callable(getattr(task, "initial_global_model", None))


@dataclass(frozen=True)
class FedCAMRound:
    """One FedCAM round of a batch of clients."""

    routes: NDArray[np.int64]
    """``c(i)``, shape (n,)."""
    losses: NDArray[np.float64]
    """Combined-predictor losses ``L̂_i(h + f_k)``, shape (n, K)."""
    global_models: NDArray[np.floating]
    """Each client's trained ``Θ_glob⁺``, shape (n, P)."""
    cluster_models: NDArray[np.floating]
    """Each client's trained ``Θ_{c(i)}⁺``, shape (n, P)."""


def combined_models(global_model: NDArray[np.floating], cluster_models: NDArray[np.floating]) -> NDArray[np.floating]:
    """``Θ_glob + Θ_k`` for every cluster: ``(P,) + (K, P)`` or ``(n, P) + (n, K, P)``.

    The combined predictor's parameters in the additive form (not meaningful for the output-sum form).
    """
    return cluster_models + np.asarray(global_model)[..., None, :]


def fedcam_losses(clients: ClientBatch, global_model: NDArray[np.floating], cluster_models: NDArray[np.floating],
                  split: str = "train") -> NDArray[np.float64]:
    """Loss of the combined predictor of every cluster on every client, shape (n, K), either form.

    ``global_model`` is ``(P,)`` or ``(n, P)``; ``cluster_models`` ``(K, P)`` or ``(n, K, P)``.
    """
    if uses_output_sum(clients):
        return clients.output_sum_losses(global_model, cluster_models, split)  # type: ignore[attr-defined]
    return clients.losses(combined_models(global_model, cluster_models), split)


def fedcam_client_round(
    clients: ClientBatch,
    global_model: NDArray[np.floating],
    cluster_models: NDArray[np.floating],
    round_index: int,
) -> FedCAMRound:
    """Assignment by the combined predictor, then one joint local update of both parts.

    Parameters
    ----------
    clients : ClientBatch
        The clients' data (optionally an :class:`OutputSumClients`).
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
    losses = fedcam_losses(clients, global_model, cluster_models)
    routes = greedy_routes(losses)
    rows = np.arange(len(routes))
    own_cluster = cluster_models[rows, routes] if cluster_models.ndim == 3 else cluster_models[routes]
    own_global = np.broadcast_to(global_model, own_cluster.shape)
    if uses_output_sum(clients):
        trained_global, trained_cluster = clients.output_sum_update(  # type: ignore[attr-defined]
            own_global, own_cluster, rows, round_index)
        return FedCAMRound(routes=routes, losses=losses, global_models=trained_global, cluster_models=trained_cluster)
    routed_combined = own_global + own_cluster
    displacement = clients.local_update(routed_combined, rows, round_index) - routed_combined
    return FedCAMRound(
        routes=routes,
        losses=losses,
        global_models=own_global + 0.5 * displacement,
        cluster_models=own_cluster + 0.5 * displacement,
    )


def initial_global_model(task: Any, cluster_models: NDArray[np.floating]) -> NDArray[np.floating]:
    """``Θ_glob^0``, the zero-output start: the task's ``initial_global_model()`` where it has one (a
    network whose last layer is zero), else zeros (additive form: ``Θ_glob + Θ_k = Θ_k``)."""
    if task_uses_output_sum(task):
        return np.asarray(task.initial_global_model(), dtype=np.asarray(cluster_models).dtype)
    return np.zeros(np.asarray(cluster_models).shape[-1], dtype=np.asarray(cluster_models).dtype)


def fedcam_global_update(
    global_models: NDArray[np.floating], trained_globals: NDArray[np.floating], kept: NDArray[np.bool_],
    num_examples: NDArray[np.floating], bounds: InfluenceBounds, run_index: Optional[NDArray[np.int64]] = None,
) -> tuple[NDArray[np.floating], NDArray[np.bool_]]:
    """The server's update of ``Θ_glob``: the kept replies' global parts under the influence bounds.

    The cluster parts went through the server step (:func:`fedroute.core.server_step.server_step`);
    the global part is one cluster every reply routes to: :func:`~fedroute.core.influence.aggregate_round`
    on the replies whose cluster part was kept (capped weights, update-norm bound, robust rule; a
    non-finite aggregate keeps ``Θ_glob``).

    Parameters
    ----------
    global_models : ndarray, shape (P,), or (R, P) with ``run_index``
        ``Θ_glob^t``.
    trained_globals : ndarray, shape (m, P)
        The replies' trained global parts.
    kept : ndarray of bool, shape (m,)
        Replies the server step kept.
    num_examples : ndarray, shape (m,)
        The claimed ``n_i``.
    bounds : InfluenceBounds
    run_index : ndarray of int, shape (m,), optional
        The run of each reply (batched runs).

    Returns
    -------
    updated : ndarray, same shape as ``global_models``
    non_finite : ndarray of bool, shape () or (R,)
        Where the aggregate was not finite (``Θ_glob`` kept).
    """
    kept = np.asarray(kept, dtype=bool)
    outcome = aggregate_round(np.asarray(global_models)[..., None, :], np.asarray(trained_globals)[kept],
                              np.zeros(int(kept.sum()), dtype=np.int64), np.asarray(num_examples)[kept], bounds,
                              None if run_index is None else np.asarray(run_index)[kept])
    return outcome.models[..., 0, :], outcome.non_finite_clusters[..., 0]
