"""What request handlers reach through `request.app.state.context`, typed (`relay_ingress.deps.Ctx`
hands it to them)."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

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
