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
    admin_token: SecretStr | None = None
    """Bearer token for `/admin/*`; admin endpoints answer 403 while it is unset."""
    startup_timeout_s: float = Field(15.0, gt=0, le=600)
    """How long start waits for Kafka and Redis before giving up with exit 69."""
    shutdown_timeout_s: float = Field(8.0, gt=0, le=60)
    """Budget for finishing in-flight work and committing on SIGTERM (the pod grace is 10 s)."""


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
