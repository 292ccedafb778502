"""The ingress's queue handlers (REST queues, WebSocket SUB and ACK) in process, over the loopback
bus of `tests.services.loopback`, with the real queue-writer and delivery behind it. What the
ingress decides: a refused request sends nothing and gets the API's error shape; an accepted one
is one command of the right kind, on the queue's partition, carrying the asker's slot and a
deadline, and is answered only with its reply (503 when none comes, or when it has another
shape); SUB and ACK frames become signed commands and the pushes that follow reach the socket."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from relay_bus import schemas, topics
from relay_bus.consumers import Received
from relay_ingress import asking
from relay_ingress.queues import SEND_UNKNOWN
from relay_queues import auth, ids
from relay_routes.subscriptions import Entry
from tests.services.loopback import INSTANCE, PARTITIONS, Recipient, Relay, WsClient, error

BAD = (400, "BAD_REQUEST")
OUTSIDE_S = auth.SKEW_S + 10
"""A timestamp this far from now is outside the window however long the test has run."""


def _commands(relay: Relay) -> list[tuple[schemas.Record, int]]:
    return relay.bus.on(topics.QUEUE_COMMANDS)


async def _queue(relay: Relay, recipient: Recipient) -> tuple[str, str]:
    created = await relay.http.post("/v1/queues", json={"recipient_key": recipient.public})
    assert created.status_code == 201, created.text
    return created.json()["recipient_id"], created.json()["sender_id"]


async def _send(relay: Relay, sender: str, body: bytes) -> str:
    sent = await relay.http.post(f"/v1/send/{sender}", json={"body": ids.b64u(body)})
    assert sent.status_code == 201, sent.text
    msg_id: str = sent.json()["msg_id"]
    return msg_id


def _reply_to(relay: Relay, request_id: str) -> tuple[schemas.QueueReply, int]:
    [(reply, slot)] = relay.bus.answers(request_id)
    assert isinstance(reply, schemas.QueueReply)
    return reply, slot


async def test_queue_requests_become_commands_on_the_queues_partition(
    tmp_path: Path, redis_url: str
) -> None:
    recipient = Recipient()
    async with Relay(tmp_path, redis_url) as relay:
        created = await relay.http.post("/v1/queues", json={"recipient_key": recipient.public})
        assert created.status_code == 201
        queue, sender = created.json()["recipient_id"], created.json()["sender_id"]
        assert created.json() == {"recipient_id": queue, "sender_id": sender, "quota": 128}
        [(create, partition)] = _commands(relay)
        assert isinstance(create, schemas.CreateQueue)
        assert (create.queue, create.sender, create.recipient_key) == (
            queue,
            sender,
            recipient.public,
        )
        assert (
            partition == ids.partition_of(queue, PARTITIONS) == ids.partition_of(sender, PARTITIONS)
        )

        # A SEND goes to the sender's partition and is answered only with the writer's reply.
        relay.bus.hold(topics.QUEUE_COMMANDS)
        asked_ms = time.time() * 1000
        sending = asyncio.create_task(
            relay.http.post(f"/v1/send/{sender}", json={"body": ids.b64u(b"hello"), "ttl_s": 60})
        )
        await relay.until(lambda: len(_commands(relay)) == 2, "the send command")
        send, partition = _commands(relay)[1]
        assert isinstance(send, schemas.SendMessage)
        assert partition == ids.partition_of(sender, PARTITIONS)
        assert (send.sender, send.body, send.ttl_s) == (sender, ids.b64u(b"hello"), 60)
        assert (send.origin, send.reply_slot) == (INSTANCE, relay.slot)
        assert asked_ms + 5000 <= send.deadline_ms <= time.time() * 1000 + 5000
        ids.id_bytes(send.msg_id)  # the ingress chose a well-formed id
        done, _ = await asyncio.wait({sending}, timeout=0.1)
        assert not done  # no answer while the command waits for its writer
        relay.bus.release(topics.QUEUE_COMMANDS)
        sent = await sending
        reply, slot = _reply_to(relay, send.id)
        assert slot == relay.slot
        assert (sent.status_code, sent.json()) == (201, reply.data)
        assert sent.json()["msg_id"] == send.msg_id

        # Recipient commands carry the text the ingress built from the request, and its signature.
        path = f"/v1/queues/{queue}/head"
        headers = recipient.headers("GET", path)
        head = await relay.http.get(path, headers=headers)
        assert head.json() == {"msg_id": send.msg_id, "ts": sent.json()["ts"], "body": send.body}
        read, partition = _commands(relay)[-1]
        assert isinstance(read, schemas.ReadHead)
        assert partition == ids.partition_of(queue, PARTITIONS)
        ts = int(headers["X-Relay-Timestamp"])
        assert (read.queue, read.signed, read.sig) == (
            queue,
            auth.rest_text("GET", path, ts, b""),
            headers["X-Relay-Signature"],
        )

        path = f"/v1/queues/{queue}/ack"
        raw = json.dumps({"msg_id": send.msg_id}).encode()
        headers = recipient.headers("POST", path, raw)
        acked = await relay.http.post(
            path, content=raw, headers={**headers, "Content-Type": "application/json"}
        )
        assert acked.status_code == 204
        ack, _ = _commands(relay)[-1]
        assert isinstance(ack, schemas.AckMessage)
        assert ack.msg_id == send.msg_id
        assert ack.signed.endswith("\n" + hashlib.sha256(raw).hexdigest())

        path = f"/v1/queues/{queue}"
        info = await relay.http.get(path, headers=recipient.headers("GET", path))
        assert info.status_code == 200
        assert {k: v for k, v in info.json().items() if k != "created_at"} == {
            "size": 0,
            "quota": 128,
            "status": "active",
        }

        # The writer's refusals come back as the API errors they name.
        stranger = Recipient()
        refused = await relay.http.get(path, headers=stranger.headers("GET", path))
        assert error(refused) == (401, "AUTH")
        assert isinstance(_commands(relay)[-1][0], schemas.ReadInfo)  # only the writer knows
        suspend = f"/v1/queues/{queue}/suspend"
        done_ = await relay.http.post(suspend, headers=recipient.headers("POST", suspend))
        assert (done_.status_code, done_.json()) == (200, {})
        forbidden = await relay.http.post(f"/v1/send/{sender}", json={"body": "eA"})
        assert error(forbidden) == (403, "FORBIDDEN")
        deleted = await relay.http.delete(path, headers=recipient.headers("DELETE", path))
        assert deleted.status_code == 204
        assert isinstance(_commands(relay)[-1][0], schemas.DeleteQueue)
        gone = await relay.http.get(path, headers=recipient.headers("GET", path))
        assert error(gone) == (401, "AUTH")
        unknown = await relay.http.post(f"/v1/send/{ids.new_id()}", json={"body": "eA"})
        assert error(unknown) == (404, "NOT_FOUND")


async def test_a_refused_request_sends_nothing(tmp_path: Path, redis_url: str) -> None:
    recipient = Recipient()
    queue, sender = ids.new_id(), ids.new_id()
    now = int(time.time())
    head = f"/v1/queues/{queue}/head"

    def signed(ts: int, sig: str | None = None) -> dict[str, str]:
        headers = recipient.headers("GET", head, ts=ts)
        if sig is not None:
            headers["X-Relay-Signature"] = sig
        return headers

    cases: dict[str, tuple[str, str, dict[str, Any], tuple[int, str]]] = {
        "key too short": ("POST", "/v1/queues", {"json": {"recipient_key": "abc"}}, BAD),
        "extra field": (
            "POST",
            "/v1/queues",
            {"json": {"recipient_key": recipient.public, "quota": 1}},
            BAD,
        ),
        "malformed JSON": (
            "POST",
            f"/v1/send/{sender}",
            {"content": b"{", "headers": {"Content-Type": "application/json"}},
            BAD,
        ),
        "sender id too short": ("POST", f"/v1/send/{sender[:-1]}", {"json": {"body": "eA"}}, BAD),
        "body length 1 mod 4": ("POST", f"/v1/send/{sender}", {"json": {"body": "eAbcd"}}, BAD),
        "body not base64url": ("POST", f"/v1/send/{sender}", {"json": {"body": "a+b/"}}, BAD),
        "ttl of 0": ("POST", f"/v1/send/{sender}", {"json": {"body": "eA", "ttl_s": 0}}, BAD),
        "body one byte over": (
            "POST",
            f"/v1/send/{sender}",
            {"json": {"body": ids.b64u(b"x" * 65)}},
            (413, "TOO_LARGE"),
        ),
        "no timestamp": ("GET", head, {}, (401, "AUTH")),
        "stale timestamp": ("GET", head, {"headers": signed(now - OUTSIDE_S)}, (401, "AUTH")),
        "future timestamp": ("GET", head, {"headers": signed(now + OUTSIDE_S)}, (401, "AUTH")),
        "signature not base64url": (
            "GET",
            head,
            {"headers": signed(now, "a+b/" * 22)},
            (401, "AUTH"),
        ),
        "signature of 63 bytes": (
            "GET",
            head,
            {"headers": signed(now, ids.b64u(b"s" * 63))},
            (401, "AUTH"),
        ),
        "recipient id bad": (
            "GET",
            f"/v1/queues/{queue[:-1]}!/head",
            {"headers": signed(now)},
            BAD,
        ),
        "ack of a bad msg_id": (
            "POST",
            f"/v1/queues/{queue}/ack",
            {"json": {"msg_id": "short"}, "headers": signed(now)},
            BAD,
        ),
        "unknown route": ("GET", "/v1/nowhere", {}, (404, "NOT_FOUND")),
        "wrong method": ("PUT", "/v1/queues", {}, (405, "METHOD_NOT_ALLOWED")),
    }
    async with Relay(tmp_path, redis_url, max_body_bytes=64) as relay:
        for what, (method, path, kwargs, expected) in cases.items():
            response = await relay.http.request(method, path, **kwargs)
            assert error(response) == expected, (what, response.text)
            assert relay.bus.posted == [], what
        # The limit itself is accepted (and reaches the writer).
        at_limit = await relay.http.post(f"/v1/send/{sender}", json={"body": ids.b64u(b"x" * 64)})
        assert error(at_limit) == (404, "NOT_FOUND")
        [(send, _)] = _commands(relay)
        assert isinstance(send, schemas.SendMessage)


async def test_no_reply_is_503_and_the_late_command_is_dropped_unapplied(
    tmp_path: Path, redis_url: str
) -> None:
    recipient = Recipient()
    async with Relay(tmp_path, redis_url, request_timeout_s=0.2) as relay:
        queue, sender = await _queue(relay, recipient)
        relay.bus.hold(topics.QUEUE_COMMANDS)  # the writer sees nothing until released
        asked = time.monotonic()
        asked_ms = time.time() * 1000
        late = await relay.http.post(f"/v1/send/{sender}", json={"body": ids.b64u(b"late")})
        waited = time.monotonic() - asked
        assert (late.status_code, late.json()) == (
            503,
            {"error": "UNAVAILABLE", "detail": f"no answer within 0.2 s; {SEND_UNKNOWN}"},
        )
        assert waited >= 0.2 + asking.REPLY_GRACE_S
        send, _ = _commands(relay)[-1]
        assert isinstance(send, schemas.SendMessage)
        assert asked_ms + 200 <= send.deadline_ms <= asked_ms + 200 + waited * 1000
        assert send.expired()
        # The writer gets the command after its deadline: dropped, neither applied nor answered.
        relay.bus.release(topics.QUEUE_COMMANDS)
        later = await _send(relay, sender, b"later")  # answered after whatever came before
        assert relay.bus.answers(send.id) == []
        assert relay.commands is not None
        stored = relay.commands.rules.journal.messages(ids.QueueId(queue))
        assert [(ids.b64u(m.msg_id), m.body) for m in stored] == [(later, b"later")]


async def test_a_reply_of_another_shape_or_for_another_instance_is_not_an_answer(
    tmp_path: Path, redis_url: str
) -> None:
    answers: list[dict[str, Any] | None] = []
    origins: list[str] = []

    async with Relay(tmp_path, redis_url, queue_writer=False, request_timeout_s=0.2) as relay:

        async def writer(received: Received) -> None:
            """Answers each command with the next of `answers`, as `origins` says."""
            command = received.record
            assert isinstance(command, schemas.QueueCommand)
            reply = schemas.QueueReply(
                id=command.id,
                origin=origins.pop(0) if origins else command.origin,
                status=200,
                data=answers.pop(0),
            )
            relay.bus.post(topics.INGRESS_INBOX, reply, partition=command.reply_slot)

        relay.bus.subscribe(topics.QUEUE_COMMANDS, writer)
        recipient, queue, sender = Recipient(), ids.new_id(), ids.new_id()
        head = f"/v1/queues/{queue}/head"

        async def ask_send() -> tuple[int, Any]:
            sent = await relay.http.post(f"/v1/send/{sender}", json={"body": "eA"})
            return sent.status_code, sent.json()

        no_ts = {"msg_id": ids.new_id()}
        answers.append(no_ts)
        assert await ask_send() == (
            503,
            {"error": "UNAVAILABLE", "detail": _detail_of_wrong_shape(no_ts)},
        )
        answers.append(None)
        assert await ask_send() == (
            503,
            {"error": "UNAVAILABLE", "detail": "the queue-writer answered without a body"},
        )
        answers.append({"msg_id": ids.new_id(), "ts": 1, "size": 3})  # a field too many
        status, body = await ask_send()
        assert (status, body["error"]) == (503, "UNAVAILABLE")
        assert body["detail"].startswith("unexpected answer: queue_reply data is not a Sent")
        good = {"msg_id": ids.new_id(), "ts": 7}
        answers.append(good)
        assert await ask_send() == (201, good)

        answers.append({"size": 1, "quota": 2, "status": "active", "created_at": 3})
        wrong = await relay.http.get(head, headers=recipient.headers("GET", head))
        assert error(wrong) == (503, "UNAVAILABLE")
        assert wrong.json()["detail"].startswith("unexpected answer: ")
        answers.append(None)
        empty = await relay.http.get(head, headers=recipient.headers("GET", head))
        assert (empty.status_code, empty.content) == (204, b"")

        # The same id answered for another ingress instance: not taken, so no answer at all.
        answers.append(good)
        origins.append("ingress-9")
        assert await ask_send() == (
            503,
            {"error": "UNAVAILABLE", "detail": f"no answer within 0.2 s; {SEND_UNKNOWN}"},
        )
        assert len(_commands(relay)) == 7


def _detail_of_wrong_shape(data: dict[str, Any]) -> str:
    """What `asking.answer` says of `data` as a Sent (in pydantic's own words)."""
    reply = schemas.QueueReply(id="x", origin="y", status=200, data=data)
    with pytest.raises(schemas.SchemaError, match="queue_reply data is not a Sent") as failure:
        reply.answer(schemas.Sent)
    return f"unexpected answer: {failure.value}"


def _sub(
    recipient: Recipient, queue: str, frame_id: object, ts: int | None = None
) -> dict[str, Any]:
    ts = int(time.time()) if ts is None else ts
    sig = recipient.sign(auth.sub_text(queue, ts))
    return {"id": frame_id, "cmd": "SUB", "queue": queue, "ts": ts, "sig": sig}


def _ack(recipient: Recipient, queue: str, msg_id: str, frame_id: object) -> dict[str, Any]:
    ts = int(time.time())
    sig = recipient.sign(auth.ack_text(queue, msg_id, ts))
    return {"id": frame_id, "cmd": "ACK", "queue": queue, "msg_id": msg_id, "ts": ts, "sig": sig}


async def test_sub_and_ack_frames_become_commands_and_messages_are_pushed(
    tmp_path: Path, redis_url: str
) -> None:
    recipient = Recipient()
    async with Relay(tmp_path, redis_url) as relay:
        queue, sender = await _queue(relay, recipient)
        first, second = await _send(relay, sender, b"one"), await _send(relay, sender, b"two")
        async with WsClient(relay.app) as ws:
            assert ws.accepted == {"type": "websocket.accept", "subprotocol": None, "headers": []}
            frame = _sub(recipient, queue, "s1")
            asked_ms = int(time.time() * 1000)
            assert await ws.ask(frame) == {"id": "s1", "ok": True}
            answered_ms = int(time.time() * 1000)
            sub, partition = _commands(relay)[-1]
            assert isinstance(sub, schemas.SubscribeQueue)
            assert partition == ids.partition_of(queue, PARTITIONS)
            assert (sub.queue, sub.slot, sub.sig) == (queue, relay.slot, frame["sig"])
            conn = sub.conn
            # Routed to this connection in Redis once the queue-writer accepted the SUB, with
            # the order it gave the SUB (its clock in microseconds).
            listed = await relay.ctx.connections.subscriptions.of_partition(partition)
            since = listed[queue].since
            assert listed == {queue: Entry(relay.slot, conn, since, None)}
            assert asked_ms * 1000 <= since <= answered_ms * 1000
            assert sub.signed == auth.sub_text(queue, frame["ts"])
            pushed = await ws.receive()
            assert pushed == {"type": "MSG", "queue": queue, "msg_id": first, **_held(pushed)}
            assert ids.unb64u(pushed["body"]) == b"one"

            msg = await _ack_and_next(ws, _ack(recipient, queue, first, 2))
            assert (msg["queue"], msg["msg_id"], ids.unb64u(msg["body"])) == (queue, second, b"two")
            ack, partition = _commands(relay)[-1]
            assert isinstance(ack, schemas.AckMessage)
            assert partition == ids.partition_of(queue, PARTITIONS)
            assert (ack.queue, ack.msg_id) == (queue, first)
            assert ack.signed == auth.ack_text(queue, first, _ack_ts(ack))

            # A message sent while subscribed is pushed once the one in flight is acked.
            third = await _send(relay, sender, b"three")
            msg = await _ack_and_next(ws, _ack(recipient, queue, second, 3))
            assert (msg["msg_id"], ids.unb64u(msg["body"])) == (third, b"three")
            assert ws.pending() == 0
        # The closed connection's subscription is gone from Redis, and delivery is told.
        unsubscribed = [
            (r, part)
            for r, part in relay.bus.on(topics.QUEUE_EVENTS)
            if isinstance(r, schemas.QueueEvent) and r.event == "unsubscribed"
        ]
        assert [(r.queue, r.conn, part) for r, part in unsubscribed] == [
            (queue, conn, ids.partition_of(queue, PARTITIONS))
        ]
        listed = await relay.ctx.connections.subscriptions.of_partition(
            ids.partition_of(queue, PARTITIONS)
        )
        assert listed == {}


def _held(frame: dict[str, Any]) -> dict[str, Any]:
    """The MSG fields a test does not predict (ts, body)."""
    return {k: frame[k] for k in ("ts", "body") if k in frame}


async def _ack_and_next(ws: WsClient, ack: dict[str, Any]) -> dict[str, Any]:
    """Send an ACK; its `ok`, then the next MSG (API.md)."""
    await ws.send(ack)
    ok, msg = await ws.receive(), await ws.receive()
    assert ok == {"id": ack["id"], "ok": True}, (ok, msg)
    assert msg["type"] == "MSG", msg
    return msg


async def _ack_with_the_inbox_held(relay: Relay, ws: WsClient, ack: dict[str, Any]) -> int:
    """Send an ACK while the inbox is held, until its reply and the next push wait there;
    returns how many inbox records came before them."""
    relay.bus.hold(topics.INGRESS_INBOX)
    before = len(relay.bus.on(topics.INGRESS_INBOX))
    await ws.send(ack)
    while len(relay.bus.on(topics.INGRESS_INBOX)) < before + 2:  # the reply, the push
        await asyncio.sleep(0.01)
    return before


async def test_an_acks_ok_comes_before_the_next_msg_that_overtook_it(
    tmp_path: Path, redis_url: str
) -> None:
    """The ACK's reply and delivery's push of the next message reach the inbox in one fetch:
    the push is handled first (the reply only wakes the ACK's task), yet the client gets the
    `ok` first; an ACK the queue-writer refuses holds nothing after its error."""
    recipient = Recipient()
    async with Relay(tmp_path, redis_url) as relay:
        queue, sender = await _queue(relay, recipient)
        first, second = await _send(relay, sender, b"one"), await _send(relay, sender, b"two")
        async with WsClient(relay.app) as ws:
            assert await ws.ask(_sub(recipient, queue, "s1")) == {"id": "s1", "ok": True}
            assert (await ws.receive())["msg_id"] == first
            before = await _ack_with_the_inbox_held(relay, ws, _ack(recipient, queue, first, 2))
            kinds = [r.kind for r, _ in relay.bus.on(topics.INGRESS_INBOX)[before:]]
            assert kinds == ["queue_reply", "deliver"]
            relay.bus.release(topics.INGRESS_INBOX)
            assert await ws.receive() == {"id": 2, "ok": True}
            msg = await ws.receive()
            assert (msg["type"], msg["msg_id"]) == ("MSG", second)
            refused = await ws.ask(_ack(recipient, queue, first, 3))
            assert (refused["ok"], refused["error"]) == (False, "NO_MSG")
            third = await _send(relay, sender, b"three")
            msg = await _ack_and_next(ws, _ack(recipient, queue, second, 4))
            assert msg["msg_id"] == third


async def test_a_push_of_the_message_an_ack_acknowledged_is_dropped_not_held(
    tmp_path: Path, redis_url: str
) -> None:
    """A push of the message being acknowledged that arrives while its ACK is in flight (a
    delivery that resynced sent the head again) waits with the queue's other frames; once the
    ACK is ok it is stale: the client gets the `ok`, the next message, and never the acked one
    again (a full run's kill test saw it 0.3 ms after the `ok`)."""
    recipient = Recipient()
    async with Relay(tmp_path, redis_url) as relay:
        queue, sender = await _queue(relay, recipient)
        first, second = await _send(relay, sender, b"one"), await _send(relay, sender, b"two")
        async with WsClient(relay.app) as ws:
            assert await ws.ask(_sub(recipient, queue, "s1")) == {"id": "s1", "ok": True}
            assert (await ws.receive())["msg_id"] == first
            (push, slot), *_ = [
                (r, p)
                for r, p in relay.bus.on(topics.INGRESS_INBOX)
                if isinstance(r, schemas.Deliver) and r.head and r.head.msg_id == first
            ]
            await _ack_with_the_inbox_held(relay, ws, _ack(recipient, queue, first, 2))
            relay.bus.post(topics.INGRESS_INBOX, push, partition=slot)  # the stale push again
            relay.bus.release(topics.INGRESS_INBOX)
            assert await ws.receive() == {"id": 2, "ok": True}
            msg = await ws.receive()
            assert (msg["type"], msg["msg_id"]) == ("MSG", second)
            await ws.send(_ack(recipient, queue, second, 3))
            assert await ws.receive() == {"id": 3, "ok": True}  # not the first message again
            assert ws.pending() == 0


def _ack_ts(ack: schemas.AckMessage) -> int:
    return int(ack.signed.rsplit("\n", 1)[1])


async def test_a_refused_frame_sends_nothing_and_gets_one_error_reply(
    tmp_path: Path, redis_url: str
) -> None:
    recipient = Recipient()
    queue = ids.new_id()
    now = int(time.time())
    sub = _sub(recipient, queue, "f")
    cases: dict[str, tuple[str | bytes, dict[str, Any]]] = {
        "not JSON": ("{", {"id": None, "error": "BAD_REQUEST", "detail": "not JSON"}),
        "not an object": (
            "[1]",
            {"id": None, "error": "BAD_REQUEST", "detail": "a frame is one JSON object"},
        ),
        "unknown command": (
            json.dumps({"id": 5, "cmd": "PEEK"}),
            {"id": 5, "error": "BAD_REQUEST", "detail": "unknown command 'PEEK'"},
        ),
        "bad queue id": (json.dumps({**sub, "queue": queue[:-1]}), {"error": "BAD_REQUEST"}),
        "extra field": (json.dumps({**sub, "x": 1}), {"error": "BAD_REQUEST"}),
        "stale ts": (
            json.dumps(_sub(recipient, queue, "f", now - OUTSIDE_S)),
            {"error": "AUTH", "detail": "timestamp outside the accepted window"},
        ),
        "signature not base64url": (
            json.dumps({**sub, "sig": "a+b/" * 22}),
            {"error": "AUTH", "detail": "signature is not base64url"},
        ),
        "signature of 63 bytes": (
            json.dumps({**sub, "sig": ids.b64u(b"s" * 63)}),
            {"error": "AUTH", "detail": "signature must be 64 bytes"},
        ),
        "ack of a bad msg_id": (
            json.dumps(_ack(recipient, queue, "short", "f")),
            {"error": "BAD_REQUEST"},
        ),
        "binary": (
            b"{}",
            {"id": None, "error": "BAD_REQUEST", "detail": "binary frames are not accepted"},
        ),
        "too large": (
            json.dumps({**sub, "pad": "x" * 1024}),
            {"id": None, "error": "TOO_LARGE", "detail": "frame over 1024 bytes"},
        ),
    }
    async with (
        Relay(tmp_path, redis_url, ws_max_frame_bytes=1024) as relay,
        WsClient(relay.app) as ws,
    ):
        for what, (frame, expected) in cases.items():
            if isinstance(frame, bytes):
                await ws.send_bytes(frame)
            else:
                await ws.send_text(frame)
            reply = await ws.receive()
            assert reply == {"id": "f", "ok": False, "detail": reply["detail"], **expected}, what
            assert reply["detail"], what
            assert relay.bus.posted == [], what
        # A SUB's signature is single-use: the same frame again is refused before the writer.
        queue, _ = await _queue(relay, recipient)
        once = _sub(recipient, queue, "once")
        assert await ws.ask(once) == {"id": "once", "ok": True}
        posted = len(relay.bus.on(topics.QUEUE_COMMANDS))
        assert await ws.ask({**once, "id": "twice"}) == {
            "id": "twice",
            "ok": False,
            "error": "AUTH",
            "detail": "signature already used",
        }
        assert len(relay.bus.on(topics.QUEUE_COMMANDS)) == posted
        assert ws.pending() == 0


async def test_a_refused_sub_leaves_the_connections_subscription_alone(
    tmp_path: Path, redis_url: str
) -> None:
    recipient = Recipient()
    async with Relay(tmp_path, redis_url) as relay:
        queue, sender = await _queue(relay, recipient)
        async with WsClient(relay.app) as ws:
            frame = _sub(recipient, queue, "s")
            assert await ws.ask(frame) == {"id": "s", "ok": True}
            retry = await ws.ask({**frame, "id": "retry"})  # the client retries its SUB
            assert (retry["ok"], retry["error"]) == (False, "AUTH")
            # Well-formed but signed by another key: refused by the queue-writer, after the
            # ingress routed the queue to this connection for the attempt.
            forged = _sub(Recipient(), queue, "forged")
            refused = await ws.ask(forged)
            assert (refused["ok"], refused["error"]) == (False, "AUTH")
            msg_id = await _send(relay, sender, b"still subscribed?")
            assert not [
                r
                for r, _ in relay.bus.on(topics.QUEUE_EVENTS)
                if isinstance(r, schemas.QueueEvent) and r.event == "unsubscribed"
            ]
            pushed = await ws.receive(timeout_s=2)
            assert (pushed["type"], pushed["msg_id"]) == ("MSG", msg_id)
