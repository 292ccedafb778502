"""The retainer's request handlers in process (`relay_retainer.ds`, `relay_retainer.retained`),
built and dispatched as `relay_retainer.app` does: real stream and retained stores on
`tmp_path`, what they hand to Relay's bus recorded (Kafka itself is crossed by the suite tests).
A retained publish is answered only once durable, then readable; an empty payload deletes; a
request past its deadline is dropped unanswered and unapplied; a request id read twice runs
once and is answered per copy; durable-stream writes read back in order through `streams`,
`iterator` and `next`; refused input is a 400-class answer that changes nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from relay_bus import routing, schemas, topics
from relay_bus.consumers import Received
from relay_durable.codec import b64u, unb64u
from relay_retainer.ds import DsRequests
from relay_retainer.retained import RetainedHost, RetainedRequests
from relay_retainer.settings import RetainedServiceSettings, StreamSettings
from relay_retainer.streams import StreamHost
from relay_runtime.readiness import Readiness
from tests.helpers import RecordingBus

PARTITIONS = 4
OWNED = [1, 3]  # retainer 1 of 2
LOWEST, OTHER = OWNED
SLOT = 5
INSTANCE = "retainer-1"
TS = 1_700_000_000_000


def _routing(request_id: str, deadline_s: float = 60) -> dict[str, Any]:
    return {
        "id": request_id,
        "origin": "ingress-0",
        "reply_slot": SLOT,
        "deadline_ms": (time.time() + deadline_s) * 1000,
    }


def _topic_on(partition: int, name: str) -> str:
    """A topic `name/<n>` whose messages live on `partition` (`routing.partition_of_topic`)."""
    for n in range(1000):
        topic = f"{name}/{n}"
        if routing.partition_of_topic(topic, PARTITIONS) == partition:
            return topic
    raise AssertionError(f"no topic under {name} on partition {partition}")


def _publish(
    request_id: str, topic: str, payload: bytes, deadline_s: float = 60, **extra: Any
) -> schemas.Publication:
    fields = {"topic": topic, "payload": b64u(payload), "ts": TS, "retain": True, **extra}
    return schemas.Publication(**_routing(request_id, deadline_s), **fields)


def _retained(
    request_id: str, op: str, deadline_s: float = 60, **fields: Any
) -> schemas.RetainedRequest:
    return schemas.RetainedRequest(**_routing(request_id, deadline_s), op=op, **fields)


def _ds(request_id: str, op: str, deadline_s: float = 60, **fields: Any) -> schemas.DsRequest:
    return schemas.DsRequest(**_routing(request_id, deadline_s), op=op, db="messages", **fields)


def _store(
    request_id: str, messages: Sequence[tuple[str, bytes, int | None]], **kw: Any
) -> schemas.DsRequest:
    ds_messages = tuple(schemas.DsMessage(topic=t, payload=b64u(p), ts=ts) for t, p, ts in messages)
    return _ds(request_id, "store", messages=ds_messages, **kw)


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(300):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Gate:
    """Holds a store's write method in its worker thread until `open()`: while held, nothing
    that method writes is durable yet."""

    def __init__(self, target: object, method: str) -> None:
        self.entered = threading.Event()
        self._opened = threading.Event()
        original = getattr(target, method)

        def held(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            if not self._opened.wait(5):
                raise TimeoutError("gate never opened")
            return original(*args, **kwargs)

        setattr(target, method, held)

    def open(self) -> None:
        self._opened.set()


class Retainer:
    """The retainer's stores and handlers as `relay_retainer.app.build` wires them."""

    def __init__(self, root: Path, bus: RecordingBus, **retained: object) -> None:
        readiness = Readiness()
        settings = StreamSettings(shards=2, max_reply_bytes=1024)
        self.streams = StreamHost(root / "streams", INSTANCE, settings, readiness)
        self.ds = DsRequests(bus, self.streams, INSTANCE, OWNED, PARTITIONS)  # type: ignore[arg-type]
        retained_settings = RetainedServiceSettings.model_validate(retained)
        self.retained_host = RetainedHost(root / "retained", retained_settings, readiness)
        self.retained = RetainedRequests(
            bus,  # type: ignore[arg-type]
            self.retained_host,
            INSTANCE,
            OWNED,
            PARTITIONS,
        )
        self.bus = bus
        self.gates: list[Gate] = []

    async def __aenter__(self) -> Retainer:
        await self.streams.open()
        await self.retained_host.open()
        return self

    async def __aexit__(self, *_: object) -> None:
        for gate in self.gates:  # a failed test leaves no write held
            gate.open()
        await self.ds.drain()
        await self.retained.drain()
        await self.streams.close()
        await self.retained_host.close()

    def gate(self, store: object, method: str) -> Gate:
        self.gates.append(Gate(store, method))
        return self.gates[-1]

    async def handle(self, record: schemas.Record, partition: int, offset: int = 0) -> None:
        """What the retainer's consumer does with a record of `relay.publications`."""
        received = Received(topics.PUBLICATIONS, partition, offset, None, record)
        if isinstance(record, schemas.DsRequest):
            await self.ds.handle(received, record)
        elif isinstance(record, schemas.Publication | schemas.RetainedRequest):
            self.retained.handle(record, received.partition, received.offset)

    async def answers(self, request_id: str, count: int = 1) -> list[schemas.DsReply]:
        """The answers to `request_id` once there are `count`; each went to the asker's slot."""
        await _until(lambda: len(self.bus.ds_replies(request_id)) >= count, f"{request_id}")
        found = self.bus.ds_replies(request_id)
        assert len(found) == count, found
        assert [part for _, part in found] == [SLOT] * count
        return [reply for reply, _ in found]

    async def answer(self, request_id: str) -> schemas.DsReply:
        return (await self.answers(request_id))[0]

    async def ask(self, record: schemas.Record, partition: int) -> schemas.DsReply:
        assert isinstance(record, schemas.DsRequest | schemas.RetainedRequest | schemas.Publication)
        await self.handle(record, partition)
        return await self.answer(record.id)

    async def read(self, topic: str, partition: int) -> schemas.DsReply:
        return await self.ask(
            _retained(f"read-{time.monotonic_ns()}", "read", topic=topic), partition
        )

    async def stream_messages(self, topic: str) -> list[tuple[str, bytes, int]]:
        """Every message of `topic` in the stream store, stream by stream (`next` n=1000)."""
        listed = await self.ask(
            _ds(f"streams-{time.monotonic_ns()}", "streams", filter=topic), LOWEST
        )
        out = []
        for entry in _data(listed, 200)["streams"]:
            partition, inner = routing.parse_address(entry["stream"], PARTITIONS)
            it = await self.ask(
                _ds(f"it-{time.monotonic_ns()}", "iterator", stream=inner, filter=topic), partition
            )
            partition, inner = routing.parse_address(_data(it, 201)["iterator"], PARTITIONS)
            page = await self.ask(
                _ds(f"next-{time.monotonic_ns()}", "next", iterator=inner, n=1000), partition
            )
            out += [_decoded(m) for m in _data(page, 200)["messages"]]
        return out


def _data(reply: schemas.DsReply, status: int) -> dict[str, Any]:
    """The data of an accepted answer of `status`."""
    assert (reply.status, reply.code) == (status, None), reply
    assert reply.data is not None, reply
    return reply.data


def _decoded(message: dict[str, Any]) -> tuple[str, bytes, int]:
    return message["topic"], unb64u(message["payload"]), message["ts"]


async def test_a_retained_publish_is_answered_once_durable_then_readable(tmp_path: Path) -> None:
    bus = RecordingBus()
    topic = _topic_on(LOWEST, "r")
    async with Retainer(tmp_path, bus) as retainer:
        gate = retainer.gate(retainer.retained_host.store, "store_many")
        await retainer.handle(_publish("p", topic, b"hello"), LOWEST)
        await _until(gate.entered.is_set, "the write to start")
        await asyncio.sleep(0.05)  # room for a premature answer to show
        assert bus.ds_replies("p") == []  # the write is not durable yet: no answer
        gate.open()
        reply = await retainer.answer("p")
        assert reply == schemas.DsReply(
            id="p", origin="ingress-0", partition=LOWEST, instance=INSTANCE, site="", status=202
        )
        read = await retainer.read(topic, LOWEST)
        assert (read.status, read.data) == (
            200,
            {"topic": topic, "payload": b64u(b"hello"), "ts": TS, "expires_at": None},
        )
        # A publish that is not retained is neither kept nor answered.
        other = _topic_on(LOWEST, "live")
        await retainer.handle(_publish("live", other, b"x", retain=False), LOWEST)
        assert (await retainer.read(other, LOWEST)).status == 404
        assert bus.ds_replies("live") == []
    async with Retainer(tmp_path, RecordingBus()) as again:
        read = await again.read(topic, LOWEST)
        assert read.data is not None
        assert (read.status, read.data["payload"]) == (200, b64u(b"hello"))


async def test_an_empty_payload_or_an_admin_delete_removes_the_message(tmp_path: Path) -> None:
    bus = RecordingBus()
    first, second = _topic_on(LOWEST, "d"), _topic_on(OTHER, "d")
    async with Retainer(tmp_path, bus) as retainer:
        # Writes of one topic, handed over together, apply in record order: the last one wins.
        for n, payload in enumerate((b"v1", b"v2", b"", b"v3")):
            await retainer.handle(_publish(f"w{n}", first, payload), LOWEST)
        assert [(await retainer.answer(f"w{n}")).status for n in range(4)] == [202] * 4
        read = await retainer.read(first, LOWEST)
        assert read.data is not None
        assert read.data["payload"] == b64u(b"v3")
        assert (await retainer.ask(_publish("empty", first, b""), LOWEST)).status == 202
        gone = await retainer.read(first, LOWEST)
        assert (gone.status, gone.code, gone.data) == (404, "NOT_FOUND", None)

        assert (await retainer.ask(_publish("p2", second, b"x"), OTHER)).status == 202
        size = await retainer.ask(_retained("s1", "size"), LOWEST)
        assert (size.status, size.data) == (200, {"size": 1})
        deleted = await retainer.ask(_retained("del", "delete", topic=second), OTHER)
        assert (deleted.status, deleted.partition, deleted.code) == (204, OTHER, None)
        assert (await retainer.read(second, OTHER)).status == 404
        # 204 whether or not the topic had a message.
        assert (await retainer.ask(_retained("del2", "delete", topic=second), OTHER)).status == 204
        size = await retainer.ask(_retained("s2", "size"), LOWEST)
        assert (size.status, size.data) == (200, {"size": 0})


async def test_a_request_past_its_deadline_is_dropped_unanswered(tmp_path: Path) -> None:
    bus = RecordingBus()
    kept, topic = _topic_on(LOWEST, "kept"), _topic_on(LOWEST, "late")
    async with Retainer(tmp_path, bus) as retainer:
        assert (await retainer.ask(_publish("keep", kept, b"k"), LOWEST)).status == 202
        # Past its deadline when read: dropped at once.
        await retainer.handle(_publish("late-pub", topic, b"x", deadline_s=-1), LOWEST)
        await retainer.handle(_retained("late-del", "delete", deadline_s=-1, topic=kept), LOWEST)
        await retainer.handle(_store("late-store", [(topic, b"x", None)], deadline_s=-1), LOWEST)
        await retainer.handle(_retained("late-read", "read", deadline_s=-1, topic=kept), LOWEST)
        # Writes after them, through the same writers: once these are durable, so would those be.
        sync = _topic_on(LOWEST, "sync")
        assert (await retainer.ask(_publish("sync", sync, b"s"), LOWEST)).status == 202
        assert (
            await retainer.ask(_store("sync-store", [(sync, b"s", None)]), LOWEST)
        ).status == 201
        read = await retainer.read(kept, LOWEST)
        assert read.data is not None
        assert read.data["payload"] == b64u(b"k")  # the late delete was not applied
        # Past its deadline by the time the writer takes it: dropped unapplied.
        retained_gate = retainer.gate(retainer.retained_host.store, "store_many")
        streams_gate = retainer.gate(retainer.streams.store, "store_batch")
        await retainer.handle(_publish("first", kept, b"k2"), LOWEST)
        await retainer.handle(_store("first-store", [(kept, b"k", None)]), LOWEST)
        await _until(retained_gate.entered.is_set, "the retained write to start")
        await _until(streams_gate.entered.is_set, "the stream write to start")
        waiting = _publish("waiting", topic, b"x", deadline_s=0.1)
        waiting_store = _store("waiting-store", [(topic, b"x", None)], deadline_s=0.1)
        await retainer.handle(waiting, LOWEST)
        await retainer.handle(waiting_store, LOWEST)
        await _until(lambda: waiting.expired() and waiting_store.expired(), "the deadlines")
        retained_gate.open()
        streams_gate.open()
        assert (await retainer.answer("first")).status == 202
        assert (await retainer.answer("first-store")).status == 201
        # Later writes go through the same writers, after the dropped ones.
        assert (await retainer.ask(_publish("after", sync, b"s2"), LOWEST)).status == 202
        assert (
            await retainer.ask(_store("after-store", [(sync, b"s", None)]), LOWEST)
        ).status == 201
        assert (await retainer.read(topic, LOWEST)).status == 404
        assert await retainer.stream_messages(topic) == []
        read = await retainer.read(kept, LOWEST)
        assert read.data is not None
        assert read.data["payload"] == b64u(b"k2")
        for dropped in (
            "late-pub",
            "late-del",
            "late-store",
            "late-read",
            "waiting",
            "waiting-store",
        ):
            assert bus.ds_replies(dropped) == [], dropped


async def test_a_request_id_read_twice_runs_once_and_is_answered_per_copy(tmp_path: Path) -> None:
    bus = RecordingBus()
    topic = _topic_on(LOWEST, "s")
    low, high = _topic_on(LOWEST, "m"), _topic_on(OTHER, "m")
    async with Retainer(tmp_path, bus) as retainer:
        store = _store("s", [(topic, b"one", TS), (topic, b"two", TS + 1)])
        await retainer.handle(store, LOWEST, offset=7)
        assert (await retainer.answer("s")).data == {"stored": 2}
        # The same record read again (decoded anew, as the consumer hands it over).
        await retainer.handle(store.model_copy(), LOWEST, offset=7)
        again = await retainer.answers("s", 2)
        assert again[0] == again[1]
        assert (again[1].status, again[1].data) == (201, {"stored": 2})
        assert await retainer.stream_messages(topic) == [
            (topic, b"one", TS),
            (topic, b"two", TS + 1),
        ]

        # A copy of an older retained publish, read again after a newer one, changes nothing.
        kept = _topic_on(LOWEST, "kept")
        older = _publish("older", kept, b"old")
        assert (await retainer.ask(older, LOWEST)).status == 202
        assert (await retainer.ask(_publish("newer", kept, b"new"), LOWEST)).status == 202
        await retainer.handle(older.model_copy(), LOWEST)
        first, copy = await retainer.answers("older", 2)
        assert first == copy
        assert _data(await retainer.read(kept, LOWEST), 200)["payload"] == b64u(b"new")

        # A match goes to every partition: one run, one answer per partition, data on the lowest.
        for name, t in (("p-low", low), ("p-high", high)):
            part = LOWEST if t == low else OTHER
            assert (await retainer.ask(_publish(name, t, b"m"), part)).status == 202
        match = _retained("m", "match", filter="m/#", limit=100)
        await retainer.handle(match, OTHER)
        await retainer.handle(match.model_copy(), LOWEST)
        by_partition = {r.partition: r for r in await retainer.answers("m", 2)}
        on_other, on_lowest = by_partition[OTHER], by_partition[LOWEST]
        assert (on_other.partition, on_other.status, on_other.data) == (OTHER, 200, None)
        matched = _data(on_lowest, 200)["messages"]
        assert sorted(m["topic"] for m in matched) == sorted([low, high])
        # The same id again after a new retained message: the first run's answer.
        newer = _topic_on(LOWEST, "m/new")
        assert (await retainer.ask(_publish("p-new", newer, b"m"), LOWEST)).status == 202
        await retainer.handle(match.model_copy(), LOWEST)
        assert (await retainer.answers("m", 3))[2] == on_lowest
        fresh = await retainer.ask(_retained("m2", "match", filter="m/#", limit=100), LOWEST)
        assert fresh.data is not None
        assert sorted(m["topic"] for m in fresh.data["messages"]) == sorted([low, high, newer])


async def test_stored_messages_read_back_in_order_through_streams_iterator_next(
    tmp_path: Path,
) -> None:
    bus = RecordingBus()
    topic, elsewhere = _topic_on(LOWEST, "ds"), _topic_on(OTHER, "ds")
    async with Retainer(tmp_path, bus) as retainer:
        first = [(topic, f"m{i}".encode(), TS + i) for i in range(3)]
        later = [(topic, b"p" * 600, TS + 10 + i) for i in range(4)]
        assert (await retainer.ask(_store("a", first), LOWEST)).data == {"stored": 3}
        assert (await retainer.ask(_store("b", later), LOWEST)).data == {"stored": 4}
        assert (await retainer.ask(_store("c", [(elsewhere, b"e", TS)]), OTHER)).status == 201

        # `streams` goes to every partition: the list travels once, with the lowest one.
        listing = _ds("streams", "streams", filter=topic)
        await retainer.handle(listing, OTHER)
        await retainer.handle(listing, LOWEST)
        by_partition = {r.partition: r for r in await retainer.answers("streams", 2)}
        on_other, on_lowest = by_partition[OTHER], by_partition[LOWEST]
        assert (on_other.status, on_other.data, on_other.parts) == (200, None, 1)
        assert on_lowest.site == retainer.streams.store.this_site() != ""
        streams = _data(on_lowest, 200)["streams"]
        assert streams
        for entry in streams:
            assert routing.parse_address(entry["stream"], PARTITIONS)[0] == LOWEST
            assert entry["rank"][0] // routing.SHARD_SPAN == LOWEST  # global shard ids

        iterators: list[str] = []
        for entry in streams:
            _, stream = routing.parse_address(entry["stream"], PARTITIONS)
            made = await retainer.ask(
                _ds(f"it{len(iterators)}", "iterator", stream=stream, filter=topic), LOWEST
            )
            iterators.append(_data(made, 201)["iterator"])
        pages: list[list[tuple[str, bytes, int]]] = []
        for first_iterator in iterators:
            it = first_iterator
            while True:
                partition, inner = routing.parse_address(it, PARTITIONS)
                assert partition == LOWEST
                page = await retainer.ask(
                    _ds(f"n{len(pages)}", "next", iterator=inner, n=4), partition
                )
                data = _data(page, 200)
                assert data["end_of_stream"] is False
                it = data["iterator"]
                pages.append([_decoded(m) for m in data["messages"]])
                if not pages[-1]:
                    break
        # 4 at most per `next`, and an answer stops at the message reaching 1,024 bytes.
        assert [len(p) for p in pages if p] == [4, 2, 1]
        assert [m for p in pages for m in p] == first + later


async def test_refused_input_is_answered_4xx_and_changes_nothing(tmp_path: Path) -> None:
    bus = RecordingBus()
    topic = _topic_on(LOWEST, "bad")
    async with Retainer(tmp_path, bus, max_payload_bytes=8, max_retained=3) as retainer:
        assert (await retainer.ask(_store("ok", [(topic, b"x", TS)]), LOWEST)).status == 201
        listed = await retainer.ask(_ds("l", "streams", filter=topic), LOWEST)
        assert listed.data is not None
        _, stream = routing.parse_address(listed.data["streams"][0]["stream"], PARTITIONS)
        made = await retainer.ask(_ds("i", "iterator", stream=stream, filter=topic), LOWEST)
        assert made.data is not None
        _, iterator = routing.parse_address(made.data["iterator"], PARTITIONS)

        def damaged(token: str) -> str:
            middle = len(token) // 2
            return token[:middle] + ("A" if token[middle] != "A" else "B") + token[middle + 1 :]

        refused = {
            "damaged stream": _ds("r1", "iterator", stream=damaged(stream), filter=topic),
            "damaged iterator": _ds("r2", "next", iterator=damaged(iterator), n=10),
            "n of 0": _ds("r3", "next", iterator=iterator, n=0),
            "topic of another partition": _store(
                "r4", [(topic, b"good", TS + 1), (_topic_on(OTHER, "bad"), b"x", TS + 1)]
            ),
            "wildcard topic": _store("r5", [(topic, b"good", TS + 1), ("bad/+", b"x", TS)]),
            "not base64url": _ds(
                "r6", "store", messages=(schemas.DsMessage(topic=topic, payload="a+b/"),)
            ),
        }
        for what, request in refused.items():
            answer = await retainer.ask(request, LOWEST)
            assert (answer.status, answer.code, answer.data) == (400, "BAD_REQUEST", None), what
            assert answer.detail, what
        missing = await retainer.ask(
            _store("r7", [(topic, b"x", TS)]).model_copy(update={"db": "nodb"}), LOWEST
        )
        assert (missing.status, missing.code) == (404, "NOT_FOUND")
        assert await retainer.stream_messages(topic) == [(topic, b"x", TS)]

        # Retained writes handed over together: the refused ones fail alone.
        writes = {
            "good": _publish("g1", _topic_on(LOWEST, "g/1"), b"ok"),
            "over max_payload_bytes": _publish("b1", _topic_on(LOWEST, "g/2"), b"x" * 9),
            "wildcard topic": _publish("b2", "g/#", b"x"),
            "topic of another partition": _publish("b4", _topic_on(OTHER, "g/4"), b"x"),
            "also good": _publish("g2", _topic_on(LOWEST, "g/3"), b"ok"),
        }
        bad_payload = writes["good"].model_copy(update={"id": "b3", "payload": "a+b/"})
        for record in (*writes.values(), bad_payload):
            await retainer.handle(record, LOWEST)
        statuses = [(await retainer.answer(r.id)).status for r in (*writes.values(), bad_payload)]
        assert statuses == [202, 400, 400, 400, 202, 400]
        assert (await retainer.read(_topic_on(OTHER, "g/4"), OTHER)).status == 404
        for bad_read in (
            _retained("f1", "match", filter="g/+/#/x", limit=10),
            _retained("f2", "match", filter="g/#", limit=0),
            _retained("f3", "read", topic="g/+"),
        ):
            refusal = await retainer.ask(bad_read, LOWEST)
            assert (refusal.status, refusal.code) == (400, "BAD_REQUEST"), bad_read
        # Full: a new topic is refused with QUOTA, a retained topic still updates.
        assert (
            await retainer.ask(_publish("g3", _topic_on(LOWEST, "q/1"), b"ok"), LOWEST)
        ).status == 202
        full = await retainer.ask(_publish("q", _topic_on(LOWEST, "q/2"), b"ok"), LOWEST)
        assert (full.status, full.code) == (429, "QUOTA")
        assert (
            await retainer.ask(_publish("u", writes["good"].topic, b"new"), LOWEST)
        ).status == 202
        size = await retainer.ask(_retained("size", "size"), LOWEST)
        assert size.data == {"size": 3}
