"""The replicator's internal routes besides the replica's own (`relay_replicator.replica`):
`GET /internal/kv/status` (what this replicator is), `POST /internal/kv/coordinate` (one
`kv_request` from another Relay service over HTTP, answered in the response: the retainer's
replicated retained messages), and the membership's: `GET /internal/kv/members` (this site's
view, change and the URLs it knows), `POST /internal/kv/announce` `{"site", "url"}` (a
replicator telling its URL), `POST /internal/kv/change` (a participant's report in a change,
`relay_replicator.changes`).

Invariant: every route but `status` needs the admin token (when one is set); `coordinate` runs
the request exactly as a record read from `relay.replication` would run; its outcome is the
response body; a malformed body is answered 400 and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from relay_bus import schemas
from relay_kv import clock
from relay_replicator.changes import Changes
from relay_replicator.coordinator import Coordinator
from relay_replicator.peers import Peers
from relay_replicator.replica import Refused, authorized
from relay_replicator.store import KvStore
from relay_replicator.sync import Sync


def internal(
    site: str,
    peers: Peers,
    store: KvStore,
    sync: Sync,
    held: Callable[[], list[int]],
    coordinator: Coordinator,
    changes: Changes,
    token: str | None,
) -> list[BaseRoute]:
    async def status(_: Request) -> JSONResponse:
        """Its site, view, the partitions it coordinates, hints held, anti-entropy passes."""
        return JSONResponse(
            {
                "site": site,
                "sites": list(peers.view.sites),
                "version": peers.view.version,
                "change": None if peers.change is None else list(peers.change.new.sites),
                "partitions": held(),
                "hint_bytes": store.hint_bytes,
                "sync_passes": sync.passes,
            }
        )

    async def coordinate(request: Request) -> JSONResponse:
        if not authorized(request, token):
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

    def forbidden() -> JSONResponse:
        return JSONResponse({"error": "FORBIDDEN", "detail": "admin token"}, status_code=403)

    def bad(detail: str) -> JSONResponse:
        return JSONResponse({"error": "BAD_REQUEST", "detail": detail}, status_code=400)

    async def members(request: Request) -> JSONResponse:
        if not authorized(request, token):
            return forbidden()
        return JSONResponse(await changes.describe())

    async def announce(request: Request) -> JSONResponse:
        if not authorized(request, token):
            return forbidden()
        try:
            body = await request.json()
            site, url = str(body["site"]), str(body["url"])
        except (ValueError, KeyError, TypeError) as error:
            return bad(f"expected {{site, url}}: {error}")
        if not clock.SITE_PATTERN.match(site) or not url.startswith(("http://", "https://")):
            return bad("site must be 16 hex digits and url an http(s) URL")
        peers.heard(site, url)
        return JSONResponse({"site": site})

    async def change(request: Request) -> JSONResponse:
        if not authorized(request, token):
            return forbidden()
        try:
            answer = await changes.receive(await request.json())
        except (ValueError, KeyError, TypeError) as error:
            return bad(f"not a change report: {error}")
        except Refused as error:
            return JSONResponse({"error": "CONFLICT", "detail": str(error)}, status_code=409)
        return JSONResponse(answer)

    return [
        Route("/internal/kv/status", status, methods=["GET"]),
        Route("/internal/kv/coordinate", coordinate, methods=["POST"]),
        Route("/internal/kv/members", members, methods=["GET"]),
        Route("/internal/kv/announce", announce, methods=["POST"]),
        Route("/internal/kv/change", change, methods=["POST"]),
    ]
