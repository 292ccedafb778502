"""The queue-writer's settings: every setting of the service (`RELAY_*`, nested ones
`RELAY_DATA__*`, `RELAY_KAFKA__*`), validated once at start; nothing else lives here, so any
module can import them without importing the wiring."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from relay_bus.config import KafkaSettings
from relay_queues import idempotency
from relay_runtime import settings


class QueueWriterSettings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()
    data: settings.DataSettings = settings.DataSettings(dir=Path("./var/queue-writer"))
    dump_interval_s: float = Field(3600.0, ge=0)
    """Seconds between store-log dumps; 0 switches the timer off (the operator drives dumps)."""
    expire_interval_s: float = Field(3600.0, gt=0)
    """Seconds between sweeps dropping expired messages from every queue."""
    idempotency_window_s: int = Field(idempotency.DEFAULT_WINDOW_S, ge=1)
    """How long a SEND is remembered by its `Idempotency-Key` (or, without one, its msg_id,
    which a Kafka producer retry repeats): a retry within it is answered with the first
    send's msg_id and stores nothing, across restarts. Memory and disk grow with the sends
    of one window."""
    store_repair: bool = False
    """Start even if the store log has unreadable records in the middle, skipping them (each
    is logged). Off by default: such a start loses the skipped changes."""
