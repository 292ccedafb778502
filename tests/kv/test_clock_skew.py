"""A write that starts after another was acknowledged wins, even when its coordinator's clock is
three seconds behind: a replica holding the newer version says so, the coordinator moves its
clock past it and writes again.

Four replicators built from their real settings, served in process on real sockets (uvicorn),
with their stores on real files; the coordinators are called directly (no Kafka needed: this is
about the coordinator and its replicas). D is not a home replica of the key, so it has never
observed the first write's version: only the replicas' answers can tell it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn

from relay_bus import schemas
from relay_durable.codec import b64u, unb64u
from relay_kv import names, placement
from relay_kv.clock import Version
from relay_replicator.app import KvSettings, ReplicatorSettings, build
from relay_replicator.coordinator import Coordinator
from relay_runtime.settings import DataSettings, HttpSettings
from tests import helpers

TOKEN = "skew-admin-token"


def request(**fields: Any) -> schemas.KvRequest:
    return schemas.KvRequest(
        id=secrets.token_hex(8),
        origin="test",
        reply_slot=0,
        deadline_ms=schemas.now_ms_() + 30_000,
        **fields,
    )


@contextlib.asynccontextmanager
async def replicators(root: Path, offsets: dict[str, int]) -> AsyncIterator[dict[str, Coordinator]]:
    ports = {name: helpers.free_port() for name in offsets}
    urls = [f"http://127.0.0.1:{port}" for port in ports.values()]
    coordinators, servers, stops = {}, [], []
    for name, offset in offsets.items():
        config = ReplicatorSettings(
            instance=f"replicator-{name}",
            http=HttpSettings(port=ports[name]),
            admin_token=TOKEN,  # type: ignore[arg-type]
            data=DataSettings(dir=root / name),
            kv=KvSettings(peers=urls, clock_offset_ms=offset, sync_interval_s=0),
        )
        app, lifecycle = build(config)
        server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=ports[name], lifespan="off", log_level="error"
            )
        )
        servers.append((server, asyncio.create_task(server.serve())))
        for hook in lifecycle.before_start:  # the store, peers and loops; not the bus
            await hook()
        stops.extend(lifecycle.after_stop)
        coordinators[name] = app.state.kv[1]
    try:
        for _ in range(200):
            if all(c.peers.resolved for c in coordinators.values()):
                break
            await asyncio.sleep(0.05)
        yield coordinators
    finally:
        for stop in stops:
            await stop()
        for server, task in servers:
            server.should_exit = True
            await task


async def test_a_later_write_wins_over_a_lagging_coordinators_clock(tmp_path: Path) -> None:
    offsets = {"A": 0, "B": 0, "C": 0, "D": -3000}
    async with replicators(tmp_path, offsets) as coordinators:
        sites = {name: c.peers.me for name, c in coordinators.items()}
        made = await coordinators["A"].run(request(op="ns_put", ns="skew", admin=True, n=3))
        assert made.ok, made
        assert made.data is not None
        token = {"token_sha256": names.token_hash(made.data["token"])}
        key = next(
            k
            for k in (f"k{i}" for i in range(1000))
            if sites["D"]
            not in placement.replicas(placement.shard_of("skew", k), list(sites.values()), 3).home
        )
        first = await coordinators["A"].run(
            request(op="put", ns="skew", key=key, value=b64u(b"first"), **token)
        )
        assert first.ok, first
        second = await coordinators["D"].run(  # starts after `first` was acknowledged
            request(op="put", ns="skew", key=key, value=b64u(b"second"), **token)
        )
        assert second.ok, second
        assert first.data is not None
        assert second.data is not None
        assert Version.parse(second.data["version"]) > Version.parse(first.data["version"])
        read = await coordinators["B"].run(request(op="get", ns="skew", key=key, r=3, **token))
        assert read.data is not None
        assert unb64u(read.data["value"]) == b"second"
