"""How many clients a run has: run-config ``num-clients``, or the connected SuperNodes' node config.

fedroute's ServerApp runs one client per SuperNode.  With run-config
``num-clients = "auto"`` (the default) the number of clients follows the
federation: each connected node reports its ``partition-id`` and
``num-partitions`` (a ``QUERY`` of phase
:data:`~fedroute.protocol.PHASE_NODE_CONFIG`; Flower's simulation gives every
node both, a deployed SuperNode gets them from ``--node-config``), and the run
has ``num-partitions`` clients once that many nodes are connected.  An
explicit ``num-clients = N`` is waited for as before (``N`` nodes); when
fewer are connected the server asks them too, so that a federation started
for a different size fails at once instead of after the wait.

Contradictions end the run before round 1 with a message saying what to pass
(:class:`FederationError`): nodes that disagree on ``num-partitions``, two
nodes with one ``partition-id``, an id outside ``0 … n−1``, a node without a
``partition-id``, or an explicit ``num-clients`` the nodes were not started
for.  :func:`federation_size` is the pure rule; :func:`discover_federation`
the thin layer over Flower's ``Grid``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedroute import protocol
from fedroute.app_identity import app_files, app_fingerprint

__all__ = ["Federation", "FederationError", "NodeReport", "check_app_identity", "discover_federation",
           "federation_size",
           "starting_hint"]

logger = logging.getLogger("fedroute")


class FederationError(ValueError):
    """The connected nodes cannot give the run a consistent set of clients (the message says what to pass)."""


@dataclass(frozen=True)
class NodeReport:
    """What one node said about its node config (``None``: not in its node config)."""

    node_id: int
    partition_id: Optional[int]
    num_partitions: Optional[int]
    app_files: Optional[str] = None
    """Where the node's ClientApp imports fedroute from (:mod:`fedroute.app_identity`)."""
    app_fingerprint: Optional[str] = None
    """The fingerprint of that code; the server's own must match."""


@dataclass(frozen=True)
class Federation:
    """The run's clients: how many, on which nodes, and where the number came from."""

    num_clients: int
    node_ids: tuple[int, ...]
    source: str
    """``"num-clients"`` (the run config's explicit value) or ``"num-partitions"`` (the nodes' node config)."""

    def to_dict(self) -> dict[str, Any]:
        """For ``config.json``."""
        return {"num_clients": self.num_clients, "num_nodes": len(self.node_ids), "source": self.source}


def starting_hint(num_clients: int) -> str:
    """How to start a federation of ``num_clients`` SuperNodes, in simulation and in deployment."""
    return (f'simulation: flwr run . --federation-config "num-supernodes={num_clients}"; deployment: '
            f'{num_clients} SuperNodes, each with --node-config "partition-id=<i> num-partitions={num_clients}"')


def federation_size(explicit: Optional[int], reports: Sequence[NodeReport]) -> int:
    """The number of clients of a run, from the run config and the nodes' reports.

    Parameters
    ----------
    explicit : int or None
        Run-config ``num-clients`` (``None``: ``"auto"``).
    reports : sequence of NodeReport
        The connected nodes' node configs (at least one).

    Returns
    -------
    int
        ``explicit`` if given, else the nodes' common ``num-partitions``.

    Raises
    ------
    FederationError
        When the reports contradict each other or ``explicit`` (the message names the node,
        the key and what to pass).
    """
    missing = [report.node_id for report in reports if report.partition_id is None]
    if missing:
        raise FederationError(f"SuperNode {missing[0]} has no integer 'partition-id' in its node config; every "
                              "node is one client: start it with --node-config \"partition-id=<i> "
                              "num-partitions=<n>\"")
    duplicated = [pid for pid, count in Counter(report.partition_id for report in reports).items() if count > 1]
    if duplicated:
        nodes = [report.node_id for report in reports if report.partition_id == duplicated[0]]
        raise FederationError(f"SuperNodes {nodes} share partition-id {duplicated[0]}; each SuperNode needs its "
                              "own partition-id (0 … n-1)")
    partitions = sorted({report.num_partitions for report in reports if report.num_partitions is not None})
    if len(partitions) > 1:
        raise FederationError(f"the connected SuperNodes disagree on num-partitions ({partitions}); start every "
                              "SuperNode with the same num-partitions")
    declared = partitions[0] if partitions else None
    if explicit is None and declared is None:
        raise FederationError("run-config 'num-clients' = \"auto\" takes the number of clients from the "
                              "SuperNodes' num-partitions, but no connected SuperNode's node config has one: start "
                              "them with --node-config \"partition-id=<i> num-partitions=<n>\", or set run-config "
                              "num-clients=<n>")
    if explicit is not None and declared is not None and declared != explicit:
        raise FederationError(f"run-config 'num-clients' = {explicit}, but the connected SuperNodes were started "
                              f"for num-partitions = {declared}: start {explicit} SuperNodes "
                              f"({starting_hint(explicit)}), or set num-clients = \"auto\" to run with the "
                              f"{declared} the federation has")
    size = explicit if explicit is not None else int(declared)  # type: ignore[arg-type]
    outside = [report for report in reports if not 0 <= int(report.partition_id) < size]  # type: ignore[arg-type]
    if outside:
        raise FederationError(f"SuperNode {outside[0].node_id} has partition-id {outside[0].partition_id}, outside "
                              f"0 … {size - 1} for {size} clients; give the SuperNodes the ids 0 … {size - 1}")
    return size


def _report(reply: Message, node_id: int) -> NodeReport:
    """One node's reply to the node-config query (``FederationError`` for an error or a malformed reply)."""
    if reply.has_error():
        raise FederationError(f"SuperNode {node_id} failed to report its node config: {reply.error.reason}; is its "
                              "ClientApp fedroute's (fedroute.client.app)?")
    try:
        metrics = reply.content[protocol.METRICS]
        values = [metrics[protocol.PARTITION_ID], metrics[protocol.NUM_PARTITIONS]]
    except KeyError:
        raise FederationError(f"SuperNode {node_id} answered the node-config query without "
                              f"'{protocol.PARTITION_ID}'/'{protocol.NUM_PARTITIONS}'") from None
    if not all(isinstance(value, int) and not isinstance(value, bool) for value in values):
        raise FederationError(f"SuperNode {node_id} reported a non-integer partition-id / num-partitions {values}")
    partition_id, num_partitions = (None if value == protocol.UNKNOWN else value for value in values)
    identity = reply.content.config_records.get(protocol.CONFIG)
    files, fingerprint = (None, None) if identity is None else (
        identity.get(protocol.APP_FILES), identity.get(protocol.APP_FINGERPRINT))
    return NodeReport(node_id, partition_id, num_partitions, files, fingerprint)


def check_app_identity(reports: Iterable[NodeReport], fingerprint: str, files: str) -> None:
    """Every node runs the server's fedroute code (``FederationError`` naming the first that does not)."""
    for report in reports:
        if report.app_fingerprint is not None and report.app_fingerprint != fingerprint:
            raise FederationError(
                f"SuperNode {report.node_id}'s ClientApp runs the fedroute files in {report.app_files} (code "
                f"{report.app_fingerprint}), not this run's app ({files}, code {fingerprint}).  In a local "
                "simulation this is a SuperLink left running by an earlier `flwr run` in that folder: Flower keeps "
                "its working directory first on the Ray workers' path.  Stop that SuperLink (docs/plugin.md, "
                "\"Flower traps\") and run again, or run with `fedroute flower`, which starts its own")


def query_node_configs(grid: Grid, node_ids: Iterable[int], timeout: float) -> dict[int, NodeReport]:
    """Ask ``node_ids`` for their node config; every one must answer within ``timeout`` seconds."""
    wanted = list(node_ids)
    config = ConfigRecord({protocol.PHASE: protocol.PHASE_NODE_CONFIG})
    messages = [Message(content=RecordDict({protocol.CONFIG: config}), message_type=MessageType.QUERY,
                        dst_node_id=node_id) for node_id in wanted]
    reports = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        source = int(reply.metadata.src_node_id)
        if source in wanted:
            reports[source] = _report(reply, source)
    silent = [node_id for node_id in wanted if node_id not in reports]
    if silent:
        raise FederationError(f"SuperNode(s) {silent} did not report their node config within {timeout:g} s "
                              "(run-config 'round-timeout')")
    return reports


def _waiting_error(online: Sequence[int], size: Optional[int], reports: dict[int, NodeReport],
                   wait_timeout: float) -> FederationError:
    if not online:
        return FederationError(f"no SuperNode connected within {wait_timeout:g} s (run-config 'node-wait-timeout')")
    present = {reports[n].partition_id for n in online if n in reports}
    missing = sorted(set(range(size or 0)) - present) if present else []
    which = f" (missing partition-ids: {missing[:10]}{' …' if len(missing) > 10 else ''})" if missing else ""
    return FederationError(f"only {len(online)} of the run's {size} SuperNodes connected within {wait_timeout:g} s"
                           f"{which}; start the missing ones ({starting_hint(int(size or 0))}), or raise "
                           "run-config 'node-wait-timeout'")


def discover_federation(grid: Grid, explicit: Optional[int], wait_timeout: float, reply_timeout: float,
                        poll_interval: float = 0.5,
                        clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], None] = time.sleep) -> Federation:
    """The run's clients, once enough nodes are connected.

    Parameters
    ----------
    grid : Grid
        Flower's grid (``get_node_ids`` lists the connected nodes).
    explicit : int or None
        Run-config ``num-clients`` (``None``: ``"auto"``, follow the nodes' ``num-partitions``).
    wait_timeout : float
        Seconds to wait for the nodes (run-config ``node-wait-timeout``).
    reply_timeout : float
        Seconds a node has to answer the node-config query (run-config ``round-timeout``).

    Returns
    -------
    Federation

    Raises
    ------
    FederationError
        At once for contradicting node configs (:func:`federation_size`), or after ``wait_timeout``
        seconds without enough nodes (naming the missing partition-ids and how to start them).
    """
    deadline = clock() + wait_timeout
    reports: dict[int, NodeReport] = {}
    size: Optional[int] = explicit
    while True:
        online = sorted(grid.get_node_ids())
        if explicit is not None and len(online) >= explicit:
            return Federation(explicit, tuple(online), "num-clients")
        if unknown := [node_id for node_id in online if node_id not in reports]:
            reports.update(query_node_configs(grid, unknown, reply_timeout))
            check_app_identity((reports[node_id] for node_id in unknown), app_fingerprint(), str(app_files()))
        if online:
            size = federation_size(explicit, [reports[node_id] for node_id in online])
            if len(online) >= size:
                logger.info("%d SuperNodes with num-partitions = %d: the run has %d clients", len(online), size, size)
                return Federation(size, tuple(online), "num-clients" if explicit is not None else "num-partitions")
        if clock() > deadline:
            raise _waiting_error(online, size, reports, wait_timeout)
        sleep(poll_interval)
