"""Telling a gone peer from a slow or cut-off one (`relay_replicator.peers`), over real loopback
sockets: only an address that refuses connections makes a site gone (`on_gone`, once until it
is up again); a reset is followed by one probe, which finds it gone if nothing listens any more;
a peer that accepts and never answers is down, never gone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relay_replicator.peers import PeerError, Peers
from relay_runtime.readiness import Readiness
from tests import helpers

SITE = "B000000000000001"


@contextlib.asynccontextmanager
async def peers_of(tmp_path: Path, port: int) -> AsyncIterator[tuple[Peers, list[str]]]:
    peers = Peers(
        "A000000000000001",
        [],
        token=None,
        timeout_s=0.5,
        down_s=60.0,
        members_file=tmp_path / "members.json",
        readiness=Readiness(),
    )
    peers.sites[SITE] = f"http://127.0.0.1:{port}"
    gone: list[str] = []

    async def record(site: str) -> None:
        gone.append(site)

    peers.on_gone = record
    try:
        yield peers, gone
    finally:
        await peers.stop()


async def until(check: list[str], length: int, budget_s: float = 5.0) -> None:
    async with asyncio.timeout(budget_s):
        while len(check) < length:
            await asyncio.sleep(0.01)


async def test_a_refused_address_is_gone_once_until_it_is_up_again(tmp_path: Path) -> None:
    port = helpers.free_port()  # nothing listens there
    async with peers_of(tmp_path, port) as (peers, gone):
        for _ in range(3):
            with pytest.raises(PeerError):
                await peers.call(SITE, "/internal/kv/write", {"items": []})
        await until(gone, 1)
        await asyncio.sleep(0.2)
        assert gone == [SITE]
        assert peers.is_down(SITE)
        peers.mark_up(SITE)  # it answered again: a later refusal is a new death
        assert not await peers.probe(SITE)
        await until(gone, 2)
        assert gone == [SITE, SITE]


async def test_a_reset_is_probed_and_found_gone_once_nothing_listens(tmp_path: Path) -> None:
    """The process dies with the connection open: the call sees a reset, not a refusal."""
    dropped = asyncio.Event()

    async def die(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.close()  # stops listening first, then drops the connection in hand
        writer.transport.abort()
        dropped.set()

    server = await asyncio.start_server(die, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with peers_of(tmp_path, port) as (peers, gone):
        with pytest.raises(PeerError):
            await peers.call(SITE, "/internal/kv/write", {"items": []})
        assert dropped.is_set()
        await until(gone, 1)
        assert gone == [SITE]


async def test_a_peer_that_never_answers_is_down_but_not_gone(tmp_path: Path) -> None:
    """A partition (the test proxy's black hole): connections accepted, nothing answered."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with peers_of(tmp_path, port) as (peers, gone):
            with pytest.raises(PeerError):
                await peers.call(SITE, "/internal/kv/write", {"items": []})
            assert peers.is_down(SITE)
            await asyncio.sleep(1.5)  # the probe after the first failure times out too
            assert len(held) == 2, "the call and one probe"
            assert gone == []
    finally:
        for writer in held:
            writer.close()
        server.close()
