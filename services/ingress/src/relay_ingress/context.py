"""What request handlers reach through `request.app.state.context`, typed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends
from redis.asyncio import Redis
from starlette.requests import HTTPConnection

from relay_bus.bus import Bus
from relay_ingress.connections import Connections
from relay_ingress.inbox import Inbox
from relay_ingress.settings import IngressSettings


@dataclass(frozen=True)
class Context:
    config: IngressSettings
    bus: Bus
    inbox: Inbox
    redis: Redis
    connections: Connections


async def _context(connection: HTTPConnection) -> Context:
    """For HTTP and WebSocket routes alike. `async`: FastAPI runs a plain `def` dependency in
    its thread pool, a thread hop on every request."""
    context = connection.app.state.context
    assert isinstance(context, Context)
    return context


Ctx = Annotated[Context, Depends(_context)]
