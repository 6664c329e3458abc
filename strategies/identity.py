"""Which Flower node speaks for which client: bindings made by first use, checked on every reply.

A reply names its client (``client-id``) itself, so without a check any node
could speak for another client: reply first with its id, get its model
averaged in and the honest reply dropped as a duplicate.  The first *valid*
reply of a client id in a run binds that id to the node it came from (and the
node to that id: one node, one client); later replies must come from the
bound node.  A reply that breaks a binding is rejected with both node ids.

A SuperNode that restarts comes back with a new node id.  Its client may move
to the new node only when the bound node is no longer connected (not among
``grid.get_node_ids()``): the binding moves and a WARNING names both ids.
Flower lists a node as connected until its heartbeat expires (≈ 60 s after a
SIGKILL, at once after a SIGTERM), so a node restarted sooner is refused until
then.  The bindings are part of the strategy's checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any, Mapping, Optional

__all__ = ["ClientBindings", "IdentityRejected"]

logger = logging.getLogger("fedroute")


class IdentityRejected(ValueError):
    """A reply's client id is bound to another node (or its node to another client id)."""


class ClientBindings:
    """Client id ↔ node id, bound on first use within a run."""

    def __init__(self) -> None:
        self.node_of_client: dict[int, int] = {}
        self.client_of_node: dict[int, int] = {}

    def admit(self, client_id: int, node_id: int, online_nodes: Optional[Callable[[], Collection[int]]] = None) -> None:
        """Accept ``node_id`` speaking for ``client_id`` (binding both if new), or raise :class:`IdentityRejected`.

        Parameters
        ----------
        client_id, node_id : int
            The reply's claimed client and the node it came from.
        online_nodes : callable, optional
            The connected node ids (``grid.get_node_ids``); without it every
            bound node counts as connected, so no binding ever moves.
        """
        bound_node = self.node_of_client.get(client_id)
        bound_client = self.client_of_node.get(node_id)
        if bound_node == node_id:
            return
        prefix = f"reply for client {client_id} from node {node_id}: "
        if bound_node is not None and (online_nodes is None or bound_node in set(online_nodes())):
            raise IdentityRejected(f"{prefix}client {client_id} is bound to node {bound_node}, which is connected")
        if bound_client is not None:
            raise IdentityRejected(f"{prefix}node {node_id} speaks for client {bound_client}")
        if bound_node is not None:
            logger.warning("client %d moves from node %d (no longer connected) to node %d",
                           client_id, bound_node, node_id)
            del self.client_of_node[bound_node]
        self.node_of_client[client_id] = node_id
        self.client_of_node[node_id] = client_id

    def to_json(self) -> list[list[int]]:
        """``[[client_id, node_id], ...]`` (for the checkpoint)."""
        return [[client, node] for client, node in sorted(self.node_of_client.items())]

    @classmethod
    def from_json(cls, pairs: Iterable[Any]) -> "ClientBindings":
        """Inverse of :meth:`to_json`; raises ``ValueError`` on a malformed list."""
        bindings = cls()
        for pair in pairs:
            client, node = (int(value) for value in pair)
            if client in bindings.node_of_client or node in bindings.client_of_node:
                raise ValueError(f"client {client} or node {node} is bound twice")
            bindings.node_of_client[client] = node
            bindings.client_of_node[node] = client
        return bindings

    def __len__(self) -> int:
        return len(self.node_of_client)

    def as_mapping(self) -> Mapping[int, int]:
        """Client id → node id."""
        return dict(self.node_of_client)
