"""Ingress wiring: settings, Redis, the bus, the inbox and the routers.

Wiring only; request handling lives in the routers, domain logic in libs.
"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import Field, RedisDsn
from redis.asyncio import Redis

from relay_bus import topics
from relay_bus.bus import Bus
from relay_bus.config import KafkaSettings
from relay_bus.lifecycle import BusLifecycle
from relay_ingress import admin, ds, ds_admin, errors, queues, retained, websocket
from relay_ingress.connections import Connections, Limits
from relay_ingress.context import Context
from relay_ingress.inbox import Inbox
from relay_routes import subscriptions
from relay_routes.subscriptions import Subscriptions
from relay_routes.topic_subscriptions import TopicSubscriptions
from relay_runtime import settings
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

SERVICE = "ingress"


class IngressSettings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()
    redis_url: RedisDsn = RedisDsn("redis://127.0.0.1:6379/0")
    """Redis for connection routing, leases and rate limits (ephemeral state only)."""
    ping_timeout_s: float = Field(10.0, gt=0, le=60)
    """How long `/admin/ping` waits for its ping to come back."""
    request_timeout_s: float = Field(10.0, gt=0, le=60)
    """How long a client request waits for its queue-writer's answer before 503."""
    ws_connections_per_address: int = Field(256, ge=1)
    """WebSocket connections one client address may hold at this instance."""
    ws_frames_per_s: float = Field(100.0, gt=0)
    """Frames per second a connection may send (RATE_LIMITED beyond), with a burst of
    `ws_frame_burst`."""
    ws_frame_burst: int = Field(200, ge=1)
    ws_max_frame_bytes: int = Field(65536, ge=1024, le=1 << 20)
    """Largest text frame answered; larger ones get TOO_LARGE (past 1 MiB the connection is
    closed by the WebSocket layer)."""
    ws_commands_in_flight: int = Field(64, ge=1, le=10_000)
    """Commands of one connection waiting for the queue-writer at once."""
    max_body_bytes: int = Field(16384, gt=0, le=1 << 20)
    """Largest message body accepted, decoded (TOO_LARGE beyond)."""
    ds_max_batch_messages: int = Field(1000, ge=1, le=100_000)
    """Messages one `POST /v1/ds/{db}/messages` may carry (TOO_LARGE beyond)."""
    ds_max_batch_bytes: int = Field(524_288, ge=1024, le=700_000)  # bytes
    """Topic and decoded payload bytes one durable-stream batch may carry (TOO_LARGE beyond):
    each part travels as one Kafka record, base64 included, under the 1 MiB record limit."""
    max_publish_bytes: int = Field(1 << 20, ge=1, le=1 << 20)
    """Largest publish payload accepted, decoded (TOO_LARGE beyond; MQTT brokers' usual 1 MiB)."""
    publish_per_s: int = Field(1000, ge=1)
    """Publishes one client address may make per second, over every ingress instance
    (RATE_LIMITED beyond)."""
    admin_timeout_s: float = Field(30.0, gt=0, le=600)
    """How long admin requests to every queue-writer (`/admin/dump`) wait for all answers."""


def build(config: IngressSettings) -> tuple[FastAPI, BusLifecycle]:
    readiness = Readiness()
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    redis = Redis.from_url(str(config.redis_url), socket_timeout=5, socket_connect_timeout=2)
    limits = Limits(
        connections_per_address=config.ws_connections_per_address,
        frames_per_s=config.ws_frames_per_s,
        frame_burst=config.ws_frame_burst,
        max_frame_bytes=config.ws_max_frame_bytes,
        commands_in_flight=config.ws_commands_in_flight,
    )
    connections = Connections(
        bus, Subscriptions(redis), config.kafka.partitions, limits, TopicSubscriptions(redis)
    )
    inbox = Inbox(
        redis,
        bus,
        config.instance,
        config.kafka.inbox_partitions,
        readiness,
        deliver=connections.deliver,
        fanout=connections.fanout,
        retaken=connections.register_all,
    )

    async def lease_inbox() -> None:
        await subscriptions.wait_for_redis(redis, str(config.redis_url), config.startup_timeout_s)
        slot = await inbox.lease()
        await connections.claim_slot(slot)
        bus.consumer(
            topics.INGRESS_INBOX,
            inbox.handle,
            group_id=None,
            partitions=[slot],
            start_offsets=claim_offsets,
        )

    async def claim_offsets(partitions: list[int]) -> dict[int, int]:
        offsets = await inbox.claim_offsets(partitions)
        await connections.forget_stale()
        return offsets

    async def close_redis() -> None:
        await inbox.release()
        await redis.aclose()

    app = FastAPI(
        title="Relay",
        summary="Durable message relay: queues, retained messages, durable streams.",
        version="0.1.0",
        routes=probe_routes(readiness),
    )
    app.state.context = Context(
        config=config, bus=bus, inbox=inbox, redis=redis, connections=connections
    )
    errors.install(app)
    app.include_router(queues.router)
    app.include_router(websocket.router)
    app.include_router(admin.router)
    app.include_router(ds.router)
    app.include_router(ds_admin.router)
    app.include_router(retained.router)
    app.include_router(retained.admin_router)
    lifecycle = BusLifecycle(
        bus, config.startup_timeout_s, before_start=(lease_inbox,), after_stop=(close_redis,)
    )
    return app, lifecycle
