"""Delivery: consumes queue events in a consumer group and pushes deliveries to the ingress
instance that holds each subscriber's connection.

Wiring only: settings, the bus and its consumers, probe routes. Domain logic lives in libs.
"""

from __future__ import annotations

from fastapi import FastAPI

from relay_bus import ping, topics
from relay_bus.bus import Bus
from relay_bus.config import KafkaSettings
from relay_bus.lifecycle import BusLifecycle
from relay_runtime import settings
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

SERVICE = "delivery"
GROUP = "relay.delivery"


class DeliverySettings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()


def build(config: DeliverySettings) -> tuple[FastAPI, BusLifecycle]:
    readiness = Readiness()
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    forward = ping.forwarder(bus, SERVICE, config.instance, topics.PUBLICATIONS)
    bus.consumer(topics.QUEUE_EVENTS, forward, group_id=GROUP)
    app = FastAPI(title="Relay delivery", routes=probe_routes(readiness))
    return app, BusLifecycle(bus, config.startup_timeout_s)
