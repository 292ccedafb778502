"""Admin endpoints (`Authorization: Bearer <RELAY_ADMIN_TOKEN>`).

Invariant: without the configured token, every admin route answers 403 FORBIDDEN and does
nothing; the token is compared in constant time.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from pydantic import BaseModel

from relay_bus import schemas, topics
from relay_ingress.context import Ctx
from relay_ingress.errors import ApiError

router = APIRouter(prefix="/admin", tags=["admin"])


def _require_admin(ctx: Ctx, authorization: Annotated[str | None, Header()] = None) -> None:
    token = ctx.config.admin_token
    presented = (authorization or "").removeprefix("Bearer ").encode()
    if token is None or not hmac.compare_digest(presented, token.get_secret_value().encode()):
        raise ApiError(403, "FORBIDDEN", "admin token missing or wrong")


Admin = Annotated[None, Depends(_require_admin)]


class HopReport(BaseModel):
    service: str
    instance: str
    latency_ms: float
    """From the previous service's send to this service's receipt (includes Kafka)."""
    processing_ms: float
    """Time spent inside this service."""


class PingReport(BaseModel):
    id: str
    total_ms: float
    hops: list[HopReport]


def _report(ping: schemas.Ping, returned_ms: float, origin: str) -> PingReport:
    hops: list[HopReport] = []
    previous_sent = ping.started_ms
    for hop in ping.hops:
        hops.append(
            HopReport(
                service=hop.service,
                instance=hop.instance,
                latency_ms=round(hop.received_ms - previous_sent, 3),
                processing_ms=round(hop.sent_ms - hop.received_ms, 3),
            )
        )
        previous_sent = hop.sent_ms
    hops.append(
        HopReport(
            service="ingress",
            instance=origin,
            latency_ms=round(returned_ms - previous_sent, 3),
            processing_ms=0.0,
        )
    )
    return PingReport(id=ping.id, total_ms=round(returned_ms - ping.started_ms, 3), hops=hops)


@router.get("/ping", response_model=PingReport)
async def ping(
    ctx: Ctx,
    _: Admin,
    timeout_s: Annotated[float | None, Query(gt=0, le=60)] = None,
) -> PingReport:
    """Send a ping through every service (ingress → queue-writer → delivery → retainer →
    replicator → ingress) and report each hop's latency."""
    wait_s = timeout_s or ctx.config.ping_timeout_s
    assert ctx.inbox.slot is not None
    started = schemas.now_ms_()
    request = schemas.Ping(
        id=secrets.token_urlsafe(16),
        origin=ctx.config.instance,
        reply_slot=ctx.inbox.slot,
        started_ms=started,
        deadline_ms=started + wait_s * 1000,
    )
    future = ctx.inbox.expect(request.id)
    try:
        await ctx.bus.send(topics.QUEUE_COMMANDS, request, key=secrets.token_bytes(24))
        reply = await asyncio.wait_for(future, wait_s)
    except TimeoutError:
        raise ApiError(
            503, "UNAVAILABLE", f"the ping did not come back within {wait_s:g} s"
        ) from None
    finally:
        ctx.inbox.forget(request.id)
    return _report(reply, schemas.now_ms_(), ctx.config.instance)
