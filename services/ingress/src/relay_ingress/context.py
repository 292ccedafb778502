"""What request handlers reach through `request.app.state.context`, typed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from relay_bus.bus import Bus
from relay_ingress.inbox import Inbox

if TYPE_CHECKING:
    from relay_ingress.app import IngressSettings


@dataclass(frozen=True)
class Context:
    config: IngressSettings
    bus: Bus
    inbox: Inbox


def _context(request: Request) -> Context:
    context = request.app.state.context
    assert isinstance(context, Context)
    return context


Ctx = Annotated[Context, Depends(_context)]
