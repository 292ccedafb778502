"""The Durable streams endpoints of API.md: validate, route to the retainer that owns the data
(`relay_bus.routing`), answer with what it says.

Routing: a topic's messages live with the retainer owning `partition_of_topic(topic)`; a write
is checked and split by partition (`relay_ds.batches`), each part sent to its partition, and
answered 201 once every part is durable. `streams` asks every partition and merges the answers
in rank order (each retainer's ranks and stream strings already name its lowest partition, so
they never collide). Stream and iterator strings are `<partition>.<store token>`: `iterators`
and `next` go to that partition.

Invariants:
- nothing reaches Kafka before the request is well-formed: database name, topics, filters,
  payload base64 and sizes, `n`, `start`, and stream and iterator strings (their partition and
  the store's own checksum), so a 400 changes nothing;
- 201 for a write only once every part's retainer answered that its messages are durable;
- every message reaches Kafka with its `ts`: one the client left out is the ingress's clock
  (as for publications), so a replay of the log gives the store's messages exactly.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Body, Path, Query
from pydantic import Field

from relay_bus import routing, schemas
from relay_ds import batches, tokens
from relay_ds.errors import BadToken, Refused, TooLarge
from relay_ingress import asking
from relay_ingress.checks import (
    B64U_PATTERN,
    JSON_INTEGER,
    BoundedJsonRoute,
    StrictBody,
    bad,
    parse_filter,
)
from relay_ingress.context import Context
from relay_ingress.deps import Ctx
from relay_ingress.errors import ApiError, documented
from relay_topics import rules as topic_rules

router = APIRouter(
    route_class=BoundedJsonRoute,
    prefix="/v1/ds",
    tags=["durable streams"],
    responses=documented(400, 404, 413, 503),
)

MAX_TS_JSON = 2**53 - 1  # ms, ~ year 287,000
"""Largest ts or start taken: integers beyond it lose precision in JSON clients that read
numbers as doubles (the store itself takes up to 2**63 - 1)."""
MAX_NEXT = 1000
"""Most messages one `next` may ask for (an answer may also stop earlier, by size)."""
DbPath = Annotated[str, Path(pattern=tokens.NAME_PATTERN, description="database name")]
Ts = Annotated[int, Field(ge=0, le=MAX_TS_JSON, description="Unix ms"), JSON_INTEGER]


class NewMessage(StrictBody):
    topic: str = Field(pattern=topic_rules.TOPIC_PATTERN, description="topic name (no wildcards)")
    payload: str = Field(pattern=B64U_PATTERN, description="b64u payload")
    ts: Ts | None = None
    """Unix ms; omitted: the ingress's clock when the request arrived (stamped before the
    write reaches Kafka, so the archive holds the ts the store keeps; decision 0012)."""


class NewIterator(StrictBody):
    stream: str = Field(pattern=routing.ADDRESS_PATTERN, description="a stream string")
    filter: str = Field(min_length=1, pattern=topic_rules.FILTER_PATTERN)
    start: Ts = 0


def _addressed(ctx: Context, text: str, what: str) -> tuple[int, str]:
    try:
        return routing.parse_address(text, ctx.config.kafka.partitions)
    except ValueError as error:
        raise bad(f"{what}: {error}") from None


def _stream_token(ctx: Context, db: str, text: str) -> tuple[int, str]:
    partition, inner = _addressed(ctx, text, "stream")
    try:
        stream = tokens.Stream.from_token(inner)
    except BadToken as error:
        raise bad(f"stream: {error}") from None
    if stream.db != db:
        raise bad(f"stream of database {stream.db!r}, not {db!r}")
    return partition, inner


def _iterator_token(ctx: Context, db: str, text: str) -> tuple[int, str]:
    partition, inner = _addressed(ctx, text, "iterator")
    try:
        iterator = tokens.StreamIterator.from_token(inner)
    except BadToken as error:
        raise bad(f"iterator: {error}") from None
    if iterator.stream.db != db:
        raise bad(f"iterator of database {iterator.stream.db!r}, not {db!r}")
    return partition, inner


@router.post("/{db}/messages", status_code=201, response_model=schemas.Stored)
async def store(
    ctx: Ctx, db: DbPath, messages: Annotated[list[NewMessage], Body(min_length=1)]
) -> schemas.Stored:
    """Store a batch; 201 once every message is durable (fsynced at its retainer)."""
    config = ctx.config
    limits = batches.BatchLimits(
        messages=config.ds_max_batch_messages,
        bytes=config.ds_max_batch_bytes,
        payload_bytes=config.max_body_bytes,
    )
    partitions = config.kafka.partitions
    now = int(schemas.now_ms_())
    messages = [m if m.ts is not None else m.model_copy(update={"ts": now}) for m in messages]
    try:
        parts = batches.split(messages, limits, lambda t: routing.partition_of_topic(t, partitions))
    except TooLarge as error:
        raise ApiError(413, "TOO_LARGE", str(error)) from None
    except Refused as error:
        raise bad(str(error)) from None
    await asyncio.gather(
        *(
            asking.retainer(
                ctx, partition, op="store", db=db, messages=[m.model_dump() for m in part]
            )
            for partition, part in parts.items()
        )
    )
    return schemas.Stored(stored=len(messages))


@router.get("/{db}/streams", response_model=list[schemas.RankedStream])
async def streams(
    ctx: Ctx,
    db: DbPath,
    filter: Annotated[
        str, Query(min_length=1, pattern=topic_rules.FILTER_PATTERN, description="topic filter")
    ],
    start: Annotated[int, Query(ge=0, le=MAX_TS_JSON, description="Unix ms")] = 0,
) -> list[schemas.RankedStream]:
    """Streams that may hold messages matching the filter from `start`, from every retainer,
    sorted by rank."""
    parse_filter(filter)
    replies = await asking.every_retainer(ctx, op="streams", db=db, filter=filter, start=start)
    found = [s for part in asking.answers(replies, schemas.StreamsFound) for s in part.streams]
    found.sort(key=lambda ranked: ranked.rank)  # stable: each owner's order within a rank
    return found


@router.post("/{db}/iterators", status_code=201, response_model=schemas.IteratorMade)
async def make_iterator(ctx: Ctx, db: DbPath, new: NewIterator) -> schemas.IteratorMade:
    partition, inner = _stream_token(ctx, db, new.stream)
    parse_filter(new.filter)
    reply = await asking.retainer(
        ctx, partition, op="iterator", db=db, stream=inner, filter=new.filter, start=new.start
    )
    return asking.required(reply, schemas.IteratorMade)


@router.get("/{db}/next", response_model=schemas.NextMessages)
async def next_messages(
    ctx: Ctx,
    db: DbPath,
    iterator: Annotated[str, Query(pattern=routing.ADDRESS_PATTERN, description="an iterator")],
    n: Annotated[int, Query(ge=1, le=MAX_NEXT)] = 100,
) -> schemas.NextMessages:
    """Up to `n` messages after the iterator (fewer when the answer reaches its size limit),
    the iterator to continue from, and whether the stream has ended."""
    partition, inner = _iterator_token(ctx, db, iterator)
    reply = await asking.retainer(ctx, partition, op="next", db=db, iterator=inner, n=n)
    return asking.required(reply, schemas.NextMessages)
