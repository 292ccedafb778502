"""Request checks shared by the endpoints (queues, durable streams, publish, retained, the
WebSocket's frames): each either returns what it checked or raises the API's 400, before
anything reaches Kafka."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import unquote_to_bytes

from pydantic import BaseModel, BeforeValidator, ConfigDict
from starlette.requests import HTTPConnection

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
