"""Which nodes a round asks: waiting for them, sampling clients, sampling an evaluation.

Training samples *clients*, not Flower node ids (:mod:`fedroute.core.participation`): with
``fraction_train < 1`` the draw is over the client ids of the connected nodes (each node is asked
once which client it serves, an identification ``QUERY``) from ``(seed, client id, t)``, so the
same seed gives the same clients in every run and in the simulator.  An evaluation during training
asks ``fraction_evaluate`` of the connected nodes, drawn from ``(seed, server_round)``.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedroute import protocol
from fedroute.core.participation import Participation
from fedroute.core.randomness import Purpose, generator

__all__ = ["connected_nodes", "sampled_nodes", "evaluation_nodes", "identification_messages",
           "unidentified_error"]


def connected_nodes(grid: Grid, needed: int, timeout: float) -> list[int]:
    """The connected node ids, sorted, once at least ``needed`` are (``RuntimeError`` after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while len(node_ids := sorted(grid.get_node_ids())) < needed:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(node_ids)} nodes connected after {timeout} s; "
                               f"min_available_nodes/min_train_nodes require {needed}")
        time.sleep(0.5)
    return node_ids


def sampled_nodes(client_of_node: Mapping[int, int], participation: Participation, seed: int,
                  server_round: int) -> list[int]:
    """The nodes whose clients the round samples, with ``t = server_round − 1`` (the provisional
    exchange, ``server_round = 0``, uses round 0's sample)."""
    sampled = set(participation.sample(np.array(list(client_of_node.values()), dtype=np.int64), seed,
                                       max(server_round - 1, 0)).tolist())
    return sorted(node for node, client in client_of_node.items() if client in sampled)


def evaluation_nodes(node_ids: Sequence[int], count: int, seed: int, server_round: int) -> list[int]:
    """``count`` of the sorted ``node_ids`` (all if there are no more), drawn from ``(seed, server_round)``."""
    if count >= len(node_ids):
        return list(node_ids)
    chosen = generator(seed, 0, server_round, Purpose.EVALUATE_SAMPLING).choice(len(node_ids), count, replace=False)
    return sorted(node_ids[i] for i in chosen)


def identification_messages(node_ids: Sequence[int], config: Mapping[str, Any], server_round: int) -> list[Message]:
    """One identification ``QUERY`` per node (``config``: the run's common entries)."""
    record = ConfigRecord({**config, protocol.PHASE: protocol.PHASE_IDENTIFY, protocol.SERVER_ROUND: server_round})
    return [Message(content=RecordDict({protocol.CONFIG: record}), message_type=MessageType.QUERY, dst_node_id=node)
            for node in node_ids]


def unidentified_error(fraction_train: float, num_nodes: int) -> RuntimeError:
    """No connected node said which client it serves: name the handler the ClientApp lacks."""
    return RuntimeError(
        f"partial participation (fraction_train = {fraction_train}) samples clients, not nodes, so the "
        f"strategy asks every node once for its client id with a QUERY message; none of the {num_nodes} "
        "connected nodes answered validly (see the rejected replies). Register a query handler in the "
        "ClientApp: @app.query() returning fedroute.routing_query(msg, context, model, loss_fn, num_examples)")
