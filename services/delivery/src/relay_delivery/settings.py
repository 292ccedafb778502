"""Delivery's settings: every setting of the service (`RELAY_*`, nested ones `RELAY_KAFKA__*`),
validated once at start; nothing else lives here, so any module can import them without
importing the wiring."""

from __future__ import annotations

from pydantic import RedisDsn

from relay_bus.config import KafkaSettings
from relay_runtime import settings


class DeliverySettings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()
    redis_url: RedisDsn = RedisDsn("redis://127.0.0.1:6379/0")
    """Redis holding which ingress connection subscribes to each queue."""
