"""Controller-free evaluation: every client's metrics at its chosen model, aggregated (Flower-free).

An evaluation gives, per client ``i`` and model ``k``, the training loss
``L[i, k]`` and any number of metrics ``v[name][i, k]`` (the held-out loss,
accuracy, ... of the user's ``metrics_fn`` or of a task's
:meth:`ClientBatch.metrics`).  Each client is read at the model it would
choose without a controller: ``argmin_k L[i, k]`` (ties to the lowest index),
the cluster identity IFCA evaluates with.  :func:`evaluation_metrics` then
aggregates each metric over clients (mean and worst decile), per cluster and
per latent group; the Flower strategies and the batched simulator call this
one function.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["evaluation_metrics", "chosen_values", "task_metrics", "higher_is_better", "WORST_FRACTION",
           "metric_table", "evaluation_line"]

WORST_FRACTION = 0.1
"""The worst decile: the share of clients whose mean is ``<name>_worst_decile``."""


def higher_is_better(name: str) -> bool:
    """Whether larger values of a metric are better: all but losses and errors (names containing them)."""
    lowered = name.lower()
    return not ("loss" in lowered or "error" in lowered)


def chosen_values(values: ArrayLike, train_losses: ArrayLike) -> NDArray[np.float64]:
    """``values[i, argmin_k train_losses[i, k]]``: each client's value at its lowest-training-loss model, (n,)."""
    values = np.asarray(values, dtype=np.float64)
    losses = np.asarray(train_losses, dtype=np.float64)
    if values.shape != losses.shape or values.ndim != 2:
        raise ValueError(f"values and train_losses must both have shape (n, K); got {values.shape} and {losses.shape}")
    chosen = np.argmin(np.where(np.isnan(losses), np.inf, losses), axis=1)
    return np.take_along_axis(values, chosen[:, None], axis=1)[:, 0]


def _worst_decile(values: NDArray[np.float64], higher_better: bool) -> float:
    """Mean of the worst ``WORST_FRACTION`` of the values (at least one)."""
    count = max(1, int(math.ceil(WORST_FRACTION * len(values))))
    ordered = np.sort(values)
    return float((ordered[:count] if higher_better else ordered[::-1][:count]).mean())


def evaluation_metrics(
    values: Mapping[str, ArrayLike],
    train_losses: ArrayLike,
    groups: Optional[ArrayLike] = None,
) -> dict[str, float]:
    """Aggregate per-client metrics read at each client's chosen model.

    Parameters
    ----------
    values : mapping of str to array_like, shape (n, K)
        Metric name → value of every model on every client (e.g. ``test_loss``, ``accuracy``).
    train_losses : array_like, shape (n, K)
        Training loss of every model on every client: the client's chosen model is its argmin.
    groups : array_like of int, shape (n,), optional
        Latent group of each client (``-1`` = unknown); groups ``≥ 0`` get their own entries.

    Returns
    -------
    dict
        For every metric ``name``: ``name`` (mean over clients), ``name_worst_decile`` (mean over
        the worst 10 % of clients, at least one: the lowest values, or the highest for losses and
        errors, :func:`higher_is_better`), ``name_cluster_<k>`` (mean over the clients choosing
        ``k``; only clusters chosen by someone) and ``name_group_<g>``; plus ``num_clients``.
        Empty (but ``num_clients = 0``) without clients.

    Raises
    ------
    ValueError
        If a metric's shape is not ``train_losses``' or ``groups`` has another length.
    """
    losses = np.asarray(train_losses, dtype=np.float64)
    if losses.ndim != 2:
        raise ValueError(f"train_losses must have shape (n, K), got {losses.shape}")
    num_clients = losses.shape[0]
    result: dict[str, float] = {"num_clients": float(num_clients)}
    if num_clients == 0:
        return result
    chosen = np.argmin(np.where(np.isnan(losses), np.inf, losses), axis=1)
    labels = np.full(num_clients, -1, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    if labels.shape != (num_clients,):
        raise ValueError(f"groups must have shape ({num_clients},), got {labels.shape}")
    for name, table in values.items():
        picked = chosen_values(table, losses)
        result[name] = float(picked.mean())
        result[f"{name}_worst_decile"] = _worst_decile(picked, higher_is_better(name))
        for cluster in np.unique(chosen):
            result[f"{name}_cluster_{int(cluster)}"] = float(picked[chosen == cluster].mean())
        for group in np.unique(labels[labels >= 0]):
            result[f"{name}_group_{int(group)}"] = float(picked[labels == group].mean())
    return result


def task_metrics(clients: Any, models: NDArray[np.floating], split: str = "test") -> dict[str, NDArray[np.float64]]:
    """The metrics a task's client batch reports besides losses (e.g. ``accuracy``), each (n, K).

    A batch reports them through an optional method ``metrics(models, split) -> {name: (n, K)}``;
    tasks without it (regression) report none.
    """
    method = getattr(clients, "metrics", None)
    return {} if method is None else {name: np.asarray(value, dtype=np.float64)
                                      for name, value in method(models, split).items()}


def metric_table(method: str, server_round: int, metrics: Mapping[str, float]) -> list[dict[str, Any]]:
    """One evaluation as rows of ``evaluation.csv``: ``method, server_round, metric, scope, value``.

    ``scope`` is ``mean``, ``worst_decile``, ``cluster_<k>`` or ``group_<g>`` (the suffix of the
    :func:`evaluation_metrics` key); ``num_clients`` is a row of its own (scope ``all``).
    """
    names = sorted({key for key in metrics if key != "num_clients" and "_worst_decile" not in key
                    and "_cluster_" not in key and "_group_" not in key})
    rows = [{"method": method, "server_round": int(server_round), "metric": "num_clients", "scope": "all",
             "value": float(metrics.get("num_clients", 0.0))}]
    for name in names:
        for key, value in metrics.items():
            if key == name:
                scope = "mean"
            elif key.startswith(f"{name}_") and key[len(name) + 1:].split("_")[0] in ("worst", "cluster", "group"):
                scope = key[len(name) + 1:]
            else:
                continue
            rows.append({"method": method, "server_round": int(server_round), "metric": name, "scope": scope,
                         "value": float(value)})
    return rows


def evaluation_line(metrics: Mapping[str, float]) -> str:
    """``accuracy 0.912 (worst decile 0.640), test_loss 0.301 (worst decile 0.912)``: each metric's mean and
    worst decile, accuracy first (for logs and tables)."""
    names = [key for key in metrics if key != "num_clients" and f"{key}_worst_decile" in metrics]
    names.sort(key=lambda name: (name != "accuracy", name))
    return ", ".join(f"{name} {metrics[name]:.3f} (worst decile {metrics[f'{name}_worst_decile']:.3f})"
                     for name in names) or "no metrics"
