"""This instance's WebSocket connections: limits, subscriptions, and the frames pushed to them.

Invariants:
- a queue subscription is written to the Redis registry only once the queue-writer accepted
  its SUB (signature verified), with the SUB's order, and delivery is then told it is
  registered (`registered`, for an instance that took the partition over meanwhile); a refused
  SUB leaves Redis and the connection's subscriptions as they were;
- a connection gets a queue's MSG frames only while it holds the queue's subscription, and
  never before the `ok` of its SUB (frames arriving earlier wait for it, and are dropped if the
  SUB fails);
- a MSG for the message this connection has just acknowledged is dropped (a late push from a
  delivery instance that lost its partition), so nothing acknowledged is shown again;
- frames to one connection are written one at a time, in the order they were queued;
- connections per client address and frames per second per connection are bounded; the
  subscriptions of a closed connection are removed from Redis (if still its own) and delivery
  is told;
- a live publication reaches a connection once however many of its filters match, and not
  before the retained messages of a filter it matches have been pushed (it waits for them);
  every topic filter change is written to Redis before delivery is told, on every partition
  of `relay.publications`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import structlog
from starlette.websockets import WebSocket, WebSocketState

from relay_bus import schemas, topics
from relay_bus.bus import Bus
from relay_ingress.checks import JsonLimits
from relay_queues import delivery, ids
from relay_routes import limits as rate_limits
from relay_routes.subscriptions import Subscriptions
from relay_routes.topic_subscriptions import TopicSubscriptions
from relay_topics import rules as topic_rules

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Limits:
    connections_per_address: int
    frames_per_s: float
    frame_burst: int
    max_frame_bytes: int
    commands_in_flight: int
    max_outbound_frames: int
    max_subscriptions: int
    max_topic_filters: int
    json: JsonLimits
    """Bounds of a frame's JSON (`checks.parse_json`)."""
    idle_unsubscribed_s: float
    """A connection holding no subscription is closed (1001) after this long without a frame
    from its client; 0: never."""


@dataclass
class Subscription:
    ready: bool = False
    """The SUB's `ok` has been sent; before that, frames wait in `waiting`."""
    waiting: list[dict[str, Any]] = field(default_factory=list)
    last_acked: str | None = None
    acks: int = 0
    """ACKs of this queue in flight: frames wait in `waiting` meanwhile, so the next MSG comes
    after the ACK's `ok` (API.md), although the two travel different ways."""
    since: int = 0
    """The SUB's order at the queue-writer, as the registry holds it."""


@dataclass
class TopicFilter:
    levels: topic_rules.Levels
    ready: bool = False
    """Its retained messages have been pushed; before that, live ones wait in `waiting`."""
    waiting: list[dict[str, Any]] = field(default_factory=list)


class Connection:
    def __init__(self, ws: WebSocket, address: str, limits: Limits) -> None:
        self.id = secrets.token_urlsafe(12)
        self.ws = ws
        self.address = address
        self.bucket = rate_limits.Bucket(limits.frames_per_s, limits.frame_burst)
        self.commands = asyncio.Semaphore(limits.commands_in_flight)
        self.subscriptions: dict[str, Subscription] = {}
        self.filters: dict[str, TopicFilter] = {}
        self.limits = limits
        self.session: str | None = None
        """The session id its HELLO drew (`relay_queues.auth.new_session`), None before."""
        self.overflowed = False
        """Set once more than `max_outbound_frames` waited: the connection is being closed."""
        self._closing: asyncio.Task[None] | None = None
        self._out: deque[dict[str, Any]] = deque()
        self._writer: asyncio.Task[None] | None = None
        """Runs while frames wait (an idle connection has none: it costs no task)."""
        self._written: asyncio.Event | None = None
        """Set after each frame taken (or when the writer stops); made by `backlog_below`."""
        self._stopped = False
        """A write failed or the connection closed: nothing more is written."""

    def queue_frame(self, frame: dict[str, Any]) -> None:
        """Queue a frame for the writer; past `max_outbound_frames` waiting, drop them all and
        close the connection (1008): a reader that slow would hold memory without end."""
        if self.overflowed or self._stopped:
            return
        if len(self._out) >= self.limits.max_outbound_frames:
            self.overflowed = True
            log.warning("ws_slow_reader_closed", waiting=len(self._out))
            if self._writer is not None:
                self._writer.cancel()  # it may be stuck on a write the client never reads
            self._out.clear()
            self._closing = asyncio.create_task(self._close_slow(), name=f"ws-{self.id}-close")
            return
        self._out.append(frame)
        if self._writer is None:
            self._writer = asyncio.create_task(self._write(), name=f"ws-{self.id}")

    async def _close_slow(self) -> None:
        """Tell the client why: the close frame goes out once the client reads what its socket
        already holds (until then the connection keeps only the transport's bounded buffer,
        and its frames are ignored); a client gone meanwhile ends it too."""
        with contextlib.suppress(Exception):
            await self.ws.close(code=1008, reason="slow reader: too many frames waiting")

    def release(self, held: Subscription | TopicFilter | None) -> None:
        """Mark `held` ready and send the frames that waited for it (once)."""
        if held is not None and not held.ready:
            held.ready = True
            for frame in held.waiting:
                self.queue_frame(frame)
            held.waiting.clear()

    async def backlog_below(self, frames: int) -> None:
        """Wait until fewer than `frames` frames wait to be written (back-pressure for long
        retained streams: a slow reader holds one page, not all of them)."""
        while len(self._out) >= frames and self._writer is not None:
            if self._written is None:
                self._written = asyncio.Event()
            self._written.clear()
            await self._written.wait()

    async def _write(self) -> None:
        """Write the waiting frames in order, then end (the next frame starts a new writer;
        there is never more than one)."""
        try:
            while self._out:
                frame = self._out.popleft()
                if self._written is not None:
                    self._written.set()
                if self.ws.application_state is not WebSocketState.CONNECTED:
                    continue
                try:
                    await self.ws.send_text(json.dumps(frame, separators=(",", ":")))
                except Exception as error:
                    log.debug("ws_write_failed", error=str(error))
                    self._stopped = True
                    self._out.clear()
                    return
        finally:
            self._writer = None
            if self._written is not None:
                self._written.set()

    async def close_writer(self) -> None:
        """Let the writer finish the frames already queued; nothing queued later is written."""
        self._stopped = True
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        if self._closing is not None:
            await asyncio.gather(self._closing, return_exceptions=True)


class Connections:
    def __init__(
        self,
        bus: Bus,
        subscriptions: Subscriptions,
        partitions: int,
        limits: Limits,
        topic_subscriptions: TopicSubscriptions,
    ) -> None:
        self.bus = bus
        self.subscriptions = subscriptions
        self.topic_subscriptions = topic_subscriptions
        self.partitions = partitions
        self.limits = limits
        self.slot: int | None = None
        self._stale_dropped = False
        self._open: dict[str, Connection] = {}
        self._per_address: Counter[str] = Counter()

    def open(self, ws: WebSocket, address: str) -> Connection | None:
        """A new connection, or None when `address` already has its maximum."""
        if self._per_address[address] >= self.limits.connections_per_address:
            return None
        self._per_address[address] += 1
        conn = Connection(ws, address, self.limits)
        self._open[conn.id] = conn
        return conn

    async def close(self, conn: Connection) -> None:
        self._open.pop(conn.id, None)
        self._per_address[conn.address] -= 1
        if self._per_address[conn.address] <= 0:
            del self._per_address[conn.address]
        for queue in list(conn.subscriptions):
            await self.unsubscribe(conn, queue)
        for topic_filter in list(conn.filters):
            await self.unsubscribe_topic(conn, topic_filter)
        await conn.close_writer()

    async def close_all(self, per_s: float, within_s: float) -> int:
        """Close every open WebSocket (1012: reconnect elsewhere), at most `per_s` a second, or
        as fast as ending within `within_s` needs; returns how many were closed. Each
        connection's own handler then releases what it held, as on any disconnect."""
        open_now = list(self._open.values())
        if not open_now:
            return 0
        rate = max(per_s, len(open_now) / within_s) if within_s > 0 else float("inf")
        started = asyncio.get_running_loop().time()
        for n, conn in enumerate(open_now):
            due = started + n / rate
            delay = due - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)
            with contextlib.suppress(Exception):
                await conn.ws.close(code=1012, reason="server restarting: reconnect")
        log.info("ws_closed_for_shutdown", connections=len(open_now), per_s=round(rate, 1))
        return len(open_now)

    # -- subscriptions ---------------------------------------------------------------------

    def partition(self, queue: str) -> int:
        return ids.partition_of(queue, self.partitions)

    def subscribing(self, conn: Connection, queue: str) -> Subscription | None:
        """Before the SUB command: route the queue's frames to `conn` (held until `ready`);
        nothing is written to Redis yet (`accepted` does). Returns the subscription `conn`
        held already, for `refused`."""
        held = conn.subscriptions.get(queue)
        conn.subscriptions[queue] = Subscription()
        return held

    async def accepted(self, conn: Connection, queue: str, since: int) -> None:
        """The queue-writer accepted the SUB (order `since`): record it in the registry, then
        tell delivery it is recorded. Raises RedisError when Redis does not answer (the caller
        undoes the SUB with `refused`)."""
        assert self.slot is not None
        subscription = conn.subscriptions.get(queue)
        if subscription is not None:
            subscription.since = since
        partition = self.partition(queue)
        await self.subscriptions.claim(partition, queue, self.slot, conn.id, since)
        notice = schemas.QueueEvent(
            event="registered", queue=queue, slot=self.slot, conn=conn.id, since=since
        )
        self.bus.post(topics.QUEUE_EVENTS, notice, partition=partition)

    async def refused(self, conn: Connection, queue: str, held: Subscription | None) -> None:
        """The SUB after `subscribing` was refused: undo it. A subscription `conn` held before
        stays (a refused command changes nothing), with the frames that came meanwhile."""
        if held is None:
            await self.unsubscribe(conn, queue)
            return
        attempt = conn.subscriptions.get(queue)
        conn.subscriptions[queue] = held
        if attempt is not None and held.ready:
            for frame in attempt.waiting:
                conn.queue_frame(frame)
        elif attempt is not None:
            held.waiting.extend(attempt.waiting)

    def subscribed(self, conn: Connection, queue: str, reply: dict[str, Any]) -> None:
        """The SUB was accepted: its `ok`, then the frames that came meanwhile."""
        conn.queue_frame(reply)
        conn.release(conn.subscriptions.get(queue))

    async def unsubscribe(
        self, conn: Connection, queue: str, *, tell_delivery: bool = True
    ) -> None:
        if conn.subscriptions.pop(queue, None) is None or self.slot is None:
            return
        partition = self.partition(queue)
        try:
            await self.subscriptions.remove(partition, queue, self.slot, conn.id)
        except Exception as error:
            log.warning("unsubscribe_not_recorded", error=str(error))
        if tell_delivery:
            event = schemas.QueueEvent(
                event="unsubscribed", queue=queue, slot=self.slot, conn=conn.id
            )
            self.bus.post(topics.QUEUE_EVENTS, event, partition=partition)

    def acking(self, conn: Connection, queue: str) -> Subscription | None:
        """Before an ACK command: hold the queue's frames until `answered` (None: `conn` is
        not subscribed to `queue`, nothing to hold)."""
        subscription = conn.subscriptions.get(queue)
        if subscription is not None:
            subscription.acks += 1
        return subscription

    def acked(self, conn: Connection, queue: str, msg_id: str) -> None:
        subscription = conn.subscriptions.get(queue)
        if subscription is not None:
            subscription.last_acked = msg_id

    def answered(self, conn: Connection, held: Subscription) -> None:
        """The ACK `acking` held frames for has queued its reply: send what waited, but a push
        of the message that ACK acknowledged (delivery sent it before the ACK reached it, as
        `deliver` drops on arrival once `last_acked` names it)."""
        held.acks -= 1
        if held.ready and not held.acks:
            for frame in held.waiting:
                if frame["type"] != "MSG" or frame["msg_id"] != held.last_acked:
                    conn.queue_frame(frame)
            held.waiting.clear()

    async def register_all(self) -> None:
        """Write every live subscription to Redis again (after Redis lost them)."""
        if self.slot is None:
            return
        slot = self.slot
        await self.subscriptions.register_all(
            (self.partition(queue), queue, slot, conn.id, subscription.since)
            for conn in self._open.values()
            for queue, subscription in conn.subscriptions.items()
            if subscription.ready
        )
        await self.topic_subscriptions.register_all(
            slot, ((conn.id, f) for conn in self._open.values() for f in conn.filters)
        )

    # -- topic subscriptions -----------------------------------------------------------------

    async def _tell_every_partition(self, change: schemas.TopicSubscription) -> None:
        await asyncio.gather(
            *(
                self.bus.send(topics.PUBLICATIONS, change, partition=p)
                for p in range(self.partitions)
            )
        )

    async def claim_slot(self, slot: int) -> None:
        """This instance took `slot` (before Kafka is up): whatever topic subscriptions an
        earlier holder left are stale; forget them in Redis (`forget_stale` tells delivery)."""
        self.slot = slot
        await self.topic_subscriptions.drop_slot(slot)

    async def forget_stale(self) -> None:
        """Tell delivery to drop the slot's subscriptions, once, before this instance makes
        any: called when the inbox consumer first starts reading."""
        if self.slot is not None and not self._stale_dropped:
            await self._tell_every_partition(
                schemas.TopicSubscription(op="drop_slot", slot=self.slot)
            )
            self._stale_dropped = True

    async def subscribe_topic(
        self, conn: Connection, topic_filter: str, levels: topic_rules.Levels
    ) -> None:
        """Route live publications matching the filter to `conn` (held until `topic_ready`).
        Subscribing again to a filter starts it over (its retained messages come again)."""
        assert self.slot is not None
        conn.filters[topic_filter] = TopicFilter(levels)
        await self.topic_subscriptions.add(self.slot, conn.id, topic_filter)
        change = schemas.TopicSubscription(
            op="add", slot=self.slot, conn=conn.id, filter=topic_filter
        )
        await self._tell_every_partition(change)

    def topic_ready(self, conn: Connection, topic_filter: str) -> None:
        """The filter's retained messages are pushed: send the live ones that waited."""
        conn.release(conn.filters.get(topic_filter))

    async def unsubscribe_topic(self, conn: Connection, topic_filter: str) -> bool:
        """Whether `conn` held the filter."""
        if conn.filters.pop(topic_filter, None) is None or self.slot is None:
            return False
        await self.topic_subscriptions.remove(self.slot, conn.id, topic_filter)
        change = schemas.TopicSubscription(
            op="remove", slot=self.slot, conn=conn.id, filter=topic_filter
        )
        await self._tell_every_partition(change)
        return True

    async def fanout(self, record: schemas.Fanout) -> None:
        frame: dict[str, Any] = {
            "type": "PUBLISH",
            "topic": record.topic,
            "payload": record.payload,
            "ts": record.ts,
            "retained": False,
        }
        levels = topic_rules.levels(record.topic)
        for conn_id in record.conns:
            conn = self._open.get(conn_id)
            if conn is None:
                continue
            matching = [f for f in conn.filters.values() if topic_rules.matches(f.levels, levels)]
            if any(f.ready for f in matching):
                conn.queue_frame(frame)
            elif matching:
                matching[0].waiting.append(frame)

    # -- frames from delivery --------------------------------------------------------------

    async def deliver(self, record: schemas.Deliver) -> None:
        conn = self._open.get(record.conn)
        subscription = conn.subscriptions.get(record.queue) if conn else None
        if conn is None or subscription is None:
            return  # closed, or the queue was taken over since
        if record.frame == "END":
            await self.unsubscribe(conn, record.queue, tell_delivery=False)
            frame: dict[str, Any] = {"type": "END", "queue": record.queue}
        else:
            head = record.head
            if head is None or delivery.acked_already(head, subscription.last_acked):
                return
            frame = {"type": "MSG", "queue": record.queue, **head.frame()}
        if (subscription.ready and not subscription.acks) or record.frame == "END":
            conn.queue_frame(frame)
        else:
            subscription.waiting.append(frame)
