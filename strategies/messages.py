"""The messages a strategy sends: their common ConfigRecord entries and one RecordDict per node.

:func:`common_config` is what every message carries (extra client config, the algorithm's entries, the
routing, the seed and run key); :func:`masses_config` the masses and the server's health view a training
round adds; :func:`node_messages` builds a round's messages from records built once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Mapping, Optional

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.core.server_step import ServerState
from fedroute.core.settings import RoutingSettings

__all__ = ["common_config", "masses_config", "node_messages"]


def common_config(client_config: Mapping[str, Any], algorithm_config: Mapping[str, Any], routing: RoutingSettings,
                  seed: int, run_key: str) -> dict[str, Any]:
    """The ConfigRecord entries every message carries: extra client config, the algorithm's, the routing."""
    return {**client_config, **algorithm_config, **protocol.routing_config(routing.to_dict()),
            protocol.SEED: seed, protocol.RUN_KEY: run_key}


def masses_config(masses: Optional[NDArray[np.float64]], server: ServerState, num_clusters: int) -> dict[str, Any]:
    """The masses and, when the routing reads it, the server's health view (:mod:`fedroute.core.health`)."""
    config: dict[str, Any] = {
        protocol.HAS_MASSES: masses is not None,
        protocol.MASSES: [float(m) for m in (masses if masses is not None else np.zeros(num_clusters))],
    }
    if (view := server.view) is not None:
        config.update({protocol.EXPLORE: bool(view.explore[0]),
                       protocol.MERGED_INTO: [int(k) for k in view.merged_into[0]],
                       protocol.SPARE: [bool(flag) for flag in view.spare[0]]})
    return config


def node_messages(node_ids: Iterable[int], message_type: str, records: dict[str, ArrayRecord],
                  node_records: Callable[[int, dict[str, ArrayRecord]], dict[str, ArrayRecord]],
                  config: Mapping[str, Any]) -> list[Message]:
    """One RecordDict per node holding ``node_records(node, records)`` and one ConfigRecord of ``config``,
    built once and shared by every message.

    Sharing is safe: Flower delivers a copy of each message's content (the simulation pickles it to the
    ClientApp's Ray actor, deployment serialises it to the SuperLink), and the strategy never changes a
    record it sent (a changed model gets a new record); ``tests/test_shared_records.py`` checks that one
    ClientApp overwriting what it received changes nothing for the others.
    """
    config_record = ConfigRecord(dict(config))
    return [Message(content=RecordDict({**node_records(node_id, records), protocol.CONFIG: config_record}),
                    message_type=message_type, dst_node_id=node_id) for node_id in node_ids]
