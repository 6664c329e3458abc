"""A SuperLink's Control API from this process: the runs ``flwr ls`` lists and the nodes ``flwr supernode list``
lists, without starting ``flwr``.

Every ``flwr`` command is a new Python process that imports all of Flower's command line: ≈ 1.3 s on a quiet
2-core machine, 5–20 s on a loaded one (a ``flwr supernode list`` took 22 s while a Ray simulation started next
to it).  These queries take milliseconds.  They go through Flower 1.42's own protobuf-over-HTTP client
(``flwr.supercore.control``, the one ``flwr`` uses) and read the same fields, so they answer as the commands
do.  :func:`control_client` returns ``None`` where that client cannot be imported (another Flower version):
callers then run the ``flwr`` command as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

__all__ = ["ControlAddress", "control_client", "ask_control", "run_statuses", "online_nodes"]

Answer = TypeVar("Answer")


@dataclass(frozen=True)
class ControlAddress:
    """Where a SuperLink serves its Control API."""

    address: str
    """``HOST:PORT``."""
    root_certificates: Optional[Path] = None
    """The CA certificate to verify a TLS SuperLink with; ``None``: plain HTTP (``--insecure``)."""


def control_client(control: ControlAddress) -> Optional[Any]:
    """Flower's Control API client for ``control`` (close it after use); ``None`` if Flower has none to import."""
    try:
        from flwr.supercore.control.control_http_client import ControlHttpClient
    except ImportError:
        return None
    certificates = control.root_certificates
    return ControlHttpClient.from_server_address(
        server_address=control.address, insecure=certificates is None,
        root_certificates=None if certificates is None else certificates.read_bytes(), interceptors=[])


def ask_control(control: ControlAddress, question: Callable[[Any], Answer], fallback: Callable[[], Answer]) -> Answer:
    """``question(client)`` on a Control API client of ``control`` (closed afterwards); ``fallback()`` (the
    ``flwr`` command) where Flower has no such client to import."""
    client = control_client(control)
    if client is None:
        return fallback()
    try:
        return question(client)
    finally:
        client.close()


def _status_text(status: Any) -> str:
    """``finished:completed`` etc., as ``flwr ls`` writes a run's status."""
    return f"{status.status}:{status.sub_status}" if status.sub_status else str(status.status)


def run_statuses(client: Any, run_id: Optional[int] = None) -> dict[int, str]:
    """Run id → status (``flwr ls``; with ``run_id``, that run only); ``{}`` if the SuperLink does not answer."""
    from flwr.proto.control_pb2 import ListRunsRequest

    try:
        response = client.ListRuns(ListRunsRequest() if run_id is None else ListRunsRequest(run_id=run_id))
    except Exception:  # the SuperLink is down or restarting: as when `flwr ls` prints no JSON
        return {}
    return {int(key): _status_text(run.status) for key, run in response.run_dict.items()}


def online_nodes(client: Any) -> int:
    """How many SuperNodes the SuperLink lists as online (``flwr supernode list``); 0 if it does not answer."""
    from flwr.proto.control_pb2 import ListNodesRequest

    try:
        response = client.ListNodes(ListNodesRequest())
    except Exception:  # the SuperLink is down or restarting
        return 0
    return sum(1 for node in response.nodes_info if str(node.status).lower() == "online")
