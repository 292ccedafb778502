"""`/v1/ws` (API.md WebSocket): SUB and ACK over text frames, MSG and END pushed; SUBSCRIBE,
UNSUBSCRIBE and PUBLISH for topics, PUBLISH frames pushed (retained ones first).

Invariants:
- every client frame gets exactly one reply `{"id", "ok": true}` or `{"id", "ok": false,
  "error", "detail"}` (id null when the frame had none); binary, oversized, malformed, unknown
  and over-rate frames get error replies, never a crash or a closed connection;
- a connection that holds nothing (no queue subscription, no topic filter, no command under
  way) and sends no frame for `RELAY_WS_IDLE_TIMEOUT_S` is closed with 1001; one that holds a
  subscription is never closed for idleness (the pings keep it honest);
- a refused command changes nothing (checks before the queue-writer, signature at it; the
  registry is written only after the queue-writer accepted a SUB);
- an unbound SUB is replay-protected: a signature already used within the timestamp window is
  refused, so a captured SUB cannot take a queue over; a bound SUB or ACK (`"bound": true`) is
  signed over its text and this connection's session id (drawn by HELLO), so it is worthless on
  any other connection and needs no such record: a client may SUB again at once after
  reconnecting. A bound frame before HELLO is BAD_REQUEST (a frame this connection cannot take,
  not a signature judged wrong: AUTH would send the client looking at its key);
- commands of one connection run concurrently (up to a bound), replies carry their ids;
- a SUB's `ok` comes before the queue's first MSG, an ACK's reply before the queue's next MSG
  (API.md), although the reply and the MSG reach this instance by different ways;
- after a SUBSCRIBE's `ok`, every retained message matching its filter is pushed (in topic
  order, one page at a time as the client reads) before any live publication it matches; if
  the retained read fails midway, an `ERROR` frame naming the filter says so and live
  publications follow.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, Any, Literal

import structlog
from fastapi import APIRouter
from pydantic import BaseModel, Field, ValidationError
from redis.exceptions import RedisError
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect

from relay_bus import schemas
from relay_bus.bus import BusUnavailableError
from relay_ingress import asking, retained
from relay_ingress.checks import JsonInt, JsonLimits, StrictBody, parse_filter, parse_json
from relay_ingress.connections import Connection, Connections
from relay_ingress.context import Context
from relay_ingress.deps import Ctx
from relay_ingress.errors import ApiError
from relay_queues import auth, ids
from relay_routes import guards

log = structlog.get_logger(__name__)

router = APIRouter(tags=["websocket"])

QueueId = Annotated[str, Field(min_length=32, max_length=32, pattern=r"^[A-Za-z0-9_-]{32}$")]


class _Command(StrictBody):
    id: str | int | None = None


class Hello(_Command):
    cmd: Literal["HELLO"]


class Sub(_Command):
    cmd: Literal["SUB"]
    queue: QueueId
    ts: JsonInt
    sig: str
    bound: bool = False


class AckCmd(_Command):
    cmd: Literal["ACK"]
    queue: QueueId
    msg_id: QueueId
    ts: JsonInt
    sig: str
    bound: bool = False


TopicFilter = Annotated[str, Field(min_length=1)]


class Subscribe(_Command):
    cmd: Literal["SUBSCRIBE"]
    filter: TopicFilter


class Unsubscribe(_Command):
    cmd: Literal["UNSUBSCRIBE"]
    filter: TopicFilter


class PublishCmd(_Command):
    cmd: Literal["PUBLISH"]
    topic: str = Field(min_length=1)
    payload: str
    retain: bool = False
    expiry_s: JsonInt | None = None


Command = Hello | Sub | AckCmd | Subscribe | Unsubscribe | PublishCmd
COMMANDS = ("HELLO", "SUB", "ACK", "SUBSCRIBE", "UNSUBSCRIBE", "PUBLISH")
RETAINED_BACKLOG = 1000
"""Frames a connection may have waiting before the retained stream waits for the client."""


class _Frame(BaseModel):
    command: Annotated[Command, Field(discriminator="cmd")]


def _error(frame_id: object, code: str, detail: str) -> dict[str, Any]:
    return {"id": frame_id, "ok": False, "error": code, "detail": detail}


def _refusal(error: ApiError | BusUnavailableError) -> tuple[str, str]:
    """The error code and detail of a refused command."""
    if isinstance(error, ApiError):
        return error.code, error.detail
    return "UNAVAILABLE", "Kafka is not answering; retry later"


def _parse(text: str, limits: JsonLimits) -> tuple[object, Command | dict[str, Any]]:
    """The frame's id and its command, or its id and the error reply."""
    try:
        raw = parse_json(text, limits)
    except ValueError:
        return None, _error(None, "BAD_REQUEST", "not JSON")
    except ApiError as error:  # nested too deeply, a number too long
        return None, _error(None, error.code, error.detail)
    if not isinstance(raw, dict):
        return None, _error(None, "BAD_REQUEST", "a frame is one JSON object")
    frame_id = raw.get("id")
    if not isinstance(frame_id, str | int) or isinstance(frame_id, bool):
        frame_id = None
    if raw.get("cmd") not in COMMANDS:
        return frame_id, _error(frame_id, "BAD_REQUEST", f"unknown command {raw.get('cmd')!r}")
    try:
        return frame_id, _Frame(command=raw).command
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"][2:]) or "frame"
        return frame_id, _error(frame_id, "BAD_REQUEST", f"{where}: {first['msg']}")


class Session:
    def __init__(self, ctx: Context, conn: Connection) -> None:
        self.ctx = ctx
        self.conn = conn
        self.connections: Connections = ctx.connections

    async def run(self, command: Command) -> None:
        """Run one command and queue its one reply, whatever happens on the way."""
        try:
            await self._run(command)
        except Exception:
            log.exception("ws_command_failed", cmd=command.cmd)
            self.conn.queue_frame(_error(command.id, "UNAVAILABLE", "internal error; retry"))

    async def _run(self, command: Command) -> None:
        if isinstance(command, Hello):
            if self.conn.session is None:
                self.conn.session = auth.new_session()
            self.conn.queue_frame({"id": command.id, "ok": True, "session": self.conn.session})
            return
        if isinstance(command, Subscribe | Unsubscribe | PublishCmd):
            await self._topic_command(command)
            return
        held = self.connections.acking(self.conn, command.queue) if command.cmd == "ACK" else None
        try:
            try:
                reply = await self._command(command)
            except (ApiError, BusUnavailableError) as error:
                reply = _error(command.id, *_refusal(error))
            except RedisError:
                reply = _error(command.id, "UNAVAILABLE", "routing state unavailable; retry")
            if isinstance(command, Sub) and reply.get("ok"):
                self.connections.subscribed(self.conn, command.queue, reply)
            else:
                self.conn.queue_frame(reply)
        finally:
            if held is not None:
                self.connections.answered(self.conn, held)

    async def _topic_command(self, command: Subscribe | Unsubscribe | PublishCmd) -> None:
        ctx, conn = self.ctx, self.conn
        try:
            if isinstance(command, PublishCmd):
                await retained.publish(
                    ctx,
                    conn.address,
                    command.topic,
                    command.payload,
                    command.retain,
                    command.expiry_s,
                )
            elif isinstance(command, Unsubscribe):
                await self.connections.unsubscribe_topic(conn, command.filter)
            else:
                levels = parse_filter(command.filter)
                limit = conn.limits.max_topic_filters
                if command.filter not in conn.filters and len(conn.filters) >= limit:
                    raise ApiError(429, "QUOTA", f"at most {limit} topic filters per connection")
                await self.connections.subscribe_topic(conn, command.filter, levels)
        except (ApiError, BusUnavailableError) as error:
            if isinstance(command, Subscribe):
                with contextlib.suppress(BusUnavailableError, RedisError):
                    await self.connections.unsubscribe_topic(conn, command.filter)
            conn.queue_frame(_error(command.id, *_refusal(error)))
            return
        except RedisError:
            conn.queue_frame(_error(command.id, "UNAVAILABLE", "routing state unavailable; retry"))
            return
        conn.queue_frame({"id": command.id, "ok": True})
        if isinstance(command, Subscribe):
            await self._push_retained(command.filter)

    async def _push_retained(self, topic_filter: str) -> None:
        conn = self.conn
        try:
            async for page in retained.retained_pages(self.ctx, topic_filter):
                for message in page:
                    conn.queue_frame(
                        {
                            "type": "PUBLISH",
                            "topic": message.topic,
                            "payload": message.payload,
                            "ts": message.ts,
                            "retained": True,
                        }
                    )
                await conn.backlog_below(RETAINED_BACKLOG)
        except ApiError as error:
            conn.queue_frame(
                {
                    "type": "ERROR",
                    "filter": topic_filter,
                    "error": error.code,
                    "detail": f"retained messages incomplete: {error.detail}",
                }
            )
        finally:
            self.connections.topic_ready(conn, topic_filter)

    def _signed(self, command: Sub | AckCmd, text: str) -> str:
        """The text the frame's signature must sign: bound to this connection's session when
        the frame says so (`_command` checked there is one)."""
        if not command.bound:
            return text
        assert self.conn.session is not None
        return auth.bound_text(text, self.conn.session)

    async def _command(self, command: Sub | AckCmd) -> dict[str, Any]:
        if command.bound and self.conn.session is None:
            raise ApiError(
                400, "BAD_REQUEST", "a bound frame needs a HELLO on this connection first"
            )
        try:
            ts = auth.parse_timestamp(command.ts, time.time())
            signature = auth.parse_signature(command.sig)
        except auth.AuthError as error:
            raise ApiError(401, "AUTH", str(error)) from None
        partition = ids.partition_of(command.queue, self.ctx.config.kafka.partitions)
        wait_s = self.ctx.config.request_timeout_s
        if isinstance(command, Sub):
            limit = self.conn.limits.max_subscriptions
            if command.queue not in self.conn.subscriptions and (
                len(self.conn.subscriptions) >= limit
            ):
                raise ApiError(429, "QUOTA", f"at most {limit} queue subscriptions per connection")
            # A bound signature is useless elsewhere: no replay record is needed (or kept).
            if not command.bound and not await guards.first_use(
                self.ctx.redis, signature, 2 * auth.SKEW_S
            ):
                raise ApiError(401, "AUTH", "signature already used")
            held = self.connections.subscribing(self.conn, command.queue)
            try:
                reply = await asking.command(
                    self.ctx,
                    partition,
                    wait_s,
                    schemas.SubscribeQueue,
                    queue=command.queue,
                    signed=self._signed(command, auth.sub_text(command.queue, ts)),
                    sig=command.sig,
                    slot=self.connections.slot,
                    conn=self.conn.id,
                )
                subscribed = asking.answer(reply, schemas.Subscribed)
                await self.connections.accepted(
                    self.conn, command.queue, 0 if subscribed is None else subscribed.since
                )
            except (ApiError, BusUnavailableError, RedisError):
                await self.connections.refused(self.conn, command.queue, held)
                raise
        else:
            await asking.command(
                self.ctx,
                partition,
                wait_s,
                schemas.AckMessage,
                queue=command.queue,
                msg_id=command.msg_id,
                signed=self._signed(command, auth.ack_text(command.queue, command.msg_id, ts)),
                sig=command.sig,
            )
            self.connections.acked(self.conn, command.queue, command.msg_id)
        return {"id": command.id, "ok": True}


IDLE_REASON = "idle: no subscription and no frame"


async def _next_message(
    ws: WebSocket, conn: Connection, running: set[asyncio.Task[None]]
) -> Message | None:
    """The client's next message; None once the connection has sent nothing for
    `idle_unsubscribed_s` while holding nothing (no queue subscription, no topic filter, no
    command under way). A subscriber that only answers pings is waiting for what it
    subscribed to, so it is never idle."""
    idle_s = conn.limits.idle_unsubscribed_s
    if not idle_s:
        return await ws.receive()
    while True:
        try:
            async with asyncio.timeout(idle_s):
                return await ws.receive()
        except TimeoutError:
            if not (conn.subscriptions or conn.filters or running):
                return None


@router.websocket("/v1/ws")
async def websocket(ws: WebSocket, ctx: Ctx) -> None:
    limits = ctx.connections.limits
    address = ws.client.host if ws.client else "unknown"
    conn = ctx.connections.open(ws, address)
    if conn is None:
        await ws.close(code=1013, reason="too many connections from this address")
        return
    await ws.accept()
    session = Session(ctx, conn)
    running: set[asyncio.Task[None]] = set()
    try:
        while True:
            message = await _next_message(ws, conn, running)
            if message is None:
                log.info("ws_idle_closed", idle_s=limits.idle_unsubscribed_s)
                with contextlib.suppress(Exception):  # the client may be gone meanwhile
                    await ws.close(code=1001, reason=IDLE_REASON)
                break
            if message["type"] == "websocket.disconnect":
                break
            if conn.overflowed:
                continue  # being closed for reading too slowly: nothing more is answered
            if not conn.bucket.take():  # every frame counts, whatever it holds
                conn.queue_frame(_error(None, "RATE_LIMITED", "too many frames per second"))
                continue
            text = message.get("text")
            if text is None:
                conn.queue_frame(_error(None, "BAD_REQUEST", "binary frames are not accepted"))
                continue
            if len(text) > limits.max_frame_bytes:
                conn.queue_frame(
                    _error(None, "TOO_LARGE", f"frame over {limits.max_frame_bytes} bytes")
                )
                continue
            _, parsed = _parse(text, limits.json)
            if isinstance(parsed, dict):
                conn.queue_frame(parsed)
                continue
            await conn.commands.acquire()
            task = asyncio.create_task(session.run(parsed))
            running.add(task)
            task.add_done_callback(running.discard)
            task.add_done_callback(lambda _: conn.commands.release())
    except WebSocketDisconnect:
        pass
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        with contextlib.suppress(RedisError, OSError):
            await ctx.connections.close(conn)
