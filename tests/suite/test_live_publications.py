"""Live publications under sustained load: 8 KB publications for `RELAY_SOAK_S` seconds (40 by
default; the memory-only stand-in lost 9 % of them and grew without bound) to a WebSocket
subscriber that keeps reading. Every accepted publication reaches it, and the broker's memory
stays within what its heap allows however much was published."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx
import psutil
import pytest
import websockets

from tests.api.client import b64u, unb64u
from tests.helpers import Running, suite

pytestmark = pytest.mark.suite

SOAK_S = float(os.environ.get("RELAY_SOAK_S", "40"))
PAYLOAD_BYTES = 8192
PUBLISHERS = 4
BROKER_RSS_LIMIT = 1024 * 1024 * 1024
"""The broker runs with a 512 MB heap; RSS past 1 GiB would mean memory outside it grows."""


def _broker_rss(running: Running) -> int:
    broker = next(c for c in running.state.children if c.name == "broker")
    assert broker.pid is not None
    return int(psutil.Process(broker.pid).memory_info().rss)


def test_every_live_publication_reaches_a_reading_subscriber(tmp_path: Path) -> None:
    with suite(tmp_path, "--port", "0", RELAY_PUBLISH_PER_S="100000") as running:
        url = running.state.ingress_url
        accepted: set[str] = set()
        received: set[str] = set()
        rss: list[int] = []

        async def subscriber(subscribed: asyncio.Event, done: asyncio.Event) -> None:
            async with websockets.connect(url.replace("http://", "ws://") + "/v1/ws") as ws:
                await ws.send(json.dumps({"id": "s", "cmd": "SUBSCRIBE", "filter": "soak/#"}))
                while not done.is_set():
                    try:
                        frame = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                    except TimeoutError:
                        continue
                    if frame.get("id") == "s":
                        assert frame["ok"], frame
                        subscribed.set()
                    elif frame.get("type") == "PUBLISH":
                        payload = unb64u(frame["payload"])
                        assert len(payload) == PAYLOAD_BYTES
                        received.add(payload[:32].decode().strip())

        async def publisher(k: int, stop: asyncio.Event) -> None:
            n = 0
            async with httpx.AsyncClient(base_url=url, timeout=20) as http:
                while not stop.is_set():
                    key = f"{k}:{n}"
                    payload = key.encode().ljust(32) + os.urandom(PAYLOAD_BYTES - 32)
                    response = await http.post(
                        "/v1/publish",
                        json={"topic": f"soak/{k}/{n % 50}", "payload": b64u(payload)},
                    )
                    assert response.status_code == 202, response.text
                    accepted.add(key)
                    n += 1

        async def sampler(stop: asyncio.Event) -> None:
            while not stop.is_set():
                rss.append(_broker_rss(running))
                await asyncio.sleep(1)

        async def main() -> None:
            subscribed, stop, done = asyncio.Event(), asyncio.Event(), asyncio.Event()
            reading = asyncio.create_task(subscriber(subscribed, done))
            await asyncio.wait_for(subscribed.wait(), 20)
            tasks = [asyncio.create_task(publisher(k, stop)) for k in range(PUBLISHERS)]
            tasks.append(asyncio.create_task(sampler(stop)))
            await asyncio.sleep(SOAK_S)
            stop.set()
            await asyncio.gather(*tasks)
            deadline = time.monotonic() + 30
            while accepted - received and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            done.set()
            await reading

        asyncio.run(main())

    megabytes = len(accepted) * PAYLOAD_BYTES / 2**20
    print(
        f"{len(accepted)} publications ({megabytes:.0f} MB) in {SOAK_S:g} s, "
        f"{len(accepted - received)} lost; broker RSS {rss[0] / 2**20:.0f} -> "
        f"{max(rss) / 2**20:.0f} MB (max)"
    )
    assert len(accepted) > 1000
    assert not accepted - received, f"{len(accepted - received)} of {len(accepted)} lost"
    assert max(rss) < BROKER_RSS_LIMIT
