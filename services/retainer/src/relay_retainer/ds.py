"""Durable-stream requests at the retainer (`ds_request` on `relay.publications`): run each
once, answer on the asker's inbox slot (`ds_reply`).

Invariants:
- a request past its deadline is dropped, and so is its answer: the asker has already answered
  503, and requests read again after a restart or a broker log loss must not act late;
- each request id runs once (a record read twice gets the first run's answer), and is answered
  once per partition it arrived on (`relay_bus.once.OncePerId`). Requests for every partition
  (`streams`, `describe`, replica and site changes) carry their data only on the answer for
  this retainer's lowest partition, so the asker gets each retainer's data once; a long stream
  list comes in several parts;
- `store` requests carry only topics of the partition they arrived on (refused otherwise), so a
  topic's messages always live with one retainer;
- the consumer never waits for an operation: answers are sent by tasks;
- with the replicators configured (`relay_retainer.ds_targets`), a replica-set change reads the
  storage's replicated record and applies it rather than the request's copy (the ingress wrote
  the record first); without them, when no replicator answers or when the storage has no
  record, the request's copy is applied as before (a poll puts a record's target back).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

import structlog

from relay_bus import routing, schemas
from relay_bus.bus import Bus
from relay_bus.consumers import Received
from relay_bus.once import OncePerId
from relay_ds import targets
from relay_ds.tokens import MAX_TS
from relay_durable import codec
from relay_durable.outcome import Outcome
from relay_retainer import answers, ds_admin
from relay_retainer.ds_targets import TargetsUnavailable, TargetSync
from relay_retainer.streams import StreamHost
from relay_streams.errors import BadInput
from relay_streams.marks import Mark
from relay_streams.model import Message
from relay_topics import rules as topic_rules

log = structlog.get_logger(__name__)

REMEMBERED = 4096
"""Writes and replica changes whose outcome is kept, so that a record read again (consumer
retry, broker log loss) is answered without being applied twice. Their outcomes are small."""
READS_REMEMBERED = 64
"""Reads whose outcome is kept for the partitions that ask later. Few: a read's outcome may be
hundreds of KiB, and running a read again is harmless."""
READS = frozenset({"streams", "iterator", "next", "describe"})
STREAMS_PER_PART = 1000
"""Streams per reply record (a stream entry is ~100 bytes: well under Kafka's 1 MiB)."""
EVERY_PARTITION = frozenset({"streams", "describe", "set_replicas", "join", "leave", "forget"})


class DsRequests:
    def __init__(
        self,
        bus: Bus,
        host: StreamHost,
        instance: str,
        owned: Sequence[int],
        partitions: int,
        targets: TargetSync | None = None,
    ) -> None:
        self.bus = bus
        self.host = host
        self.instance = instance
        self.owned = list(owned)
        self.partitions = partitions
        self._writes: OncePerId[Outcome] = OncePerId(REMEMBERED, "ds")
        self._reads: OncePerId[Outcome] = OncePerId(READS_REMEMBERED, "ds-read")
        self.targets = targets
        self._admin = asyncio.Lock() if targets is None else targets.lock

    async def handle(self, received: Received, request: schemas.DsRequest) -> None:
        if request.expired():
            return
        requests = self._reads if request.op in READS else self._writes
        requests.handle(
            request.id,
            functools.partial(self._run, request, received.partition, received.offset),
            functools.partial(self._answer, request, received.partition),
        )

    async def _run(self, request: schemas.DsRequest, partition: int, offset: int) -> Outcome:
        return await answers.guarded(
            self._op(request, partition, offset), f"ds {request.op} {request.db}"
        )

    async def _op(self, request: schemas.DsRequest, partition: int, offset: int) -> Outcome:
        op, db = request.op, request.db
        if op == "store":
            messages = self._messages(request, partition)
            mark = Mark(partition, self.bus.epoch or "", offset + 1)
            await self.host.store_batch(db, messages, mark, request.expired)
            return Outcome(201, schemas.Stored(stored=len(messages)).model_dump())
        if op == "streams":
            owner = self.owned[0]
            found = await self.host.get_streams(db, request.filter, request.start)
            streams = [
                schemas.RankedStream(
                    rank=(routing.global_shard(owner, r.rank[0]), r.rank[1]),
                    stream=routing.address(owner, r.stream.token()),
                )
                for r in found
            ]
            return Outcome(200, schemas.StreamsFound(streams=streams).model_dump())
        if op == "iterator":
            it = await self.host.make_iterator(db, request.stream, request.filter, request.start)
            made = schemas.IteratorMade(iterator=routing.address(partition, it.token()))
            return Outcome(201, made.model_dump())
        if op == "next":
            result = await self.host.next(db, request.iterator, request.n)
            answer = schemas.NextMessages(
                messages=[
                    schemas.StoredMessage(topic=m.topic, payload=codec.b64u(m.payload), ts=m.ts)
                    for m in result.messages
                ],
                iterator=routing.address(partition, result.iterator.token()),
                end_of_stream=result.end_of_stream,
            )
            return Outcome(200, answer.model_dump())
        read = await self._read_record(request) if op == "set_replicas" else None
        async with self._admin:
            store, peers = self.host.store, request.peers
            if op == "describe":
                data = await asyncio.to_thread(ds_admin.describe, store, self.instance, self.owned)
                return Outcome(200, data)
            if op == "set_replicas":
                if not await self._from_record(request, read):
                    await asyncio.to_thread(ds_admin.set_replicas, store, db, request.sites, peers)
            elif op == "join":
                await asyncio.to_thread(ds_admin.join, store, db, request.site, peers)
            elif op == "leave":
                await asyncio.to_thread(ds_admin.leave, store, db, request.site)
            else:
                await asyncio.to_thread(ds_admin.forget, store, request.site)
            return Outcome(202)

    async def _read_record(self, request: schemas.DsRequest) -> dict[str, targets.Read] | None:
        """The storage's replicated record as read now (outside the admin lock); None when
        there is no replicator to read or none answered."""
        if self.targets is None:
            return None
        try:
            return await self.targets.read([request.db])
        except TargetsUnavailable as error:
            log.warning("ds_target_record_unread", db=request.db, error=str(error))
            return None

    async def _from_record(
        self, request: schemas.DsRequest, read: dict[str, targets.Read] | None
    ) -> bool:
        """Apply the storage's record instead of the request's copy (the caller holds the
        admin lock); False when it was not read or the storage has no record (an asker that
        writes no records): the caller applies the copy."""
        if self.targets is None or read is None:
            return False
        store, db = self.host.store, request.db
        await asyncio.to_thread(ds_admin.register, store, db, request.peers)
        return db in await self.targets.apply(read)

    def _messages(
        self, request: schemas.DsRequest, partition: int
    ) -> list[Message | tuple[str, bytes]]:
        """The request's messages, each checked, so that one request's bad message cannot
        refuse the batch it shares with others."""
        out: list[Message | tuple[str, bytes]] = []
        for i, m in enumerate(request.messages):
            try:
                topic_rules.parse_topic(m.topic)
            except topic_rules.TopicError as error:
                raise BadInput(f"message {i}: {error}") from None
            owner = routing.partition_of_topic(m.topic, self.partitions)
            if owner != partition:
                raise BadInput(f"message {i}: topic belongs to partition {owner}, not {partition}")
            payload = answers.payload(m.payload)
            if m.ts is None:
                out.append((m.topic, payload))
            elif 0 <= m.ts <= MAX_TS:
                out.append(Message(m.topic, payload, m.ts))
            else:
                raise BadInput(f"message {i}: ts out of range")
        return out

    async def _answer(self, request: schemas.DsRequest, partition: int, outcome: Outcome) -> None:
        if request.expired():
            return
        data = outcome.data
        if request.op in EVERY_PARTITION and partition != self.owned[0]:
            data = None  # this retainer's data travels once, with its lowest partition
        chunks: list[dict[str, Any] | None] = [data]
        if data is not None and request.op == "streams":
            streams = data["streams"]  # a `StreamsFound`, cut into parts of the same shape
            chunks = [
                {"streams": streams[i : i + STREAMS_PER_PART]}
                for i in range(0, max(1, len(streams)), STREAMS_PER_PART)
            ]
        site = self.host.store.this_site()
        for part, chunk in enumerate(chunks):
            sent = await answers.reply(
                self.bus, request, partition, self.instance, site, outcome, chunk, part, len(chunks)
            )
            if not sent:
                return

    async def drain(self, budget_s: float = 2.0) -> None:
        """Let running operations finish and send their answers (within `budget_s`), then
        cancel what is left; called once the consumer has stopped."""
        await asyncio.gather(self._writes.drain(budget_s), self._reads.drain(budget_s))
