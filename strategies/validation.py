"""Reply validation: a malformed client reply is rejected with a reason, never averaged in.

Pure functions over a reply's ``RecordDict``-like content (a mapping from keys
to ArrayRecord / MetricRecord objects).  Flower types are only duck-typed here
(``.items()``, ``Array.numpy()``), so the checks are testable without a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from flwr.app import MetricRecord

import numpy as np
from numpy.typing import NDArray

from fedroute import protocol

__all__ = ["TrainReply", "ProvisionalReply", "EvaluateReply", "ReplyRejected",
           "validate_train_reply", "validate_provisional_reply", "validate_evaluate_reply", "validate_model_record",
           "MAX_NUM_EXAMPLES", "MIN_NUM_EXAMPLES"]

MAX_NUM_EXAMPLES = 10**9
"""Largest accepted ``num-examples``: a larger claim would let one client dominate."""
MIN_NUM_EXAMPLES = 1e-6
"""Smallest accepted ``num-examples`` (a sample weight; a subnormal one would underflow ``n·w``)."""


class ReplyRejected(ValueError):
    """A reply failed validation; the message says which field and why."""


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


@dataclass(frozen=True)
class ProvisionalReply:
    """A validated provisional-Greedy report (synchronized entry, step 1)."""

    client_id: int
    cluster: int
    num_examples: float


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


def _record(content: Mapping[str, Any], key: str, kind: str) -> Any:
    if key not in content:
        raise ReplyRejected(f"missing {kind} '{key}' (reply has {sorted(content.keys())})")
    return content[key]


def _is_integer(value: Any) -> bool:
    """An int (not bool), or a float with an integral value."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer()


def _integer(metrics: Mapping[str, Any], key: str, low: int, high: int) -> int:
    if key not in metrics:
        raise ReplyRejected(f"metric '{key}' is missing")
    value = metrics[key]
    if not _is_integer(value):
        raise ReplyRejected(f"metric '{key}' = {value!r} must be an integer")
    if not low <= int(value) <= high:  # int() of an int never overflows
        raise ReplyRejected(f"metric '{key}' is out of range [{low}, {high}]")
    return int(value)


def _num_examples(metrics: Mapping[str, Any]) -> float:
    value = metrics.get(protocol.NUM_EXAMPLES)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ReplyRejected(f"metric '{protocol.NUM_EXAMPLES}' = {value!r} must be a finite number")
    if isinstance(value, (int, np.integer)) and not MIN_NUM_EXAMPLES <= value <= MAX_NUM_EXAMPLES:
        raise ReplyRejected(f"metric '{protocol.NUM_EXAMPLES}' is out of range "
                            f"[{MIN_NUM_EXAMPLES}, {MAX_NUM_EXAMPLES}]")
    if not (math.isfinite(value) and MIN_NUM_EXAMPLES <= value <= MAX_NUM_EXAMPLES):
        raise ReplyRejected(f"metric '{protocol.NUM_EXAMPLES}' = {value!r} is out of range "
                            f"[{MIN_NUM_EXAMPLES}, {MAX_NUM_EXAMPLES}]")
    return float(value)


def _vector(metrics: Mapping[str, Any], key: str, length: Optional[int]) -> NDArray[np.float64]:
    value = metrics.get(key)
    if not isinstance(value, list) or (length is not None and len(value) != length):
        expected = f"a list of {length} numbers" if length is not None else "a list of numbers"
        raise ReplyRejected(f"metric '{key}' must be {expected}, got {value!r}")
    if any(isinstance(item, bool) or not isinstance(item, (int, float)) for item in value):
        raise ReplyRejected(f"metric '{key}' must hold numbers only")
    vector = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(vector)):
        raise ReplyRejected(f"metric '{key}' has non-finite entries")
    return vector


def _optional_metrics(metrics: Mapping[str, Any]) -> None:
    """Check the optional routing metrics a fedroute client sends, where present."""
    for key in (protocol.ROUNDS_PLAYED, protocol.CONTROLLER, protocol.ENTERED, protocol.RELEASED):
        if key in metrics:
            _integer(metrics, key, -1, 2**62)
    if protocol.ARM in metrics:
        _integer(metrics, protocol.ARM, -1, 2**31)
    if protocol.FEEDBACK in metrics:
        value = metrics[protocol.FEEDBACK]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ReplyRejected(f"metric '{protocol.FEEDBACK}' = {value!r} must be a finite number")
    if protocol.EXP3_LOG_WEIGHTS in metrics:
        if len(_vector(metrics, protocol.EXP3_LOG_WEIGHTS, None)) == 0:
            raise ReplyRejected(f"metric '{protocol.EXP3_LOG_WEIGHTS}' must not be empty")


def _metrics(content: Mapping[str, Any]) -> dict[str, Any]:
    record = _record(content, protocol.METRICS, "MetricRecord")
    if not isinstance(record, (MetricRecord, dict)):
        raise ReplyRejected(f"'{protocol.METRICS}' must be a MetricRecord, got {type(record).__name__}")
    return dict(record.items())


def validate_model_record(content: Mapping[str, Any], key: str, template: Mapping[str, NDArray]) -> dict[str, NDArray]:
    """The arrays of ArrayRecord ``key``: same names, shapes and dtypes as ``template``, all finite."""
    record = _record(content, key, "ArrayRecord")
    try:
        items = list(record.items())
    except AttributeError as error:
        raise ReplyRejected(f"'{key}' is not an ArrayRecord") from error
    if [name for name, _ in items] != list(template):
        raise ReplyRejected(f"{key} arrays {[name for name, _ in items]} differ from {list(template)}")
    model = {}
    for name, array in items:
        try:
            values = array.numpy()
        except Exception as error:  # a corrupt or pickled payload must not crash the server
            raise ReplyRejected(f"{key} array '{name}' cannot be decoded: {error}") from error
        expected = template[name]
        if values.shape != expected.shape or values.dtype != expected.dtype:
            raise ReplyRejected(f"{key} array '{name}' has shape {values.shape} and dtype {values.dtype}; "
                                f"expected {expected.shape} and {expected.dtype}")
        if not np.all(np.isfinite(values)):
            raise ReplyRejected(f"{key} array '{name}' has NaN or Inf entries")
        model[name] = values
    return model


def validate_train_reply(
    content: Mapping[str, Any], num_clusters: int, template: Mapping[str, NDArray]
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

    Returns
    -------
    TrainReply

    Raises
    ------
    ReplyRejected
        Naming the offending field.
    """
    metrics = _metrics(content)
    cluster = _integer(metrics, protocol.CLUSTER, 0, num_clusters - 1)
    client_id = _integer(metrics, protocol.CLIENT_ID, 0, 2**62)
    num_examples = _num_examples(metrics)
    for key in (protocol.LOSSES, protocol.ROUTE_DISTRIBUTION):
        _vector(metrics, key, num_clusters)
    _optional_metrics(metrics)
    model = validate_model_record(content, protocol.MODEL, template)
    return TrainReply(client_id=client_id, cluster=cluster, num_examples=num_examples, model=model, metrics=metrics,
                      train_metrics=validate_train_metrics(content))


def validate_provisional_reply(content: Mapping[str, Any], num_clusters: int) -> ProvisionalReply:
    """Check a provisional-Greedy report (cluster, num-examples, client-id)."""
    metrics = _metrics(content)
    return ProvisionalReply(
        client_id=_integer(metrics, protocol.CLIENT_ID, 0, 2**62),
        cluster=_integer(metrics, protocol.CLUSTER, 0, num_clusters - 1),
        num_examples=_num_examples(metrics),
    )


def validate_evaluate_reply(content: Mapping[str, Any], num_clusters: int) -> EvaluateReply:
    """Check an evaluation reply (losses of every cluster model on both splits)."""
    metrics = _metrics(content)
    return EvaluateReply(
        client_id=_integer(metrics, protocol.CLIENT_ID, 0, 2**62),
        num_examples=_num_examples(metrics),
        train_losses=_vector(metrics, protocol.TRAIN_LOSSES, num_clusters),
        test_losses=_vector(metrics, protocol.TEST_LOSSES, num_clusters),
        group=_integer(metrics, protocol.GROUP, -1, 2**31),
        metrics=metrics,
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


__all__.append("first_reply_per_client")

MAX_TRAIN_METRICS = 64
"""Most keys a reply's ``train-metrics`` record may hold."""


def validate_train_metrics(content: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The optional ``train-metrics`` MetricRecord: at most 64 keys, finite numbers or lists of them; None if absent."""
    if protocol.TRAIN_METRICS not in content:
        return None
    record = content[protocol.TRAIN_METRICS]
    if not isinstance(record, (MetricRecord, dict)):
        raise ReplyRejected(f"'{protocol.TRAIN_METRICS}' must be a MetricRecord, got {type(record).__name__}")
    metrics = dict(record.items())
    if len(metrics) > MAX_TRAIN_METRICS:
        raise ReplyRejected(f"'{protocol.TRAIN_METRICS}' holds {len(metrics)} keys; at most {MAX_TRAIN_METRICS}")
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if any(isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item)
               for item in values):
            raise ReplyRejected(f"'{protocol.TRAIN_METRICS}' metric '{key}' must be a finite number or a list of them")
    return metrics


__all__.append("validate_train_metrics")
