"""Property tests of the bounded records (issue 11): whatever a reply holds, its rejection stays small.

Hypothesis generates replies with oversized lists, long or control-character
text in record and array names, error replies with arbitrary text, route
distributions that are not distributions over the route, and arrays whose
declared shape, dtype or payload size lies.  For each: the reply is rejected,
the reason names the field, is at most a few hundred printable ASCII
characters, and holds no piece of the offending value; oversized payloads are
refused before they are decoded.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedroute import protocol
from fedroute.monitoring.telemetry import short_reason
from fedroute.strategies.rejections import MAX_REASON
from fedroute.strategies.validation import (
    ROUTE_DISTRIBUTION_TOLERANCE,
    ReplyRejected,
    printable,
    validate_evaluate_reply,
    validate_train_reply,
)
from support.replies import error_reply, strategy

K = 3
TEMPLATE = {"w": np.zeros((2, 3))}
PROPERTIES = settings(max_examples=200, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REASON_LIMIT = 300


def _metrics(cluster: int = 1) -> dict[str, Any]:
    return {protocol.CLUSTER: cluster, protocol.CLIENT_ID: 4, protocol.NUM_EXAMPLES: 10,
            protocol.LOSSES: [0.5] * K, protocol.ROUTE_DISTRIBUTION: [float(k == cluster) for k in range(K)]}


def _content(metrics: dict[str, Any], model: Any = None) -> RecordDict:
    return RecordDict({protocol.METRICS: MetricRecord(metrics),
                       protocol.MODEL: model if model is not None else ArrayRecord({"w": Array(np.ones((2, 3)))})})


def _assert_bounded(reason: str, key: str) -> None:
    assert f"'{key}'" in reason or key in reason, reason
    assert len(reason) <= REASON_LIMIT and reason.isascii() and reason.isprintable(), reason


_LONG_LISTS = st.integers(K + 1, 200_000).map(lambda n: [0.125] * n)
_NUMBERS = st.floats(allow_nan=True, allow_infinity=True)


@PROPERTIES
@given(key=st.sampled_from([protocol.LOSSES, protocol.ROUTE_DISTRIBUTION, protocol.EXP3_LOG_WEIGHTS,
                            protocol.CLUSTER, protocol.NUM_EXAMPLES, protocol.FEEDBACK, protocol.ROUNDS_PLAYED]),
       value=st.one_of(_LONG_LISTS, st.lists(_NUMBERS, max_size=40).filter(lambda v: not 1 <= len(v) <= K)))
def test_reasons_for_lists_name_the_field_and_their_length_only(key: str, value: list) -> None:
    metrics = {**_metrics(), key: value}
    with pytest.raises(ReplyRejected) as caught:
        validate_train_reply(_content(metrics), K, TEMPLATE, num_arms=2)
    reason = str(caught.value)
    _assert_bounded(reason, key)
    assert "0.125, 0.125" not in reason


_TEXT = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=3000)


@PROPERTIES
@given(names=st.lists(_TEXT, min_size=1, max_size=12, unique=True))
def test_reasons_for_record_and_array_names_are_escaped_and_cut(names: list[str]) -> None:
    arrays = ArrayRecord({name: Array(np.ones(2)) for name in names})
    with pytest.raises(ReplyRejected) as caught:
        validate_train_reply(_content(_metrics(), model=arrays), K, TEMPLATE)
    _assert_bounded(str(caught.value), protocol.MODEL)
    content = RecordDict({name: ConfigRecord({"x": 1}) for name in names})
    with pytest.raises(ReplyRejected) as caught:
        validate_evaluate_reply(content, K)
    _assert_bounded(str(caught.value), protocol.METRICS)


@PROPERTIES
@given(text=st.text(max_size=5000))
def test_error_replies_are_recorded_escaped_and_cut(text: str) -> None:
    made = strategy()
    made.aggregate_train(1, [error_reply(7, text)])
    (entry,) = made.rejected
    assert entry["reason"] == f"error reply: {printable(short_reason(text))}"  # tracebacks to one line, escaped
    assert len(entry["reason"]) <= MAX_REASON and entry["reason"].isascii() and entry["reason"].isprintable()


@st.composite
def bad_distributions(draw: st.DrawFn) -> tuple[int, list[float], str]:
    cluster = draw(st.integers(0, K - 1))
    kind = draw(st.sampled_from(["negative", "sum", "zero at the route"]))
    values = draw(st.lists(st.floats(0.0, 1.0), min_size=K, max_size=K))
    if kind == "negative":
        values[draw(st.integers(0, K - 1))] = draw(st.floats(-1e6, -1e-9))
    elif kind == "sum":
        total = sum(values)
        target = draw(st.one_of(st.floats(0.0, 1.0 - 1e-4), st.floats(1.0 + 1e-4, 10.0)))
        values = [v * target / total for v in values] if total > 0 else [target / K] * K
        values[cluster] = max(values[cluster], 1e-3)
        assume_sum = sum(values)
        if abs(assume_sum - 1.0) <= ROUTE_DISTRIBUTION_TOLERANCE:
            values[cluster] += 0.5
    else:
        values[cluster] = 0.0
        rest = [k for k in range(K) if k != cluster]
        values = [0.0 if k == cluster else 1.0 / len(rest) for k in range(K)]
    return cluster, values, kind


@PROPERTIES
@given(case=bad_distributions())
def test_route_distributions_must_be_distributions_with_mass_on_the_route(case: tuple[int, list[float], str]) -> None:
    cluster, values, _ = case
    metrics = {**_metrics(cluster), protocol.ROUTE_DISTRIBUTION: values}
    with pytest.raises(ReplyRejected, match=f"'{protocol.ROUTE_DISTRIBUTION}'"):
        validate_train_reply(_content(metrics), K, TEMPLATE)


@PROPERTIES
@given(cluster=st.integers(0, K - 1), raw=st.lists(st.floats(0.0, 1.0), min_size=K, max_size=K))
def test_any_distribution_with_mass_on_the_route_is_accepted(cluster: int, raw: list[float]) -> None:
    raw[cluster] = max(raw[cluster], 1e-6)
    values = [v / sum(raw) for v in raw]
    metrics = {**_metrics(cluster), protocol.ROUTE_DISTRIBUTION: values}
    assert validate_train_reply(_content(metrics), K, TEMPLATE).cluster == cluster


@st.composite
def lying_arrays(draw: st.DrawFn) -> tuple[Array, str]:
    """An Array whose declared fields or payload contradict the template (2, 3) float64."""
    kind = draw(st.sampled_from(["declared shape", "declared dtype", "payload too long", "payload too short",
                                 "payload contradicts the fields"]))
    good = Array(np.ones((2, 3)))
    if kind == "declared shape":
        shape = draw(st.lists(st.integers(0, 10**6), max_size=12).map(tuple).filter(lambda s: s != (2, 3)))
        return Array(dtype="float64", shape=shape, stype=good.stype, data=good.data), kind
    if kind == "declared dtype":
        dtype = draw(st.sampled_from(["float32", "int64", "object", "<U5", "complex128", "x" * 500]))
        return Array(dtype=dtype, shape=(2, 3), stype=good.stype, data=good.data), kind
    if kind == "payload too long":
        extra = draw(st.integers(4097, 3_000_000))
        return Array(dtype="float64", shape=(2, 3), stype=good.stype, data=good.data + b"\0" * extra), kind
    if kind == "payload too short":
        return Array(dtype="float64", shape=(2, 3), stype=good.stype, data=good.data[:draw(st.integers(0, 47))]), kind
    other = Array(np.ones((3, 2)))  # the payload's own header says (3, 2), the fields (2, 3)
    return Array(dtype="float64", shape=(2, 3), stype=other.stype, data=other.data + b"\0" * 8), kind


@PROPERTIES
@given(case=lying_arrays())
def test_arrays_whose_fields_or_payload_lie_are_refused(case: tuple[Array, str]) -> None:
    array, _ = case
    with pytest.raises(ReplyRejected) as caught:
        validate_train_reply(_content(_metrics(), model=ArrayRecord({"w": array})), K, TEMPLATE)
    _assert_bounded(str(caught.value), f"{protocol.MODEL} array 'w'")


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_values_in_lists_are_named(value: float) -> None:
    metrics = {**_metrics(), protocol.LOSSES: [0.5, value, 0.5]}
    with pytest.raises(ReplyRejected, match=f"'{protocol.LOSSES}' has non-finite"):
        validate_train_reply(_content(metrics), K, TEMPLATE)
