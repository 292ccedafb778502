"""The serving loop of every service: bind, start, serve, drain, stop.

Invariants:
- start-up failures (bad settings, port in use, a dependency that does not answer within
  `startup_timeout_s`) end the process with one line on stderr and a sysexits code, no traceback;
- the first SIGTERM first runs `Lifecycle.lame_duck()` (bounded by `lame_duck_s`) while the
  service still serves everything: the ingress turns unready and closes its WebSockets at a
  bounded rate there; then, as on SIGINT, the server stops taking new work (uvicorn stops
  accepting), lets in-flight requests finish within `shutdown_timeout_s / 2`, then
  `Lifecycle.stop()` finishes and commits what its consumers hold; the process exits 0 within
  `lame_duck_s + shutdown_timeout_s` (the pod's grace covers it). A second signal skips what
  is left of the lame duck.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any, NoReturn, Protocol, TypeVar

import structlog
import uvicorn
import uvloop
from starlette.types import ASGIApp, Receive, Scope, Send

from relay_runtime import bounds, exits, logs, settings

log = structlog.get_logger(__name__)


class Lifecycle(Protocol):
    """What a service starts before serving and stops after the server has drained."""

    async def start(self) -> None:
        """Connect to dependencies (bounded wait) and start background work.

        Raises `StartupError` for anything an operator must fix.
        """

    async def stop(self) -> None:
        """Stop consuming, finish and commit in-flight work, close clients. Idempotent."""

    async def lame_duck(self) -> None:
        """Before shutting down, while everything is still served (may do nothing)."""


class _Server(uvicorn.Server):
    """uvicorn's server with a lame-duck phase: the first SIGTERM runs `lame_duck` on the loop
    (within `budget_s`) and only then lets uvicorn shut down; any other or later signal shuts
    down at once."""

    def __init__(
        self, config: uvicorn.Config, lame_duck: Callable[[], Awaitable[None]], budget_s: float
    ) -> None:
        super().__init__(config)
        self._lame_duck = lame_duck
        self._budget_s = budget_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ducking = False
        self._duck_task: asyncio.Task[None] | None = None
        """Kept referenced while it runs (the loop holds only weak references to tasks)."""

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self._ducking or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)  # re-raised after serving, as uvicorn does
        loop = self._loop
        self._ducking = True

        def start() -> None:
            self._duck_task = loop.create_task(self._duck(), name="lame-duck")

        loop.call_soon_threadsafe(start)

    async def _duck(self) -> None:
        try:
            await asyncio.wait_for(self._lame_duck(), self._budget_s)
        except TimeoutError:
            log.warning("lame_duck_timed_out", budget_s=self._budget_s)
        except Exception:
            log.exception("lame_duck_failed")
        finally:
            self.should_exit = True


class _LifespanApp:
    """Runs the `Lifecycle` on ASGI lifespan events and hands everything else to `app`.

    Start-up errors are kept here rather than raised through the lifespan protocol, which would
    print a traceback; `run_service` reports them as one line.
    """

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle, shutdown_timeout_s: float) -> None:
        self.app = app
        self.lifecycle = lifecycle
        self.shutdown_timeout_s = shutdown_timeout_s
        self.startup_error: exits.StartupError | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.lifecycle.start()
                except exits.StartupError as error:
                    self.startup_error = error
                    await self._stop_quietly()
                    await send({"type": "lifespan.startup.failed", "message": ""})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._stop_quietly()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _stop_quietly(self) -> None:
        try:
            await asyncio.wait_for(self.lifecycle.stop(), self.shutdown_timeout_s / 2)
        except TimeoutError:
            log.warning("stop_timed_out", budget_s=self.shutdown_timeout_s / 2)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the listening socket before anything else starts, so a busy port fails fast."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY on accepted connections
    # only for such sockets. Without it a response written as headers then body waits for the
    # client's delayed ACK: 40 ms on every request of a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise exits.StartupError(f"port {port} on {host} is in use", exits.EXIT_OSERR) from None
        raise exits.StartupError(
            f"cannot listen on {host}:{port}: {error.strerror}", exits.EXIT_OSERR
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


S = TypeVar("S", bound=settings.ServiceSettings)


def _exit_on_sigterm(*_: Any) -> NoReturn:
    # uvicorn re-raises the signal it caught once it has drained; by then the lifecycle has
    # stopped, so the graceful outcome is exit 0 rather than death by signal.
    sys.exit(exits.EXIT_OK)


def run_service(
    service: str,
    settings_type: type[S],
    build: Callable[[S], tuple[ASGIApp, Lifecycle]],
) -> NoReturn:
    """Load settings, bind, start the lifecycle, serve until SIGTERM, stop; never returns."""
    try:
        loaded = settings.load_settings(settings_type)
        logs.configure_logging(service, loaded.instance, loaded.log_level, loaded.log_events_per_s)
        sock = bind_socket(loaded.http.host, loaded.http.port)
        app, lifecycle = build(loaded)
        http = loaded.http
        wrapped = _LifespanApp(
            bounds.BodyLimit(app, http.max_request_bytes), lifecycle, loaded.shutdown_timeout_s
        )
        protocol = bounds.bounded_protocol(
            bounds.Bounds(
                header_timeout_s=http.header_timeout_s,
                body_timeout_s=http.body_timeout_s,
                max_header_bytes=http.max_header_bytes,
                max_connections=bounds.connection_ceiling(http.max_connections),
                max_connections_per_address=http.max_connections_per_address,
            )
        )
        config = uvicorn.Config(
            wrapped,
            lifespan="on",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=max(1, int(loaded.shutdown_timeout_s / 2)),
            timeout_keep_alive=http.keep_alive_timeout_s,
            ws_max_size=1 << 20,
            # The sans-I/O websockets protocol without permessage-deflate: 2,000 idle
            # connections to a bare service cost 30 KB each, against 38 KB with uvicorn's legacy
            # websockets protocol, and 65 KB (sans-I/O) or 127 KB (legacy) when the client
            # offers deflate, as browsers do (a zlib context per direction and connection).
            # Relay's frames are short JSON: compressing them saves little and costs that memory
            # and CPU. The sans-I/O protocol also stops reading while the application has a
            # message unread, so a client cannot queue frames in the server.
            # Subclassed for a handshake timeout (bounds).
            ws=bounds.bounded_websocket_protocol(http.ws_handshake_timeout_s),
            ws_per_message_deflate=False,
            ws_ping_interval=http.ws_ping_interval_s,
            ws_ping_timeout=http.ws_ping_timeout_s,
            # httptools (C) parses HTTP/1.1 instead of h11 (pure Python): with uvloop, the
            # ingress's CPU per queue message fell ~25% in interleaved runs (decision 0011).
            # Subclassed for the header timeout, connection limits and JSON refusals (bounds).
            http=protocol,
        )
        server = _Server(config, lifecycle.lame_duck, loaded.lame_duck_s)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        log.info("starting", port=sock.getsockname()[1])
        try:
            # uvloop: the event loop and socket transports in C. Every service spends most of
            # its CPU in socket writes and loop turns (py-spy, bench/queues_bench.py).
            uvloop.run(server.serve(sockets=[sock]))
        except SystemExit:
            # uvicorn exits 3 when start-up failed; our SIGTERM handler exits 0 after draining.
            if wrapped.startup_error is None:
                log.info("stopped")
                raise
        if wrapped.startup_error is not None:
            raise wrapped.startup_error
    except exits.StartupError as error:
        print(f"{service}: error: {error}", file=sys.stderr, flush=True)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        sys.exit(exits.EXIT_OK)
    log.info("stopped")
    sys.exit(exits.EXIT_OK)
