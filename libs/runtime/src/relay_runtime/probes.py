"""The probe routes every service serves: `/healthz`, `/readyz`, `/metrics`.

Plain Starlette routes, so FastAPI apps include them and this lib needs no web framework of its
own. `/healthz` answers while the process serves; `/readyz` answers 200 only when `Readiness`
says so, 503 with the failing conditions otherwise.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from relay_runtime.readiness import Readiness


def probe_routes(readiness: Readiness) -> list[BaseRoute]:
    """Routes for the three probes, bound to one service's `readiness`."""

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> Response:
        checks = readiness.snapshot()
        ok = all(checks.values())
        return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return [
        Route("/healthz", healthz, methods=["GET"], include_in_schema=False),
        Route("/readyz", readyz, methods=["GET"], include_in_schema=False),
        Route("/metrics", metrics, methods=["GET"], include_in_schema=False),
    ]
