"""Reply validation: a malformed client reply is rejected with a reason, never averaged in.

Pure functions over a reply's ``RecordDict``-like content (a mapping from keys
to ArrayRecord / MetricRecord objects).  Flower types are only duck-typed here
(``.items()``, an ``Array``'s ``dtype``/``shape``/``data``), so the checks are
testable without a run.

A reason names the field and says what is wrong with it in bounded words: the
type, shape or length of a bad value, never the value itself (a reply may hold
a list of millions of numbers or text meant for a terminal).  Arrays are
checked against the template by their declared shape, dtype and payload size
*before* they are decoded, and decoded in place
(:func:`~fedroute.strategies.records.decode_array`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from flwr.app import MetricRecord

import numpy as np
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.strategies.records import NPY_HEADER_LIMIT, decode_array

__all__ = ["TrainReply", "ProvisionalReply", "IdentityReply", "EvaluateReply", "ReplyRejected",
           "validate_train_reply", "validate_provisional_reply", "validate_identity_reply", "validate_evaluate_reply",
           "validate_model_record",
           "MAX_NUM_EXAMPLES", "MIN_NUM_EXAMPLES", "printable", "describe", "ROUTE_DISTRIBUTION_TOLERANCE"]

MAX_NUM_EXAMPLES = 10**9
"""Largest accepted ``num-examples``: a larger claim would let one client dominate."""
MIN_NUM_EXAMPLES = 1e-6
"""Smallest accepted ``num-examples`` (a sample weight; a subnormal one would underflow ``n·w``)."""
ROUTE_DISTRIBUTION_TOLERANCE = 1e-6
"""How far a route distribution's sum may be from 1."""
TEXT_LIMIT = 200
"""Characters of client-supplied text (error reasons, record names) kept in a reason."""


def printable(text: Any, limit: int = TEXT_LIMIT) -> str:
    """``text`` safe for a log line: control and non-ASCII characters escaped, at most ``limit`` characters.

    A longer text is cut and its length noted (``...(N characters)``).
    """
    text = text if isinstance(text, str) else str(text)
    escaped = text[:limit].encode("unicode_escape", errors="backslashreplace").decode("ascii")
    if len(text) <= limit and len(escaped) <= limit:
        return escaped
    return f"{escaped[:limit]}...({len(text)} characters)"


def describe(value: Any) -> str:
    """What ``value`` is, in bounded words (its type and size, never its content)."""
    if value is None:
        return "nothing"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, (str, bytes)):
        return f"a {type(value).__name__} of length {len(value)}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {_shape_text(value.shape)}"
    if isinstance(value, (bool, np.bool_)):
        return "a bool"
    if isinstance(value, (int, np.integer)):
        return "an int" if -2**63 <= value < 2**64 else "an int beyond 64 bits"
    if isinstance(value, (float, np.floating)):
        return "a float" if math.isfinite(value) else "a non-finite float"
    return f"a {printable(type(value).__name__, 40)}"


def _shape_text(shape: Any) -> str:
    """A declared shape in bounded words."""
    try:
        dims = tuple(shape)
    except TypeError:
        return describe(shape)
    if len(dims) > 8:
        return f"<{len(dims)} dimensions>"
    return printable(str(dims), 80)


def _names_text(names: Any, limit: int = 160) -> str:
    """Record or array names (client-supplied) in bounded words: escaped, at most ``limit`` characters."""
    names = list(names)
    text = "[" + ", ".join(repr(printable(name, 40)) for name in names[:5]) + (", ..." if len(names) > 5 else "") + "]"
    return text if len(text) <= limit else f"{text[:limit]}...]"


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
    node_id: int = -1
    """The Flower node the reply came from (set by the strategy; -1 = unknown)."""
    preferred: int = -1
    """The client's Greedy choice (metric ``preferred``; the lowest reported loss when it is missing)."""


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


def _record(content: Mapping[str, Any], key: str, kind: str) -> Any:
    if key not in content:
        keys = list(content.keys())
        raise ReplyRejected(f"missing {kind} '{key}' (reply has {len(keys)} records: {_names_text(sorted(keys))})")
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
        raise ReplyRejected(f"metric '{key}' must be an integer, got {describe(value)}")
    if not low <= int(value) <= high:  # int() of an int never overflows
        raise ReplyRejected(f"metric '{key}' is out of range [{low}, {high}]")
    return int(value)


def _num_examples(metrics: Mapping[str, Any]) -> float:
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


def _vector(metrics: Mapping[str, Any], key: str, length: int, *, at_most: bool = False) -> NDArray[np.float64]:
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


def _route_distribution(metrics: Mapping[str, Any], num_clusters: int, cluster: int) -> NDArray[np.float64]:
    """The distribution the route was drawn from: ``K`` entries ≥ 0 summing to 1, positive at the route."""
    key = protocol.ROUTE_DISTRIBUTION
    distribution = _vector(metrics, key, num_clusters)
    if np.any(distribution < 0.0):
        raise ReplyRejected(f"metric '{key}' has negative entries")
    if abs(float(distribution.sum()) - 1.0) > ROUTE_DISTRIBUTION_TOLERANCE:
        raise ReplyRejected(f"metric '{key}' does not sum to 1 (tolerance {ROUTE_DISTRIBUTION_TOLERANCE:g})")
    if not distribution[cluster] > 0.0:
        raise ReplyRejected(f"metric '{key}' gives the routed cluster {cluster} probability 0")
    return distribution


def _optional_metrics(metrics: Mapping[str, Any], num_arms: int) -> None:
    """Check the optional routing metrics a fedroute client sends, where present."""
    for key in (protocol.ROUNDS_PLAYED, protocol.CONTROLLER, protocol.ENTERED, protocol.RELEASED):
        if key in metrics:
            _integer(metrics, key, -1, 2**62)
    if protocol.ARM in metrics:
        _integer(metrics, protocol.ARM, -1, 2**31)
    if protocol.FEEDBACK in metrics:
        value = metrics[protocol.FEEDBACK]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ReplyRejected(f"metric '{protocol.FEEDBACK}' must be a finite number, got {describe(value)}")
    if protocol.EXP3_LOG_WEIGHTS in metrics:
        _vector(metrics, protocol.EXP3_LOG_WEIGHTS, num_arms, at_most=True)


def _metrics(content: Mapping[str, Any]) -> dict[str, Any]:
    record = _record(content, protocol.METRICS, "MetricRecord")
    if not isinstance(record, (MetricRecord, dict)):
        raise ReplyRejected(f"'{protocol.METRICS}' must be a MetricRecord, got {describe(record)}")
    return dict(record.items())


def _shape_mismatch(key: str, name: str, shape: Any, dtype: Any, expected: NDArray) -> ReplyRejected:
    return ReplyRejected(f"{key} array '{name}' has shape {_shape_text(shape)} and dtype {printable(dtype, 40)}; "
                         f"expected {expected.shape} and {expected.dtype}")


def _decoded_checked(key: str, name: str, array: Any, expected: NDArray) -> NDArray:
    """One array of a reply, checked against ``expected`` before and after decoding.

    The declared shape and dtype (fields of Flower's ``Array``) and the payload
    size are checked first, so an oversized or mislabelled payload is refused
    without being decoded; then the values are read in place.
    """
    try:
        shape, dtype, data = tuple(array.shape), str(array.dtype), array.data
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError
    except Exception as error:  # not an Array (e.g. a number from a MetricRecord)
        raise ReplyRejected(f"{key} array '{name}' cannot be decoded: it is {describe(array)}") from error
    if shape != expected.shape or dtype != str(expected.dtype):
        raise _shape_mismatch(key, name, shape, dtype, expected)
    if not expected.nbytes <= len(data) <= expected.nbytes + NPY_HEADER_LIMIT:
        raise ReplyRejected(f"{key} array '{name}' has a payload of {len(data)} bytes; "
                            f"expected {expected.nbytes} bytes of values plus a header")
    try:
        values = decode_array(array)
    except Exception as error:  # a corrupt or pickled payload must not crash the server
        raise ReplyRejected(f"{key} array '{name}' cannot be decoded ({type(error).__name__})") from error
    if values.shape != expected.shape or values.dtype != expected.dtype:  # the payload may contradict its fields
        raise _shape_mismatch(key, name, values.shape, values.dtype, expected)
    return values


def validate_model_record(content: Mapping[str, Any], key: str, template: Mapping[str, NDArray]) -> dict[str, NDArray]:
    """The arrays of ArrayRecord ``key``: same names, shapes and dtypes as ``template``, all finite.

    The returned arrays may be read-only views of the reply's payload.
    """
    record = _record(content, key, "ArrayRecord")
    try:
        items = list(record.items())
    except AttributeError as error:
        raise ReplyRejected(f"'{key}' is not an ArrayRecord") from error
    names = [name for name, _ in items]
    if names != list(template):
        raise ReplyRejected(f"{key} arrays {_names_text(names)} ({len(names)}) differ from {list(template)}")
    model = {}
    for name, array in items:
        values = _decoded_checked(key, name, array, template[name])
        if not np.all(np.isfinite(values)):
            raise ReplyRejected(f"{key} array '{name}' has NaN or Inf entries")
        model[name] = values
    return model


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
    metrics = _metrics(content)
    cluster = _integer(metrics, protocol.CLUSTER, 0, num_clusters - 1)
    client_id = _integer(metrics, protocol.CLIENT_ID, 0, 2**62)
    num_examples = _num_examples(metrics)
    losses = _vector(metrics, protocol.LOSSES, num_clusters)
    _route_distribution(metrics, num_clusters, cluster)
    _optional_metrics(metrics, num_clusters if num_arms is None else num_arms)
    preferred = _integer(metrics, protocol.PREFERRED, 0, num_clusters - 1) if protocol.PREFERRED in metrics \
        else int(np.argmin(losses))
    model = validate_model_record(content, protocol.MODEL, template)
    return TrainReply(client_id=client_id, cluster=cluster, num_examples=num_examples, model=model, metrics=metrics,
                      train_metrics=validate_train_metrics(content), preferred=preferred)


def validate_provisional_reply(content: Mapping[str, Any], num_clusters: int) -> ProvisionalReply:
    """Check a provisional-Greedy report (cluster, num-examples, client-id)."""
    metrics = _metrics(content)
    return ProvisionalReply(
        client_id=_integer(metrics, protocol.CLIENT_ID, 0, 2**62),
        cluster=_integer(metrics, protocol.CLUSTER, 0, num_clusters - 1),
        num_examples=_num_examples(metrics),
    )


def validate_identity_reply(content: Mapping[str, Any]) -> IdentityReply:
    """Check an identification (client-id, num-examples)."""
    metrics = _metrics(content)
    return IdentityReply(client_id=_integer(metrics, protocol.CLIENT_ID, 0, 2**62), num_examples=_num_examples(metrics))


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
        model_metrics=validate_model_metrics(content, num_clusters),
    )


def validate_model_metrics(content: Mapping[str, Any], num_clusters: int) -> dict[str, NDArray[np.float64]]:
    """The optional ``evaluate-metrics`` MetricRecord: at most 64 names, each a list of ``K`` finite numbers."""
    if protocol.EVALUATE_METRICS not in content:
        return {}
    record = content[protocol.EVALUATE_METRICS]
    if not isinstance(record, (MetricRecord, dict)):
        raise ReplyRejected(f"'{protocol.EVALUATE_METRICS}' must be a MetricRecord, got {describe(record)}")
    metrics = dict(record.items())
    if len(metrics) > MAX_TRAIN_METRICS:
        raise ReplyRejected(f"'{protocol.EVALUATE_METRICS}' holds {len(metrics)} keys; at most {MAX_TRAIN_METRICS}")
    if any(not isinstance(key, str) or len(key) > TEXT_LIMIT for key in metrics):
        raise ReplyRejected(f"'{protocol.EVALUATE_METRICS}' has a key longer than {TEXT_LIMIT} characters")
    return {key: _vector(metrics, key, num_clusters) for key in metrics}


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
MAX_TRAIN_METRIC_VALUES = 1024
"""Most values one ``train-metrics`` list may hold."""


def validate_train_metrics(content: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The optional ``train-metrics`` MetricRecord: at most 64 keys, finite numbers or lists of them; None if absent."""
    if protocol.TRAIN_METRICS not in content:
        return None
    record = content[protocol.TRAIN_METRICS]
    if not isinstance(record, (MetricRecord, dict)):
        raise ReplyRejected(f"'{protocol.TRAIN_METRICS}' must be a MetricRecord, got {describe(record)}")
    metrics = dict(record.items())
    if len(metrics) > MAX_TRAIN_METRICS:
        raise ReplyRejected(f"'{protocol.TRAIN_METRICS}' holds {len(metrics)} keys; at most {MAX_TRAIN_METRICS}")
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


__all__.append("validate_train_metrics")
