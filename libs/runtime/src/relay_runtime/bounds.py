"""Server-level bounds every service keeps against hostile or broken clients (issue 19).

Invariants:
- a connection that has not finished its request headers within `header_timeout_s` (from its
  connect, or from the first byte of a kept-alive request) is closed: half-open connections
  cost a file descriptor for at most that long;
- a request whose body is not complete within `body_timeout_s` of its headers is answered 408
  `TIMEOUT` (unless the application already answered) and its connection closed, however
  slowly its bytes keep coming;
- past `max_connections` per process, or `max_connections_per_address` HTTP connections from
  one address, a new connection is answered 503 and closed without reading it;
- the HTTP server's own refusals (unparseable bytes, bad request line, bad Content-Length,
  oversized headers) use the API's error shape `{"error": CODE, "detail": text}`, never
  uvicorn's plain-text "Invalid HTTP request received.";
- a request body larger than `max_request_bytes` (declared or streamed) is answered 413 before
  the application reads past the limit;
- a WebSocket whose handshake the application has not completed within `ws_handshake_timeout_s`
  of the upgrade is closed.

uvicorn has no header-read or body-read timeout, no per-address limit and a plain-text 400, so the
httptools protocol is subclassed (`bounded_protocol`) and passed as `http=` to uvicorn.Config.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn._types import ASGISendEvent
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

log = structlog.get_logger(__name__)

DESCRIPTORS_KEPT_FREE = 256
"""File descriptors `max_connections` leaves to the process (Kafka, Redis, logs, journals)."""


@dataclass(frozen=True)
class Bounds:
    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    max_connections: int
    max_connections_per_address: int


def error_body(code: str, detail: str) -> bytes:
    return json.dumps({"error": code, "detail": detail}, separators=(",", ":")).encode()


def raw_error(status: int, code: str, detail: str) -> bytes:
    """A complete HTTP/1.1 error response in the API's error shape, closing the connection."""
    body = error_body(code, detail)
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


def connection_ceiling(wanted: int) -> int:
    """`wanted`, lowered to what the open-file limit allows once `DESCRIPTORS_KEPT_FREE` are
    kept for everything else. Raises the soft limit to the hard one first (containers often
    start at 1,024 with a hard limit far above)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    allowed = max(1, soft - DESCRIPTORS_KEPT_FREE)
    if wanted > allowed:
        log.warning("max_connections_lowered", wanted=wanted, allowed=allowed, nofile=soft)
        return allowed
    return wanted


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header timeout, connection limits, a header-size
    bound and JSON refusals. Use `bounded_protocol(bounds)` for a class bound to settings."""

    bounds: ClassVar[Bounds]
    per_address: ClassVar[Counter[str]]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.header_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.awaiting_headers = True
        self.header_bytes = 0
        self.address: str | None = None
        """The client address counted in `per_address` while this connection is HTTP."""

    # Connection life

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else ""
        if len(self.connections) > self.bounds.max_connections:
            log.warning("connection_refused", reason="max_connections", client=address)
            self.refuse(503, "UNAVAILABLE", "this server holds all the connections it can")
            return
        if self.per_address[address] >= self.bounds.max_connections_per_address:
            log.warning("connection_refused", reason="max_connections_per_address", client=address)
            self.refuse(503, "UNAVAILABLE", "too many connections from this address")
            return
        self.per_address[address] += 1
        self.address = address
        self.arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.release()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        # The WebSocket protocol takes the transport over; its own limits apply from here
        # (the ingress's per-address limit, ping timeout), and this one's count ends.
        self.release()
        super().handle_websocket_upgrade()

    def release(self) -> None:
        self.cancel_header_timer()
        self.cancel_body_timer()
        if self.address is not None:
            self.per_address[self.address] -= 1
            if self.per_address[self.address] <= 0:
                del self.per_address[self.address]
            self.address = None

    def refuse(self, status: int, code: str, detail: str) -> None:
        """Answer `status` in the API's error shape and close; nothing more is read."""
        self.cancel_header_timer()
        if self.transport.is_closing():
            return
        self.transport.write(raw_error(status, code, detail))
        self.transport.close()

    # Header timeout

    def arm_header_timer(self) -> None:
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(
                self.bounds.header_timeout_s, self.header_timed_out
            )

    def cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def header_timed_out(self) -> None:
        self.header_timer = None
        if (self.awaiting_headers or self.between_requests()) and not self.transport.is_closing():
            log.info("connection_shed", reason="header_timeout", client=self.address)
            self.transport.close()

    # Body timeout

    def cancel_body_timer(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None

    def body_timed_out(self) -> None:
        self.body_timer = None
        if self.transport.is_closing():
            return
        log.info("connection_shed", reason="body_timeout", client=self.address)
        if self.cycle is not None and not self.cycle.response_started:
            seconds = f"{self.bounds.body_timeout_s:g}"
            self.refuse(408, "TIMEOUT", f"the request body did not arrive within {seconds} s")
        else:
            self.transport.close()

    # Parsing

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        if self.between_requests():
            # Bytes after a response (the next request, or CRLFs the parser skips, which would
            # otherwise keep the connection forever with neither timer armed): the next
            # request's headers are due within the header timeout.
            self.arm_header_timer()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as error:
            log.info("bad_http_request", client=self.address, reason=str(error)[:200])
            self.send_400_response(f"malformed HTTP request: {str(error)[:200]}")
            return
        if self.awaiting_headers:
            # Headers still unfinished after this chunk: everything read so far is header.
            self.header_bytes += len(data)
            if self.header_bytes > self.bounds.max_header_bytes:
                self.refuse_large_headers()

    def send_400_response(self, msg: str) -> None:
        self.refuse(400, "BAD_REQUEST", msg)

    def refuse_large_headers(self) -> None:
        log.info("bad_http_request", client=self.address, reason="headers too large")
        self.refuse(
            431,
            "TOO_LARGE",
            f"request line and headers exceed {self.bounds.max_header_bytes} bytes",
        )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.awaiting_headers = True
        self.header_bytes = 0
        self.arm_header_timer()

    def on_headers_complete(self) -> None:
        self.awaiting_headers = False
        self.cancel_header_timer()
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.bounds.max_header_bytes:
            self.refuse_large_headers()
            return
        super().on_headers_complete()
        if not self.transport.is_closing():
            # Cancelled by on_message_complete: at once for a request without a body.
            self.body_timer = self.loop.call_later(self.bounds.body_timeout_s, self.body_timed_out)

    def on_body(self, body: bytes) -> None:
        if self.transport.is_closing() and self.cycle is None:
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.header_bytes = 0
        self.cancel_body_timer()
        if self.transport.is_closing() and self.cycle is None:
            return
        super().on_message_complete()


def bounded_protocol(bounds: Bounds) -> type[BoundedHttpToolsProtocol]:
    """A protocol class bound to `bounds`, with its own per-address counts (one per server)."""
    return type(
        "BoundedHttpToolsProtocol",
        (BoundedHttpToolsProtocol,),
        {"bounds": bounds, "per_address": Counter()},
    )


class BoundedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O websockets protocol with a handshake timeout: a connection whose
    handshake the application has not completed (accepted or refused) within
    `handshake_timeout_s` of the upgrade is closed. Use `bounded_websocket_protocol`."""

    handshake_timeout_s: ClassVar[float]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.handshake_timer: asyncio.TimerHandle | None = self.loop.call_later(
            self.handshake_timeout_s, self.handshake_timed_out
        )

    def handshake_timed_out(self) -> None:
        self.handshake_timer = None
        if not self.handshake_complete and not self.transport.is_closing():
            log.info("connection_shed", reason="websocket_handshake_timeout")
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handshake_timer is not None:
            self.handshake_timer.cancel()
            self.handshake_timer = None
        super().connection_lost(exc)

    async def send(self, message: ASGISendEvent) -> None:
        await super().send(message)
        if self.handshake_complete and getattr(self, "response", None) is not None:
            # The handshake's parsed request and response are never read again (the scope
            # has the headers): dropped, an idle connection costs ~2.5 KB less.
            self.request = None  # type: ignore[assignment]
            self.response = None  # type: ignore[assignment]


def bounded_websocket_protocol(handshake_timeout_s: float) -> type[BoundedWebSocketProtocol]:
    return type(
        "BoundedWebSocketProtocol",
        (BoundedWebSocketProtocol,),
        {"handshake_timeout_s": handshake_timeout_s},
    )


class _BodyTooLargeError(Exception):
    pass


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered 413 TOO_LARGE before the
    application reads past the limit, whether declared (Content-Length) or streamed (chunked).

    The application sees the overflow as an exception from `receive`; whatever it then tries
    to send is dropped, since the 413 has already gone out.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0:
                    await self.refuse(send, 400, "BAD_REQUEST", "invalid Content-Length")
                    return
                if declared > self.max_bytes:
                    await self.refuse_large(send)
                    return
        received = 0
        started = False
        refused = False

        async def counting_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if not started:
                        refused = True
                        await self.refuse_large(send)
                    raise _BodyTooLargeError
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        # Refused (413 sent), or the response had already started: uvicorn closes the
        # connection either way, as the application never read the whole body.
        with contextlib.suppress(_BodyTooLargeError):
            await self.app(scope, counting_receive, guarded_send)

    async def refuse_large(self, send: Send) -> None:
        await self.refuse(send, 413, "TOO_LARGE", f"request body exceeds {self.max_bytes} bytes")

    @staticmethod
    async def refuse(send: Send, status: int, code: str, detail: str) -> None:
        body = error_body(code, detail)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode("ascii")),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
