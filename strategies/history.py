"""Recording a training round: the run's history, routes, per-cluster train metrics and telemetry.

:func:`record_round` writes one round into the :class:`~fedroute.strategies.state.RunState` (a
:class:`~fedroute.strategies.results.RoundRecord` in ``history``, the executed routes, the clusters'
``train_fn`` metrics) and the recorder (``rounds.csv``, ``clients.csv``, alarms), and returns the
round's ``MetricRecord`` for Flower's ``Result``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from flwr.app import MetricRecord

from fedroute import protocol
from fedroute.monitoring.recorder import RunRecorder
from fedroute.monitoring.telemetry import ClientReplies
from fedroute.strategies.results import MetricsAggregation, aggregate_cluster_metrics, cluster_metric_record
from fedroute.strategies.state import Models, RunState
from fedroute.strategies.validation import TrainReply

__all__ = ["models_changed", "record_round"]


def models_changed(before: Models, after: Models) -> list[bool]:
    """Per cluster: whether any of its arrays changed."""
    return [any(not np.array_equal(old[name], new[name]) for name in old) for old, new in zip(before, after)]


def record_round(state: RunState, recorder: RunRecorder, server_round: int, valid: Sequence[TrainReply],
                 changed: list[bool], seconds: float, aggregate: Optional[MetricsAggregation]) -> MetricRecord:
    """Record the round whose kept replies are ``valid``; return its metrics (valid replies, masses,
    routed training loss, the clusters' ``train-metrics``)."""
    replies = ClientReplies.from_metrics(
        [r.client_id for r in valid], [r.node_id for r in valid], [r.cluster for r in valid],
        [r.num_examples for r in valid], [r.metrics for r in valid], state.num_clusters)
    rejections = state.rejections
    record = recorder.round(
        server_round, replies, state.routing_masses, changed,
        [entry for entry in rejections.entries
         if entry["server_round"] == server_round and entry["phase"] == protocol.PHASE_TRAIN],
        seconds, rejected_count=rejections.count(server_round, protocol.PHASE_TRAIN),
        spare=None if state.server.view is None else state.server.view.spare[0])
    state.history.append(record)  # type: ignore[arg-type]
    state.client_routes[server_round - 1] = {r.client_id: r.cluster for r in valid}
    cluster_metrics = aggregate_cluster_metrics([(r.cluster, r.num_examples, r.train_metrics) for r in valid],
                                                aggregate)
    if cluster_metrics:
        state.cluster_train_metrics[server_round] = cluster_metrics
    masses = state.routing_masses if state.routing_masses is not None else np.zeros(state.num_clusters)
    return MetricRecord({
        "num-valid-replies": len(valid),
        "masses": [float(m) for m in masses],
        "routed-train-loss": float(record["routed_train_loss"]),
        **cluster_metric_record(cluster_metrics),
    })
