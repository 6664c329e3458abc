"""What :class:`~fedroute.strategies.clustered.ClusteredRouting` exposes after a run, as documented types.

``strategy.history`` is a list of :class:`RoundRecord`, ``strategy.rejected``
a list of :class:`RejectedReply`, ``strategy.client_routes`` a
:data:`ClientRoutes`, ``strategy.final_evaluation`` a list of
:class:`~fedroute.strategies.validation.EvaluateReply`, ``strategy.alarms`` a
list of :class:`~fedroute.monitoring.alarms.Alarm`; ``cluster_train_metrics``
and ``server_evaluation`` map a server round to one Flower ``MetricRecord``
per cluster.  ``docs/plugin.md`` shows each with an example.  The helpers
aggregate the user's ``train_fn`` metrics per cluster with Flower's own
``aggregate_metricrecords`` (as ``FedAvg`` does) and flatten per-cluster
records into one.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional, Sequence, TypedDict

from flwr.app import MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fedroute import protocol

__all__ = ["RoundRecord", "RejectedReply", "ClientRoutes", "aggregate_cluster_metrics", "cluster_metric_record",
           "MetricsAggregation"]

logger = logging.getLogger("fedroute")


class RoundRecord(TypedDict, total=False):
    """One training round (an item of ``strategy.history``; a row of ``rounds.csv`` without ``method``).

    Besides the keys below, every cluster ``k = 0 … K-1`` has ``mass_<k>``
    (float, ``μ_k^t`` after the round), ``routed_<k>`` (int, clients routed to
    it), ``changed_<k>`` (bool, its model changed) and ``preferred_<k>``
    (int, clients whose lowest-loss model it was before training); every
    controller id ``c`` (``gr``, ``rh``, ``rev``, ``com``, ``hys``) and
    ``none`` has ``arm_<c>`` (float, share of the replies with that EXP3 arm
    in force).  ``pandas.DataFrame(strategy.history)`` is the per-round table.
    """

    server_round: int
    """Flower's round, from 1."""
    round_index: int
    """The paper's round ``t = server_round - 1``."""
    num_replies: int
    """Accepted training replies."""
    rejected: int
    """Rejected training replies."""
    routed_train_loss: float
    """Sample-weighted mean, over accepted replies, of the routed model's training loss before training (NaN: none)."""
    mean_feedback: float
    """Mean EXP3 feedback ``f_i^t`` (NaN when clients report none, e.g. FedCAM)."""
    entered: int
    """Clients entering a hysteresis episode."""
    released: int
    """Clients released from one."""
    min_rounds_played: int
    """Fewest rounds a replying client has played (``-1``: not reported)."""
    max_rounds_played: int
    """Most rounds a replying client has played."""
    exp3_weight_spread: float
    """Largest ``max v - min v`` of a client's EXP3 log-weights (0 before any update)."""
    seconds: float
    """Wall time of the round on the server."""


class RejectedReply(TypedDict):
    """A reply the strategy dropped (an item of ``strategy.rejected``)."""

    server_round: int
    """Round of the exchange (0 for synchronized entry's provisional query)."""
    phase: str
    """``train``, ``provisional`` or ``evaluate``."""
    node_id: int
    """The Flower node it came from (``-1`` for a duplicate, whose node is not kept)."""
    reason: str
    """Why: the field and what was wrong, or the node's error reply."""


ClientRoutes = dict[int, dict[int, int]]
"""``strategy.client_routes[t][client_id]``: the cluster client ``client_id`` trained in round ``t``."""

MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]
"""Flower ``FedAvg``'s ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn``: ``(replies' RecordDicts,
weighting key) -> MetricRecord`` (default: ``aggregate_metricrecords``, the weighted mean)."""


def aggregate_cluster_metrics(
    replies: Sequence[tuple[int, float, Optional[Mapping[str, Any]]]],
    aggregate: Optional[MetricsAggregation] = None,
) -> dict[int, MetricRecord]:
    """Each cluster's ``train_fn`` metrics, averaged like ``FedAvg`` averages a ``MetricRecord``.

    Parameters
    ----------
    replies : sequence of (cluster, num_examples, metrics or None)
        One entry per accepted reply; replies without metrics are left out.
    aggregate : callable, optional
        ``train_metrics_aggr_fn(records, "num-examples") -> MetricRecord`` applied to each cluster's
        replies (each a RecordDict with MetricRecord ``train-metrics``, ``num-examples`` included);
        Flower's ``aggregate_metricrecords`` by default.

    Returns
    -------
    dict
        Cluster → ``MetricRecord`` (the ``num-examples``-weighted mean of every
        key, lists element-wise), from Flower's ``aggregate_metricrecords``.
        A cluster whose replies disagree on keys or list lengths is left out
        (logged).
    """
    grouped: dict[int, list[RecordDict]] = {}
    for cluster, num_examples, metrics in replies:
        if metrics:
            grouped.setdefault(int(cluster), []).append(RecordDict({protocol.TRAIN_METRICS: MetricRecord(
                {**dict(metrics), protocol.NUM_EXAMPLES: float(num_examples)})}))
    aggregated = {}
    for cluster, records in sorted(grouped.items()):
        keys = [sorted(record[protocol.TRAIN_METRICS].keys()) for record in records]
        if any(key_set != keys[0] for key_set in keys):
            logger.warning("train metrics of cluster %d not aggregated: replies report different keys", cluster)
            continue
        try:
            aggregated[cluster] = (aggregate or aggregate_metricrecords)(records, protocol.NUM_EXAMPLES)
        except ValueError as error:  # lists of different lengths
            logger.warning("train metrics of cluster %d not aggregated: %s", cluster, error)
    return aggregated


def cluster_metric_record(records: Mapping[int, MetricRecord]) -> dict[str, Any]:
    """Per-cluster records flattened into one mapping with keys ``cluster-<k>/<name>``."""
    return {f"{protocol.cluster_key(cluster)}/{name}": value
            for cluster, record in sorted(records.items()) for name, value in record.items()}
