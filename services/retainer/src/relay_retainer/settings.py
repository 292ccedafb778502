"""The retainer's settings: every setting of the service (`RELAY_*`, nested ones
`RELAY_STREAMS__*`, `RELAY_RETAINED__*`, `RELAY_DATA__*`, `RELAY_KAFKA__*`), validated once at
start; nothing else lives here, so any module can import them without importing the wiring or
the stores. The engines' own settings (`relay_streams.settings.DbSettings`,
`relay_streams.retained.RetainedSettings`) are not read from the environment: the hosts build
them from these."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from relay_bus.config import KafkaSettings
from relay_runtime import settings
from relay_streams.settings import MAX_SHARDS


class StreamSettings(BaseModel):
    """The retainer's stream store (`RELAY_STREAMS__*`)."""

    databases: list[str] = ["messages"]
    """Databases opened (created if needed) at start; those already on disk open as well."""
    shards: int = Field(4, ge=1, le=MAX_SHARDS)
    """Shards of a database this retainer creates; fixed once the database exists."""
    max_reply_bytes: int = Field(393_216, ge=1024, le=700_000)  # bytes of topics and payloads
    """A `next` answer stops after the message that reaches this size, so that the reply
    (base64 payloads, JSON) stays under Kafka's 1 MiB record limit."""


class RetainedServiceSettings(BaseModel):
    """The retainer's retained store (`RELAY_RETAINED__*`)."""

    max_payload_bytes: int = Field(1 << 20, ge=1, le=1 << 20)
    """Largest retained payload (MQTT's default in EMQX: 1 MiB)."""
    max_retained: int = Field(0, ge=0)
    """Most topics this retainer keeps (0: no limit); at the limit new topics are refused with
    `QUOTA`, retained topics are still replaced."""
    clear_interval_s: float = Field(10.0, ge=0)
    """How often expired messages are deleted (0: never; they are never returned either way)."""
    max_reply_bytes: int = Field(393_216, ge=1024, le=700_000)
    """A `match` answer stops after the message that reaches this size (topics and payloads)."""
    replication: Literal["off", "quorum"] = "off"
    """`quorum`: each retained publish and delete is also written to a quorum of replicators
    before it is answered, and an empty store is rebuilt from them at start."""
    replicators: list[str] = []
    """URLs of the replicators (JSON list); the first that answers coordinates the write."""
    replication_timeout_s: float = Field(5.0, gt=0, le=60)
    """How long one replicated write may take before the publish is answered 503."""


class RetainerSettings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()
    data: settings.DataSettings = settings.DataSettings(dir=Path("./var/retainer"))
    streams: StreamSettings = StreamSettings()
    retained: RetainedServiceSettings = RetainedServiceSettings()
