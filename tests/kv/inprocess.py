"""Replicators built from their real settings and served in process on real sockets (uvicorn),
their stores on real files, their coordinators called directly (no Kafka): for tests of the
coordinator and the replicas' rules."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn

from relay_bus import schemas
from relay_replicator.app import build
from relay_replicator.coordinator import Coordinator
from relay_replicator.settings import KvSettings, ReplicatorSettings
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
async def replicators(
    root: Path, offsets: dict[str, int], **kv: Any
) -> AsyncIterator[dict[str, Coordinator]]:
    """One replicator per name, its clock moved by the given offset (ms); `kv`: more
    `KvSettings`. The replica timeout defaults to 10 s, not 1 s: the replicators share this
    process's one event loop, so on a loaded machine one replica's fsyncs can hold the others'
    answers past a second, and a test of the rules must not fail on the machine's pace."""
    ports = {name: helpers.free_port() for name in offsets}
    urls = [f"http://127.0.0.1:{port}" for port in ports.values()]
    coordinators, servers, stops = {}, [], []
    kv.setdefault("replica_timeout_s", 10.0)
    for name, offset in offsets.items():
        config = ReplicatorSettings(
            instance=f"replicator-{name}",
            http=HttpSettings(port=ports[name]),
            admin_token=TOKEN,  # type: ignore[arg-type]
            data=DataSettings(dir=root / name),
            kv=KvSettings(peers=urls, clock_offset_ms=offset, sync_interval_s=0, **kv),
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
