"""The strategy's record of rejected replies, bounded in memory, logs and checkpoints.

Every rejection is counted (per round and phase, and in total); the first
:data:`MAX_RECORDED_PER_ROUND` of a round and phase are kept with their
reason, the rest only counted (one log line says how many were left out),
and at most :data:`MAX_RECORDED` entries are kept overall (the newest).
Reasons come from :mod:`fedroute.strategies.validation` (client-supplied text
escaped there with :func:`~fedroute.strategies.validation.printable`) and are
short by construction; they are cut at :data:`MAX_REASON` characters all the same.

A node that fails the same way every round (a ClientApp built for another
architecture, a missing handler) is logged once: a reason is logged the first
time a node sends it, and its repeats from that node are kept and counted like
any rejection but not logged again.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from typing import Any, Iterable, Optional

__all__ = ["RejectionLog", "MAX_RECORDED_PER_ROUND", "MAX_RECORDED", "MAX_REASON", "MAX_LOGGED_PAIRS"]

logger = logging.getLogger("fedroute")

MAX_RECORDED_PER_ROUND = 100
"""Rejections kept with their reason per (round, phase); further ones are only counted."""
MAX_RECORDED = 2000
"""Rejections kept in total (memory and checkpoint); older ones are dropped, their counts kept."""
MAX_REASON = 500
"""Characters of a reason kept."""
MAX_LOGGED_PAIRS = 10_000
"""(node, reason) pairs remembered as logged; beyond them every rejection is logged again."""


class RejectionLog:
    """Rejected replies: bounded entries ``{server_round, phase, node_id, reason}`` plus exact counts."""

    def __init__(self) -> None:
        self.entries: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self.counts: Counter[tuple[int, str]] = Counter()
        self._logged: set[tuple[int, str]] = set()

    @property
    def total(self) -> int:
        """Rejections so far, recorded or not."""
        return sum(self.counts.values())

    def count(self, server_round: int, phase: str) -> int:
        """Rejections in ``(server_round, phase)``, recorded or not."""
        return self.counts[(server_round, phase)]

    def add(self, server_round: int, phase: str, node_id: int, reason: str) -> Optional[dict[str, Any]]:
        """Count a rejection; keep and return it unless the round already has the maximum (then ``None``).

        A kept rejection is logged unless its node sent the same reason before.
        """
        key = (server_round, phase)
        self.counts[key] += 1
        if self.counts[key] > MAX_RECORDED_PER_ROUND:
            if self.counts[key] == MAX_RECORDED_PER_ROUND + 1:
                logger.warning("round %d (%s): more than %d rejected replies; the rest are counted, not logged",
                               server_round, phase, MAX_RECORDED_PER_ROUND)
            return None
        reason = _cut(reason)
        if self._first_from_node(node_id, reason):
            logger.warning("round %d (%s): rejected reply from node %s: %s", server_round, phase, node_id, reason)
        entry = {"server_round": server_round, "phase": phase, "node_id": node_id, "reason": reason}
        self.entries.append(entry)
        return entry

    def _first_from_node(self, node_id: int, reason: str) -> bool:
        """Whether ``node_id`` sends ``reason`` for the first time (then it is logged)."""
        if (node_id, reason) in self._logged:
            return False
        if len(self._logged) < MAX_LOGGED_PAIRS:
            self._logged.add((node_id, reason))
        return True

    def reasons(self, server_round: int, phase: str) -> list[str]:
        """The recorded reasons of ``(server_round, phase)``, in arrival order."""
        return [entry["reason"] for entry in self.entries
                if entry["server_round"] == server_round and entry["phase"] == phase]

    def to_json(self) -> dict[str, Any]:
        """The entries and counts (for the checkpoint)."""
        return {"entries": list(self.entries),
                "counts": [[server_round, phase, count] for (server_round, phase), count in sorted(self.counts.items())]}

    @classmethod
    def from_json(cls, stored: Any) -> "RejectionLog":
        """Inverse of :meth:`to_json`; raises ``ValueError`` on a malformed value."""
        log = cls()
        if not isinstance(stored, dict):
            raise ValueError("'rejected' must be an object with 'entries' and 'counts'")
        entries: Iterable[Any] = stored.get("entries", [])
        for entry in list(entries)[-MAX_RECORDED:]:
            log.entries.append({"server_round": int(entry["server_round"]), "phase": str(entry["phase"]),
                                "node_id": int(entry["node_id"]),
                                "reason": _cut(str(entry["reason"]))})
        for server_round, phase, count in stored.get("counts", []):
            log.counts[(int(server_round), str(phase))] = int(count)
        return log


def _cut(reason: str) -> str:
    """A reason of at most :data:`MAX_REASON` characters (reasons are made printable where they are made)."""
    return reason if len(reason) <= MAX_REASON else f"{reason[:MAX_REASON]}...({len(reason)} characters)"
