"""The ingress's lame duck on SIGTERM (a real ingress process on Kafka and Redis): unready at
once while still answering requests, WebSockets kept until the unready time is over, then
closed with 1012 at the bounded rate, spread out rather than all at once, and exit 0."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import httpx
import websockets

from tests import helpers

UNREADY_S = 2.0
CLOSE_PER_S = 10.0
SOCKETS = 10


async def _hold(url: str, closed: list[tuple[float, int]]) -> None:
    async with websockets.connect(url) as ws:
        try:
            await ws.recv()
        except websockets.ConnectionClosed as error:
            code = error.rcvd.code if error.rcvd else -1
            closed.append((time.monotonic(), code))


async def test_sigterm_makes_the_ingress_unready_then_closes_websockets_at_a_rate(
    kafka: helpers.Kafka, redis_url: str
) -> None:
    port = helpers.free_port()
    env = helpers.service_env(
        RELAY_HTTP__PORT=str(port),
        RELAY_INSTANCE="ingress-lame-duck",
        RELAY_REDIS_URL=redis_url,
        RELAY_LAME_DUCK_UNREADY_S=str(UNREADY_S),
        RELAY_WS_CLOSE_PER_S=str(CLOSE_PER_S),
        **kafka.env(),
    )
    process = subprocess.Popen(
        [str(helpers.BIN / "relay-ingress")], env=env, stdout=subprocess.DEVNULL, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=2) as http:
            for _ in range(300):
                try:
                    if (await http.get("/readyz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
            closed: list[tuple[float, int]] = []
            ws_url = url.replace("http://", "ws://") + "/v1/ws"
            holders = [asyncio.create_task(_hold(ws_url, closed)) for _ in range(SOCKETS)]
            await asyncio.sleep(1.0)  # every socket is open
            assert not closed

            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.5)
            assert (await http.get("/readyz")).status_code == 503
            made = await http.post("/v1/queues", json={})  # still answered (a 4xx, not refused)
            assert made.status_code == 400, made.text
            await asyncio.wait_for(asyncio.gather(*holders), 30)

        assert [code for _, code in closed] == [1012] * SOCKETS
        first, last = closed[0][0] - signalled, closed[-1][0] - signalled
        assert first >= UNREADY_S - 0.2, first  # nothing closed while only unready
        assert last - first >= (SOCKETS - 1) / CLOSE_PER_S * 0.8, (first, last)  # spread out
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
