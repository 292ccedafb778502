"""The ingress's topic handlers (publish, retained reads, durable streams, WebSocket SUBSCRIBE,
UNSUBSCRIBE and PUBLISH) in process, over the loopback bus of `tests.services.loopback`, with the
real retainer and delivery behind it. What the ingress decides: a refused request sends nothing
and gets the API's error shape; a publish goes to the partition owning its topic and, when
retained, is answered only once its retainer answers; reads of one topic go to its partition,
filter reads to every partition; a durable-stream batch is split by owning partition; a topic
subscription is told to every partition, and its retained messages come before live ones."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from relay_bus import routing, schemas, topics
from relay_bus.consumers import Received
from relay_queues import ids
from tests.services.loopback import INSTANCE, PARTITIONS, Relay, WsClient, error

BAD = (400, "BAD_REQUEST")


def _topic_on(partition: int, name: str) -> str:
    """A topic `name/<n>` owned by `partition` (`routing.partition_of_topic`)."""
    for n in range(1000):
        topic = f"{name}/{n}"
        if routing.partition_of_topic(topic, PARTITIONS) == partition:
            return topic
    raise AssertionError(f"no topic under {name} on partition {partition}")


def _publications(relay: Relay) -> list[tuple[schemas.Record, int]]:
    return relay.bus.on(topics.PUBLICATIONS)


def _of(relay: Relay, kind: type[Any]) -> list[tuple[Any, int]]:
    return [(r, part) for r, part in _publications(relay) if isinstance(r, kind)]


async def test_a_publish_goes_to_its_topics_partition_and_retained_ones_read_back(
    tmp_path: Path, redis_url: str
) -> None:
    topic = _topic_on(2, "sensors")
    async with Relay(tmp_path, redis_url) as relay:
        # Retained: answered only once the retainer has answered.
        relay.bus.hold(topics.PUBLICATIONS)
        asked_ms = time.time() * 1000
        body = {"topic": topic, "payload": ids.b64u(b"21.5"), "retain": True, "expiry_s": 60}
        publishing = asyncio.create_task(relay.http.post("/v1/publish", json=body))
        await relay.until(lambda: _publications(relay), "the publication")
        [(publication, partition)] = _publications(relay)
        assert isinstance(publication, schemas.Publication)
        assert partition == routing.partition_of_topic(topic, PARTITIONS) == 2
        assert (publication.topic, publication.payload, publication.retain) == (
            topic,
            ids.b64u(b"21.5"),
            True,
        )
        assert (publication.expiry_s, publication.origin, publication.reply_slot) == (
            60,
            INSTANCE,
            relay.slot,
        )
        assert asked_ms <= publication.ts <= publication.deadline_ms - 5000
        done, _ = await asyncio.wait({publishing}, timeout=0.1)
        assert not done
        relay.bus.release(topics.PUBLICATIONS)
        published = await publishing
        assert (published.status_code, published.json()) == (202, {"ts": publication.ts})
        replies = [r for r, _ in relay.bus.on(topics.INGRESS_INBOX)]
        assert [r.status for r in replies if isinstance(r, schemas.DsReply)] == [202]

        found = await relay.http.get("/v1/retained/message", params={"topic": topic})
        assert found.status_code == 200
        assert found.json() == {
            "topic": topic,
            "payload": ids.b64u(b"21.5"),
            "ts": publication.ts,
            "expires_at": publication.ts + 60_000,  # counted from the ts the ingress stamped
        }
        [(read, partition)] = _of(relay, schemas.RetainedRequest)
        assert (read.op, read.topic, partition) == ("read", topic, 2)

        # Not retained: done once sent, nobody answers, nothing kept.
        live = _topic_on(1, "sensors")
        sent = await relay.http.post("/v1/publish", json={"topic": live, "payload": ids.b64u(b"x")})
        assert sent.status_code == 202
        publication, partition = _publications(relay)[-1]
        assert isinstance(publication, schemas.Publication)
        assert (publication.topic, publication.retain, partition) == (live, False, 1)
        assert sent.json() == {"ts": publication.ts}
        missing = await relay.http.get("/v1/retained/message", params={"topic": live})
        assert error(missing) == (404, "NOT_FOUND")
        assert relay.bus.answers(publication.id) == []

        # A filter read asks every partition once, and merges their answers in topic order.
        others = [_topic_on(p, "sensors") for p in (3, 0)]
        for other in others:
            retained = {"topic": other, "payload": ids.b64u(other.encode()), "retain": True}
            assert (await relay.http.post("/v1/publish", json=retained)).status_code == 202
        page = await relay.http.get("/v1/retained", params={"filter": "sensors/#", "limit": 2})
        assert page.status_code == 200
        ordered = sorted([topic, *others])
        assert [m["topic"] for m in page.json()["messages"]] == ordered[:2]
        match = [(r, part) for r, part in _of(relay, schemas.RetainedRequest) if r.op == "match"]
        assert sorted(part for _, part in match) == list(range(PARTITIONS))
        assert {(r.id, r.filter, r.limit, r.after) for r, _ in match} == {
            (match[0][0].id, "sensors/#", 2, None)
        }
        rest = await relay.http.get(
            "/v1/retained",
            params={"filter": "sensors/#", "limit": 2, "cursor": page.json()["cursor"]},
        )
        assert (rest.status_code, rest.json()["cursor"]) == (200, None)
        assert [m["topic"] for m in rest.json()["messages"]] == ordered[2:]

        # An empty retained payload deletes.
        delete = {"topic": topic, "payload": "", "retain": True}
        assert (await relay.http.post("/v1/publish", json=delete)).status_code == 202
        gone = await relay.http.get("/v1/retained/message", params={"topic": topic})
        assert error(gone) == (404, "NOT_FOUND")


async def test_a_refused_publish_or_read_sends_nothing(tmp_path: Path, redis_url: str) -> None:
    good = {"topic": "a/b", "payload": ids.b64u(b"ok")}
    cases: dict[str, tuple[str, str, dict[str, Any], tuple[int, str]]] = {
        "wildcard +": ("POST", "/v1/publish", {"json": {**good, "topic": "a/+"}}, BAD),
        "wildcard #": ("POST", "/v1/publish", {"json": {**good, "topic": "a/#"}}, BAD),
        "empty topic": ("POST", "/v1/publish", {"json": {**good, "topic": ""}}, BAD),
        "payload not base64url": (
            "POST",
            "/v1/publish",
            {"json": {**good, "payload": "a+b/"}},
            BAD,
        ),
        "payload length 1 mod 4": (
            "POST",
            "/v1/publish",
            {"json": {**good, "payload": "abcde"}},
            BAD,
        ),
        "payload one byte over": (
            "POST",
            "/v1/publish",
            {"json": {**good, "payload": ids.b64u(b"x" * 17)}},
            (413, "TOO_LARGE"),
        ),
        "expiry of 0": ("POST", "/v1/publish", {"json": {**good, "expiry_s": 0}}, BAD),
        "extra field": ("POST", "/v1/publish", {"json": {**good, "qos": 1}}, BAD),
        "filter # not last": ("GET", "/v1/retained", {"params": {"filter": "a/#/b"}}, BAD),
        "filter + in a level": ("GET", "/v1/retained", {"params": {"filter": "a+"}}, BAD),
        "limit of 0": ("GET", "/v1/retained", {"params": {"limit": 0}}, BAD),
        "limit over 1000": ("GET", "/v1/retained", {"params": {"limit": 1001}}, BAD),
        "cursor not a topic": (
            "GET",
            "/v1/retained",
            {"params": {"cursor": ids.b64u(b"a/+")}},
            BAD,
        ),
        "read of a wildcard": (
            "GET",
            "/v1/retained/message",
            {"params": {"topic": "a/+"}},
            BAD,
        ),
    }
    async with Relay(tmp_path, redis_url, max_publish_bytes=16, publish_per_s=3) as relay:
        for what, (method, path, kwargs, expected) in cases.items():
            response = await relay.http.request(method, path, **kwargs)
            assert error(response) == expected, (what, response.text)
            assert relay.bus.posted == [], what
        # Over the publish rate: refused before Kafka (the refusals above did not count).
        while True:
            second, before = int(time.time()), len(relay.bus.posted)
            responses = [await relay.http.post("/v1/publish", json=good) for _ in range(4)]
            if int(time.time()) == second:  # all four in one rate window
                break
            await _next_second()  # a fresh window, then again
        assert [r.status_code for r in responses[:3]] == [202, 202, 202]
        assert error(responses[3]) == (429, "RATE_LIMITED")
        assert len(relay.bus.posted) - before == 3


async def _next_second() -> None:
    await asyncio.sleep(1 - time.time() % 1)


async def test_a_durable_stream_batch_is_split_by_owner_and_reads_back(
    tmp_path: Path, redis_url: str
) -> None:
    a, b, c = _topic_on(0, "ds"), _topic_on(2, "ds"), _topic_on(3, "ds")
    batch = [(a, b"a1"), (b, b"b1"), (a, b"a2"), (c, b"c1"), (b, b"b2")]
    async with Relay(tmp_path, redis_url, ds_max_batch_messages=5, max_body_bytes=32) as relay:
        stored = await relay.http.post(
            "/v1/ds/messages/messages",
            json=[
                {"topic": t, "payload": ids.b64u(p), "ts": 1000 + i}
                for i, (t, p) in enumerate(batch)
            ],
        )
        assert (stored.status_code, stored.json()) == (201, {"stored": 5})
        parts = _of(relay, schemas.DsRequest)
        assert [(part, r.op, r.db) for r, part in parts] == [
            (0, "store", "messages"),
            (2, "store", "messages"),
            (3, "store", "messages"),
        ]
        assert [[(m.topic, ids.unb64u(m.payload), m.ts) for m in r.messages] for r, _ in parts] == [
            [(a, b"a1", 1000), (a, b"a2", 1002)],
            [(b, b"b1", 1001), (b, b"b2", 1004)],
            [(c, b"c1", 1003)],
        ]
        assert len({r.id for r, _ in parts}) == 3  # each part answered on its own

        listed = await relay.http.get("/v1/ds/messages/streams", params={"filter": b})
        assert listed.status_code == 200
        streams = [(r, part) for r, part in _of(relay, schemas.DsRequest) if r.op == "streams"]
        assert sorted(part for _, part in streams) == list(range(PARTITIONS))
        [entry] = listed.json()
        # One retainer owns every partition here: its strings name its lowest one.
        owner, _ = routing.parse_address(entry["stream"], PARTITIONS)
        assert owner == 0
        made = await relay.http.post(
            "/v1/ds/messages/iterators", json={"stream": entry["stream"], "filter": b}
        )
        assert made.status_code == 201
        iterator_request, partition = _of(relay, schemas.DsRequest)[-1]
        assert (iterator_request.op, partition) == ("iterator", owner)
        page = await relay.http.get(
            "/v1/ds/messages/next", params={"iterator": made.json()["iterator"], "n": 10}
        )
        assert page.status_code == 200
        messages = page.json()["messages"]
        assert [(m["topic"], ids.unb64u(m["payload"]), m["ts"]) for m in messages] == [
            (b, b"b1", 1001),
            (b, b"b2", 1004),
        ]
        next_request, partition = _of(relay, schemas.DsRequest)[-1]
        assert (next_request.op, next_request.n, partition) == ("next", 10, owner)

        # Refused before anything leaves.
        stream, iterator = entry["stream"], made.json()["iterator"]
        sent = len(relay.bus.posted)
        one = [{"topic": a, "payload": "eA"}]
        refusals: dict[str, tuple[str, str, dict[str, Any], tuple[int, str]]] = {
            "bad db name": ("POST", "/v1/ds/no%20db/messages", {"json": one}, BAD),
            "empty batch": ("POST", "/v1/ds/messages/messages", {"json": []}, BAD),
            "too many messages": (
                "POST",
                "/v1/ds/messages/messages",
                {"json": one * 6},
                (413, "TOO_LARGE"),
            ),
            "payload over the limit": (
                "POST",
                "/v1/ds/messages/messages",
                {"json": [{"topic": a, "payload": ids.b64u(b"x" * 33)}]},
                (413, "TOO_LARGE"),
            ),
            "wildcard topic in a batch": (
                "POST",
                "/v1/ds/messages/messages",
                {"json": [*one, {"topic": "ds/+", "payload": "eA"}]},
                BAD,
            ),
            "payload not base64url": (
                "POST",
                "/v1/ds/messages/messages",
                {"json": [{"topic": a, "payload": "a+b/"}]},
                BAD,
            ),
            "bad filter": ("GET", "/v1/ds/messages/streams", {"params": {"filter": "a/#/b"}}, BAD),
            "stream of no partition": (
                "POST",
                "/v1/ds/messages/iterators",
                {"json": {"stream": f"{PARTITIONS}.{stream.split('.', 1)[1]}", "filter": b}},
                BAD,
            ),
            "stream of another db": (
                "POST",
                "/v1/ds/other/iterators",
                {"json": {"stream": stream, "filter": b}},
                BAD,
            ),
            "damaged iterator": (
                "GET",
                "/v1/ds/messages/next",
                {"params": {"iterator": _damaged(iterator)}},
                BAD,
            ),
            "n of 0": (
                "GET",
                "/v1/ds/messages/next",
                {"params": {"iterator": iterator, "n": 0}},
                BAD,
            ),
        }
        for what, (method, path, kwargs, expected) in refusals.items():
            response = await relay.http.request(method, path, **kwargs)
            assert error(response) == expected, (what, response.text)
            assert len(relay.bus.posted) == sent, what


def _damaged(token: str) -> str:
    middle = len(token) // 2
    return token[:middle] + ("A" if token[middle] != "A" else "B") + token[middle + 1 :]


async def test_topic_frames_tell_every_partition_and_retained_messages_come_first(
    tmp_path: Path, redis_url: str
) -> None:
    kept = _topic_on(1, "room")
    async with Relay(tmp_path, redis_url) as relay:
        retained = {"topic": kept, "payload": ids.b64u(b"old"), "retain": True}
        assert (await relay.http.post("/v1/publish", json=retained)).status_code == 202
        async with WsClient(relay.app) as ws:
            refused = await ws.ask({"id": "bad", "cmd": "SUBSCRIBE", "filter": "room/#/x"})
            assert (refused["id"], refused["ok"], refused["error"]) == ("bad", False, "BAD_REQUEST")
            bad_publish = await ws.ask(
                {"id": "bp", "cmd": "PUBLISH", "topic": "room/+", "payload": "eA"}
            )
            assert (bad_publish["ok"], bad_publish["error"]) == (False, "BAD_REQUEST")
            assert not _of(relay, schemas.TopicSubscription)
            assert len(_publications(relay)) == 1

            assert await ws.ask({"id": 1, "cmd": "SUBSCRIBE", "filter": "room/#"}) == {
                "id": 1,
                "ok": True,
            }
            changes = _of(relay, schemas.TopicSubscription)
            assert sorted(part for _, part in changes) == list(range(PARTITIONS))
            add = changes[0][0]
            assert {r for r, _ in changes} == {add}  # one record, once per partition
            assert (add.op, add.slot, add.filter) == ("add", relay.slot, "room/#")
            assert await ws.receive() == {
                "type": "PUBLISH",
                "topic": kept,
                "payload": ids.b64u(b"old"),
                "ts": (await _retained_ts(relay, kept)),
                "retained": True,
            }

            # A PUBLISH frame: a publication on the topic's partition, then pushed back live.
            live = _topic_on(3, "room")
            await ws.send({"id": 2, "cmd": "PUBLISH", "topic": live, "payload": ids.b64u(b"hi")})
            frames = [await ws.receive(), await ws.receive()]
            publication, partition = _publications(relay)[-1]
            assert isinstance(publication, schemas.Publication)
            assert (publication.topic, publication.retain, partition) == (live, False, 3)
            assert {"id": 2, "ok": True} in frames
            assert {
                "type": "PUBLISH",
                "topic": live,
                "payload": ids.b64u(b"hi"),
                "ts": publication.ts,
                "retained": False,
            } in frames

            assert await ws.ask({"id": 3, "cmd": "UNSUBSCRIBE", "filter": "room/#"}) == {
                "id": 3,
                "ok": True,
            }
            removes = [(r, p) for r, p in _of(relay, schemas.TopicSubscription) if r.op == "remove"]
            assert sorted(part for _, part in removes) == list(range(PARTITIONS))
            assert {(r.slot, r.conn, r.filter) for r, _ in removes} == {
                (relay.slot, add.conn, "room/#")
            }
            # No longer subscribed: a publication is not pushed (its ok is the next frame).
            assert await ws.ask(
                {"id": 4, "cmd": "PUBLISH", "topic": live, "payload": ids.b64u(b"x")}
            ) == {"id": 4, "ok": True}
            await relay.bus.settled(topics.PUBLICATIONS)
            await relay.bus.settled(topics.INGRESS_INBOX)
            # Frames leave in order: a push queued by now would come before this reply.
            assert await ws.ask({"id": 5, "cmd": "UNSUBSCRIBE", "filter": "room/#"}) == {
                "id": 5,
                "ok": True,
            }
            assert ws.pending() == 0


async def _retained_ts(relay: Relay, topic: str) -> int:
    found = await relay.http.get("/v1/retained/message", params={"topic": topic})
    ts: int = found.json()["ts"]
    return ts


async def test_a_retainer_answer_of_another_shape_is_a_503_not_a_half_read_value(
    tmp_path: Path, redis_url: str
) -> None:
    """The retainer's bodies are `relay_bus.schemas` models: the ingress reads each back as the
    model of what it asked and answers 503 for any other shape (a build mismatch)."""
    answers: list[dict[str, Any] | None] = []

    async with Relay(tmp_path, redis_url, retainer=False, delivery=False) as relay:

        async def retainer(received: Received) -> None:
            """Answers each request with the next of `answers` on partition 0, none elsewhere."""
            record = received.record
            assert isinstance(record, schemas.DsRequest | schemas.RetainedRequest)
            reply = schemas.DsReply(
                id=record.id,
                origin=record.origin,
                partition=received.partition,
                instance="retainer-x",
                site="s",
                status=200,
                data=answers.pop(0) if received.partition == 0 else None,
            )
            relay.bus.post(topics.INGRESS_INBOX, reply, partition=record.reply_slot)

        relay.bus.subscribe(topics.PUBLICATIONS, retainer)
        topic = _topic_on(0, "shape")

        async def read() -> tuple[int, Any]:
            found = await relay.http.get("/v1/retained/message", params={"topic": topic})
            return found.status_code, found.json()

        answers.append({"topic": topic, "payload": "eA", "ts": 1})  # no expires_at
        status, body = await read()
        assert (status, body["error"]) == (503, "UNAVAILABLE")
        assert body["detail"].startswith(
            "unexpected answer: ds_reply data is not a RetainedMessage"
        )
        answers.append(None)
        assert await read() == (
            503,
            {"error": "UNAVAILABLE", "detail": "the retainer answered without a body"},
        )
        good = {"topic": topic, "payload": "eA", "ts": 1, "expires_at": None}
        answers.append(good)
        assert await read() == (200, good)

        async def streams() -> tuple[int, Any]:
            found = await relay.http.get("/v1/ds/db1/streams", params={"filter": "#"})
            return found.status_code, found.json()

        ranked = {"rank": [0, 1], "stream": "0.x"}
        answers.append({"streams": [{**ranked, "size": 9}]})  # a field too many
        status, body = await streams()
        assert (status, body["error"]) == (503, "UNAVAILABLE")
        assert body["detail"].startswith("unexpected answer: ds_reply data is not a StreamsFound")
        answers.append({"streams": [{"rank": [3, 0], "stream": "0.y"}, ranked]})
        assert await streams() == (200, [ranked, {"rank": [3, 0], "stream": "0.y"}])
        assert answers == []
