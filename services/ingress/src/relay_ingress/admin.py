"""Admin endpoints (`Authorization: Bearer <RELAY_ADMIN_TOKEN>`).

Invariant: without the configured token, every admin route answers 403 FORBIDDEN and does
nothing; the token is compared in constant time (the guard: `relay_ingress.deps.Admin`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel

from relay_bus import schemas, topics
from relay_ingress import asking
from relay_ingress.checks import BoundedJsonRoute
from relay_ingress.deps import Admin, Ctx
from relay_ingress.errors import ApiError, documented

AnswerT = TypeVar("AnswerT", bound=schemas.AdminAnswer)

router = APIRouter(
    route_class=BoundedJsonRoute,
    prefix="/admin",
    tags=["admin"],
    responses=documented(400, 403, 503),
)


class HopReport(BaseModel):
    service: str
    instance: str
    latency_ms: float
    """From the previous service's send to this service's receipt (includes Kafka)."""
    processing_ms: float
    """Time spent inside this service."""


class PingReport(BaseModel):
    id: str
    total_ms: float
    hops: list[HopReport]


def _report(ping: schemas.Ping, returned_ms: float, origin: str) -> PingReport:
    hops: list[HopReport] = []
    previous_sent = ping.started_ms
    for hop in ping.hops:
        hops.append(
            HopReport(
                service=hop.service,
                instance=hop.instance,
                latency_ms=round(hop.received_ms - previous_sent, 3),
                processing_ms=round(hop.sent_ms - hop.received_ms, 3),
            )
        )
        previous_sent = hop.sent_ms
    hops.append(
        HopReport(
            service="ingress",
            instance=origin,
            latency_ms=round(returned_ms - previous_sent, 3),
            processing_ms=0.0,
        )
    )
    return PingReport(id=ping.id, total_ms=round(returned_ms - ping.started_ms, 3), hops=hops)


@router.get("/ping", response_model=PingReport)
async def ping(
    ctx: Ctx,
    _: Admin,
    timeout_s: Annotated[float | None, Query(ge=1, le=60)] = None,
) -> PingReport:
    """Send a ping through every service (ingress → queue-writer → delivery → retainer →
    replicator → ingress) and report each hop's latency."""
    reply = await asking.ping(ctx, timeout_s or ctx.config.ping_timeout_s)
    return _report(reply, schemas.now_ms_(), ctx.config.instance)


class WriterDump(BaseModel):
    instance: str
    partitions: list[int]
    """The command partitions this queue-writer owns."""
    dump: int
    """N of `store-(N).dump`: the dump started, or the one already running."""
    records: int | None = None
    """With `wait`: queue records in the dump; likewise `bytes`, `pause_ms`, `total_s`."""
    bytes: int | None = None
    pause_ms: float | None = None
    """How long changes waited while the snapshot was taken (seed 001's steps 1-4)."""
    total_s: float | None = None


class DumpReport(BaseModel):
    dump: int
    """N of the dump of the first queue-writer (the owner of partition 0)."""
    writers: list[WriterDump]


def _by_writer(
    replies: list[schemas.AdminReply], model: type[AnswerT]
) -> list[tuple[str, list[int], AnswerT]]:
    """One entry per owner instance, in partition order, with the partitions it owns and its
    result read back as `model` (503 for another shape)."""
    owners: dict[str, tuple[str, list[int], AnswerT]] = {}
    for reply in replies:
        entry = owners.get(reply.instance)
        if entry is None:
            entry = owners[reply.instance] = (reply.instance, [], asking.required(reply, model))
        entry[1].append(reply.partition)
    return list(owners.values())


@router.post(
    "/dump",
    status_code=202,
    response_model=DumpReport,
    response_model_exclude_none=True,
    responses={200: {"model": DumpReport, "description": "with `wait`: the finished dumps"}},
)
async def dump(
    ctx: Ctx,
    _: Admin,
    response: Response,
    wait: bool = False,
    timeout_s: Annotated[float | None, Query(ge=1, le=600)] = None,
) -> DumpReport:
    """Start a store-log dump on every queue-writer now (a dump already running is reported
    instead of starting another). With `wait=true`, answer 200 once every dump is finished."""
    replies = await asking.every_queue_writer(
        ctx,
        lambda routing: schemas.AdminRequest(**routing, op="dump", wait=wait),
        timeout_s or ctx.config.admin_timeout_s,
    )
    model = schemas.DumpFinished if wait else schemas.DumpStarted
    writers = [
        WriterDump(instance=instance, partitions=partitions, **result.model_dump())
        for instance, partitions, result in _by_writer(replies, model)
    ]
    if wait:
        response.status_code = 200
    return DumpReport(dump=writers[0].dump, writers=writers)


class WriterExport(BaseModel):
    instance: str
    partitions: list[int]
    """The command partitions this queue-writer owns (its part's cut covers them)."""
    folder: str
    """Where this owner wrote its part (`queues/<instance>.parquet`, `messages/…`,
    `cut-<instance>.json`), on its own volume."""
    at_ms: int
    """When its cut was taken (wall clock)."""
    offsets: dict[str, int]
    queues: int
    messages: int
    early: int
    """Queues read ahead of the slices because a command was about to change them."""
    longest_ms: float
    """The longest time commands waited for the export (one slice or one early read)."""
    read_s: float
    total_s: float


class RetainerExport(BaseModel):
    instance: str
    partitions: list[int]
    """The publication partitions this retainer owns."""
    folder: str
    """Where it wrote its part (`retained/<instance>.parquet`, `streams/…`,
    `publications-<instance>.json`), on its own volume."""
    at_ms: int
    publications: dict[str, int]
    """Per partition, every record before this offset is in the export."""
    publications_upto: dict[str, int]
    """Per partition, no record at or after this offset is; those between were in flight
    (verify counts them as uncertain)."""
    stores: dict[str, dict[str, int]] = {}
    """Per partition, per store (`retained`, `streams/<db>/<shard>`), the first offset whose
    write the exported store does not hold, read from the marks in its checkpoint: the exact
    cut (`relay_archive.standing`); a store left out (made before marks) has the window."""
    exact: bool = False
    """Every store's position is known: nothing is uncertain."""
    retained: int
    streams: int
    pause_ms: float
    """The longest a write handed over while the export ran waited until durable (writes are
    never held: this is the ordinary round time, plus what the checkpoints cost)."""
    writes_during: int = 0
    """Writes settled while the export ran."""
    before_ms: float = 0.0
    """`pause_ms` of the writes settled in as long a time right before the export: the
    ordinary wait to compare with."""
    total_s: float


class ExportCut(BaseModel):
    epoch: str
    """The broker log's epoch (decision 0003): the offsets are of that log."""
    at_ms: int
    """The latest owner's cut time: verify explains messages expiring before it."""
    queue_commands: dict[str, str]
    """Command partition → `<epoch>:<first offset not applied>` (exact)."""
    publications: dict[str, str]
    """Publication partition → `<epoch>:<offset>`: every record before it is in the export."""
    publications_upto: dict[str, str]
    """Publication partition → `<epoch>:<offset>`: no record at or after it is in the export."""


class ExportReport(BaseModel):
    export: str
    cut: ExportCut
    writers: list[WriterExport]
    retainers: list[RetainerExport]


def _positions(
    owners: list[tuple[str, list[int], AnswerT]],
    key: Callable[[AnswerT], dict[str, int]],
    epoch: str,
) -> dict[str, str]:
    found = {}
    for _, partitions, result in owners:
        for partition in partitions:
            found[partition] = key(result).get(str(partition), 0)
    return {str(p): f"{epoch}:{o}" for p, o in sorted(found.items())}


@router.post("/export", status_code=202, response_model=ExportReport)
async def export(
    ctx: Ctx,
    _: Admin,
    timeout_s: Annotated[float | None, Query(ge=1, le=600)] = None,
) -> ExportReport:
    """Every queue-writer and retainer writes its live state as of its own position in the
    log (the cut) to Parquet, in the layout of `relayctl export`, under its own data dir
    (`exports/<id>/`), without pausing writes; answers once every part is written."""
    wait_s = timeout_s or ctx.config.admin_timeout_s
    writer_replies, retainer_replies = await asyncio.gather(
        asking.every_queue_writer(
            ctx, lambda routing: schemas.AdminRequest(**routing, op="export"), wait_s
        ),
        asking.every_owner(
            ctx,
            topics.PUBLICATIONS,
            lambda routing: schemas.AdminRequest(**routing, op="export"),
            wait_s,
            "retainer",
            "publication",
        ),
    )
    writers = _by_writer(writer_replies, schemas.QueuePart)
    retainers = _by_writer(retainer_replies, schemas.RetainerPart)
    parts = [result for _, _, result in writers] + [result for _, _, result in retainers]
    epochs = {part.epoch for part in parts}
    if len(epochs) != 1:
        raise ApiError(
            503, "UNAVAILABLE", f"the owners' cuts name {len(epochs)} broker epochs; export again"
        )
    epoch = epochs.pop()
    cut = ExportCut(
        epoch=epoch,
        at_ms=max(part.at_ms for part in parts),
        queue_commands=_positions(writers, lambda part: part.offsets, epoch),
        publications=_positions(retainers, lambda part: part.publications, epoch),
        publications_upto=_positions(retainers, lambda part: part.publications_upto, epoch),
    )
    unshown = {"epoch"}  # the cut's, once for all
    return ExportReport(
        export=writer_replies[0].id,
        cut=cut,
        writers=[
            WriterExport(instance=i, partitions=p, **r.model_dump(exclude=unshown))
            for i, p, r in writers
        ],
        retainers=[
            RetainerExport(instance=i, partitions=p, **r.model_dump(exclude=unshown))
            for i, p, r in retainers
        ],
    )


class WriterStats(BaseModel):
    instance: str
    partitions: list[int]
    queues: int
    """Queue records in the store log."""
    messages: int
    """Messages waiting in the queues (quota markers included)."""
    bytes: int
    """Bytes of those messages' records in the message files."""
    open_queues: int
    """Queues with state in memory now."""


class QueueStats(BaseModel):
    writers: list[WriterStats]
    total: dict[str, int]
    """`queues`, `messages`, `bytes`, `open_queues` summed over every queue-writer."""


@router.get("/queues/stats", response_model=QueueStats)
async def queue_stats(
    ctx: Ctx,
    _: Admin,
    timeout_s: Annotated[float | None, Query(ge=1, le=600)] = None,
) -> QueueStats:
    """Queues, messages, bytes and open queues, per queue-writer."""
    replies = await asking.every_queue_writer(
        ctx,
        lambda routing: schemas.AdminRequest(**routing, op="stats"),
        timeout_s or ctx.config.admin_timeout_s,
    )
    writers = [
        WriterStats(instance=instance, partitions=partitions, **result.model_dump())
        for instance, partitions, result in _by_writer(replies, schemas.QueueWriterStats)
    ]
    keys = ("queues", "messages", "bytes", "open_queues")
    total = {key: sum(getattr(writer, key) for writer in writers) for key in keys}
    return QueueStats(writers=writers, total=total)
