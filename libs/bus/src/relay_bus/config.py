"""Kafka connection and topic settings, shared by every service.

Invariant: the same settings work against the embedded broker (plaintext, one node) and a real
cluster (TLS and SASL passed through to the client untouched); invalid combinations are rejected
at start, before any connection is tried.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


class KafkaSettings(BaseModel):
    """How to reach Kafka and how Relay's topics are laid out (`RELAY_KAFKA__*`)."""

    bootstrap_servers: str = "127.0.0.1:9092"
    """Comma-separated `host:port` list."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    """CA bundle for SSL and SASL_SSL; the system store when unset."""
    ssl_certfile: Path | None = None
    """Client certificate for mutual TLS."""
    ssl_keyfile: Path | None = None
    partitions: int = Field(8, ge=1, le=4096)
    """Partitions of the keyed topics (queue commands and events, publications, replication)."""
    inbox_partitions: int = Field(16, ge=1, le=1024)
    """Partitions of the ingress inbox: the most ingress instances that can run at once."""
    replication_factor: int = Field(1, ge=1, le=16)
    """Replication factor of topics Relay creates; 3 on a production cluster."""
    session_timeout_ms: int = Field(6000, ge=1000, le=300_000)
    heartbeat_interval_ms: int = Field(1000, ge=100, le=60_000)
    request_timeout_ms: int = Field(10_000, ge=1000, le=300_000)
    fetch_max_wait_ms: int = Field(10, ge=1, le=10_000)
    """Longest a fetch waits for data. The embedded broker answers a fetch only when this runs
    out (records wait half of it on average), so it is low; a real broker answers as soon as
    data arrives, and a low value there only adds fetches while a consumer is idle."""
    topic_check_interval_s: float = Field(1.0, gt=0, le=300)
    """How often each service checks that its topics exist and the broker kept its log."""
    recreate_mismatched_topics: bool = False
    """Delete and recreate a Relay topic whose partition count is wrong. Only for brokers
    that lose everything on restart (the embedded one): on a real cluster a wrong count is
    an operator's decision and stops the start instead."""

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",") if s.strip()]
        if not servers:
            raise ValueError("needs at least one host:port")
        for server in servers:
            match = _HOST_PORT.match(server)
            if match is None or not 0 < int(match.group(2)) < 65536:
                raise ValueError(f"{server!r} is not host:port")
        return ",".join(servers)

    @model_validator(mode="after")
    def _security_complete(self) -> Self:
        if self.security_protocol.startswith("SASL") and not (
            self.sasl_mechanism and self.sasl_username and self.sasl_password
        ):
            raise ValueError(
                f"{self.security_protocol} needs sasl_mechanism, sasl_username and sasl_password"
            )
        for path in (self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile):
            if path is not None and not path.is_file():
                raise ValueError(f"TLS file {path} does not exist")
        return self

    @property
    def servers(self) -> list[str]:
        return self.bootstrap_servers.split(",")
