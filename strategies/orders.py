"""The signature start's per-node orders in a ``TRAIN`` message: the held route, and whether to send a signature.

The server's :class:`~fedroute.core.signature_start.SignatureState` is per client; Flower addresses nodes.  A
node's client is the one it is bound to (:mod:`fedroute.strategies.identity`); a node not bound yet (its first
reply under full participation) is asked for its signature and is free.  The orders are the same pure
functions the batched simulator calls (:func:`fedroute.core.signature_start.signature_orders`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np
from flwr.app import ConfigRecord
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.core.participation import Participation
from fedroute.core.server_step import ServerState
from fedroute.core.settings import RoutingSettings
from fedroute.core.signature_start import signature_orders

__all__ = ["node_orders"]


def node_orders(server: ServerState, client_of_node: dict[int, int], node_ids: Sequence[int], round_index: int,
                settings: RoutingSettings, participation: Participation,
                cluster_models: Sequence[Mapping[str, NDArray]]) -> Optional[dict[int, ConfigRecord]]:
    """Node id → its :data:`~fedroute.protocol.SIGNATURE_ORDERS` record for round ``t``; None without the start.
    ``cluster_models`` (``W^t``) are read in round 0 only: which runs the start acts in."""
    if settings.signature_hold_rounds <= 0:           # signature_orders' own check, made before stacking W^0
        return None
    row_of = {int(client): row for row, client in enumerate(server.federation.client_ids)}
    rows = np.array([row_of.get(client_of_node.get(node, -1), -1) for node in node_ids], dtype=np.int64)
    orders = signature_orders(server.signatures, rows, np.zeros(len(rows), dtype=np.int64), round_index, settings,
                              participation, protocol.stack_flat(cluster_models) if round_index == 0 else None)
    assert orders is not None                          # the signature start is on (checked above)
    held = np.full(len(rows), -1, dtype=np.int64) if orders.held is None else orders.held
    return {int(node): ConfigRecord({protocol.HELD_ROUTE: int(route), protocol.SEND_SIGNATURE: bool(wanted)})
            for node, route, wanted in zip(node_ids, held, orders.wanted)}
