"""Reply validation: a malformed client reply is rejected with a reason, never averaged in.

Pure functions over a reply's ``RecordDict``-like content (a mapping from keys
to ArrayRecord / MetricRecord objects).  Flower types are only duck-typed here
(``.items()``, an ``Array``'s ``dtype``/``shape``/``data``), so the checks are
testable without a run.  This module holds the validated reply types and the check of each
reply kind; the pieces are the checks of the metric fields (:mod:`~fedroute.strategies.reply_fields`),
of the model records (:mod:`~fedroute.strategies.reply_arrays`) and the bounded words of a
reason (:mod:`~fedroute.strategies.reply_text`), whose public names are importable from here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.strategies.reply_arrays import validate_model_record
from fedroute.strategies.reply_fields import (MAX_NUM_EXAMPLES, MAX_TRAIN_METRIC_VALUES, MAX_TRAIN_METRICS,
                                              MIN_NUM_EXAMPLES, ROUTE_DISTRIBUTION_TOLERANCE, check_optional_metrics,
                                              integer_metric, metrics_of, num_examples_metric, number_list,
                                              route_distribution, validate_model_metrics, validate_train_metrics)
from fedroute.strategies.reply_text import TEXT_LIMIT, ReplyRejected, describe, printable

__all__ = ["TrainReply", "ProvisionalReply", "IdentityReply", "EvaluateReply", "ReplyRejected",
           "validate_train_reply", "validate_provisional_reply", "validate_identity_reply", "validate_evaluate_reply",
           "validate_model_record", "validate_model_metrics", "validate_train_metrics", "first_reply_per_client",
           "MAX_NUM_EXAMPLES", "MIN_NUM_EXAMPLES", "MAX_TRAIN_METRICS", "MAX_TRAIN_METRIC_VALUES", "TEXT_LIMIT",
           "printable", "describe", "ROUTE_DISTRIBUTION_TOLERANCE"]


@dataclass(frozen=True)
class TrainReply:
    """A validated training reply."""

    client_id: int
    cluster: int
    num_examples: float
    model: dict[str, NDArray]
    metrics: dict[str, Any]
    extras: dict[str, dict[str, NDArray]] = field(default_factory=dict)
    """Further validated model records (e.g. FedCAM's global part)."""
    train_metrics: Optional[dict[str, Any]] = None
    """The user's ``train_fn`` metrics (MetricRecord ``train-metrics``), if the reply has them."""
    node_id: int = -1
    """The Flower node the reply came from (set by the strategy; -1 = unknown)."""
    preferred: int = -1
    """The client's Greedy choice (metric ``preferred``; the lowest reported loss when it is missing)."""
    signature: Optional[tuple[NDArray[np.float64], NDArray[np.float64]]] = None
    """The signature start: the client's sketched class means ``(C, d)`` and class counts ``(C,)``, if it sent them."""


@dataclass(frozen=True)
class IdentityReply:
    """A validated identification (partial participation: which client a node serves)."""

    client_id: int
    num_examples: float
    node_id: int = -1


@dataclass(frozen=True)
class ProvisionalReply:
    """A validated provisional-Greedy report (synchronized entry, step 1)."""

    client_id: int
    cluster: int
    num_examples: float
    node_id: int = -1


@dataclass(frozen=True)
class EvaluateReply:
    """A validated evaluation reply (controller-free metrics): an item of ``strategy.final_evaluation``."""

    client_id: int
    """The client's id."""
    num_examples: float
    """Its training examples (the weight of its vote)."""
    train_losses: NDArray[np.float64]
    """Loss of each of the ``K`` final models on its training data, shape (K,)."""
    test_losses: NDArray[np.float64]
    """The same on its held-out data (the training losses if it has none)."""
    group: int
    """Its latent group if the experiment knows it, else ``-1`` (evaluation metrics only)."""
    metrics: dict[str, Any]
    """The whole reply MetricRecord."""
    node_id: int = -1
    """The Flower node the reply came from (set by the strategy; -1 = unknown)."""
    model_metrics: dict[str, NDArray[np.float64]] = field(default_factory=dict)
    """The ``evaluate-metrics`` record: metric name → its value for each of the ``K`` models, shape (K,)."""


def validate_train_reply(
    content: Mapping[str, Any], num_clusters: int, template: Mapping[str, NDArray], num_arms: Optional[int] = None,
) -> TrainReply:
    """Check a training reply against the schema and the cluster-model template.

    Parameters
    ----------
    content : mapping
        The reply's ``RecordDict``.
    num_clusters : int
        ``K``: the routed cluster must lie in ``[0, K-1]``.
    template : mapping of str to ndarray
        A cluster model: the returned model must have the same array names,
        shapes and dtypes, and only finite values.
    num_arms : int, optional
        Controllers per client: the longest accepted ``exp3-log-weights``
        (``K`` when not given).

    Returns
    -------
    TrainReply

    Raises
    ------
    ReplyRejected
        Naming the offending field.
    """
    metrics = metrics_of(content)
    cluster = integer_metric(metrics, protocol.CLUSTER, 0, num_clusters - 1)
    client_id = integer_metric(metrics, protocol.CLIENT_ID, 0, 2**62)
    num_examples = num_examples_metric(metrics)
    losses = number_list(metrics, protocol.LOSSES, num_clusters)
    route_distribution(metrics, num_clusters, cluster)
    check_optional_metrics(metrics, num_clusters if num_arms is None else num_arms)
    preferred = integer_metric(metrics, protocol.PREFERRED, 0, num_clusters - 1) if protocol.PREFERRED in metrics \
        else int(np.argmin(losses))
    model = validate_model_record(content, protocol.MODEL, template)
    return TrainReply(client_id=client_id, cluster=cluster, num_examples=num_examples, model=model, metrics=metrics,
                      train_metrics=validate_train_metrics(content), preferred=preferred)


def validate_provisional_reply(content: Mapping[str, Any], num_clusters: int) -> ProvisionalReply:
    """Check a provisional-Greedy report (cluster, num-examples, client-id)."""
    metrics = metrics_of(content)
    return ProvisionalReply(
        client_id=integer_metric(metrics, protocol.CLIENT_ID, 0, 2**62),
        cluster=integer_metric(metrics, protocol.CLUSTER, 0, num_clusters - 1),
        num_examples=num_examples_metric(metrics),
    )


def validate_identity_reply(content: Mapping[str, Any]) -> IdentityReply:
    """Check an identification (client-id, num-examples)."""
    metrics = metrics_of(content)
    return IdentityReply(client_id=integer_metric(metrics, protocol.CLIENT_ID, 0, 2**62), num_examples=num_examples_metric(metrics))


def validate_evaluate_reply(content: Mapping[str, Any], num_clusters: int) -> EvaluateReply:
    """Check an evaluation reply (losses of every cluster model on both splits)."""
    metrics = metrics_of(content)
    return EvaluateReply(
        client_id=integer_metric(metrics, protocol.CLIENT_ID, 0, 2**62),
        num_examples=num_examples_metric(metrics),
        train_losses=number_list(metrics, protocol.TRAIN_LOSSES, num_clusters),
        test_losses=number_list(metrics, protocol.TEST_LOSSES, num_clusters),
        group=integer_metric(metrics, protocol.GROUP, -1, 2**31),
        metrics=metrics,
        model_metrics=validate_model_metrics(content, num_clusters),
    )


def first_reply_per_client(replies: list, client_id_of: Optional[Any] = None) -> tuple[list, list]:
    """Keep the first reply of each client id; return ``(kept, duplicates)``."""
    seen: set[int] = set()
    kept, duplicates = [], []
    for reply in replies:
        client_id = reply.client_id if client_id_of is None else client_id_of(reply)
        (duplicates if client_id in seen else kept).append(reply)
        seen.add(client_id)
    return kept, duplicates

