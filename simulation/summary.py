"""End-of-run summary shared by the Flower ServerApp and the batched simulator."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core import metrics
from fedroute.core.evaluation import evaluation_metrics

__all__ = ["run_summary", "RECOVERY_THRESHOLD"]

RECOVERY_THRESHOLD = 0.5
"""A linear run has recovered iff ``R_T < 0.5`` (docs/algorithm.md, rules §9)."""


def run_summary(
    cluster_models: NDArray[np.floating],
    train_losses: NDArray[np.float64],
    test_losses: NDArray[np.float64],
    groups: NDArray[np.int64],
    route_counts: NDArray[np.int64],
    group_parameters: Optional[NDArray[np.float64]] = None,
    metric_values: Optional[Mapping[str, NDArray[np.float64]]] = None,
) -> dict[str, Any]:
    """Controller-free evaluation at ``W^T`` plus routing facts of the run.

    Parameters
    ----------
    cluster_models : ndarray, shape (K, P)
        Final models ``W^T``.
    train_losses, test_losses : ndarray, shape (n, K)
        Every client's loss of every final model on each split.
    groups : ndarray of int, shape (n,)
        Latent groups (evaluation only).
    route_counts : ndarray of int, shape (T, K)
        Clients routed to each cluster per round.
    group_parameters : ndarray, shape (G, P), optional
        ``θ_g`` where the task has them (linear): adds ``R_T`` and ``recovered`` (when ``G ≤ K``).
    metric_values : mapping of str to ndarray, shape (n, K), optional
        Further held-out metrics of every final model on every client (e.g. ``accuracy``).

    Returns
    -------
    dict
        ``usable_models_train/test`` (``K^eval``), ``assignment_accuracy_train/test``,
        ``persistent_collapse``, ``rounds_with_two_routed``, ``evaluation_metrics``
        (:func:`fedroute.core.evaluation.evaluation_metrics` of ``test_loss`` and ``metric_values``:
        every client at its lowest-training-loss model; mean, worst decile, per cluster, per group) and,
        with ``group_parameters``, ``recovery_error`` and ``recovered``.
    """
    num_clusters = cluster_models.shape[0]
    summary: dict[str, Any] = {
        "usable_models_train": int(metrics.usable_models(train_losses)),
        "usable_models_test": int(metrics.usable_models(test_losses)),
        "assignment_accuracy_train": float(metrics.assignment_accuracy(train_losses, groups, num_clusters)),
        "assignment_accuracy_test": float(metrics.assignment_accuracy(test_losses, groups, num_clusters)),
        "persistent_collapse": bool(metrics.persistent_collapse(route_counts)),
        "rounds_with_two_routed": int(np.sum((route_counts > 0).sum(axis=1) >= 2)),
        "evaluation_metrics": evaluation_metrics({"test_loss": test_losses, **dict(metric_values or {})},
                                                 train_losses, groups),
    }
    if group_parameters is not None and len(group_parameters) <= num_clusters:  # R_T maps groups to clusters
        error = float(metrics.recovery_error(cluster_models, group_parameters))
        summary["recovery_error"] = error
        summary["recovered"] = bool(error < RECOVERY_THRESHOLD)
    return summary
