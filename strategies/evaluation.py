"""The controller-free client evaluation as the strategy aggregates it (free functions).

The nodes report every model's training and test losses and metrics; each client is read at the
model with its lowest training loss (:mod:`fedroute.core.evaluation`).  :func:`evaluation_aggregate`
gives the aggregate (an ``evaluation.csv`` row), :func:`evaluation_record` the ``MetricRecord`` a Flower
``Result`` keeps; :func:`evaluate_on_server` runs a server-side ``evaluate_fn`` on each cluster model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy import Result
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.core.evaluation import chosen_values, evaluation_metrics
from fedroute.strategies.records import array_record
from fedroute.strategies.results import MetricsAggregation, cluster_metric_record
from fedroute.strategies.validation import EvaluateReply
from fedroute.core.validation import invalid

if TYPE_CHECKING:
    from fedroute.strategies.state import RunState

__all__ = ["evaluation_values", "client_records", "evaluation_aggregate", "evaluation_record", "check_evaluation",
           "EvaluateFn", "evaluate_on_server"]

EvaluateFn = Callable[[int, ArrayRecord], Optional[MetricRecord]]
"""Flower's server-side ``evaluate_fn(server_round, arrays) -> MetricRecord | None``."""


def evaluation_values(replies: Sequence[EvaluateReply]) -> tuple[dict[str, NDArray[np.float64]], NDArray[np.float64]]:
    """The evaluation's tables, (n, K) each: ``test_loss`` and every metric all replies report; and the
    training losses (which choose each client's model)."""
    names = set(replies[0].model_metrics)
    for reply in replies[1:]:
        names &= set(reply.model_metrics)
    values = {"test_loss": np.stack([r.test_losses for r in replies])}
    values.update({name: np.stack([r.model_metrics[name] for r in replies]) for name in sorted(names)})
    return values, np.stack([r.train_losses for r in replies])


def client_records(replies: Sequence[EvaluateReply], values: Mapping[str, NDArray[np.float64]],
                   train_losses: NDArray[np.float64]) -> list[RecordDict]:
    """One RecordDict per evaluated client for ``evaluate_metrics_aggr_fn``: MetricRecord ``metrics`` with its
    values at its chosen model, its ``cluster`` (that model) and ``num-examples``."""
    chosen = np.argmin(train_losses, axis=1)
    picked = {name: chosen_values(table, train_losses) for name, table in values.items()}
    return [RecordDict({protocol.METRICS: MetricRecord({
        **{name: float(column[i]) for name, column in picked.items()},
        protocol.CLUSTER: int(chosen[i]), protocol.NUM_EXAMPLES: float(reply.num_examples)})})
        for i, reply in enumerate(replies)]


def evaluation_aggregate(valid: Sequence[EvaluateReply]) -> dict[str, float]:
    """The aggregated evaluation of the valid replies (:func:`~fedroute.core.evaluation.evaluation_metrics`)."""
    values, train_losses = evaluation_values(valid)
    return evaluation_metrics(values, train_losses, np.array([r.group for r in valid], dtype=np.int64))


def evaluation_record(valid: Sequence[EvaluateReply], aggregated: Mapping[str, float],
                      aggregate: Optional[MetricsAggregation]) -> MetricRecord:
    """The ``MetricRecord`` an evaluation reports: how many models are usable, and ``aggregate``'s result on
    :func:`client_records` (default: ``aggregated``, the :func:`evaluation_aggregate`)."""
    train_choice = np.array([np.argmin(r.train_losses) for r in valid])
    test_choice = np.array([np.argmin(r.test_losses) for r in valid])
    record = MetricRecord({
        "usable-models-train": int(len(np.unique(train_choice))),
        "usable-models-test": int(len(np.unique(test_choice))),
        "num-clients": len(valid),
    })
    if aggregate is not None:
        values, train_losses = evaluation_values(valid)
        record.update(aggregate(client_records(valid, values, train_losses), protocol.NUM_EXAMPLES))
    else:
        record.update({name: value for name, value in aggregated.items() if name != "num_clients"})
    return record


def check_evaluation(evaluate_every: Any, fraction_evaluate: Any, min_evaluate_nodes: Any) -> None:
    """The evaluation settings of a strategy, each error naming the argument and its range."""
    if isinstance(evaluate_every, bool) or int(evaluate_every) != evaluate_every or evaluate_every < 0:
        raise invalid("evaluate_every", evaluate_every, "an integer ≥ 0 (0 = only the final evaluation)")
    if isinstance(fraction_evaluate, bool) or not 0.0 <= float(fraction_evaluate) <= 1.0:
        raise invalid("fraction_evaluate", fraction_evaluate, "a number in [0, 1]")
    if isinstance(min_evaluate_nodes, bool) or int(min_evaluate_nodes) != min_evaluate_nodes or min_evaluate_nodes < 0:
        raise invalid("min_evaluate_nodes", min_evaluate_nodes, "an integer ≥ 0")


def evaluate_on_server(state: "RunState", server_round: int, evaluate_fn: Optional[EvaluateFn], result: Result) -> None:
    """``evaluate_fn`` on each cluster model: kept per cluster in ``state.server_evaluation`` and, with keys
    ``cluster-<k>/<name>``, in ``result.evaluate_metrics_serverapp``."""
    if evaluate_fn is None:
        return
    records = {}
    for cluster, model in enumerate(state.cluster_models):
        if (record := evaluate_fn(server_round, array_record(model))) is not None:
            records[cluster] = record
    if records:
        state.server_evaluation[server_round] = records
        result.evaluate_metrics_serverapp[server_round] = cluster_metric_record(records)
