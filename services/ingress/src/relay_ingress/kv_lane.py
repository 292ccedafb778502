"""The hot `/v1/kv` requests, a string's `PUT` and `GET /v1/kv/{ns}/{key}`, answered without
FastAPI's routing, dependency solving and parameter models: on this path they cost the ingress
about half of its CPU per request (decision 0011, "A warm broker, the transport's floor, and
the ingress's lane").

Invariant: the lane answers a request only when it has checked every part of it exactly as the
route in `relay_ingress.kv` would accept it, and then answers through that route's own
function (`kv.ask`), so tokens, keys, the replicator's answer and every error are rendered by
one definition. Anything else (a query string, a percent-escape in the path, a body that is
not a plain `{"value": ...[, "ttl_s": ...]}` object, a second `Authorization` header, another
method or path) is handed to the app unchanged, with the body it read replayed; the app then
answers as if the lane were not there.
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import Counter
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relay_bus import schemas
from relay_bus.bus import BusUnavailableError
from relay_ingress import checks, errors, kv
from relay_ingress.errors import ApiError
from relay_kv import names

PREFIX = "/v1/kv/"
_NAMESPACE = re.compile(names.NAMESPACE_PATTERN)
_B64U = re.compile(checks.B64U_PATTERN)
_ANSWERED = Counter(
    "relay_ingress_kv_lane_requests",
    "Requests under /v1/kv/ the ingress's lane answered (lane) or handed to the app (app)",
    ["by"],
)


class KvLane:
    """ASGI middleware in front of the ingress's routes (`app.add_middleware`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = _plain(scope)
        if found is None:
            if scope["type"] == "http" and scope["path"].startswith(PREFIX):
                _ANSWERED.labels("app").inc()
            await self.app(scope, receive, send)
            return
        ns, key, authorization = found
        model: type[schemas.KvAnswer]
        if scope["method"] == "GET":
            op, model, fields = "get", schemas.KvRegister, {"r": None}
        else:
            body, disconnected = await _body(receive)
            if disconnected:
                return  # nobody to answer
            value = _value_body(body, scope)
            if value is None:
                _ANSWERED.labels("app").inc()
                await self.app(scope, _replay(body, receive), send)
                return
            op, model, fields = "put", schemas.KvVersion, {**value, "w": None}
        _ANSWERED.labels("lane").inc()
        response: Response
        try:
            context = scope["app"].state.context
            answer = await kv.ask(context, op, model, ns, key, authorization, **fields)
            response = JSONResponse(answer)
        except (ApiError, BusUnavailableError) as error:
            response = errors.rendered(error)
        await response(scope, receive, send)


def _plain(scope: Scope) -> tuple[str, str, str | None] | None:
    """(namespace, key, Authorization) of a `PUT` or `GET /v1/kv/{ns}/{key}` with nothing the
    lane leaves to the app; None otherwise."""
    path: str = scope.get("path", "")
    if scope["type"] != "http" or scope["method"] not in ("GET", "PUT"):
        return None
    if not path.startswith(PREFIX):  # every other route pays only this
        return None
    raw = scope.get("raw_path") or b""
    tokens = [value for name, value in scope["headers"] if name == b"authorization"]
    ns, slash, key = path.removeprefix(PREFIX).partition("/")
    plain = (
        not scope.get("query_string")
        and not scope.get("root_path")
        and raw.isascii()
        and b"%" not in raw  # percent-escapes: the app's UTF-8 check decides
        and slash
        and "/" not in key
        and _NAMESPACE.fullmatch(ns)
        and 1 <= len(key) <= names.MAX_KEY_BYTES
        and len(tokens) <= 1
    )
    if not plain:
        return None
    return ns, key, tokens[0].decode("latin-1") if tokens else None


async def _body(receive: Receive) -> tuple[bytes, bool]:
    """The request's body, and whether the client disconnected before sending all of it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _value_body(body: bytes, scope: Scope) -> dict[str, Any] | None:
    """`value` and `ttl_s` of a body `kv.ValueBody` accepts as it is (JSON, within the app's
    limits, no field it would refuse or convert); None for anything else."""
    content_types = [value for name, value in scope["headers"] if name == b"content-type"]
    if content_types != [b"application/json"]:
        return None
    try:
        parsed = checks.parse_json(body, scope["app"].state.json_limits)
    except (ApiError, ValueError):
        return None
    if not isinstance(parsed, dict) or not set(parsed) <= {"value", "ttl_s"}:
        return None
    value, ttl_s = parsed.get("value"), parsed.get("ttl_s")
    if not isinstance(value, str) or len(value) > kv.MAX_B64 or not _B64U.fullmatch(value):
        return None
    if "ttl_s" in parsed and not (type(ttl_s) is int and 1 <= ttl_s <= kv.MAX_TTL_S):
        return None
    return {"value": value, "ttl_s": ttl_s}


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for the app: the body the lane read, then whatever comes next."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
