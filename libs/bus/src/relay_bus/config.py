"""Kafka connection and topic settings, shared by every service.

Invariant: the same settings work against the local broker (plaintext, one node) and a production
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
    """Replication factor of topics Relay creates; 3 on a production cluster. A start waits
    (within its budget) for this many brokers and fails if fewer ever answer."""
    min_insync_replicas: int = Field(1, ge=1, le=16)
    """`min.insync.replicas` of topics Relay creates; 2 on a production cluster. With acks=all,
    a write is acknowledged only once this many replicas have it."""
    topic_prefix: str = Field("", pattern=r"^[A-Za-z0-9._-]{0,100}$")
    """Prepended to every topic and consumer group name, so that several Relay installations
    (or tests) can share one cluster."""
    session_timeout_ms: int = Field(6000, ge=1000, le=300_000)
    heartbeat_interval_ms: int = Field(250, ge=100, le=60_000)
    """How often a group member tells the coordinator it lives, and so how soon it learns of a
    rebalance (a member joined, or was removed as dead: `Bus.remove_static_member`) and stops
    fetching; 250 ms puts a killed replicator's partitions on the live ones within about
    0.3 s of its removal (1000: 0.8 s, kv_faults_bench). A heartbeat is a few dozen bytes."""
    request_timeout_ms: int = Field(10_000, ge=1000, le=300_000)
    fetch_max_wait_ms: int = Field(500, ge=1, le=10_000)
    """Longest a fetch waits for data on an idle partition. The broker answers as soon as data
    arrives (fetch.min.bytes 1), so this bounds only idle polling, not latency."""
    batch_bytes: int = Field(512 * 1024, ge=16 * 1024, le=1_000_000)
    """The producer's batch per partition (`batch.size`). The producer keeps one batch per
    partition open while the previous one is in flight, and a send waits when it is full; at
    aiokafka's 16 KiB default, one 8 KB publication fans out per round trip to an ingress's inbox
    partition, and under load fanouts missed their send budget. At most 1,000,000: a batch must
    fit the broker's default `max.message.bytes` (larger records still go alone)."""
    commit_interval_ms: int = Field(1000, ge=0, le=60_000)
    """Most time between the offset commits of a consumer on fixed partitions that keeps its
    own resume point (the queue-writer): in the background, off the record path (0: after every
    batch). Every other consumer commits after every batch."""
    topic_check_interval_s: float = Field(1.0, gt=0, le=300)
    """How often each service checks that the broker kept its log (the epoch record); every
    `relay_bus.bus.TOPICS_EVERY`th time, also that its topics exist."""

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
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas {self.min_insync_replicas} exceeds replication_factor "
                f"{self.replication_factor}: no write could ever be acknowledged"
            )
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
