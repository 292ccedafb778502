"""Delivery: consumes queue events and publications in consumer groups and pushes deliveries
(queue messages, live publications) to the ingress instance that holds each subscriber's
connection.

Wiring only: settings (`relay_delivery.settings`), Redis, the bus and its consumers, probe
routes. Domain logic lives in `relay_queues.delivery` and `relay_topics.index`.
"""

from __future__ import annotations

from fastapi import FastAPI

from relay_bus import ping, topics
from relay_bus.bus import Bus
from relay_bus.lifecycle import BusLifecycle
from relay_delivery.publications import LivePublications
from relay_delivery.pushes import Pushes
from relay_delivery.settings import DeliverySettings
from relay_routes import client, subscriptions
from relay_routes.topic_subscriptions import TopicSubscriptions
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

SERVICE = "delivery"
GROUP = "relay.delivery"
PUBLICATIONS_GROUP = "relay.delivery.publications"


def build(config: DeliverySettings) -> tuple[FastAPI, BusLifecycle]:
    readiness = Readiness()
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    redis = client.connect(str(config.redis_url))
    pushes = Pushes(
        bus, subscriptions.Subscriptions(redis), config.kafka.partitions, config.instance
    )
    forward = ping.forwarder(bus, SERVICE, config.instance, topics.PUBLICATIONS)
    bus.consumer(
        topics.QUEUE_EVENTS,
        pushes.handler(forward),
        group_id=GROUP,
        start_offsets=pushes.start_offsets,
        on_revoked=pushes.revoked,
    )
    live = LivePublications(
        bus, TopicSubscriptions(redis), config.kafka.inbox_partitions, config.instance
    )
    bus.consumer(
        topics.PUBLICATIONS,
        live.handle,
        group_id=PUBLICATIONS_GROUP,
        start_offsets=live.start_offsets,
        on_revoked=live.revoked,
    )

    async def connect_redis() -> None:
        await subscriptions.wait_for_redis(redis, str(config.redis_url), config.startup_timeout_s)

    async def close_redis() -> None:
        await redis.aclose()

    app = FastAPI(title="Relay delivery", routes=probe_routes(readiness))
    lifecycle = BusLifecycle(
        bus,
        config.startup_timeout_s,
        before_start=(connect_redis,),
        drain=(pushes.close,),
        after_stop=(close_redis,),
    )
    return app, lifecycle
