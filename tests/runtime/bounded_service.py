"""A minimal service on `relay_runtime.serve.run_service` (no Kafka, no Redis) for the
server-level bounds tests: `python -m tests.runtime.bounded_service`, configured by `RELAY_*`."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect

from relay_runtime.serve import run_service
from relay_runtime.settings import ServiceSettings


class _Idle:
    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def lame_duck(self) -> None:
        pass


def build(_: ServiceSettings) -> tuple[FastAPI, _Idle]:
    app = FastAPI()

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        body = await request.json()
        return {"items": len(body)}

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                await websocket.send_text(await websocket.receive_text())
        except WebSocketDisconnect:
            pass

    @app.websocket("/ws-stalled")
    async def stalled(websocket: WebSocket) -> None:
        await asyncio.sleep(3600)  # never accepts

    return app, _Idle()


if __name__ == "__main__":
    run_service("bounded", ServiceSettings, build)
