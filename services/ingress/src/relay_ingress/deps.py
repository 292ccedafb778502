"""The ingress's FastAPI dependencies, as `Annotated` aliases a handler names in its signature:
`Ctx` (the request's `Context`, for HTTP and WebSocket routes) and `Admin` (the admin guard).

Invariant: a route that takes `Admin` answers 403 FORBIDDEN and does nothing unless the request
carries `Authorization: Bearer <RELAY_ADMIN_TOKEN>` (the scheme required, the token compared in
constant time); while `RELAY_ADMIN_TOKEN` is unset, every such route answers 403.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header
from starlette.requests import HTTPConnection

from relay_ingress.context import Context
from relay_ingress.errors import ApiError


async def _context(connection: HTTPConnection) -> Context:
    """For HTTP and WebSocket routes alike. `async`: FastAPI runs a plain `def` dependency in
    its thread pool, a thread hop on every request."""
    context = connection.app.state.context
    assert isinstance(context, Context)
    return context


Ctx = Annotated[Context, Depends(_context)]


def _require_admin(ctx: Ctx, authorization: Annotated[str | None, Header()] = None) -> None:
    token = ctx.config.admin_token
    scheme, _, presented = (authorization or "").partition(" ")
    # The scheme is required (RFC 6750; its name is case-insensitive): a bare token is refused.
    matches = hmac.compare_digest(
        presented.encode("utf-8", "replace"),
        (token.get_secret_value() if token is not None else "").encode(),
    )
    if token is None or scheme.lower() != "bearer" or not matches:
        raise ApiError(403, "FORBIDDEN", "admin token missing or wrong")


Admin = Annotated[None, Depends(_require_admin)]
