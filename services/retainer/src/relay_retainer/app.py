"""Retainer: keeps retained messages and durable streams for the publication partitions it owns
(instance k of n owns partitions p with p mod n == k).

Wiring only: settings, the bus and its consumers, probe routes. Domain logic lives in libs.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from relay_bus import ping, topics
from relay_bus.bus import Bus
from relay_bus.config import KafkaSettings
from relay_bus.lifecycle import BusLifecycle
from relay_runtime import ownership, settings
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

SERVICE = "retainer"
GROUP = "relay.retainer"


class RetainerSettings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()
    data: settings.DataSettings = settings.DataSettings(dir=Path("./var/retainer"))


def build(config: RetainerSettings) -> tuple[FastAPI, BusLifecycle]:
    readiness = Readiness()
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    forward = ping.forwarder(bus, SERVICE, config.instance, topics.REPLICATION)
    ordinal = ownership.resolve_ordinal(config.data)
    replicas = config.data.replicas
    owned = ownership.owned_partitions(config.kafka.partitions, ordinal, replicas)
    bus.consumer(topics.PUBLICATIONS, forward, group_id=GROUP, partitions=owned)

    async def claim_data_dir() -> None:
        ownership.claim_data_dir(config.data.dir, SERVICE, ordinal, replicas)

    app = FastAPI(title="Relay retainer", routes=probe_routes(readiness))
    return app, BusLifecycle(bus, config.startup_timeout_s, before_start=(claim_data_dir,))
