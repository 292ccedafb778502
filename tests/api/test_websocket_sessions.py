"""API.md WebSocket `HELLO` and session-bound SUB and ACK frames (issue 18), against the running
suite: a bound signature needs no replay record, so a client may SUB again at once, on another
connection, in the same second; and it is worth nothing on any other connection."""

from __future__ import annotations

import time

import httpx
import pytest
from websockets.asyncio.client import ClientConnection

from tests.api.client import Recipient, unb64u
from tests.api.test_websocket import connect, msg, nothing_within, recv, send

pytestmark = pytest.mark.suite


async def _hello(ws: ClientConnection, frame_id: str = "h") -> str:
    await send(ws, {"id": frame_id, "cmd": "HELLO"})
    reply = await recv(ws)
    assert set(reply) == {"id", "ok", "session"}, reply
    assert (reply["id"], reply["ok"]) == (frame_id, True)
    session: str = reply["session"]
    assert len(unb64u(session)) == 32
    assert "=" not in session
    return session


async def test_hello_names_one_session_per_connection(ws_url: str) -> None:
    async with connect(ws_url) as one, connect(ws_url) as two:
        first = await _hello(one)
        assert await _hello(one, "again") == first  # the connection's one session
        assert await _hello(two) != first


async def test_two_connections_sub_in_one_second_with_bound_frames(
    http: httpx.Client, ws_url: str
) -> None:
    """The second takes the queue over with the same timestamp, the first gets END; the
    unbound form of the same second would be refused as a used signature."""
    r = Recipient(http).create()
    msg_id = r.send(b"one").json()["msg_id"]
    ts = int(time.time())
    async with connect(ws_url) as old, connect(ws_url) as new:
        await send(old, r.sub("old", ts=ts, session=await _hello(old)))
        assert await recv(old) == {"id": "old", "ok": True}
        assert msg(await recv(old), r) == msg_id
        await send(new, r.sub("new", ts=ts, session=await _hello(new)))
        assert await recv(new) == {"id": "new", "ok": True}
        assert msg(await recv(new), r) == msg_id  # the same msg_id on redelivery
        assert await recv(old) == {"type": "END", "queue": r.queue}
        following = r.send(b"two").json()["msg_id"]
        await nothing_within(old)
        await send(new, r.ack(msg_id, "a", session=None))  # unbound ACKs still work
        frames = [await recv(new), await recv(new)]
        assert {"id": "a", "ok": True} in frames
        assert following in [f.get("msg_id") for f in frames]


async def test_a_client_reconnecting_subs_again_at_once(http: httpx.Client, ws_url: str) -> None:
    r = Recipient(http).create()
    ts = int(time.time())
    async with connect(ws_url) as ws:
        await send(ws, r.sub("first", ts=ts, session=await _hello(ws)))
        assert await recv(ws) == {"id": "first", "ok": True}
    async with connect(ws_url) as ws:
        await send(ws, r.sub("again", ts=ts, session=await _hello(ws)))
        assert await recv(ws) == {"id": "again", "ok": True}
        sent = r.send(b"after").json()["msg_id"]
        assert msg(await recv(ws), r) == sent
        session = await _hello(ws)
        await send(ws, r.ack(sent, "bound-ack", session=session))
        assert await recv(ws) == {"id": "bound-ack", "ok": True}
        assert r.call("GET", "/head").status_code == 204  # acknowledged


async def test_a_bound_frame_is_worthless_elsewhere(http: httpx.Client, ws_url: str) -> None:
    """A captured bound SUB: refused on a connection without HELLO (BAD_REQUEST, before any
    signature check) and on another session (AUTH); neither changes the subscription."""
    r = Recipient(http).create()
    msg_id = r.send(b"held").json()["msg_id"]
    async with connect(ws_url) as owner, connect(ws_url) as thief:
        session = await _hello(owner)
        captured = r.sub("owner", session=session)
        await send(owner, captured)
        assert await recv(owner) == {"id": "owner", "ok": True}
        assert msg(await recv(owner), r) == msg_id
        await send(thief, {**captured, "id": "no-hello"})
        reply = await recv(thief)
        assert (reply["id"], reply["ok"], reply["error"]) == ("no-hello", False, "BAD_REQUEST")
        assert "HELLO" in reply["detail"]
        await _hello(thief)
        await send(thief, {**captured, "id": "other-session"})
        reply = await recv(thief)
        assert (reply["id"], reply["ok"], reply["error"]) == ("other-session", False, "AUTH")
        await send(thief, {**r.ack(msg_id, "ack", session=session)})  # signed for the owner's
        assert (await recv(thief))["error"] == "AUTH"
        await send(thief, {**captured, "id": "unbound", "bound": False})  # text lacks session
        assert (await recv(thief))["error"] == "AUTH"
        await nothing_within(owner)  # no END: the owner holds the queue
        assert r.call("GET", "/head").json()["msg_id"] == msg_id  # not acknowledged
        following = r.send(b"next").json()["msg_id"]
        await send(owner, r.ack(msg_id, "ack", session=session))
        frames = [await recv(owner), await recv(owner)]
        assert {"id": "ack", "ok": True} in frames
        assert following in [f.get("msg_id") for f in frames]
