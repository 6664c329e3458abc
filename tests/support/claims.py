"""One client claiming many times its samples, in both runtimes: Flower handlers and a simulator task.

``num-examples`` is a client's claim; its local training does not depend on it.  The
wrapped handlers multiply the claim in every reply of the nodes holding the listed
partitions (partition ``i`` is client ``i`` of the built-in tasks), and
:class:`ClaimingTask` multiplies the same clients' ``num_examples`` in the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from flwr.app import Context, Message

from fedroute import protocol
from support.grid import Handler


def claiming_handlers(handlers: Mapping[str, Handler], claims: Mapping[int, int]) -> dict[str, Handler]:
    """``handlers`` whose replies from partition ``i`` claim ``claims[i]`` × their ``num-examples``."""

    def wrapped(handler: Handler) -> Handler:
        def handle(message: Message, context: Context) -> Message:
            answer = handler(message, context)
            factor = claims.get(int(context.node_config["partition-id"]))
            if factor is not None and answer.has_content() and protocol.METRICS in answer.content.metric_records:
                metrics = answer.content.metric_records[protocol.METRICS]
                if protocol.NUM_EXAMPLES in metrics:
                    metrics[protocol.NUM_EXAMPLES] = metrics[protocol.NUM_EXAMPLES] * factor
            return answer
        return handle

    return {message_type: wrapped(handler) for message_type, handler in handlers.items()}


@dataclass(frozen=True)
class ClaimingTask:
    """``task`` whose clients ``claims`` (client id → factor) claim ``factor`` × their ``num_examples``."""

    task: Any
    claims: Mapping[int, int]

    def __getattr__(self, name: str) -> Any:  # everything else is the task's own
        return getattr(self.task, name)

    @property
    def num_clients(self) -> int:
        return self.task.num_clients

    def initial_models(self, num_clusters: int) -> np.ndarray:
        return self.task.initial_models(num_clusters)

    def clients(self, client_ids: np.ndarray) -> Any:
        batch = self.task.clients(client_ids)
        factors = np.array([self.claims.get(int(client), 1) for client in batch.client_ids], dtype=np.int64)
        return replace(batch, num_examples=batch.num_examples * factors)
