"""The archiver's settings: every setting of the service (`RELAY_*`, nested ones
`RELAY_ARCHIVE__*`, `RELAY_DATA__*`, `RELAY_KAFKA__*`), validated once at start; nothing else
lives here, so any module can import them without importing the wiring."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from relay_bus.config import KafkaSettings
from relay_runtime import settings


class ArchiveSettings(BaseModel):
    location: str = ""
    """Where the archive lives: a local folder, or a `pyarrow.fs` URI such as
    `s3://bucket/prefix?endpoint_override=…`; empty: `<data dir>/archive`."""
    roll_bytes: int = Field(64 * 1024 * 1024, ge=1)
    """A partition's file is written once its records reach this many bytes (uncompressed)."""
    roll_age_s: float = Field(60.0, gt=0)
    """… or once its oldest record was read this many seconds ago."""
    fetch_min_bytes: int = Field(256 * 1024, ge=1, le=64 * 1024 * 1024)
    """The least each fetch from Kafka returns, unless `RELAY_KAFKA__FETCH_MAX_WAIT_MS` passes
    first: no request waits for the archiver, so it reads in batches (fewer fetches for it and
    the broker, decision 0013); 1 reads each record as soon as it is written."""
    lag_interval_s: float = Field(5.0, gt=0)
    """How often lag (`relay_archiver_lag_records`) is measured against Kafka."""


class ArchiverSettings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()
    data: settings.DataSettings = settings.DataSettings(dir=Path("./var/archiver"))
    archive: ArchiveSettings = ArchiveSettings()
