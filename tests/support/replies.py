"""Crafted training replies, as the SuperLink delivers them, and a strategy to receive them."""

from __future__ import annotations

import itertools
import time
from typing import Any, Optional

import numpy as np
from flwr.app import DEFAULT_TTL, Array, ArrayRecord, Error, Message, MessageType, Metadata, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID

from fedroute import protocol
from fedroute.core.settings import RoutingSettings
from fedroute.strategies.clustered import ClusteredRouting

SHAPE = (3,)
"""The shape of the one array (``"w"``) of the crafted models."""

ROUTING = RoutingSettings(num_clusters=2, controllers=("gr",))
"""The routing settings of :func:`strategy`."""

_message_ids = itertools.count(1)


def train_instruction(node_id: int, server_round: int) -> Message:
    """The TRAIN instruction a reply answers, as the SuperLink would have stored it.

    ``Message(content, dst_node_id, message_type)`` needs a running task identity
    (``TaskIdentity.run_id``), so the metadata is given explicitly instead.
    """
    metadata = Metadata(run_id=1, message_id=f"instruction-{next(_message_ids)}", src_node_id=SUPERLINK_NODE_ID,
                        dst_node_id=node_id, reply_to_message_id="", group_id=str(server_round),
                        created_at=time.time(), ttl=DEFAULT_TTL, message_type=MessageType.TRAIN)
    return Message(content=RecordDict(), metadata=metadata)


def train_metrics(client_id: int, cluster: int, num_examples: Any, num_clusters: int = 2) -> dict[str, Any]:
    """A valid training reply's metrics: routed to ``cluster`` with certainty, loss 0.5 on every model."""
    return {protocol.CLUSTER: cluster, protocol.CLIENT_ID: client_id, protocol.NUM_EXAMPLES: num_examples,
            protocol.LOSSES: [0.5] * num_clusters,
            protocol.ROUTE_DISTRIBUTION: [float(k == cluster) for k in range(num_clusters)]}


def reply(node_id: int, client_id: int, cluster: int, num_examples: Any, value: Any, *, server_round: int = 1,
          global_value: Any = None, metrics: Optional[dict[str, Any]] = None,
          model: Optional[ArrayRecord] = None) -> Message:
    """A training reply from ``node_id`` as the SuperLink delivers it (model = ``value`` everywhere)."""
    content = RecordDict({
        protocol.METRICS: MetricRecord(metrics if metrics is not None else train_metrics(client_id, cluster,
                                                                                         num_examples)),
        protocol.MODEL: model if model is not None else ArrayRecord({"w": Array(np.full(SHAPE, value, dtype=np.float64))}),
    })
    if global_value is not None:
        content[protocol.GLOBAL_MODEL] = ArrayRecord({"w": Array(np.full(SHAPE, global_value, dtype=np.float64))})
    return Message(content=content, reply_to=train_instruction(node_id, server_round))


def error_reply(node_id: int, reason: str, server_round: int = 1) -> Message:
    """An error reply (``Error(code=3, reason)``) from ``node_id``."""
    return Message(error=Error(code=3, reason=reason), reply_to=train_instruction(node_id, server_round))


def strategy(kind: type = ClusteredRouting, **kwargs: Any) -> ClusteredRouting:
    """A ``kind`` strategy with :data:`ROUTING`, cluster models 0 and 1 (shape :data:`SHAPE`), in a 10-round run."""
    made = kind(ROUTING, **kwargs)
    made.cluster_models = [{"w": np.zeros(SHAPE)}, {"w": np.ones(SHAPE)}]
    made._num_rounds = 10
    return made


class OnlineNodes:
    """The part of a Flower ``Grid`` the identity check uses."""

    def __init__(self, node_ids: set[int]) -> None:
        self.node_ids = set(node_ids)

    def get_node_ids(self) -> list[int]:
        return sorted(self.node_ids)
