"""free_port: ports for processes that listen a few seconds later, outside the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket
import threading

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


def test_threads_drawing_at_once_never_get_the_same_port(monkeypatch) -> None:
    """A test runs a Ray simulation and a deployment at once (tests/test_deployment.py): two threads may draw
    together.  Here each draw waits (up to 0.5 s) for the other inside the draw, with one candidate port: a draw
    not serialised hands that port out twice."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        only = probe.getsockname()[1]
    monkeypatch.setattr(processes, "LISTEN_PORTS", (only, only + 1))
    monkeypatch.setattr(processes, "_ephemeral_range", lambda: (1, 2))
    monkeypatch.setattr(processes, "_HANDED_OUT", set())
    both_drawing = threading.Barrier(2, timeout=0.5)

    class MeetingRandom(random.SystemRandom):
        def randrange(self, *args, **kwargs):
            try:
                both_drawing.wait()
            except threading.BrokenBarrierError:  # the other thread is not drawing now
                pass
            return super().randrange(*args, **kwargs)

    monkeypatch.setattr(processes.random, "SystemRandom", MeetingRandom)
    ports: list[int] = []
    threads = [threading.Thread(target=lambda: ports.append(free_port())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(ports) == 2 and len(set(ports)) == 2 and only in ports, ports
