"""Request checks shared by the endpoints (queues, durable streams, publish, retained, the
WebSocket's frames): each either returns what it checked or raises the API's 400, before
anything reaches Kafka. Every JSON the ingress reads (request bodies through `BoundedJsonRoute`,
WebSocket frames) is parsed by `parse_json`, within `JsonLimits`: nesting depth and the length
of each number literal are bounded before any model sees the value."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

from fastapi import HTTPException
from fastapi.routing import APIRoute
from pydantic import BaseModel, BeforeValidator, ConfigDict
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response

from relay_durable import codec
from relay_ingress.errors import ApiError
from relay_topics import rules as topic_rules

B64U_PATTERN = codec.PATTERN
"""Base64url without padding (for API schemas): what `relay_durable.codec` decodes."""


def _json_integer(value: object) -> object:
    """A JSON number with no fraction (`5.0`) is an integer (JSON Schema says so); a bool is
    not, and anything else is left for strict validation to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JSON_INTEGER = BeforeValidator(_json_integer)
"""Ends the `Annotated` of a `StrictBody`'s integer field, after its `Field` constraints (so
that they stay in the JSON schema as minimum and maximum)."""
JsonInt = Annotated[int, JSON_INTEGER]
"""An unconstrained integer field of a `StrictBody`."""


class StrictBody(BaseModel):
    """A request body or WebSocket frame: unknown fields refused, no coercion (`true` is not 1,
    `"yes"` is not true, `"5"` is not 5), so a client learns of its mistake instead of having
    it guessed."""

    model_config = ConfigDict(extra="forbid", strict=True)


def bad(detail: str) -> ApiError:
    return ApiError(400, "BAD_REQUEST", detail)


def parse_topic(text: str, where: str = "topic") -> topic_rules.Levels:
    try:
        return topic_rules.parse_topic(text)
    except topic_rules.TopicError as error:
        raise bad(f"{where}: {error}") from None


def parse_filter(text: str) -> topic_rules.Levels:
    try:
        return topic_rules.parse_filter(text)
    except topic_rules.TopicError as error:
        raise bad(f"filter: {error}") from None


async def utf8_request(connection: HTTPConnection) -> None:
    """Every percent-escape of the path and the query string decodes as UTF-8; 400 otherwise.
    The framework decodes them with replacement characters, so `?topic=%FF` would otherwise
    name a topic the client never wrote (an app-wide dependency)."""
    if connection.scope["type"] != "http":
        return  # the WebSocket takes no path or query parameters
    raw_path = connection.scope.get("raw_path") or connection.scope["path"].encode()
    parts = [raw_path.split(b"?", 1)[0]]
    for pair in connection.scope.get("query_string", b"").split(b"&"):
        parts.extend(pair.replace(b"+", b" ").split(b"=", 1))
    for part in parts:
        try:
            unquote_to_bytes(part).decode("utf-8")
        except UnicodeDecodeError:
            raise bad("the path and query string must be UTF-8 once percent-decoded") from None


@dataclass(frozen=True)
class JsonLimits:
    max_depth: int
    """Arrays and objects nested in one another (a flat object is 1)."""
    max_number_chars: int
    """Characters of one number literal (sign, digits, point and exponent)."""


class _NumberTooLong(Exception):
    pass


def parse_json(text: str | bytes, limits: JsonLimits) -> Any:
    """`text` parsed; the API's 400 for a number literal or a nesting past `limits` (or past
    the parser's own recursion bound); `ValueError` when it is not JSON at all."""

    def number(parse: Callable[[str], Any]) -> Callable[[str], Any]:
        def bounded(literal: str) -> Any:
            if len(literal) > limits.max_number_chars:
                raise _NumberTooLong
            return parse(literal)

        return bounded

    try:
        value = json.loads(text, parse_int=number(int), parse_float=number(float))
    except _NumberTooLong:
        raise bad(f"a JSON number over {limits.max_number_chars} characters") from None
    except RecursionError:
        raise bad(f"JSON nested over {limits.max_depth} levels") from None
    if _nested_over(value, limits.max_depth):
        raise bad(f"JSON nested over {limits.max_depth} levels")
    return value


def _nested_over(value: Any, limit: int) -> bool:
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


class _BoundedJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            limits = self.app.state.json_limits
            assert isinstance(limits, JsonLimits)
            try:
                self._json = parse_json(await self.body(), limits)
            except ApiError as error:
                raise HTTPException(error.status, error.detail) from None
        return self._json


class BoundedJsonRoute(APIRoute):
    """Every router's `route_class`: request bodies are parsed by `parse_json` within the
    app's `state.json_limits` (FastAPI's custom request class pattern)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            return await handler(_BoundedJsonRequest(request.scope, request.receive))

        return bounded
