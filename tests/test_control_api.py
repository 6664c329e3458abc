"""``deployment.control_api``: a SuperLink's runs and nodes read in this process, as ``flwr ls`` and ``flwr
supernode list`` read them.

No Flower process: a small HTTP server in this process answers the two Control API calls with Flower's own
protobuf messages (the bytes a SuperLink sends), plain and with TLS (the CA :func:`make_certificates` makes,
as a ``LocalFederation(tls=True)`` uses it).  The real SuperLink answers them in ``tests/test_deployment.py``
and ``tests/test_faults.py`` (every wait for SuperNodes and every run's final status goes through them).
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

import pytest
from flwr.proto.control_pb2 import ListNodesRequest, ListNodesResponse, ListRunsRequest, ListRunsResponse
from flwr.proto.node_pb2 import NodeInfo
from flwr.proto.run_pb2 import Run, RunStatus

from fedroute.deployment.certificates import make_certificates
from fedroute.deployment.control import FederationControl
from fedroute.deployment.control_api import ControlAddress, control_client, online_nodes, run_statuses
from fedroute.deployment.launcher import local_superlink
from fedroute.deployment.processes import free_port, run_status

RUNS = {
    11: RunStatus(status="finished", sub_status="completed"),
    12: RunStatus(status="finished", sub_status="failed", details="ServerApp raised"),
    13: RunStatus(status="running"),
    14: RunStatus(status="pending", sub_status=""),
}
"""The SuperLink's runs; ``flwr ls`` writes ``status:sub_status``, or the status alone without a sub-status."""
EXPECTED = {11: "finished:completed", 12: "finished:failed", 13: "running", 14: "pending"}
NODE_STATUSES = ["online", "offline", "online", "unregistered", "ONLINE", "registered"]


class FakeSuperLink(ThreadingHTTPServer):
    """Answers ``/v1/control/list-runs`` and ``/v1/control/list-nodes`` as a SuperLink does; records the
    requests."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", free_port()), _Handler)
        self.requests: list[tuple[str, bytes]] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeSuperLink

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.requests.append((self.path, body))
        if self.path == "/v1/control/list-runs":
            request = ListRunsRequest.FromString(body)
            runs = {run_id: Run(run_id=run_id, status=status) for run_id, status in RUNS.items()
                    if not request.HasField("run_id") or run_id == request.run_id}
            payload = ListRunsResponse(run_dict=runs, now="2026-12-06T00:00:00+00:00").SerializeToString()
        elif self.path == "/v1/control/list-nodes":
            nodes = [NodeInfo(node_id=index + 1, status=status) for index, status in enumerate(NODE_STATUSES)]
            payload = ListNodesResponse(nodes_info=nodes, now="2026-12-06T00:00:00+00:00").SerializeToString()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("content-type", "application/protobuf")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:  # quiet
        pass


def _serve(server: FakeSuperLink) -> Iterator[FakeSuperLink]:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture()
def superlink() -> Iterator[FakeSuperLink]:
    yield from _serve(FakeSuperLink())


@pytest.fixture()
def tls_superlink(tmp_path: Path) -> Iterator[tuple[FakeSuperLink, Path]]:
    """A fake SuperLink serving HTTPS with the server certificate of a private CA; and that CA's file."""
    files = make_certificates(tmp_path / "certificates")
    server = FakeSuperLink()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(files.cert), str(files.key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    for running in _serve(server):
        yield running, files.ca


def _query(control: ControlAddress, run_id: Optional[int] = None) -> tuple[dict[int, str], int]:
    client = control_client(control)
    assert client is not None, "Flower 1.42's Control API client must import"
    try:
        return run_statuses(client, run_id), online_nodes(client)
    finally:
        client.close()


def test_statuses_and_online_nodes_read_as_flwr_writes_them(superlink: FakeSuperLink) -> None:
    statuses, online = _query(ControlAddress(superlink.address))
    assert statuses == EXPECTED
    assert online == 3  # "online" in any case; offline, registered and unregistered nodes are not
    assert [path for path, _ in superlink.requests] == ["/v1/control/list-runs", "/v1/control/list-nodes"]
    assert not ListRunsRequest.FromString(superlink.requests[0][1]).HasField("run_id")
    assert ListNodesRequest.FromString(superlink.requests[1][1]) == ListNodesRequest()


def test_one_runs_status_asks_for_that_run_only(superlink: FakeSuperLink) -> None:
    statuses, _ = _query(ControlAddress(superlink.address), run_id=12)
    assert statuses == {12: "finished:failed"}
    assert ListRunsRequest.FromString(superlink.requests[0][1]).run_id == 12
    # run_status through the Control API: the run's status, "unknown" for a run the SuperLink does not list;
    # no `flwr` command runs (its path does not exist).
    assert run_status("/nonexistent/flwr", 11, {}, ControlAddress(superlink.address)) == "finished:completed"
    assert run_status("/nonexistent/flwr", 99, {}, ControlAddress(superlink.address)) == "unknown"


def test_a_superlink_that_does_not_answer_lists_nothing() -> None:
    """Down or restarting (a fault test kills it): no runs, no nodes, as when ``flwr ls`` prints no JSON."""
    statuses, online = _query(ControlAddress(f"127.0.0.1:{free_port()}"))  # nothing listens there
    assert statuses == {} and online == 0


def test_tls_is_verified_with_the_federations_ca(tls_superlink: tuple[FakeSuperLink, Path], tmp_path: Path) -> None:
    server, ca = tls_superlink
    statuses, online = _query(ControlAddress(server.address, ca))
    assert statuses == EXPECTED and online == 3
    # Another CA's certificate does not verify this server: nothing is read, as from a SuperLink that is down.
    other_ca = make_certificates(tmp_path / "other").ca
    assert _query(ControlAddress(server.address, other_ca)) == ({}, 0)
    assert len(server.requests) == 2  # the refused handshake never reached the handler


def test_addresses_of_a_federation_and_of_flwr_runs_local_superlink(tmp_path: Path) -> None:
    assert local_superlink({"FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "23456"}) == ControlAddress("127.0.0.1:23456")
    control = object.__new__(FederationControl)  # the fields the address is made of (no processes)
    control.port, control.certificates = 23457, None
    assert control.control_address == ControlAddress("127.0.0.1:23457")
    control.certificates = make_certificates(tmp_path / "certificates")
    assert control.control_address == ControlAddress("127.0.0.1:23457", control.certificates.ca)


def test_without_flowers_client_the_flwr_commands_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Flower version without ``flwr.supercore.control``: the ``flwr ls`` / ``flwr supernode list``
    paths are taken."""
    import fedroute.deployment.control_api as control_api

    monkeypatch.setattr(control_api, "control_client", lambda control: None)
    control = object.__new__(FederationControl)
    control.port, control.certificates = 1, None
    monkeypatch.setattr(FederationControl, "_runs_listed", lambda self: {5: "running"})
    monkeypatch.setattr(FederationControl, "_online_supernodes_listed", lambda self: 2)
    assert control.runs() == {5: "running"} and control.online_supernodes() == 2
