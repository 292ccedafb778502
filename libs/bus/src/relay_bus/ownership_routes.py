"""The internal ownership routes of a stateful service (queue-writer, retainer), admin token:
`GET /internal/ownership` (the assignment in force, its generation, what this instance owns,
serves and still waits for), `PUT /internal/ownership` (install a newer generation) and `POST
/internal/ownership/lost/{ordinal}` (publish the accepted generation for an ordinal lost with
its volume, so that the partitions it held under an older one are no longer waited for:
`Ownership.publish_for_lost`).

Invariants: all need the admin token, and answer 403 `FORBIDDEN` while none is configured;
a body that is not a valid assignment for this topic is 400 with the assignment rule's code,
an older generation 409 `STALE_GENERATION`, the same generation with other owners 409
`CONFLICTING_ASSIGNMENT`; a lost ordinal that is this instance 400 `NOT_LOST`, one the
accepted generation still gives partitions 409 `ORDINAL_OWNS`; none of these changes
anything. The 200 of a `PUT` comes after the partitions it removes have stopped being served
(`relay_bus.fencing`).
"""

from __future__ import annotations

import hmac
import json

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from relay_bus import clients
from relay_bus.fencing import Ownership, Refused
from relay_runtime import assignment

MAX_ORDINAL = 999
"""Ordinals a lost one may have (a StatefulSet's pods are 0..replicas-1)."""


def _error(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


def ownership_routes(owner: Ownership, token: str | None) -> list[BaseRoute]:
    def allowed(request: Request) -> bool:
        presented = request.headers.get("authorization", "").encode()
        return token is not None and hmac.compare_digest(presented, f"Bearer {token}".encode())

    async def read(request: Request) -> JSONResponse:
        if not allowed(request):
            return _error(403, "FORBIDDEN", "admin token")
        return JSONResponse(owner.state())

    async def install(request: Request) -> JSONResponse:
        if not allowed(request):
            return _error(403, "FORBIDDEN", "admin token")
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise assignment.InvalidAssignment("BAD_ASSIGNMENT", "the body is a JSON object")
            offered = assignment.parse(body, owner.partitions)
        except json.JSONDecodeError as error:
            return _error(400, "BAD_JSON", str(error))
        except assignment.InvalidAssignment as error:
            return _error(400, error.code, str(error))
        try:
            return JSONResponse(await owner.install(offered))
        except Refused as refused:
            return _error(409, refused.code, refused.detail)
        except clients.KafkaError as error:
            return _error(503, "UNAVAILABLE", f"relay.ownership: {error}; install again")

    async def lost(request: Request) -> JSONResponse:
        if not allowed(request):
            return _error(403, "FORBIDDEN", "admin token")
        raw = request.path_params["ordinal"]
        if not raw.isdigit() or int(raw) > MAX_ORDINAL:
            return _error(400, "BAD_ORDINAL", f"an ordinal is 0..{MAX_ORDINAL}")
        try:
            return JSONResponse(await owner.publish_for_lost(int(raw)))
        except Refused as refused:
            status = 400 if refused.code == "NOT_LOST" else 409
            return _error(status, refused.code, refused.detail)
        except clients.KafkaError as error:
            return _error(503, "UNAVAILABLE", f"relay.ownership: {error}; again")

    return [
        Route("/internal/ownership", read, methods=["GET"]),
        Route("/internal/ownership", install, methods=["PUT"]),
        Route("/internal/ownership/lost/{ordinal}", lost, methods=["POST"]),
    ]
