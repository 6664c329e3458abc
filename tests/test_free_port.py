"""free_port: ports for processes that listen a few seconds later, outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

from fedroute.deployment import processes
from fedroute.deployment.processes import LISTEN_PORTS, free_port


def test_free_ports_are_outside_the_ephemeral_range_distinct_and_bindable() -> None:
    low, high = processes._ephemeral_range()
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)                                         # never handed out twice
    assert all(LISTEN_PORTS[0] <= port < LISTEN_PORTS[1] and not (low <= port <= high) for port in ports)
    with socket.socket() as listener:                                            # free right now
        listener.bind(("127.0.0.1", ports[-1]))


def test_a_port_in_use_is_skipped(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        taken.listen()
        monkeypatch.setattr(processes, "LISTEN_PORTS", (busy, busy + 1))         # the only candidate is in use
        monkeypatch.setattr(processes, "_ephemeral_range", lambda: (1, 2))
        monkeypatch.setattr(processes, "_HANDED_OUT", set())
        port = free_port()                                                       # the kernel's choice instead
        assert port != busy
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))
