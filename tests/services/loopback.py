"""The ingress in process, over a loopback of Relay's bus interface, for in-process tests of its
handlers (Kafka itself is crossed by the suite tests).

`LoopbackBus` records every record handed to the bus (as `RecordingBus` does) and hands each,
in post order, to every handler that subscribed to its topic, with a partition and an offset
per partition, as Kafka hands a record to every consumer group. `Relay` builds the ingress with
`relay_ingress.app.build` (its routers, error handlers, inbox and connections), puts the
loopback in place of the Kafka bus, leases an inbox slot in a real Redis, and wires in the real
peers the ingress talks to, each built as its own app builds it: the queue-writer's command
and admin handlers over stores on `tmp_path`, the retainer's request and export handlers over
stores on `tmp_path` (an export read on a thread), and delivery's pushes and live publications
over the same Redis. A test may leave a peer out
and answer in its place (`LoopbackBus.subscribe`), or hold a topic's records and release them
later. Requests go through real HTTP (`httpx.ASGITransport`) and WebSocket (`WsClient`, the
ASGI WebSocket messages) handling, in this event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from fastapi import FastAPI

from relay_bus import schemas, topics
from relay_bus.config import KafkaSettings
from relay_bus.consumers import Received
from relay_delivery.publications import LivePublications
from relay_delivery.pushes import Pushes
from relay_ingress import app as ingress_app
from relay_ingress.context import Context
from relay_ingress.settings import IngressSettings
from relay_queue_writer.admin import AdminRequests
from relay_queue_writer.commands import Commands
from relay_queue_writer.stores import Stores
from relay_queues import auth, ids
from relay_retainer.ds import DsRequests
from relay_retainer.exports import RetainerExports
from relay_retainer.retained import RetainedHost, RetainedRequests
from relay_retainer.settings import RetainedServiceSettings, StreamSettings
from relay_retainer.streams import StreamHost
from relay_routes import client
from relay_routes.subscriptions import Subscriptions
from relay_routes.topic_subscriptions import TopicSubscriptions
from relay_runtime.readiness import Readiness
from tests.helpers import RecordingBus

PARTITIONS = 4
INBOX_SLOTS = 2
INSTANCE = "ingress-0"
CLIENT = ("127.0.0.1", 40000)

Handler = Callable[[Received], Awaitable[None]]


@dataclass
class _Subscriber:
    handler: Handler
    partitions: frozenset[int] | None
    queue: asyncio.Queue[Received] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None


@dataclass
class LoopbackBus(RecordingBus):
    """Records every record and hands it to the handlers subscribed to its topic."""

    errors: list[BaseException] = field(default_factory=list)
    """What a handler raised (a test fails on any, when its `Relay` closes)."""
    _subscribers: dict[str, list[_Subscriber]] = field(default_factory=dict)
    _offsets: Counter[tuple[str, int]] = field(default_factory=Counter)
    _held: dict[str, list[Received]] = field(default_factory=dict)

    def subscribe(self, topic: str, handler: Handler, partitions: set[int] | None = None) -> None:
        """Hand every later record of `topic` (of `partitions`, default all) to `handler`, one
        at a time, in post order."""
        subscriber = _Subscriber(handler, None if partitions is None else frozenset(partitions))
        subscriber.task = asyncio.create_task(self._consume(subscriber), name=f"loop-{topic}")
        self._subscribers.setdefault(topic, []).append(subscriber)

    async def _consume(self, subscriber: _Subscriber) -> None:
        while True:
            received = await subscriber.queue.get()
            try:
                await subscriber.handler(received)
            except Exception as error:  # a test fails on it at close
                self.errors.append(error)
            finally:
                subscriber.queue.task_done()

    def hold(self, topic: str) -> None:
        """Record `topic`'s records but hand them to nobody until `release`."""
        self._held.setdefault(topic, [])

    def release(self, topic: str) -> None:
        for received in self._held.pop(topic, []):
            self._hand_on(received)

    async def settled(self, topic: str) -> None:
        """Every record of `topic` handed on so far has been handled."""
        for subscriber in self._subscribers.get(topic, []):
            await subscriber.queue.join()

    def _hand_on(self, received: Received) -> None:
        for subscriber in self._subscribers.get(received.topic, []):
            if subscriber.partitions is None or received.partition in subscriber.partitions:
                subscriber.queue.put_nowait(received)

    def post(
        self,
        topic: str,
        record: schemas.Record,
        *,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> None:
        self.send_now(topic, record, key=key, partition=partition)

    async def send(
        self,
        topic: str,
        record: schemas.Record,
        *,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> tuple[int, int]:
        return self.send_now(topic, record, key=key, partition=partition)

    def send_now(
        self, topic: str, record: schemas.Record, *, key: bytes | None, partition: int | None
    ) -> tuple[int, int]:
        part = partition if partition is not None else 0  # a keyed record: one partition here
        super().post(topic, record, partition=part)
        offset = self._offsets[topic, part]
        self._offsets[topic, part] += 1
        # Decoded anew, as a consumer would see it: nobody shares the sender's object.
        received = Received(topic, part, offset, key, schemas.decode(schemas.encode(record)))
        if topic in self._held:
            self._held[topic].append(received)
        else:
            self._hand_on(received)
        return part, offset

    def on(self, topic: str) -> list[tuple[schemas.Record, int]]:
        """Every record sent to `topic`, with its partition, in send order."""
        return [(r, part or 0) for t, r, part in self.posted if t == topic]

    def answers(self, request_id: str) -> list[tuple[schemas.Reply, int]]:
        """The replies to `request_id` (sent to the inbox), with their slots."""
        return [
            (r, part)
            for r, part in self.on(topics.INGRESS_INBOX)
            if isinstance(r, schemas.Reply) and r.id == request_id
        ]

    async def close(self) -> None:
        tasks = [s.task for subs in self._subscribers.values() for s in subs if s.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Recipient:
    """A queue's recipient key: signs REST requests and WebSocket commands as API.md says."""

    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.generate()
        self.public = ids.b64u(self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    def sign(self, text: str) -> str:
        return ids.b64u(self.key.sign(text.encode()))

    def headers(
        self, method: str, path: str, body: bytes = b"", ts: int | None = None
    ) -> dict[str, str]:
        ts = int(time.time()) if ts is None else ts
        return {
            "X-Relay-Timestamp": str(ts),
            "X-Relay-Signature": self.sign(auth.rest_text(method, path, ts, body)),
        }


class WsClient:
    """One WebSocket connection to the app, as the ASGI messages a server would hand it."""

    def __init__(self, app: FastAPI, path: str = "/v1/ws") -> None:
        self.app = app
        self.path = path
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.accepted: dict[str, Any] = {}

    async def __aenter__(self) -> WsClient:
        scope = {
            "type": "websocket",
            "asgi": {"version": "3.0"},
            "scheme": "ws",
            "http_version": "1.1",
            "path": self.path,
            "raw_path": self.path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"relay.test")],
            "client": CLIENT,
            "server": ("relay.test", 80),
            "subprotocols": [],
            "state": {},
        }
        self._task = asyncio.create_task(self.app(scope, self._to_app.get, self._sent))
        await self._to_app.put({"type": "websocket.connect"})
        self.accepted = await self._next()
        return self

    async def _sent(self, message: MutableMapping[str, Any]) -> None:
        await self._from_app.put(dict(message))

    async def __aexit__(self, *_: object) -> None:
        await self._to_app.put({"type": "websocket.disconnect", "code": 1000})
        assert self._task is not None
        await asyncio.wait_for(self._task, 10)

    async def _next(self, timeout_s: float = 10) -> dict[str, Any]:
        return await asyncio.wait_for(self._from_app.get(), timeout_s)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.send_text(json.dumps(frame))

    async def send_text(self, text: str) -> None:
        await self._to_app.put({"type": "websocket.receive", "text": text})

    async def send_bytes(self, data: bytes) -> None:
        await self._to_app.put({"type": "websocket.receive", "bytes": data})

    async def receive(self, timeout_s: float = 10) -> dict[str, Any]:
        message = await self._next(timeout_s)
        assert message["type"] == "websocket.send", message
        frame: dict[str, Any] = json.loads(message["text"])
        return frame

    def pending(self) -> int:
        """Frames sent by the app and not yet received."""
        return self._from_app.qsize()

    async def ask(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send a frame and return the next frame received (its reply, when nothing else is
        pushed meanwhile)."""
        await self.send(frame)
        return await self.receive()


class Relay:
    """The ingress app over a `LoopbackBus`, with the peers asked for."""

    def __init__(
        self,
        root: Path,
        redis_url: str,
        *,
        queue_writer: bool = True,
        retainer: bool = True,
        delivery: bool = True,
        **settings: Any,
    ) -> None:
        self.root = root
        self.redis_url = redis_url
        self.config = IngressSettings(
            instance=INSTANCE,
            redis_url=redis_url,
            kafka=KafkaSettings(partitions=PARTITIONS, inbox_partitions=INBOX_SLOTS),
            **{"request_timeout_s": 5.0, **settings},
        )
        self.app, _ = ingress_app.build(self.config)
        self.bus = LoopbackBus()
        built: Context = self.app.state.context
        built.inbox.bus = self.bus  # type: ignore[assignment]
        built.connections.bus = self.bus  # type: ignore[assignment]
        self.ctx = dataclasses.replace(built, bus=self.bus)  # type: ignore[arg-type]
        self.app.state.context = self.ctx
        self.slot = -1
        self._peers = (queue_writer, retainer, delivery)
        self._closers: list[Callable[[], Awaitable[object]]] = []
        self.commands: Commands | None = None
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app, client=CLIENT),
            base_url="http://relay.test",
        )

    async def __aenter__(self) -> Relay:
        ctx, bus = self.ctx, self.bus
        self._closers.append(ctx.redis.aclose)
        self.slot = await ctx.inbox.lease()
        self._closers.append(ctx.inbox.release)
        await ctx.connections.claim_slot(self.slot)
        bus.subscribe(topics.INGRESS_INBOX, ctx.inbox.handle, {self.slot})
        queue_writer, retainer, delivery = self._peers
        if queue_writer:
            await self._queue_writer()
        if retainer:
            await self._retainer()
        if delivery:
            self._delivery()
        return self

    async def _queue_writer(self) -> None:
        stores = Stores(self.root / "queue-writer", Readiness(), 0, repair=False)
        bus: Any = self.bus
        self.commands = Commands(bus, stores, PARTITIONS, 3600)
        await stores.open()
        self._closers.append(stores.close)
        await self.commands.open()
        self._closers.append(self.commands.close)
        await self.commands.start_offsets(list(range(PARTITIONS)))
        commands = self.commands
        admin = AdminRequests(bus, stores, "queue-writer-0", commands)
        self._closers.append(admin.close)

        async def handle(received: Received) -> None:  # as relay_queue_writer.app wires it
            record = received.record
            if isinstance(record, schemas.AdminRequest):
                await admin.handle(received, record)
            else:
                await commands.handle(received)

        self.bus.subscribe(topics.QUEUE_COMMANDS, handle)

    async def _retainer(self) -> None:
        readiness, owned = Readiness(), list(range(PARTITIONS))
        streams = StreamHost(self.root / "streams", "retainer-0", StreamSettings(), readiness)
        retained_host = RetainedHost(self.root / "retained", RetainedServiceSettings(), readiness)
        bus: Any = self.bus
        ds = DsRequests(bus, streams, "retainer-0", owned, PARTITIONS)
        retained = RetainedRequests(bus, retained_host, "retainer-0", owned, PARTITIONS)
        exports = RetainerExports(  # its stores read on a thread: no fork server in a test
            bus, streams, retained_host, "retainer-0", self.root, owned, reader="thread"
        )
        await streams.open()
        self._closers.append(streams.close)
        await retained_host.open()
        self._closers += [retained_host.close, ds.drain, retained.drain, exports.close]

        async def handle(received: Received) -> None:  # as relay_retainer.app wires it
            record = received.record
            exports.seen(received)
            if isinstance(record, schemas.AdminRequest):
                exports.handle(received, record)
            elif isinstance(record, schemas.DsRequest):
                await ds.handle(received, record)
            elif isinstance(record, schemas.Publication | schemas.RetainedRequest):
                retained.handle(record, received.partition, received.offset)

        self.bus.subscribe(topics.PUBLICATIONS, handle)

    def _delivery(self) -> None:
        redis = client.connect(self.redis_url)
        self._closers.append(redis.aclose)
        bus: Any = self.bus
        pushes = Pushes(bus, Subscriptions(redis), PARTITIONS, "delivery-0")
        self._closers.append(pushes.close)

        async def no_ping(received: Received) -> None:
            raise AssertionError(f"unexpected ping {received.record}")

        self.bus.subscribe(topics.QUEUE_EVENTS, pushes.handler(no_ping))
        live = LivePublications(bus, TopicSubscriptions(redis), INBOX_SLOTS, "delivery-0")
        self.bus.subscribe(topics.PUBLICATIONS, live.handle)

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        await self.bus.close()
        for close in reversed(self._closers):
            await close()
        if exc[0] is None:
            assert self.bus.errors == [], self.bus.errors

    def replicator(self, answer: Callable[[schemas.KvRequest], dict[str, Any]]) -> None:
        """Answer every key-value request in the replicators' place with the `KvReply` fields
        (`status`, `data`, `code`, `detail`) `answer` returns for it."""

        async def replicate(received: Received) -> None:
            record = received.record
            assert isinstance(record, schemas.KvRequest)
            reply = schemas.KvReply(
                id=record.id, origin=record.origin, instance="replicator-x", **answer(record)
            )
            self.bus.post(topics.INGRESS_INBOX, reply, partition=record.reply_slot)

        self.bus.subscribe(topics.REPLICATION, replicate)

    async def until(self, condition: Callable[[], object], what: str) -> None:
        """Wait (at most 10 s) until `condition()` holds."""
        deadline = time.monotonic() + 10
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.005)


def error(response: httpx.Response) -> tuple[int, str]:
    """A refusal's status and code, once its body is the API's error shape exactly."""
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    assert isinstance(body["detail"], str)
    assert body["detail"], body
    return response.status_code, body["error"]
