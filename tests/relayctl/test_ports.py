"""`relayctl up` picks its children's ports below the kernel's ephemeral range
(`relayctl.processes.free_port`), where no outgoing connection can take one between the pick
and the child's bind; a port in use there is skipped."""

from __future__ import annotations

import socket

import pytest

from relayctl import processes


def test_ports_are_free_and_below_the_ephemeral_range() -> None:
    low = processes.ephemeral_low()
    for _ in range(50):
        port = processes.free_port("127.0.0.1")
        assert low - processes.PORT_SPAN <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # still free


def test_a_taken_port_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # only that port, then the range is exhausted: the fallback picks any free port
        monkeypatch.setattr(processes.random, "randrange", lambda _a, _b: port)
        chosen = processes.free_port("127.0.0.1")
        assert chosen != port
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", chosen))


def test_a_port_is_never_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite picks every child's port before any child binds one: a port still free at the
    second pick must not go to a second child (the archiver once failed with "port in use")."""
    port = processes.free_port("127.0.0.1")  # free, and not bound by anyone
    monkeypatch.setattr(processes.random, "randrange", lambda _a, _b: port)
    again = processes.free_port("127.0.0.1")
    assert again != port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # still free: only the memory refused it
