"""Accepting a round's replies: validated, bound to their node, one per client.

:func:`accepted_replies` runs every reply through its validator
(:mod:`fedroute.strategies.validation`) and the client ↔ node binding
(:mod:`fedroute.strategies.identity`), hands each rejected one with its reason to ``reject``,
and keeps the first valid reply per client, in client-id order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Collection, Iterable, Mapping, Optional

from flwr.app import Message

from fedroute.monitoring.telemetry import short_reason
from fedroute.strategies.identity import ClientBindings, IdentityRejected
from fedroute.strategies.validation import ReplyRejected, first_reply_per_client, printable

__all__ = ["accepted_replies"]


def accepted_replies(replies: Iterable[Message], validate: Callable[[Mapping[str, Any]], Any],
                     bindings: ClientBindings, online: Optional[Callable[[], Collection[int]]],
                     reject: Callable[[int, str], None]) -> list[Any]:
    """The valid replies (``node_id`` set), first per client, sorted by client id; ``reject(node, reason)``
    for each other one (``online``: the connected node ids, for a client moving to a new node)."""
    accepted = []
    for message in replies:
        node_id = message.metadata.src_node_id
        if message.has_error():
            reject(node_id, f"error reply: {printable(short_reason(message.error.reason))}")
            continue
        try:
            reply = validate(message.content)
            bindings.admit(reply.client_id, node_id, online)
        except (ReplyRejected, IdentityRejected) as error:
            reject(node_id, str(error))
            continue
        accepted.append(replace(reply, node_id=node_id))
    kept, duplicates = first_reply_per_client(accepted)
    for duplicate in duplicates:
        reject(duplicate.node_id, f"duplicate reply for client {duplicate.client_id}")
    return sorted(kept, key=lambda reply: reply.client_id)
