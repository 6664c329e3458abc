"""What a routing client reads from a server message: the config, the models, the health view.

Torch-free decoding shared by every ClientApp (:mod:`fedroute.client.handlers`).  A
``check_layout`` decode checks every received model against the client's module
(``clients.check_template``, a :class:`~fedroute.client.torch_adapter.TorchClient`'s).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from flwr.app import ArrayRecord, Message

from fedroute import protocol
from fedroute.core.health import RoutingView
from fedroute.core.task import ClientBatch
from fedroute.strategies.records import decode_array

__all__ = ["message_config", "routing_config", "cluster_models", "global_part", "received_view", "is_identification",
           "received_orders"]


def is_identification(message: Message) -> bool:
    """Whether a ``QUERY`` is the strategy's identification (partial participation: no models, answer who you are)."""
    records = message.content.config_records
    return protocol.CONFIG in records and records[protocol.CONFIG].get(protocol.PHASE) == protocol.PHASE_IDENTIFY


def message_config(message: Message) -> dict[str, Any]:
    """The message's ``config`` record as a dict (empty without one)."""
    records = message.content.config_records
    return dict(records[protocol.CONFIG].items()) if protocol.CONFIG in records else {}


def routing_config(message: Message) -> dict[str, Any]:
    """The ``config`` record of a message of fedroute's strategies.

    Raises
    ------
    ValueError
        If the record lacks the routing keys (the message was not sent by ClusteredRouting or FedCAM).
    """
    config = message_config(message)
    if protocol.RUN_KEY not in config:
        raise ValueError(f"this {message.metadata.message_type!r} message (records {list(message.content)}) was not "
                         "sent by fedroute's ClusteredRouting: its ConfigRecord 'config' has no routing keys. "
                         "Use ClusteredRouting (or FedCAM) as the ServerApp's strategy")
    return config


def _decoded(record: ArrayRecord, clients: ClientBatch, check_layout: bool) -> dict[str, np.ndarray]:
    """An ArrayRecord as numpy arrays, checked against the client's module when ``check_layout``."""
    arrays = {name: decode_array(array) for name, array in record.items()}
    if check_layout:
        clients.check_template(arrays)
    return arrays


def cluster_models(message: Message, num_clusters: int, clients: ClientBatch,
                   check_layout: bool = False) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The ``K`` broadcast models as a (K, P) float64 array, and cluster 0's arrays (the reply template)."""
    keys = [protocol.cluster_key(k) for k in range(num_clusters)]
    records = message.content.array_records  # a new view per access: read once
    missing = [key for key in keys if key not in records]
    if missing:
        raise ValueError(f"the message lacks the cluster models {missing} (records: {list(message.content)})")
    decoded = [_decoded(records[key], clients, check_layout) for key in keys]
    return protocol.stack_flat(decoded), decoded[0]


def global_part(message: Message, clients: ClientBatch, check_layout: bool = False) -> np.ndarray:
    """FedCAM's ``Θ_glob`` (the ``global-model`` record) as a flat vector."""
    records = message.content.array_records
    if protocol.GLOBAL_MODEL not in records:
        raise ValueError(f"a FedCAM message needs the ArrayRecord '{protocol.GLOBAL_MODEL}'")
    return protocol.flatten_arrays(_decoded(records[protocol.GLOBAL_MODEL], clients, check_layout))


def received_view(config: dict[str, Any], num_clusters: int) -> Optional[RoutingView]:
    """The server's health view in a message (one row), or None when it sent none."""
    if protocol.EXPLORE not in config:
        return None
    merged = np.asarray(config[protocol.MERGED_INTO], dtype=np.int64).reshape(1, -1)
    spare = np.asarray(config[protocol.SPARE], dtype=bool).reshape(1, -1)
    if merged.shape[1] != num_clusters or spare.shape[1] != num_clusters \
            or merged.min(initial=-1) < -1 or merged.max(initial=-1) >= num_clusters:
        raise ValueError(f"the message's '{protocol.MERGED_INTO}'/'{protocol.SPARE}' do not describe "
                         f"{num_clusters} clusters")
    return RoutingView(explore=np.array([bool(config[protocol.EXPLORE])]), merged_into=merged, spare=spare)


def received_orders(message: Message, num_clusters: int) -> tuple[Optional[np.ndarray], bool]:
    """The signature start's orders in a ``TRAIN`` message: the held route as a one-client array (None: free) and
    whether to send the signature; ``(None, False)`` when the message has none."""
    records = message.content.config_records
    if protocol.SIGNATURE_ORDERS not in records:
        return None, False
    orders = dict(records[protocol.SIGNATURE_ORDERS].items())
    held = orders.get(protocol.HELD_ROUTE, -1)
    if isinstance(held, bool) or not isinstance(held, int) or not -1 <= held < num_clusters:
        raise ValueError(f"the message's '{protocol.HELD_ROUTE}' = {held!r} is not a cluster in "
                         f"[-1, {num_clusters - 1}]")
    return (None if held < 0 else np.array([held], dtype=np.int64)), bool(orders.get(protocol.SEND_SIGNATURE, False))
