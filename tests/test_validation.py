"""Tests of reply validation: malformed replies are rejected with the field named."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedroute import protocol
from fedroute.strategies.validation import (
    ReplyRejected,
    TrainReply,
    first_reply_per_client,
    validate_train_reply,
)

K = 3
TEMPLATE = {"weights": np.zeros((2, 3)), "bias": np.zeros(2)}


def _metrics(**changes):
    values = {
        protocol.CLUSTER: 1,
        protocol.CLIENT_ID: 7,
        protocol.NUM_EXAMPLES: 40,
        protocol.LOSSES: [0.5, 0.25, 1.0],
        protocol.ROUTE_DISTRIBUTION: [0.0, 1.0, 0.0],
    }
    for key, value in changes.items():
        key = key.replace("_", "-")
        if value is _DROP:
            values.pop(key)
        else:
            values[key] = value
    cluster = values.get(protocol.CLUSTER)
    if "route_distribution" not in changes and isinstance(cluster, (int, float)) and cluster in range(K):
        values[protocol.ROUTE_DISTRIBUTION] = [float(k == cluster) for k in range(K)]  # the route's own distribution
    return values


_DROP = object()


def _model(**arrays):
    values = {"weights": np.arange(6.0).reshape(2, 3), "bias": np.array([0.5, -0.5])}
    for name, value in arrays.items():
        if value is _DROP:
            values.pop(name)
        else:
            values[name] = value
    return ArrayRecord({name: Array(value) for name, value in values.items()})


def _reply(metrics=None, model=None, drop=()):
    content = {protocol.MODEL: _model() if model is None else model,
               protocol.METRICS: MetricRecord(_metrics() if metrics is None else metrics)}
    for key in drop:
        content.pop(key)
    return RecordDict(content)


def test_accepts_a_good_reply():
    reply = validate_train_reply(_reply(), K, TEMPLATE)
    assert isinstance(reply, TrainReply)
    assert reply.cluster == 1 and reply.client_id == 7 and reply.num_examples == 40.0
    np.testing.assert_array_equal(reply.model["weights"], np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(reply.model["bias"], [0.5, -0.5])
    assert reply.metrics[protocol.LOSSES] == [0.5, 0.25, 1.0]


def test_accepts_boundary_values():
    for cluster in (0, K - 1):
        assert validate_train_reply(_reply(_metrics(cluster=cluster)), K, TEMPLATE).cluster == cluster
    assert validate_train_reply(_reply(_metrics(cluster=2.0)), K, TEMPLATE).cluster == 2
    assert validate_train_reply(_reply(_metrics(num_examples=1e9)), K, TEMPLATE).num_examples == 1e9
    assert validate_train_reply(_reply(_metrics(num_examples=0.5)), K, TEMPLATE).num_examples == 0.5


@pytest.mark.parametrize("drop, field", [((protocol.METRICS,), "metrics"), ((protocol.MODEL,), "model")])
def test_rejects_missing_record(drop, field):
    with pytest.raises(ReplyRejected, match=field):
        validate_train_reply(_reply(drop=drop), K, TEMPLATE)


@pytest.mark.parametrize("value", [_DROP, -1, K, 1.5, 10**6])
def test_rejects_bad_cluster(value):
    with pytest.raises(ReplyRejected, match="'cluster'"):
        validate_train_reply(_reply(_metrics(cluster=value)), K, TEMPLATE)


def test_rejects_bool_cluster():
    # MetricRecord refuses bools itself, so a decoded payload is modelled with a plain mapping.
    content = {protocol.MODEL: _model(), protocol.METRICS: _metrics(cluster=True)}
    with pytest.raises(ReplyRejected, match="'cluster'"):
        validate_train_reply(content, K, TEMPLATE)


@pytest.mark.parametrize("value", [_DROP, 0, -5, math.nan, math.inf, 10**9 + 1, 1e12])
def test_rejects_bad_num_examples(value):
    with pytest.raises(ReplyRejected, match="'num-examples'"):
        validate_train_reply(_reply(_metrics(num_examples=value)), K, TEMPLATE)


@pytest.mark.parametrize("value", [_DROP, [0.5, 0.25], [0.5, 0.25, 1.0, 2.0], [0.5, math.nan, 1.0],
                                   [0.5, math.inf, 1.0]])
def test_rejects_bad_losses(value):
    with pytest.raises(ReplyRejected, match="'losses'"):
        validate_train_reply(_reply(_metrics(losses=value)), K, TEMPLATE)


def test_rejects_bad_route_distribution():
    with pytest.raises(ReplyRejected, match="'route-distribution'"):
        validate_train_reply(_reply(_metrics(route_distribution=[1.0, 0.0])), K, TEMPLATE)


@pytest.mark.parametrize("value", [_DROP, -1])
def test_rejects_bad_client_id(value):
    with pytest.raises(ReplyRejected, match="'client-id'"):
        validate_train_reply(_reply(_metrics(client_id=value)), K, TEMPLATE)


def test_rejects_missing_model_array():
    with pytest.raises(ReplyRejected, match="model arrays"):
        validate_train_reply(_reply(model=_model(bias=_DROP)), K, TEMPLATE)


def test_rejects_extra_model_array():
    with pytest.raises(ReplyRejected, match="model arrays"):
        validate_train_reply(_reply(model=_model(extra=np.zeros(1))), K, TEMPLATE)


@pytest.mark.parametrize("array, name", [
    (np.zeros((3, 2)), "weights"),                    # wrong shape
    (np.zeros(6), "weights"),                         # flattened
    (np.zeros(2, dtype=np.float32), "bias"),          # wrong dtype
    (np.zeros(2, dtype=np.int64), "bias"),
])
def test_rejects_wrong_shape_or_dtype(array, name):
    with pytest.raises(ReplyRejected, match=f"model array '{name}'"):
        validate_train_reply(_reply(model=_model(**{name: array})), K, TEMPLATE)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_rejects_non_finite_model(bad):
    weights = np.arange(6.0).reshape(2, 3)
    weights[1, 2] = bad
    with pytest.raises(ReplyRejected, match="model array 'weights'.*NaN or Inf"):
        validate_train_reply(_reply(model=_model(weights=weights)), K, TEMPLATE)


def test_rejected_is_a_value_error():
    assert issubclass(ReplyRejected, ValueError)


def test_first_reply_per_client_drops_duplicates():
    replies = [SimpleNamespace(client_id=c, tag=i) for i, c in enumerate([3, 1, 3, 2, 1, 3])]
    kept, duplicates = first_reply_per_client(replies)
    assert [(r.client_id, r.tag) for r in kept] == [(3, 0), (1, 1), (2, 3)]
    assert [(r.client_id, r.tag) for r in duplicates] == [(3, 2), (1, 4), (3, 5)]


def test_first_reply_per_client_with_key_function():
    kept, duplicates = first_reply_per_client([("a", 1), ("b", 2), ("a", 3)], client_id_of=lambda r: r[0])
    assert kept == [("a", 1), ("b", 2)] and duplicates == [("a", 3)]
