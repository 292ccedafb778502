"""Ingress wiring: Redis, the bus, the inbox and the routers, from `IngressSettings`.

Wiring only; request handling lives in the routers, domain logic in libs.
"""

from __future__ import annotations

import asyncio

from fastapi import Depends, FastAPI

from relay_bus import topics
from relay_bus.bus import Bus
from relay_bus.lifecycle import BusLifecycle
from relay_ingress import admin, checks, ds, ds_admin, errors, kv, queues, retained, websocket
from relay_ingress.connections import Connections, Limits
from relay_ingress.context import Context
from relay_ingress.inbox import Inbox
from relay_ingress.kv_lane import KvLane
from relay_ingress.settings import IngressSettings
from relay_routes import client, subscriptions
from relay_routes.subscriptions import Subscriptions
from relay_routes.topic_subscriptions import TopicSubscriptions
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

SERVICE = "ingress"


def build(config: IngressSettings) -> tuple[FastAPI, BusLifecycle]:
    readiness = Readiness("serving")
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    redis = client.connect(str(config.redis_url))
    json_limits = checks.JsonLimits(config.json_max_depth, config.json_max_number_chars)
    limits = Limits(
        connections_per_address=config.ws_connections_per_address,
        frames_per_s=config.ws_frames_per_s,
        frame_burst=config.ws_frame_burst,
        max_frame_bytes=config.ws_max_frame_bytes,
        commands_in_flight=config.ws_commands_in_flight,
        max_outbound_frames=config.ws_max_outbound_frames,
        max_subscriptions=config.ws_max_subscriptions,
        max_topic_filters=config.ws_max_topic_filters,
        json=json_limits,
        idle_unsubscribed_s=config.ws_idle_timeout_s,
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
        # Relay exports Prometheus metrics, not OpenTelemetry: FastAPI's native telemetry
        # otherwise looks the providers up (and reads the environment) on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        dependencies=[Depends(checks.utf8_request)],
    )
    app.state.json_limits = json_limits
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
    app.include_router(kv.router)
    app.include_router(kv.admin_router)
    if config.kv_lane:
        app.add_middleware(KvLane)

    async def serving() -> None:
        readiness.set("serving", True)

    async def lame_duck() -> None:
        """Unready first (load balancers stop sending new clients), still serving; then the
        WebSockets closed at a bounded rate, in what is left of `lame_duck_s`."""
        readiness.set("serving", False)
        await asyncio.sleep(config.lame_duck_unready_s)
        left = max(0.0, config.lame_duck_s - config.lame_duck_unready_s - 1.0)
        await connections.close_all(config.ws_close_per_s, left)

    lifecycle = BusLifecycle(
        bus,
        config.startup_timeout_s,
        before_start=(lease_inbox,),
        after_start=(serving,),
        after_stop=(close_redis,),
        lame_duck=(lame_duck,),
    )
    return app, lifecycle
