"""Flower in this process: a ``Grid`` whose nodes are handler functions, and the ServerApp on it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Optional

from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

Handler = Callable[[Message, Context], Message]

FIRST_NODE_ID = 1000
"""Node ``FIRST_NODE_ID + i`` holds partition ``i``."""

SERVER_RUN_ID = 77
"""The run id :func:`server_main` gives the ServerApp (its results land in ``results-dir/77``)."""


@contextlib.contextmanager
def server_task_identity() -> Iterator[None]:
    """Flower stamps new messages with the running task's identity; give this process a ServerApp's."""
    previous = TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    try:
        yield
    finally:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = previous


def builtin_handlers() -> dict[str, Handler]:
    """fedroute's built-in ClientApp (``fedroute.client.app``), one handler per message type."""
    from fedroute.client import app as client

    return {MessageType.TRAIN: client.train, MessageType.QUERY: client.provisional,
            MessageType.EVALUATE: client.evaluate}


class InProcessGrid:
    """A Flower ``Grid`` whose nodes are handler functions in this process.

    Node ``1000 + i`` has ``node_config = {partition-id: i, num-partitions: n}``
    and keeps its ``Context`` (hence ``context.state``) across messages, as
    Flower keeps it.

    Parameters
    ----------
    handlers : dict
        Message type → ``handler(message, context) -> reply``.
    num_nodes : int
        How many nodes.
    run_config : Mapping, optional
        Every node's ``context.run_config`` (the built-in ClientApp reads its task from it).
    fail_evaluation : bool, default False
        Answer every EVALUATE message with an error reply instead.
    node_ids : sequence of int, optional
        The nodes' ids (partition ``i`` on ``node_ids[i]``; e.g. random 64-bit ids, as Flower
        draws them anew for every simulation); ``1000 + i`` by default.

    A message type without a handler gets an error reply, as Flower gives one.
    """

    def __init__(self, handlers: Mapping[str, Handler], num_nodes: int, run_config: Optional[Mapping[str, Any]] = None,
                 fail_evaluation: bool = False, node_ids: Optional[Sequence[int]] = None) -> None:
        self.handlers = dict(handlers)
        self.fail_evaluation = fail_evaluation
        ids = [FIRST_NODE_ID + i for i in range(num_nodes)] if node_ids is None else [int(n) for n in node_ids]
        self.contexts = {
            node: Context(run_id=1, node_id=node, state=RecordDict(),
                          node_config={"partition-id": i, "num-partitions": num_nodes},
                          run_config=dict(run_config or {}))
            for i, node in enumerate(ids)
        }
        self.sent: list[Message] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Any, timeout: Optional[float] = None) -> list[Message]:
        replies = []
        for message in messages:
            self.sent.append(message)
            if self.fail_evaluation and message.metadata.message_type == MessageType.EVALUATE:
                replies.append(Message(error=Error(code=1, reason="evaluation crashed"), reply_to=message))
                continue
            handler = self.handlers.get(message.metadata.message_type)
            if handler is None:
                replies.append(Message(error=Error(code=0, reason=f"no {message.metadata.message_type} handler"),
                                       reply_to=message))
                continue
            replies.append(handler(message, self.contexts[message.metadata.dst_node_id]))
        return replies

    def count(self, message_type: str, phase: str) -> int:
        """Messages sent of one type and ``phase`` (the ConfigRecord's ``phase`` key)."""
        from fedroute import protocol

        return sum(1 for m in self.sent if m.metadata.message_type == message_type
                   and m.content.config_records[protocol.CONFIG].get(protocol.PHASE) == phase)


def builtin_grid(num_nodes: int, run_config: Mapping[str, Any], fail_evaluation: bool = False) -> InProcessGrid:
    """``num_nodes`` nodes running fedroute's built-in ClientApp with ``run_config``."""
    return InProcessGrid(builtin_handlers(), num_nodes, run_config, fail_evaluation)


def server_main(grid: InProcessGrid, run_config: Mapping[str, Any]) -> None:
    """fedroute's ServerApp ``main`` on ``grid`` (run id :data:`SERVER_RUN_ID`)."""
    from fedroute.server.app import main

    main(grid, Context(run_id=SERVER_RUN_ID, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                       run_config=dict(run_config)))


def node_context(partition_id: int = 3) -> Context:
    """A fresh ClientApp ``Context`` of node 1 holding ``partition-id`` (a restarted node: empty state)."""
    return Context(run_id=1, node_id=1, node_config={"partition-id": partition_id}, state=RecordDict(),
                   run_config={})
