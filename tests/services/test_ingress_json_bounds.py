"""`relay_ingress.checks.parse_json` (issue 19): the JSON of every request body and WebSocket
frame is bounded in nesting depth and number length before any model reads it, and every
router of the ingress parses its bodies through it."""

from __future__ import annotations

import json

import pytest
from fastapi.routing import APIRoute

from relay_ingress import admin, ds, ds_admin, kv, queues, retained
from relay_ingress.checks import BoundedJsonRoute, JsonLimits, parse_json
from relay_ingress.errors import ApiError

LIMITS = JsonLimits(max_depth=3, max_number_chars=5)


@pytest.mark.parametrize(
    "text",
    ['{"a": [{"b": 1}]}', "[[[]]]", "12345", "-1234", "1.5e3", '"' + "9" * 100 + '"', "null"],
)
def test_within_the_bounds_json_parses(text: str) -> None:
    parse_json(text, LIMITS)


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ('{"a": [{"b": []}]}', "JSON nested over 3 levels"),
        ("[[[[1]]]]", "JSON nested over 3 levels"),
        ("[" * 100_000 + "]" * 100_000, "JSON nested over 3 levels"),  # the parser's own bound
        ("123456", "a JSON number over 5 characters"),
        ("-12345", "a JSON number over 5 characters"),
        ("1.5e10", "a JSON number over 5 characters"),
        ('{"ts": ' + "9" * 10_000 + "}", "a JSON number over 5 characters"),  # past 4,300 digits
    ],
)
def test_past_the_bounds_json_is_a_400(text: str, detail: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse_json(text, LIMITS)
    assert (refused.value.status, refused.value.code, refused.value.detail) == (
        400,
        "BAD_REQUEST",
        detail,
    )


@pytest.mark.parametrize("text", ["", "{", "[1,]", "NaNa"])
def test_what_is_not_json_is_a_decode_error(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        parse_json(text, LIMITS)
    with pytest.raises(UnicodeDecodeError):
        parse_json(b'"\xff"', LIMITS)


def test_every_router_parses_bodies_within_the_bounds() -> None:
    routers = [queues.router, admin.router, ds.router, ds_admin.router, retained.router]
    routers += [retained.admin_router, kv.router, kv.admin_router]
    for router in routers:
        assert router.route_class is BoundedJsonRoute
        for route in router.routes:
            assert isinstance(route, APIRoute)
            assert isinstance(route, BoundedJsonRoute), route.path
