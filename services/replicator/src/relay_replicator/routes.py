"""The replicator's internal routes besides the replica's own (`relay_replicator.replica`):
`GET /internal/kv/status` (what this replicator is) and `POST /internal/kv/coordinate` (one
`kv_request` from another Relay service over HTTP, answered in the response: the retainer's
replicated retained messages).

Invariant: `coordinate` needs the admin token (when one is set) and runs the request exactly as
a record read from `relay.replication` would run; its outcome is the response body.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from relay_bus import schemas
from relay_replicator.coordinator import Coordinator
from relay_replicator.peers import Peers
from relay_replicator.store import KvStore
from relay_replicator.sync import Sync


def internal(
    site: str,
    peers: Peers,
    store: KvStore,
    sync: Sync,
    held: Callable[[], list[int]],
    coordinator: Coordinator,
    token: str | None,
) -> list[BaseRoute]:
    def allowed(request: Request) -> bool:
        presented = request.headers.get("authorization", "").encode()
        return token is None or hmac.compare_digest(presented, f"Bearer {token}".encode())

    async def status(_: Request) -> JSONResponse:
        """Its site, view, the partitions it coordinates, hints held, anti-entropy passes."""
        return JSONResponse(
            {
                "site": site,
                "sites": list(peers.view.sites),
                "partitions": held(),
                "hint_bytes": store.hint_bytes,
                "sync_passes": sync.passes,
            }
        )

    async def coordinate(request: Request) -> JSONResponse:
        if not allowed(request):
            return JSONResponse({"error": "FORBIDDEN", "detail": "admin token"}, status_code=403)
        try:
            kv_request = schemas.KvRequest.model_validate_json(await request.body())
        except ValueError as error:
            return JSONResponse({"error": "BAD_REQUEST", "detail": str(error)}, status_code=400)
        outcome = await coordinator.run(kv_request)
        return JSONResponse(
            {
                "status": outcome.status,
                "data": outcome.data,
                "code": outcome.code,
                "detail": outcome.detail,
            }
        )

    return [
        Route("/internal/kv/status", status, methods=["GET"]),
        Route("/internal/kv/coordinate", coordinate, methods=["POST"]),
    ]
