"""A benchmark's HTTP client: one keep-alive HTTP/1.1 connection per task, requests one at a
time, each answer read whole by its Content-Length.

httpx costs ~1 ms of CPU per request, about five times what the NATS, Redis and Valkey clients
cost; on two cores that CPU is taken from the servers being measured, so a figure taken
through it measures its client. The servers this talks to (Relay's ingress, etcd's JSON
gateway) answer with a Content-Length and keep the connection open."""

from __future__ import annotations

import asyncio
import contextlib


class RawHttp:
    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        self.extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self.request("POST", path, body)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """(status, body) of one request; the connection is closed and the error raised on
        anything unexpected, so the next request opens a new one."""
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.extra}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        try:
            status_line = await self.reader.readline()
            length = 0
            while (line := await self.reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            payload = await self.reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            await self.close()
            raise
        if not status_line:
            await self.close()
            raise ConnectionError("connection closed")
        return int(status_line.split()[1]), payload

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None
