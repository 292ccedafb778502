"""The replicator's settings: every setting of the service (`RELAY_*`, nested ones `RELAY_KV__*`,
`RELAY_DATA__*`, `RELAY_KAFKA__*`), validated once at start; nothing else lives here, so any
module can import them without importing the wiring. (`coordinator.CoordinatorSettings` is
not one: the coordinator's own values, taken from `KvSettings` when the app is built.)"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from relay_bus.config import KafkaSettings
from relay_runtime import settings


class KvSettings(BaseModel):
    """The replicated key-value store and its peers."""

    peers: list[str] = []
    """URLs of every replicator (this one's may be listed too); empty: this site alone."""
    replica_timeout_s: float = Field(1.0, gt=0, le=30)
    """How long a coordinator waits for a replica's answer (a quorum round's limit)."""
    down_s: float = Field(1.0, gt=0, le=300)
    """How long a peer that failed a call is treated as unreachable before it is tried again."""
    max_skew_ms: int = Field(5000, ge=0)
    """How far ahead of this site's clock a version may be; later ones are refused."""
    max_value_bytes: int = Field(65536, ge=1, le=1 << 20)
    """Largest value or set member accepted, decoded (TOO_LARGE beyond)."""
    hint_max_bytes: int = Field(64 << 20, ge=0)
    """Bytes of hints this site keeps for unreachable peers; more are refused."""
    hint_max_age_s: float = Field(10800.0, gt=0)
    """Hints older than this are dropped (anti-entropy repairs what they carried)."""
    handoff_interval_s: float = Field(1.0, gt=0)
    """How often held hints are offered back to their targets."""
    sync_interval_s: float = Field(10.0, ge=0)
    """Seconds between anti-entropy passes (0: none)."""
    clock_offset_ms: int = 0
    """Added to this site's wall clock (tests skew one site's clock with it; 0 in production)."""
    gc_guard: bool = True
    """Purge a tombstone only after a completed sync with every replica (tests switch it off
    to show the deleted value coming back)."""


class ReplicatorSettings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()
    data: settings.DataSettings = settings.DataSettings(dir=Path("./var/replicator"))
    kv: KvSettings = KvSettings()
