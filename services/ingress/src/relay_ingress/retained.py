"""Topics and retained messages (API.md): publish, the retained reads, and the admin retained
endpoints; `publish` and `retained_pages` are shared with the WebSocket's PUBLISH and SUBSCRIBE.

Routing: a topic lives with the retainer owning `partition_of_topic(topic)`; a publish goes
to that partition, where the retainer keeps it (when retained) and delivery routes it to live
subscribers. Reads of one topic go to its partition; filter reads, pages and sizes ask every
partition and merge the answers in the retained store's topic order (`relay_topics.pages`), so
a cursor (the last topic returned) makes the next page cost what the first one cost.

Invariants:
- nothing reaches Kafka before a request is well-formed (topic, filter, payload base64 and
  size, expiry, cursor) and within the publish rate, so a refused request changes nothing;
- a retained publish is answered only once its retainer says it is durable; a publish that
  is not retained once Kafka has it;
- a page holds each retained topic at most once, in topic order, and paging on with its
  cursor visits every topic retained throughout exactly once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field
from redis.exceptions import RedisError

from relay_bus import routing, schemas
from relay_ingress import asking
from relay_ingress.checks import (
    B64U_PATTERN,
    JSON_INTEGER,
    BoundedJsonRoute,
    StrictBody,
    bad,
    parse_filter,
    parse_topic,
)
from relay_ingress.context import Context
from relay_ingress.deps import Admin, Ctx
from relay_ingress.errors import ApiError, documented
from relay_queues import ids
from relay_routes import limits
from relay_topics import pages
from relay_topics import rules as topic_rules

router = APIRouter(route_class=BoundedJsonRoute, tags=["topics"], responses=documented(400, 503))
admin_router = APIRouter(
    route_class=BoundedJsonRoute,
    prefix="/admin",
    tags=["admin"],
    responses=documented(400, 403, 503),
)

MAX_EXPIRY_S = 2**32 - 1
MAX_LIMIT = 1000
ADMIN_SKIP_CHUNK = 1000
"""Topics per ask while an admin page walks past earlier pages (no cursor given)."""


class NewPublication(StrictBody):
    topic: str = Field(pattern=topic_rules.TOPIC_PATTERN, description="topic name (no wildcards)")
    payload: str = Field(pattern=B64U_PATTERN, description="b64u payload (empty: delete)")
    retain: bool = False
    expiry_s: Annotated[int, Field(ge=1, le=MAX_EXPIRY_S), JSON_INTEGER] | None = None
    """Seconds until the retained message expires (MQTT 5 Message Expiry Interval)."""


class Published(BaseModel):
    ts: int


class RetainedPage(BaseModel):
    messages: list[schemas.RetainedMessage]
    cursor: str | None
    """Pass it back as `cursor` for the next page; null once there is none."""


class PageMeta(BaseModel):
    page: int
    limit: int
    hasnext: bool
    count: int
    """Retained topics (expired ones not yet cleared included)."""
    cursor: str | None = None
    """Addition to API.md: the next page's `cursor` (a page given by cursor costs what page 1
    costs; by number, the walk past the earlier pages)."""


class AdminPage(BaseModel):
    data: list[schemas.RetainedMessage]
    meta: PageMeta


def encode_cursor(topic: str) -> str:
    """A page's cursor: its last topic as base64url (the one codec, through `ids`)."""
    return ids.b64u(topic.encode())


def decode_cursor(text: str) -> str:
    try:
        topic = ids.unb64u(text).decode()
        topic_rules.parse_topic(topic)
    except (ValueError, topic_rules.TopicError):
        raise bad("cursor: not a cursor this API returned") from None
    return topic


async def _rate_limited(ctx: Context, address: str) -> None:
    """At most `publish_per_s` publishes per client address per second, across every ingress
    instance (a Redis counter per address and second)."""
    try:
        count = await limits.count_publish(ctx.redis, address, int(time.time()))
    except RedisError:
        raise ApiError(503, "UNAVAILABLE", "rate limit state unavailable; retry") from None
    if count > ctx.config.publish_per_s:
        raise ApiError(429, "RATE_LIMITED", f"over {ctx.config.publish_per_s} publishes/s")


async def publish(
    ctx: Context,
    address: str,
    topic: str,
    payload: str,
    retain: bool,
    expiry_s: int | None,
) -> int:
    """Check, rate-limit and send one publication; its ts once it is durable (retained) or in
    Kafka (not retained). Raises `ApiError` for what is refused (nothing sent then)."""
    parse_topic(topic)
    try:
        size = len(ids.unb64u(payload))
    except ValueError:
        raise bad("payload: not base64url") from None
    if size > ctx.config.max_publish_bytes:
        raise ApiError(413, "TOO_LARGE", f"payload over {ctx.config.max_publish_bytes} bytes")
    if expiry_s is not None and not 1 <= expiry_s <= MAX_EXPIRY_S:
        raise bad(f"expiry_s: must be in 1..{MAX_EXPIRY_S}")
    await _rate_limited(ctx, address)
    ts = int(schemas.now_ms_())
    partition = routing.partition_of_topic(topic, ctx.config.kafka.partitions)
    fields: dict[str, Any] = {
        "topic": topic,
        "payload": payload,
        "ts": ts,
        "retain": retain,
        "expiry_s": expiry_s,
    }
    if retain:
        await asking.retainer(ctx, partition, schemas.Publication, **fields)
    else:
        await asking.post_publication(ctx, partition, **fields)
    return ts


async def _page(
    ctx: Context, topic_filter: str, after: str | None, limit: int
) -> tuple[list[schemas.RetainedMessage], bool]:
    """Up to `limit` retained messages matching the filter after topic `after`, merged from
    every retainer in topic order, and whether more follow."""
    levels = parse_filter(topic_filter)
    if not topic_rules.is_wildcard(levels):  # one topic: ask its owner only
        if after is not None and not pages.sorts_before(after, topic_filter):
            return [], False
        found = await read_one(ctx, topic_filter)
        return ([] if found is None else [found]), False
    replies = await asking.every_retainer(
        ctx, schemas.RetainedRequest, op="match", filter=topic_filter, after=after, limit=limit
    )
    answers = asking.answers(replies, schemas.RetainedMatch)
    return pages.merge_pages([(a.messages, a.more) for a in answers], limit, _topic_of)


async def _topics_page(
    ctx: Context, after: str | None, limit: int
) -> tuple[list[schemas.RetainedTopic], bool]:
    """`_page` of `#`, topics only (no payloads)."""
    replies = await asking.every_retainer(
        ctx,
        schemas.RetainedRequest,
        op="match",
        filter="#",
        after=after,
        limit=limit,
        keys_only=True,
    )
    answers = asking.answers(replies, schemas.RetainedTopics)
    return pages.merge_pages([(a.messages, a.more) for a in answers], limit, _topic_of)


def _topic_of(message: schemas.RetainedMessage | schemas.RetainedTopic) -> str:
    return message.topic


async def read_one(ctx: Context, topic: str) -> schemas.RetainedMessage | None:
    partition = routing.partition_of_topic(topic, ctx.config.kafka.partitions)
    try:
        reply = await asking.retainer(
            ctx, partition, schemas.RetainedRequest, op="read", topic=topic
        )
    except ApiError as error:
        if error.code == "NOT_FOUND":
            return None
        raise
    return asking.required(reply, schemas.RetainedMessage)


async def retained_pages(
    ctx: Context, topic_filter: str, limit: int = 500
) -> AsyncIterator[list[schemas.RetainedMessage]]:
    """Every retained message matching the filter, page by page, in topic order (the
    WebSocket's SUBSCRIBE): one page in memory at a time."""

    async def fetch(after: str | None, limit: int) -> tuple[list[schemas.RetainedMessage], bool]:
        return await _page(ctx, topic_filter, after, limit)

    async for page in pages.walk(fetch, limit, _topic_of):
        yield page


async def size(ctx: Context) -> int:
    replies = await asking.every_retainer(ctx, schemas.RetainedRequest, op="size")
    return sum(answer.size for answer in asking.answers(replies, schemas.RetainedSize))


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


@router.post(
    "/v1/publish", status_code=202, response_model=Published, responses=documented(413, 429)
)
async def publish_rest(ctx: Ctx, request: Request, body: NewPublication) -> Published:
    """Publish to a topic: 202 once Kafka has it, or, when `retain`, once the retained message
    (or its deletion, for an empty payload) is durable. Over the publish rate: 429
    `RATE_LIMITED`; retained store full: 429 `QUOTA`."""
    ts = await publish(ctx, _address(request), body.topic, body.payload, body.retain, body.expiry_s)
    return Published(ts=ts)


Filter = Annotated[
    str, Query(min_length=1, pattern=topic_rules.FILTER_PATTERN, description="topic filter")
]
Cursor = Annotated[str | None, Query(pattern=B64U_PATTERN, min_length=1, max_length=100_000)]


@router.get("/v1/retained", response_model=RetainedPage)
async def retained(
    ctx: Ctx,
    filter: Filter = "#",
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    cursor: Cursor = None,
) -> RetainedPage:
    """Retained messages matching the filter, in topic order, a page at a time."""
    after = decode_cursor(cursor) if cursor is not None else None
    page, more = await _page(ctx, filter, after, limit)
    next_cursor = encode_cursor(page[-1].topic) if more and page else None
    return RetainedPage(messages=page, cursor=next_cursor)


@router.get(
    "/v1/retained/message", response_model=schemas.RetainedMessage, responses=documented(404)
)
async def retained_message(
    ctx: Ctx,
    topic: Annotated[str, Query(min_length=1, pattern=topic_rules.TOPIC_PATTERN)],
) -> schemas.RetainedMessage:
    parse_topic(topic)
    found = await read_one(ctx, topic)
    if found is None:
        raise ApiError(404, "NOT_FOUND", f"no retained message on {topic!r}")
    return found


@admin_router.get("/retained", response_model=AdminPage)
async def admin_retained(
    ctx: Ctx,
    _: Admin,
    page: Annotated[int, Query(ge=1, le=10_000_000)] = 1,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    cursor: Cursor = None,
) -> AdminPage:
    """Every retained message in topic order, EMQX-style pages. With `cursor` (from the
    previous page's meta) a page costs what page 1 costs; by number alone, the topics of the
    earlier pages are walked first (topics only, no payloads)."""
    after = decode_cursor(cursor) if cursor is not None else None
    if after is None and page > 1:
        after = await _skip(ctx, (page - 1) * limit)
    messages: list[schemas.RetainedMessage] = []
    more = False
    if after is not None or page == 1:
        messages, more = await _page(ctx, "#", after, limit)
    return AdminPage(
        data=messages,
        meta=PageMeta(
            page=page,
            limit=limit,
            hasnext=more,
            count=await size(ctx),
            cursor=encode_cursor(messages[-1].topic) if more and messages else None,
        ),
    )


async def _skip(ctx: Context, count: int) -> str | None:
    """The topic `count` topics into `#` (None when there are fewer)."""

    async def fetch(after: str | None, limit: int) -> tuple[list[schemas.RetainedTopic], bool]:
        return await _topics_page(ctx, after, limit)

    return await pages.skip(fetch, count, ADMIN_SKIP_CHUNK, _topic_of)


@admin_router.get("/retained/size", response_model=schemas.RetainedSize)
async def admin_retained_size(ctx: Ctx, _: Admin) -> schemas.RetainedSize:
    return schemas.RetainedSize(size=await size(ctx))


@admin_router.delete("/retained/message", status_code=204)
async def admin_retained_delete(
    ctx: Ctx,
    _: Admin,
    topic: Annotated[str, Query(min_length=1, pattern=topic_rules.TOPIC_PATTERN)],
) -> Response:
    """Delete a topic's retained message (204 whether or not one was retained), durable when
    answered; ordered with the topic's publications."""
    parse_topic(topic)
    partition = routing.partition_of_topic(topic, ctx.config.kafka.partitions)
    await asking.retainer(ctx, partition, schemas.RetainedRequest, op="delete", topic=topic)
    return Response(status_code=204)
