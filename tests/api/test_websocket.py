"""API.md WebSocket `/v1/ws`, frame by frame, against the running suite."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection

from tests.api.client import Recipient, b64u

pytestmark = pytest.mark.suite


@asynccontextmanager
async def connect(url: str) -> AsyncIterator[ClientConnection]:
    async with websockets.connect(url, max_size=2**21) as ws:
        yield ws


async def send(ws: ClientConnection, frame: dict[str, Any] | str | bytes) -> None:
    await ws.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))


async def recv(ws: ClientConnection, timeout_s: float = 10) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), timeout_s))
    return frame


async def nothing_within(ws: ClientConnection, timeout_s: float = 0.5) -> None:
    with pytest.raises(TimeoutError):
        await recv(ws, timeout_s)


def msg(frame: dict[str, Any], r: Recipient) -> str:
    assert frame["type"] == "MSG", frame
    assert frame["queue"] == r.queue
    msg_id: str = frame["msg_id"]
    return msg_id


async def test_sub_then_messages_then_ack_then_next(http: httpx.Client, ws_url: str) -> None:
    r = Recipient(http).create()
    sent = [r.send(f"m{i}".encode()).json() for i in range(2)]
    async with connect(ws_url) as ws:
        await send(ws, r.sub("s1"))
        assert await recv(ws) == {"id": "s1", "ok": True}  # ok comes before any MSG
        first = await recv(ws)
        assert first == {
            "type": "MSG",
            "queue": r.queue,
            "msg_id": sent[0]["msg_id"],
            "ts": sent[0]["ts"],
            "body": b64u(b"m0"),
        }
        await nothing_within(ws)  # one in flight until ACK
        await send(ws, r.ack(sent[0]["msg_id"], "a1"))
        frames = [await recv(ws), await recv(ws)]
        assert {"id": "a1", "ok": True} in frames
        assert msg(next(f for f in frames if "type" in f), r) == sent[1]["msg_id"]
        await send(ws, r.ack(sent[1]["msg_id"], "a2"))
        assert await recv(ws) == {"id": "a2", "ok": True}
        later = r.send(b"later").json()
        assert msg(await recv(ws), r) == later["msg_id"]  # pushed as it arrives


async def test_a_newer_sub_takes_over_and_redelivers_the_same_message(
    http: httpx.Client, ws_url: str
) -> None:
    r = Recipient(http).create()
    msg_id = r.send().json()["msg_id"]
    async with connect(ws_url) as old, connect(ws_url) as new:
        await send(old, r.sub("old"))
        assert await recv(old) == {"id": "old", "ok": True}
        assert msg(await recv(old), r) == msg_id
        await send(new, r.sub("new", ts=int(time.time()) + 1))
        assert await recv(new) == {"id": "new", "ok": True}
        assert msg(await recv(new), r) == msg_id  # the same msg_id on redelivery
        assert await recv(old) == {"type": "END", "queue": r.queue}
        following = r.send(b"next").json()["msg_id"]
        await send(new, r.ack(msg_id, "a"))
        frames = [await recv(new), await recv(new)]
        assert {"id": "a", "ok": True} in frames
        assert following in [f.get("msg_id") for f in frames]
        await nothing_within(old)


async def test_head_read_over_rest_is_in_flight_too(http: httpx.Client, ws_url: str) -> None:
    r = Recipient(http).create()
    async with connect(ws_url) as ws:
        await send(ws, r.sub())
        assert (await recv(ws))["ok"] is True
        first = r.send(b"1").json()["msg_id"]
        assert msg(await recv(ws), r) == first
        second = r.send(b"2").json()["msg_id"]
        assert r.call("GET", "/head").json()["msg_id"] == first
        acked = r.call("POST", "/ack", {"msg_id": first})  # over REST: the next is in flight
        assert acked.json()["msg_id"] == second
        assert msg(await recv(ws), r) == second  # and pushed once to the subscriber


async def test_refused_commands(http: httpx.Client, ws_url: str) -> None:
    r = Recipient(http).create()
    stranger = Recipient(http)
    stranger.queue = r.queue
    async with connect(ws_url) as ws:
        stale = r.sub("stale", ts=int(time.time()) - 400)
        wrong = stranger.sub("wrong")
        for frame, code in [(stale, "AUTH"), (wrong, "AUTH")]:
            await send(ws, frame)
            reply = await recv(ws)
            assert (reply["id"], reply["ok"], reply["error"]) == (frame["id"], False, code)
        ok = r.sub("ok")
        await send(ws, ok)
        assert await recv(ws) == {"id": "ok", "ok": True}
        await send(ws, {**ok, "id": "replayed"})  # the same signature again
        assert (await recv(ws))["error"] == "AUTH"
        await send(ws, r.ack(b64u(bytes(24)), "noack"))
        assert await recv(ws) == {
            "id": "noack",
            "ok": False,
            "error": "NO_MSG",
            "detail": "msg_id is not the message in flight",
        }
        ghost = Recipient(http)
        ghost.queue = b64u(bytes(range(24)))
        await send(ws, ghost.sub("ghost"))
        assert (await recv(ws))["error"] == "AUTH"


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("not json", "BAD_REQUEST"),
        (b"\x00binary", "BAD_REQUEST"),
        ("[1, 2]", "BAD_REQUEST"),
        ('{"id": "u", "cmd": "FLY"}', "BAD_REQUEST"),
        ('{"id": "m", "cmd": "SUB"}', "BAD_REQUEST"),
        ('{"id": "q", "cmd": "SUB", "queue": "x", "ts": 1, "sig": "y"}', "BAD_REQUEST"),
        ("x" * 70_000, "TOO_LARGE"),
    ],
)
async def test_bad_frames_get_error_replies_and_the_connection_lives(
    ws_url: str, frame: str | bytes, code: str
) -> None:
    async with connect(ws_url) as ws:
        await send(ws, frame)
        reply = await recv(ws)
        assert reply["ok"] is False
        assert reply["error"] == code
        await send(ws, "still there?")
        assert (await recv(ws))["error"] == "BAD_REQUEST"


@pytest.mark.parametrize("frame", ["{}", b"\x00binary"])
async def test_frames_per_second_are_limited(ws_url: str, frame: str | bytes) -> None:
    async with connect(ws_url) as ws:
        for _ in range(60):
            await send(ws, frame)
        codes = [(await recv(ws))["error"] for _ in range(60)]
        assert "RATE_LIMITED" in codes
        assert codes[0] == "BAD_REQUEST"


async def test_connections_per_address_are_limited(ws_url: str) -> None:
    async with connect(ws_url) as first:
        others = [await websockets.connect(ws_url) for _ in range(7)]
        try:
            with pytest.raises(websockets.exceptions.InvalidStatus):
                await websockets.connect(ws_url)
            await send(first, "{}")
            assert (await recv(first))["error"] == "BAD_REQUEST"
        finally:
            for ws in others:
                await ws.close()


_ids = st.one_of(st.none(), st.text(max_size=8), st.integers(-5, 5), st.booleans())
_b64ish = st.one_of(
    st.text(
        alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", max_size=90
    ),
    st.text(max_size=20),
)
_huge = st.one_of(st.integers(2**53, 10**400), st.integers(-(10**400), -(2**53)), st.just(10**4000))
_times = st.one_of(
    st.integers(-(2**40), 2**40),
    _huge,
    st.just("now"),
    st.just("stale"),
    st.text(max_size=5),
    st.floats(allow_nan=True),
)


_bad_retain = st.sampled_from(["yes", "true", 1, 0, None, [], {}])


def _frames(canary: Recipient, topic: str) -> st.SearchStrategy[str | bytes]:
    now = int(time.time())

    def fix(frame: dict[str, Any]) -> str:
        if frame.get("ts") == "now":
            frame["ts"] = now
        elif frame.get("ts") == "stale":
            frame["ts"] = now - 1000
        return json.dumps(frame)

    def damage(frame: dict[str, Any], defect: tuple[str, Any]) -> str:
        """One field made wrong, so the PUBLISH is refused whatever else it holds."""
        field, value = defect
        frame[field] = value
        return json.dumps(frame)

    publishes = st.builds(
        damage,
        st.fixed_dictionaries(
            {
                "id": _ids,
                "cmd": st.just("PUBLISH"),
                "topic": st.one_of(st.just(topic), st.text(max_size=8)),
                "payload": st.just(b64u(b"fuzz")),
            },
            optional={"retain": st.booleans(), "expiry_s": st.integers(1, 3600)},
        ),
        st.one_of(
            st.tuples(st.just("retain"), _bad_retain),
            st.tuples(st.just("expiry_s"), st.one_of(_huge, st.floats(), st.just("60"))),
            st.tuples(st.just("payload"), st.one_of(_huge, st.just("not base64!"))),
            st.tuples(st.just("extra"), st.integers()),
        ),
    )

    commands = st.fixed_dictionaries(
        {
            "id": _ids,
            "cmd": st.sampled_from(
                ["SUB", "ACK", "SUBSCRIBE", "PUBLISH", "HELLO", "sub", "", "FLY"]
            ),
        },
        optional={
            "queue": st.one_of(st.just(canary.queue), _b64ish),
            "msg_id": _b64ish,
            "ts": _times,
            "sig": _b64ish,
            "bound": st.one_of(st.booleans(), st.none(), st.integers(0, 1), st.just("true")),
            "extra": st.integers(),
        },
    ).map(fix)
    return st.one_of(
        commands,
        publishes,
        st.binary(max_size=64),
        st.text(max_size=64),
        st.just("x" * 70_000),
        st.integers(50, 20_000).map(lambda depth: "[" * depth + "]" * depth),
        st.integers(50, 10_000).map(lambda depth: '{"a":' * depth + "1" + "}" * depth),
        _huge.map(lambda n: f'{{"id": 1, "cmd": "SUB", "ts": {n}}}'),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=5),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=3), inner, max_size=3)
            ),
            max_leaves=8,
        ).map(json.dumps),
    )


def test_fuzzed_frames_get_one_error_reply_each_and_change_nothing(
    http: httpx.Client, ws_url: str
) -> None:
    """On a connection that holds the canary queue's subscription: every fuzzed frame (bad
    SUBs of that queue included, bound or not, before or after a HELLO; PUBLISHes to the canary
    retained topic with a bad field; huge numbers, deep nesting) gets exactly one error reply
    (a well-formed HELLO gets its session), and afterwards the queue and the topic's retained
    message are as they were and the subscription still delivers."""
    canary = Recipient(http).create()
    msg_id = canary.send(b"canary").json()["msg_id"]
    before = canary.call("GET").json()
    topic = f"canary/{time.monotonic_ns()}"
    published = {"topic": topic, "payload": b64u(b"canary"), "retain": True}
    assert http.post("/v1/publish", json=published).status_code == 202
    retained_before = http.get("/v1/retained/message", params={"topic": topic}).json()

    async def reply_to(ws: ClientConnection) -> dict[str, Any]:
        """The next reply, past the pushes of the held subscription (never an END)."""
        while True:
            frame = await recv(ws)
            assert frame.get("type") != "END", frame
            if "type" not in frame:
                return frame

    async def run() -> None:
        async with connect(ws_url) as ws:
            await send(ws, canary.sub("held"))
            assert await reply_to(ws) == {"id": "held", "ok": True}

            @given(frames=st.lists(_frames(canary, topic), min_size=1, max_size=4))
            @settings(
                max_examples=60,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def fuzz(frames: list[str | bytes]) -> None:
                async def example() -> None:
                    for frame in frames:
                        await send(ws, frame)
                        reply = await reply_to(ws)
                        if reply.get("ok") is True:  # only a HELLO can succeed
                            assert json.loads(frame)["cmd"] == "HELLO", (frame, reply)
                            assert len(reply["session"]) == 43, reply
                            continue
                        assert reply.get("ok") is False, reply  # nothing here is validly signed
                        allowed = {"BAD_REQUEST", "AUTH", "TOO_LARGE", "RATE_LIMITED"}
                        assert reply["error"] in allowed, reply

                asyncio.run_coroutine_threadsafe(example(), loop).result(60)

            loop = asyncio.get_running_loop()
            await asyncio.to_thread(fuzz)
            assert canary.call("GET").json() == before
            assert canary.call("GET", "/head").json()["msg_id"] == msg_id
            retained_after = http.get("/v1/retained/message", params={"topic": topic}).json()
            assert retained_after == retained_before
            # The subscription survived every bad SUB of its queue: an ACK brings the next one.
            await asyncio.sleep(2.5)  # a full frame bucket again (the module's limit is 20/s)
            second = canary.send(b"after").json()["msg_id"]
            await send(ws, canary.ack(msg_id, "ack"))
            frames = [await recv(ws), await recv(ws)]
            assert {"id": "ack", "ok": True} in frames, frames
            pushed = [f for f in frames if f.get("type") == "MSG"]
            assert [f["msg_id"] for f in pushed] == [second], frames

    asyncio.run(run())
