"""Hostile clients against the ingress (issue 19), each case as a regression test: header bytes,
lax types, the admin scheme, 405, undecodable escapes, huge and deeply nested WebSocket frames,
subscription bounds and a reader that stops reading. Every refusal is a JSON error of the API,
never a 5xx or a dropped connection, and changes nothing; no secret reaches a log."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets

from relayctl.suite import SERVICES
from tests import helpers
from tests.api.client import Recipient, b64u
from tests.api.test_websocket import connect, recv, send

pytestmark = pytest.mark.suite

OUTBOUND = 100
SUBSCRIPTIONS = 3
FILTERS = 2
IDLE_S = 3.0
JSON_DEPTH = 8
NUMBER_CHARS = 24


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[helpers.Running]:
    """A suite with the per-connection bounds low enough to reach in a test."""
    with helpers.suite(
        tmp_path_factory.mktemp("suite"),
        "--port",
        str(helpers.free_port()),
        RELAY_WS_MAX_OUTBOUND_FRAMES=str(OUTBOUND),
        RELAY_WS_MAX_SUBSCRIPTIONS=str(SUBSCRIPTIONS),
        RELAY_WS_MAX_TOPIC_FILTERS=str(FILTERS),
        RELAY_WS_IDLE_TIMEOUT_S=str(IDLE_S),
        RELAY_JSON_MAX_DEPTH=str(JSON_DEPTH),
        RELAY_JSON_MAX_NUMBER_CHARS=str(NUMBER_CHARS),
        RELAY_HTTP__WS_PING_INTERVAL_S="0.5",
    ) as running:
        yield running


def _error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    assert body["error"] == code, body


def test_hostile_signature_headers_are_auth_errors(http: httpx.Client) -> None:
    recipient = Recipient(http).create()
    path = f"/v1/queues/{recipient.queue}"
    good = recipient.headers("GET", path)
    for headers in (
        {**good, "X-Relay-Timestamp": b"1\xb2"},  # "1²" once read as latin-1: a digit to isdigit
        {**good, "X-Relay-Timestamp": b"\xd9\xa1\xd9\xa2"},
        {**good, "X-Relay-Timestamp": "9" * 400},
        {**good, "X-Relay-Signature": ""},
        {**good, "X-Relay-Signature": b"\xff\xfe"},
    ):
        _error(http.get(path, headers=headers), 401, "AUTH")
    assert http.get(path, headers=good).status_code == 200  # the queue is as it was


def test_lax_types_are_refused(http: httpx.Client) -> None:
    recipient = Recipient(http).create()
    send_path = f"/v1/send/{recipient.sender}"
    for body in (
        {"body": b64u(b"x"), "ttl_s": True},
        {"body": b64u(b"x"), "ttl_s": "5"},
        {"body": b64u(b"x"), "ttl_s": 5.5},
        {"body": 5},
    ):
        _error(http.post(send_path, json=body), 400, "BAD_REQUEST")
    for body in (
        {"topic": "t/lax", "payload": b64u(b"x"), "retain": "yes"},
        {"topic": "t/lax", "payload": b64u(b"x"), "retain": 1},
        {"topic": "t/lax", "payload": b64u(b"x"), "expiry_s": "60"},
    ):
        _error(http.post("/v1/publish", json=body), 400, "BAD_REQUEST")
    _error(http.get("/v1/retained/message", params={"topic": "t/lax"}), 404, "NOT_FOUND")
    assert recipient.call("GET").json()["size"] == 0


def _nested(depth: int) -> str:
    """A frame or body field whose value makes the whole JSON `depth` deep (the object it sits
    in is level 1)."""
    return "[" * (depth - 1) + "1" + "]" * (depth - 1)


def test_json_depth_and_number_length_are_bounded_before_any_model(http: httpx.Client) -> None:
    """At the bounds (settings here: depth 8, 24 characters) a body reaches its model, which
    refuses the extra field or the out-of-range number; one past them is refused by the
    bound itself. Nothing is sent."""
    recipient = Recipient(http).create()
    path = f"/v1/send/{recipient.sender}"
    body = b64u(b"x")

    def post(text: str) -> str:
        """The detail of the 400 that `text` gets."""
        response = http.post(path, content=text, headers={"Content-Type": "application/json"})
        _error(response, 400, "BAD_REQUEST")
        detail: str = response.json()["detail"]
        return detail

    at_depth = post(f'{{"body": "{body}", "x": {_nested(JSON_DEPTH)}}}')
    assert "nested" not in at_depth, at_depth
    past_depth = post(f'{{"body": "{body}", "x": {_nested(JSON_DEPTH + 1)}}}')
    assert past_depth == f"JSON nested over {JSON_DEPTH} levels"
    at_length = post(f'{{"body": "{body}", "ttl_s": {"9" * NUMBER_CHARS}}}')
    assert "characters" not in at_length, at_length
    for number in ("9" * (NUMBER_CHARS + 1), "-" + "9" * NUMBER_CHARS, "1." + "0" * 30):
        past_length = post(f'{{"body": "{body}", "ttl_s": {number}}}')
        assert past_length == f"a JSON number over {NUMBER_CHARS} characters"
    past = post("[" * 5000 + "]" * 5000)  # past the parser's own recursion bound
    assert past == f"JSON nested over {JSON_DEPTH} levels"
    assert recipient.call("GET").json()["size"] == 0


async def test_json_bounds_hold_for_websocket_frames(ws_url: str) -> None:
    async with connect(ws_url) as ws:
        for frame, detail in (
            (f'{{"id": 1, "cmd": "HELLO", "x": {_nested(JSON_DEPTH + 1)}}}', "nested"),
            (f'{{"id": 1, "cmd": "HELLO", "x": {"9" * (NUMBER_CHARS + 1)}}}', "characters"),
            (f'{{"id": 1, "cmd": "HELLO", "x": {_nested(JSON_DEPTH)}}}', "x"),
        ):
            await send(ws, frame)
            reply = await recv(ws)
            assert (reply["ok"], reply["error"]) == (False, "BAD_REQUEST"), reply
            assert detail in reply["detail"], reply


def test_admin_needs_the_bearer_scheme(http: httpx.Client, running: helpers.Running) -> None:
    token = running.token()
    for value in (token, f"Token {token}", f"Bearer{token}", f"Bearer  {token}", "Bearer"):
        _error(http.get("/admin/ping", headers={"Authorization": value}), 403, "FORBIDDEN")
    for scheme in ("Bearer", "bearer"):
        headers = {"Authorization": f"{scheme} {token}"}
        assert http.get("/admin/ping", headers=headers).status_code == 200


def test_every_status_has_the_api_shape(http: httpx.Client) -> None:
    _error(http.put("/v1/queues"), 405, "METHOD_NOT_ALLOWED")
    _error(http.delete("/v1/publish"), 405, "METHOD_NOT_ALLOWED")
    _error(http.get("/v1/nothing-here"), 404, "NOT_FOUND")


def test_undecodable_escapes_are_refused(http: httpx.Client) -> None:
    for url in (
        "/v1/retained/message?topic=%FF",
        "/v1/retained?filter=a/%C3%28",
        "/v1/retained?filter=%ED%A0%80",  # an encoded surrogate is not UTF-8 either
        "/v1/send/%FF%FE",
    ):
        _error(http.get(url) if "send" not in url else http.post(url, json={}), 400, "BAD_REQUEST")
    # A topic that really holds U+FFFD, spelled in UTF-8, is a topic like any other.
    _error(http.get("/v1/retained/message?topic=%EF%BF%BD"), 404, "NOT_FOUND")


async def test_every_websocket_frame_gets_exactly_one_reply(ws_url: str) -> None:
    queue = "A" * 32
    frames: list[str] = [
        json.dumps({"id": 1, "cmd": "SUB", "queue": queue, "ts": 10**400, "sig": "x"}),
        json.dumps({"id": 2, "cmd": "ACK", "queue": queue, "msg_id": queue, "ts": -(10**400)}),
        json.dumps({"id": 3, "cmd": "SUB", "queue": queue, "ts": "1", "sig": "x"}),
        json.dumps({"id": 4, "cmd": "PUBLISH", "topic": "t", "payload": "", "retain": "yes"}),
        "[" * 30_000 + "]" * 30_000,
        '{"id": 6, "cmd": "SUB", "ts": ' + "9" * 5000 + "}",
        json.dumps({"id": 7, "cmd": "SUB", "queue": queue, "ts": 1e400, "sig": "x"}),
    ]
    async with connect(ws_url) as ws:
        for frame in frames:
            await send(ws, frame)
            reply = await recv(ws)
            assert reply["ok"] is False, reply
            assert reply["error"] in ("BAD_REQUEST", "AUTH"), reply
        await send(ws, {"id": "alive", "cmd": "UNSUBSCRIBE", "filter": "x"})
        assert await recv(ws) == {"id": "alive", "ok": True}


async def test_subscriptions_per_connection_are_bounded(http: httpx.Client, ws_url: str) -> None:
    recipients = [Recipient(http).create() for _ in range(SUBSCRIPTIONS + 1)]
    async with connect(ws_url) as ws:
        for n, recipient in enumerate(recipients):
            await send(ws, recipient.sub(n))
            reply = await recv(ws)
            if n < SUBSCRIPTIONS:
                assert reply == {"id": n, "ok": True}, reply
            else:
                assert (reply["ok"], reply["error"]) == (False, "QUOTA"), reply
        for n in range(FILTERS + 1):
            await send(ws, {"id": f"f{n}", "cmd": "SUBSCRIBE", "filter": f"bound/{n}/#"})
            reply = await recv(ws)
            assert reply.get("ok") is (n < FILTERS), reply
        # The queue refused is untouched: its own SUB elsewhere still works.
        async with connect(ws_url) as other:
            await send(other, recipients[-1].sub("late"))
            assert await recv(other) == {"id": "late", "ok": True}


async def test_a_reader_that_stops_reading_is_disconnected_not_buffered(
    http: httpx.Client, ws_url: str
) -> None:
    """The client stops reading (a tiny receive buffer, one frame queued in its library):
    big publications fill the sockets, then small ones pile up at the ingress past its bound.
    The connection ends with 1008 once the client reads again, having got fewer frames than
    were published; a normal subscriber of the same topic gets every one."""
    topic = f"slow/{time.monotonic_ns()}"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((httpx.URL(ws_url).host, httpx.URL(ws_url).port or 80))
    slow = await websockets.connect(ws_url, sock=sock, max_queue=1, max_size=2**21)
    async with connect(ws_url) as fast:
        for ws, name in ((slow, "slow"), (fast, "fast")):
            await send(ws, {"id": name, "cmd": "SUBSCRIBE", "filter": topic})
            assert await recv(ws) == {"id": name, "ok": True}
        big, small = 100, OUTBOUND * 2  # 8 MB: more than both kernel buffers hold (4 MB)

        def publish_all() -> None:
            for n in range(big + small):
                payload = b"x" * (60_000 if n < big else 10)
                body = {"topic": topic, "payload": b64u(payload)}
                response = http.post("/v1/publish", json=body)
                assert response.status_code == 202, response.text

        async def read_fast() -> list[dict[str, Any]]:
            return [await recv(fast, timeout_s=60) for _ in range(big + small)]

        reading = asyncio.create_task(read_fast())
        await asyncio.to_thread(publish_all)
        got_fast = await reading
        assert [len(f["payload"]) for f in got_fast].count(len(b64u(b"x" * 10))) == small
    await asyncio.sleep(1)
    got_slow, closed = await _read_until_closed(slow)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1008, closed
    assert got_slow < big + small


async def _read_until_closed(ws: Any) -> tuple[int, websockets.ConnectionClosed]:
    """Frames read until the connection closed (within 30 s of silence), and how it closed."""
    got = 0
    while True:
        try:
            await asyncio.wait_for(ws.recv(), 30)
        except websockets.ConnectionClosed as closed:
            return got, closed
        got += 1


async def test_a_websocket_holding_nothing_is_closed_when_idle(
    http: httpx.Client, ws_url: str
) -> None:
    """A connection that subscribes nothing and sends nothing is closed (1001) after the idle
    timeout, though it answers every ping (every 0.5 s here); one that keeps sending frames, or
    holds a topic filter or a queue subscription, stays open and is served."""
    recipient = Recipient(http).create()
    topic = f"idle/{time.monotonic_ns()}"
    silent = await websockets.connect(ws_url)
    hello = await websockets.connect(ws_url)
    chatty = await websockets.connect(ws_url)
    started = time.monotonic()
    async with connect(ws_url) as filtered, connect(ws_url) as queued:
        await send(hello, {"id": "h", "cmd": "HELLO"})
        assert (await recv(hello))["ok"] is True
        await send(filtered, {"id": "f", "cmd": "SUBSCRIBE", "filter": topic})
        assert await recv(filtered) == {"id": "f", "ok": True}
        await send(queued, recipient.sub("q"))
        assert await recv(queued) == {"id": "q", "ok": True}
        while time.monotonic() - started < 2.5 * IDLE_S:
            await send(chatty, {"id": "c", "cmd": "HELLO"})
            assert (await recv(chatty))["ok"] is True
            await asyncio.sleep(IDLE_S / 3)
        for ws in (silent, hello):
            got, closed = await _read_until_closed(ws)
            assert got == 0
            assert closed.rcvd is not None
            assert (closed.rcvd.code, closed.rcvd.reason) == (
                1001,
                "idle: no subscription and no frame",
            )
        published = {"topic": topic, "payload": b64u(b"still here")}
        assert http.post("/v1/publish", json=published).status_code == 202
        assert (await recv(filtered))["topic"] == topic
        assert recipient.send(b"still here").status_code == 201
        assert (await recv(queued))["type"] == "MSG"
        await send(chatty, {"id": "c", "cmd": "HELLO"})
        assert (await recv(chatty))["ok"] is True
    await chatty.close()


def test_no_secret_reaches_a_log(http: httpx.Client, running: helpers.Running) -> None:
    """Bodies, signatures (REST and WebSocket) and the admin token appear in no service's log
    (every file the suite writes under `logs/`, Kafka's and Redis's included), whatever
    happens to the request (accepted, refused, malformed, refused by the HTTP server itself)."""
    recipient = Recipient(http).create()
    body = b"secret-body-" + str(time.monotonic_ns()).encode()
    assert recipient.send(body).status_code == 201
    http.post(f"/v1/send/{recipient.sender}", content=b'{"body": "' + b64u(body).encode())
    head = recipient.call("GET", "/head")
    signature = recipient.headers("GET", f"/v1/queues/{recipient.queue}/head")
    token = running.token()
    http.get("/admin/ping", headers={"Authorization": f"Bearer {token}x"})
    http.get("/admin/ping", headers={"Authorization": f"Bearer {token}"})
    assert head.status_code == 200
    # The token in a request the HTTP server itself refuses (a bad header line after it).
    url = httpx.URL(running.state.ingress_url)
    with socket.create_connection((url.host, url.port or 80), timeout=5) as sock:
        sock.sendall(
            f"GET /admin/ping HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            "Bad Header: x\r\n\r\n".encode()
        )
        assert b"BAD_REQUEST" in sock.recv(4096)
    sub = recipient.sub("s")

    async def over_the_websocket() -> None:
        """A SUB (its signature), a frame refused after parsing and one that is not JSON, both
        holding the body, and a PUBLISH of it."""
        ws_url = running.state.ingress_url.replace("http://", "ws://") + "/v1/ws"
        async with connect(ws_url) as ws:
            for frame in (
                sub,
                {"id": "x", "cmd": "SUB", "queue": b64u(body), "ts": 1, "sig": sub["sig"]},
                '{"cmd": "PUBLISH", "payload": "' + b64u(body),
                {"id": "p", "cmd": "PUBLISH", "topic": "t/secret", "payload": b64u(body)},
            ):
                await send(ws, frame)
                await recv(ws)

    asyncio.run(over_the_websocket())
    secrets: dict[str, Any] = {
        "body": b64u(body),
        "signature": signature["X-Relay-Signature"],
        "SUB signature": sub["sig"],
        "token": token,
    }
    files = [path for path in (running.data_dir / "logs").glob("*") if path.is_file()]
    for service in SERVICES:
        assert any(path.name.startswith(f"{service}-") for path in files), (service, files)
    logs = "".join(path.read_text(errors="replace") for path in files)
    assert logs  # the services did log: the check is not vacuous
    for what, secret in secrets.items():
        assert secret not in logs, what
