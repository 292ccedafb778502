"""The ingress's key-value lane (`relay_ingress.kv_lane`) answers exactly as the routes do: a
corpus of `/v1/kv` requests, plain and malformed, sent to the ingress with the lane and
without it (a test answering in the replicators' place, deterministically from each request),
gets the same status, headers and body byte for byte, and hands the same requests to the bus;
the plain ones are answered by the lane, the rest by the app."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from relay_bus import schemas
from tests.services.loopback import Relay

PATHS = [
    "/v1/kv/app/k",
    "/v1/kv/app/refused",
    "/v1/kv/app/" + "k" * 512,
    "/v1/kv/app/" + "k" * 513,
    "/v1/kv/-bad/k",
    "/v1/kv/app/k%C3%A9",
    "/v1/kv/app/k%FF",
    "/v1/kv/app/k%00",
    "/v1/kv/app/k?w=2",
    "/v1/kv/app/k?r=1",
    "/v1/kv/app/k?w=9",
    "/v1/kv/app/k/",
    "/v1/kv/app",
]
AUTHS: list[list[tuple[str, str]]] = [
    [("Authorization", "Bearer secret")],
    [],
    [("Authorization", "Basic secret")],
    [("Authorization", "Bearer a"), ("Authorization", "Bearer b")],
]
DEEP: Any = "eA"
for _ in range(40):
    DEEP = [DEEP]  # past the ingress's JSON depth limit
BODIES: list[tuple[list[tuple[str, str]], bytes]] = [
    ([("Content-Type", "application/json")], json.dumps(body).encode())
    for body in [
        {"value": "eA"},
        {"value": "eA", "ttl_s": 60},
        {"value": "eA", "ttl_s": None},
        {"value": "eA", "ttl_s": 5.0},
        {"value": "eA", "ttl_s": 5.5},
        {"value": "eA", "ttl_s": True},
        {"value": "eA", "ttl_s": 0},
        {"value": "eA", "ttl_s": 2**32},
        {"value": "eA", "ttl_s": "60"},
        {"value": "eA", "extra": 1},
        {"value": "eA=="},
        {"value": "eA\n"},
        {"value": ""},
        {"value": 5},
        {"ttl_s": 5},
        {"value": DEEP},
        ["eA"],
    ]
] + [
    ([("Content-Type", "application/json")], b'{"value": "eA", "ttl_s": 1' + b"0" * 400 + b"}"),
    ([("Content-Type", "application/json")], b'{"value": "eA"'),
    ([("Content-Type", "application/json")], b""),
    ([("Content-Type", "application/json")], b'{"value": "\xff"}'),
    ([], b'{"value": "eA"}'),
    ([("Content-Type", "text/plain")], b'{"value": "eA"}'),
    ([("Content-Type", "application/json; charset=utf-8")], b'{"value": "eA"}'),
    ([("Content-Type", "application/merge-patch+json")], b'{"value": "eA"}'),
]


def requests() -> list[tuple[str, str, list[tuple[str, str]], bytes]]:
    found = []
    for path, auth in itertools.product(PATHS, AUTHS):
        found.append(("GET", path, auth, b""))
        found.append(("DELETE", path, auth, b""))
        found.append(("POST", path, auth, b""))
        found.extend(("PUT", path, auth + headers, body) for headers, body in BODIES)
    return found


def lane_count(by: str) -> float:
    return REGISTRY.get_sample_value("relay_ingress_kv_lane_requests_total", {"by": by}) or 0.0


async def answers(
    tmp_path: Path, redis_url: str, lane: bool
) -> tuple[list[tuple[int, list[tuple[str, str]], bytes]], list[dict[str, Any]]]:
    """Every request's answer, and what reached the bus (routing fields left out)."""
    asked: list[dict[str, Any]] = []
    async with Relay(
        tmp_path, redis_url, queue_writer=False, retainer=False, delivery=False, kv_lane=lane
    ) as relay:

        def replicator(record: schemas.KvRequest) -> dict[str, Any]:
            fields = record.model_dump(exclude={"id", "origin", "reply_slot", "deadline_ms"})
            asked.append(fields)
            seen = json.dumps(fields, sort_keys=True)
            if record.key == "refused":
                return {"status": 404, "code": "NOT_FOUND", "detail": f"no such key ({seen})"}
            if record.op == "get":
                value = {"value": "eA", "version": seen[:40], "expires_at": None}
                return {"status": 200, "data": value}
            return {"status": 200, "data": {"version": seen}}

        relay.replicator(replicator)
        found = []
        for method, path, headers, body in requests():
            response = await relay.http.request(method, path, headers=headers, content=body)
            kept = [(k, v) for k, v in response.headers.items() if k != "date"]
            found.append((response.status_code, kept, response.content))
    return found, asked


async def test_the_lane_answers_as_the_routes_do(tmp_path: Path, redis_url: str) -> None:
    before = lane_count("lane"), lane_count("app")
    with_lane, asked_with = await answers(tmp_path / "lane", redis_url, lane=True)
    counted = lane_count("lane") - before[0], lane_count("app") - before[1]
    without, asked_without = await answers(tmp_path / "routes", redis_url, lane=False)
    assert lane_count("lane") - before[0] == counted[0]  # off: nothing through the lane
    for request, one, other in zip(requests(), with_lane, without, strict=True):
        assert one == other, request
    assert asked_with == asked_without
    statuses = {status for status, _, _ in with_lane}
    assert {200, 307, 400, 401, 404, 405} <= statuses
    assert counted[0] > 0
    assert counted[1] > 0


async def test_plain_requests_take_the_lane_and_others_the_app(
    tmp_path: Path, redis_url: str
) -> None:
    async with Relay(
        tmp_path, redis_url, queue_writer=False, retainer=False, delivery=False
    ) as relay:
        relay.replicator(
            lambda record: {
                "status": 200,
                "data": {"version": "1.0.A"} if record.op == "put" else None,
            }
        )
        auth = {"Authorization": "Bearer secret"}
        before = lane_count("lane"), lane_count("app")
        put = await relay.http.put("/v1/kv/app/k", headers=auth, json={"value": "eA", "ttl_s": 9})
        assert (put.status_code, put.json()) == (200, {"version": "1.0.A"})
        assert (lane_count("lane") - before[0], lane_count("app") - before[1]) == (1, 0)
        put = await relay.http.put(
            "/v1/kv/app/k", headers=auth, json={"value": "eA", "ttl_s": None}
        )
        assert put.status_code == 200
        assert (lane_count("lane") - before[0], lane_count("app") - before[1]) == (1, 1)
        got = await relay.http.get("/v1/kv/app/k", headers=auth)
        assert got.status_code == 503  # answered without a body, as the route would
        assert (lane_count("lane") - before[0], lane_count("app") - before[1]) == (2, 1)
        got = await relay.http.get("/v1/kv/app/k?r=1", headers=auth)
        assert (lane_count("lane") - before[0], lane_count("app") - before[1]) == (2, 2)
