"""Ingress wiring: settings, Redis, the bus, the inbox and the routers.

Wiring only; request handling lives in the routers, domain logic in libs.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI
from pydantic import Field, RedisDsn
from redis.asyncio import Redis
from redis.exceptions import RedisError

from relay_bus import topics
from relay_bus.bus import Bus
from relay_bus.config import KafkaSettings
from relay_bus.lifecycle import BusLifecycle
from relay_ingress import admin, errors, queues
from relay_ingress.context import Context
from relay_ingress.inbox import Inbox
from relay_runtime import exits, settings
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
    max_body_bytes: int = Field(16384, gt=0, le=1 << 20)
    """Largest message body accepted, decoded (TOO_LARGE beyond)."""
    admin_timeout_s: float = Field(30.0, gt=0, le=600)
    """How long admin requests to every queue-writer (`/admin/dump`) wait for all answers."""


async def _wait_for_redis(redis: Redis, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await redis.ping()
            return
        except (RedisError, OSError) as error:
            if time.monotonic() + 0.5 >= deadline:
                raise exits.StartupError(
                    f"cannot reach Redis at {url}: {error}", exits.EXIT_UNAVAILABLE
                ) from None
        await asyncio.sleep(0.5)


def build(config: IngressSettings) -> tuple[FastAPI, BusLifecycle]:
    readiness = Readiness()
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    redis = Redis.from_url(str(config.redis_url), socket_timeout=5, socket_connect_timeout=2)
    inbox = Inbox(redis, bus, config.instance, config.kafka.inbox_partitions, readiness)

    async def lease_inbox() -> None:
        await _wait_for_redis(redis, str(config.redis_url), config.startup_timeout_s)
        slot = await inbox.lease()
        bus.consumer(
            topics.INGRESS_INBOX,
            inbox.handle,
            group_id=None,
            partitions=[slot],
            start_offsets=inbox.claim_offsets,
        )

    async def close_redis() -> None:
        await inbox.release()
        await redis.aclose()

    app = FastAPI(
        title="Relay",
        summary="Durable message relay: queues, retained messages, durable streams.",
        version="0.1.0",
        routes=probe_routes(readiness),
    )
    app.state.context = Context(config=config, bus=bus, inbox=inbox)
    errors.install(app)
    app.include_router(queues.router)
    app.include_router(admin.router)
    lifecycle = BusLifecycle(
        bus, config.startup_timeout_s, before_start=(lease_inbox,), after_stop=(close_redis,)
    )
    return app, lifecycle
