"""Service settings from `RELAY_*` environment variables, validated once at start.

Invariant: a service either gets fully valid settings or a `StartupError` whose message names
every bad variable on one line. Settings are built in `main()`, never at import, and no other
module reads `os.environ`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from relay_runtime import exits

ENV_PREFIX = "RELAY_"
NESTED_DELIMITER = "__"


def default_instance() -> str:
    """`<hostname>-<pid>`: unique per process on one host, stable for its lifetime."""
    return f"{socket.gethostname()}-{os.getpid()}"


class HttpSettings(BaseModel):
    """Where the service's HTTP server listens."""

    host: str = "127.0.0.1"
    """Interface to bind; `0.0.0.0` in containers."""
    port: int = Field(8080, ge=0, le=65535)
    """TCP port; 0 picks a free one (tests only)."""
    header_timeout_s: float = Field(10.0, gt=0, le=300)
    """How long a connection may take to send a request's headers (from its connect, or from the
    first byte of a kept-alive request) before it is closed: half-open connections are shed."""
    body_timeout_s: float = Field(30.0, gt=0, le=3600)
    """How long a request may take to send its whole body once its headers are in (however
    slowly bytes keep coming); past it the client gets 408 TIMEOUT if nothing was answered yet,
    and the connection is closed: a body trickled a byte at a time cannot hold a connection."""
    keep_alive_timeout_s: int = Field(5, ge=1, le=300)
    """How long an idle kept-alive HTTP connection stays open between requests."""
    max_header_bytes: int = Field(32768, ge=1024, le=1 << 20)
    """Largest request line plus headers accepted (431 TOO_LARGE beyond)."""
    max_request_bytes: int = Field(4 << 20, ge=1024, le=1 << 30)
    """Largest request body accepted, by Content-Length or counted while streamed (413
    TOO_LARGE beyond, before the application parses anything)."""
    max_connections: int = Field(10_000, ge=1)
    """Connections (HTTP and WebSocket) this process holds at once; beyond, a new connection gets
    503 UNAVAILABLE and is closed unread. Lowered at start to what RLIMIT_NOFILE allows."""
    max_connections_per_address: int = Field(1024, ge=1)
    """HTTP connections (before any WebSocket upgrade) one client address may hold at once;
    beyond, a new one gets 503 UNAVAILABLE and is closed unread."""
    ws_handshake_timeout_s: float = Field(10.0, gt=0, le=300)
    """How long the application may take to accept or refuse a WebSocket after its upgrade
    request before the connection is closed."""
    ws_ping_interval_s: float = Field(20.0, gt=0, le=600)
    """How often the server pings an idle WebSocket connection."""
    ws_ping_timeout_s: float = Field(20.0, gt=0, le=600)
    """How long a ping may go unanswered before the WebSocket connection is closed."""


class ServiceSettings(BaseSettings):
    """Settings every service has. Each service subclasses this once."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED_DELIMITER,
        extra="ignore",
        frozen=True,
    )

    instance: str = Field(default_factory=default_instance)
    """This process's name in logs, metrics and the ping; defaults to `<hostname>-<pid>`."""
    http: HttpSettings = HttpSettings()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Minimum level of the JSON log lines written to stderr."""
    log_events_per_s: int = Field(20, ge=1, le=100_000)
    """Lines one event (by name) may write per second; the rest are counted in one
    `log_suppressed` line, so a client repeating what gets logged cannot fill the disk."""
    admin_token: SecretStr | None = None
    """Bearer token for `/admin/*`; admin endpoints answer 403 while it is unset."""
    startup_timeout_s: float = Field(15.0, gt=0, le=600)
    """How long start waits for Kafka and Redis before giving up with exit 69."""
    shutdown_timeout_s: float = Field(8.0, gt=0, le=60)
    """Budget for finishing in-flight work and committing on SIGTERM (the pod grace is 10 s)."""
    lame_duck_s: float = Field(20.0, ge=0, le=300)
    """Most time the lame-duck phase may take on SIGTERM before the shutdown (the ingress's:
    unready, then WebSockets closed at a bounded rate; other services have none). The pod's
    grace must cover it plus `shutdown_timeout_s`."""


class DataSettings(BaseModel):
    """Where a stateful service keeps its volume, and which share of the work it owns."""

    dir: Path = Path("./var/data")
    """Data directory (the PVC mount in Kubernetes)."""
    ordinal: int | None = Field(None, ge=0)
    """This instance's index k of n; derived from a StatefulSet hostname `name-k` when unset."""
    replicas: int = Field(1, ge=1, le=1024)
    """n, the number of instances sharing the work; fixed per data directory."""


S = TypeVar("S", bound=BaseSettings)


_SECRET_WORDS = ("password", "token", "secret", "key")


def _describe(error: dict[str, object]) -> str:
    loc = error["loc"]
    assert isinstance(loc, tuple)
    name = ENV_PREFIX + NESTED_DELIMITER.join(str(part) for part in loc).upper()
    text = f"{name}: {error['msg']}"
    value = error.get("input")
    if isinstance(value, str | int | float) and not any(w in name.lower() for w in _SECRET_WORDS):
        text += f" (got {value!r})"
    return text


def load_settings(settings_type: type[S]) -> S:
    """Build `settings_type` from the environment or raise one-line `StartupError`."""
    try:
        return settings_type()
    except ValidationError as error:
        problems = "; ".join(_describe(dict(e)) for e in error.errors())
        raise exits.StartupError(f"invalid settings: {problems}", exits.EXIT_CONFIG) from None
