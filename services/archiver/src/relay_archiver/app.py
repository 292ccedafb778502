"""Archiver: copies the topics a rebuild needs (`relay_archive.selection`) to Parquet files
(`relay_archive`), for the PySpark jobs in `spark-jobs/`.

Wiring only: settings (`relay_archiver.settings`), the bus and its consumers (consumer group
`relay.archiver`), the archive store, probe routes. The work is `relay_archiver.archiving`, the
files `relay_archive`.
"""

from __future__ import annotations

from fastapi import FastAPI

from relay_archive import selection, writer
from relay_archive.store import open_store
from relay_archiver.archiving import Archiver, Timing
from relay_archiver.settings import ArchiverSettings
from relay_bus.bus import Bus
from relay_bus.lifecycle import BusLifecycle
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

SERVICE = "archiver"
GROUP = "relay.archiver"


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
            fetch_min_bytes=config.archive.fetch_min_bytes,
        )
    app = FastAPI(title="Relay archiver", routes=probe_routes(readiness))
    lifecycle = BusLifecycle(
        bus, config.startup_timeout_s, before_start=(archiver.open,), drain=(archiver.close,)
    )
    return app, lifecycle
