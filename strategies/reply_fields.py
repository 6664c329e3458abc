"""Checks of a reply's metric fields: integers in range, sample weights, lists of finite numbers.

Pure functions over a MetricRecord's items (or a reply's ``RecordDict``-like content for the optional
metric records); each raises :class:`~fedroute.strategies.reply_text.ReplyRejected` naming the field.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import numpy as np
from flwr.app import MetricRecord
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.strategies.reply_text import TEXT_LIMIT, ReplyRejected, describe, names_text, printable

__all__ = ["MAX_NUM_EXAMPLES", "MIN_NUM_EXAMPLES", "ROUTE_DISTRIBUTION_TOLERANCE", "MAX_TRAIN_METRICS",
           "MAX_TRAIN_METRIC_VALUES", "required_record", "is_integer", "integer_metric", "num_examples_metric",
           "number_list", "route_distribution", "check_optional_metrics", "metrics_of", "validate_model_metrics",
           "validate_train_metrics"]

MAX_NUM_EXAMPLES = 10**9
"""Largest accepted ``num-examples``: a larger claim would let one client dominate."""
MIN_NUM_EXAMPLES = 1e-6
"""Smallest accepted ``num-examples`` (a sample weight; a subnormal one would underflow ``n·w``)."""
ROUTE_DISTRIBUTION_TOLERANCE = 1e-6
"""How far a route distribution's sum may be from 1."""
MAX_TRAIN_METRICS = 64
"""Most keys a reply's ``train-metrics`` record may hold."""
MAX_TRAIN_METRIC_VALUES = 1024
"""Most values one ``train-metrics`` list may hold."""


def required_record(content: Mapping[str, Any], key: str, kind: str) -> Any:
    if key not in content:
        keys = list(content.keys())
        raise ReplyRejected(f"missing {kind} '{key}' (reply has {len(keys)} records: {names_text(sorted(keys))})")
    return content[key]


def is_integer(value: Any) -> bool:
    """An int (not bool), or a float with an integral value."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer()


def integer_metric(metrics: Mapping[str, Any], key: str, low: int, high: int) -> int:
    if key not in metrics:
        raise ReplyRejected(f"metric '{key}' is missing")
    value = metrics[key]
    if not is_integer(value):
        raise ReplyRejected(f"metric '{key}' must be an integer, got {describe(value)}")
    if not low <= int(value) <= high:  # int() of an int never overflows
        raise ReplyRejected(f"metric '{key}' is out of range [{low}, {high}]")
    return int(value)


def num_examples_metric(metrics: Mapping[str, Any]) -> float:
    value = metrics.get(protocol.NUM_EXAMPLES)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ReplyRejected(f"metric '{protocol.NUM_EXAMPLES}' must be a finite number, got {describe(value)}")
    if isinstance(value, (int, np.integer)) and not MIN_NUM_EXAMPLES <= value <= MAX_NUM_EXAMPLES:
        raise ReplyRejected(f"metric '{protocol.NUM_EXAMPLES}' is out of range "
                            f"[{MIN_NUM_EXAMPLES}, {MAX_NUM_EXAMPLES}]")
    if not (math.isfinite(value) and MIN_NUM_EXAMPLES <= value <= MAX_NUM_EXAMPLES):
        raise ReplyRejected(f"metric '{protocol.NUM_EXAMPLES}' ({describe(value)}) is out of range "
                            f"[{MIN_NUM_EXAMPLES}, {MAX_NUM_EXAMPLES}]")
    return float(value)


def number_list(metrics: Mapping[str, Any], key: str, length: int, *, at_most: bool = False) -> NDArray[np.float64]:
    """A list of finite numbers of ``length`` entries (``1..length`` with ``at_most``); the length is
    checked before anything else is done with the list."""
    value = metrics.get(key)
    fits = isinstance(value, list) and (1 <= len(value) <= length if at_most else len(value) == length)
    if not fits:
        expected = f"a list of 1 to {length} numbers" if at_most else f"a list of {length} numbers"
        raise ReplyRejected(f"metric '{key}' must be {expected}, got {describe(value)}")
    if any(isinstance(item, bool) or not isinstance(item, (int, float)) for item in value):
        raise ReplyRejected(f"metric '{key}' must hold numbers only")
    vector = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(vector)):
        raise ReplyRejected(f"metric '{key}' has non-finite entries")
    return vector


def route_distribution(metrics: Mapping[str, Any], num_clusters: int, cluster: int) -> NDArray[np.float64]:
    """The distribution the route was drawn from: ``K`` entries ≥ 0 summing to 1, positive at the route."""
    key = protocol.ROUTE_DISTRIBUTION
    distribution = number_list(metrics, key, num_clusters)
    if np.any(distribution < 0.0):
        raise ReplyRejected(f"metric '{key}' has negative entries")
    if abs(float(distribution.sum()) - 1.0) > ROUTE_DISTRIBUTION_TOLERANCE:
        raise ReplyRejected(f"metric '{key}' does not sum to 1 (tolerance {ROUTE_DISTRIBUTION_TOLERANCE:g})")
    if not distribution[cluster] > 0.0:
        raise ReplyRejected(f"metric '{key}' gives the routed cluster {cluster} probability 0")
    return distribution


def check_optional_metrics(metrics: Mapping[str, Any], num_arms: int) -> None:
    """Check the optional routing metrics a fedroute client sends, where present."""
    for key in (protocol.ROUNDS_PLAYED, protocol.CONTROLLER, protocol.ENTERED, protocol.RELEASED):
        if key in metrics:
            integer_metric(metrics, key, -1, 2**62)
    if protocol.ARM in metrics:
        integer_metric(metrics, protocol.ARM, -1, 2**31)
    if protocol.FEEDBACK in metrics:
        value = metrics[protocol.FEEDBACK]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ReplyRejected(f"metric '{protocol.FEEDBACK}' must be a finite number, got {describe(value)}")
    if protocol.EXP3_LOG_WEIGHTS in metrics:
        number_list(metrics, protocol.EXP3_LOG_WEIGHTS, num_arms, at_most=True)


MAX_SIGNATURE_CLASSES = 100_000
"""Largest number of classes a signature may describe (its length is checked before it is read)."""


def signature_metrics(metrics: Mapping[str, Any], dim: int,
                      num_classes: Optional[int] = None) -> Optional[tuple[NDArray[np.float64], NDArray[np.float64]]]:
    """The optional signature of a reply: ``(means (C, d), counts (C,))``, or None when it has none.

    ``C`` is the recorded signatures' (``num_classes``; None before any); both lists must be present together,
    finite, the means ``C × d`` numbers and the counts ``≥ 0``.
    """
    has_means, has_counts = protocol.SIGNATURE_MEANS in metrics, protocol.SIGNATURE_COUNTS in metrics
    if not has_means and not has_counts:
        return None
    if has_means != has_counts:
        raise ReplyRejected(f"metrics '{protocol.SIGNATURE_MEANS}' and '{protocol.SIGNATURE_COUNTS}' come together; "
                            f"the reply has only one")
    counts = number_list(metrics, protocol.SIGNATURE_COUNTS,
                         MAX_SIGNATURE_CLASSES if num_classes is None else num_classes, at_most=num_classes is None)
    if np.any(counts < 0):
        raise ReplyRejected(f"metric '{protocol.SIGNATURE_COUNTS}' has negative entries")
    means = number_list(metrics, protocol.SIGNATURE_MEANS, len(counts) * dim)
    return means.reshape(len(counts), dim), counts


def metrics_of(content: Mapping[str, Any]) -> dict[str, Any]:
    record = required_record(content, protocol.METRICS, "MetricRecord")
    if not isinstance(record, (MetricRecord, dict)):
        raise ReplyRejected(f"'{protocol.METRICS}' must be a MetricRecord, got {describe(record)}")
    return dict(record.items())


def _bounded_metric_record(content: Mapping[str, Any], name: str) -> Optional[dict[str, Any]]:
    """``content[name]`` as a dict of at most ``MAX_TRAIN_METRICS`` keys (a MetricRecord or dict); None if absent."""
    if name not in content:
        return None
    record = content[name]
    if not isinstance(record, (MetricRecord, dict)):
        raise ReplyRejected(f"'{name}' must be a MetricRecord, got {describe(record)}")
    metrics = dict(record.items())
    if len(metrics) > MAX_TRAIN_METRICS:
        raise ReplyRejected(f"'{name}' holds {len(metrics)} keys; at most {MAX_TRAIN_METRICS}")
    return metrics


def validate_model_metrics(content: Mapping[str, Any], num_clusters: int) -> dict[str, NDArray[np.float64]]:
    """The optional ``evaluate-metrics`` MetricRecord: at most 64 names, each a list of ``K`` finite numbers."""
    metrics = _bounded_metric_record(content, protocol.EVALUATE_METRICS)
    if metrics is None:
        return {}
    if any(not isinstance(key, str) or len(key) > TEXT_LIMIT for key in metrics):
        raise ReplyRejected(f"'{protocol.EVALUATE_METRICS}' has a key longer than {TEXT_LIMIT} characters")
    return {key: number_list(metrics, key, num_clusters) for key in metrics}


def validate_train_metrics(content: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The optional ``train-metrics`` MetricRecord: at most 64 keys, finite numbers or lists of them; None if absent."""
    metrics = _bounded_metric_record(content, protocol.TRAIN_METRICS)
    if metrics is None:
        return None
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if len(values) > MAX_TRAIN_METRIC_VALUES:
            raise ReplyRejected(f"'{protocol.TRAIN_METRICS}' metric '{printable(key, 40)}' holds {len(values)} "
                                f"values; at most {MAX_TRAIN_METRIC_VALUES}")
        if any(isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item)
               for item in values):
            raise ReplyRejected(f"'{protocol.TRAIN_METRICS}' metric '{printable(key, 40)}' must be a finite number "
                                "or a list of them")
    if any(len(key) > TEXT_LIMIT for key in metrics):
        raise ReplyRejected(f"'{protocol.TRAIN_METRICS}' has a key longer than {TEXT_LIMIT} characters")
    return metrics

