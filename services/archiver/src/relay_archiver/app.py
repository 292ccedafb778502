"""Archiver: copies the topics a rebuild needs (`relay_archive.selection`) to Parquet files
(`relay_archive`), for the PySpark jobs in `spark-jobs/`.

Wiring only: settings, the bus and its consumers (consumer group `relay.archiver`), the archive
store, probe routes. The work is `relay_archiver.archiving`, the files `relay_archive`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from pydantic import BaseModel, Field

from relay_archive import selection, writer
from relay_archive.store import open_store
from relay_archiver.archiving import Archiver, Timing
from relay_bus.bus import Bus
from relay_bus.config import KafkaSettings
from relay_bus.lifecycle import BusLifecycle
from relay_runtime import settings
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

SERVICE = "archiver"
GROUP = "relay.archiver"


class ArchiveSettings(BaseModel):
    location: str = ""
    """Where the archive lives: a local folder, or a `pyarrow.fs` URI such as
    `s3://bucket/prefix?endpoint_override=…`; empty: `<data dir>/archive`."""
    roll_bytes: int = Field(64 * 1024 * 1024, ge=1)
    """A partition's file is written once its records reach this many bytes (uncompressed)."""
    roll_age_s: float = Field(60.0, gt=0)
    """… or once its oldest record was read this many seconds ago."""
    lag_interval_s: float = Field(5.0, gt=0)
    """How often lag (`relay_archiver_lag_records`) is measured against Kafka."""


class ArchiverSettings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()
    data: settings.DataSettings = settings.DataSettings(dir=Path("./var/archiver"))
    archive: ArchiveSettings = ArchiveSettings()


def build(config: ArchiverSettings) -> tuple[FastAPI, BusLifecycle]:
    readiness = Readiness()
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    location = config.archive.location or str(config.data.dir / "archive")
    policy = writer.RollPolicy(config.archive.roll_bytes, config.archive.roll_age_s)
    archiver = Archiver(
        bus, open_store(location), policy, Timing(lag_interval_s=config.archive.lag_interval_s)
    )
    for topic in selection.ARCHIVED:
        bus.consumer(
            topic,
            archiver.handler(topic),
            group_id=GROUP,
            start_offsets=archiver.start_offsets(topic),
            on_revoked=archiver.revoked(topic),
            on_unreadable=archiver.unreadable(topic),
        )
    app = FastAPI(title="Relay archiver", routes=probe_routes(readiness))
    lifecycle = BusLifecycle(
        bus, config.startup_timeout_s, before_start=(archiver.open,), drain=(archiver.close,)
    )
    return app, lifecycle
