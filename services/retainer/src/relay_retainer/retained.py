"""The retainer's retained messages (`relay_streams.retained`) for the publication partitions it
owns: the store's lifecycle, group-committed writes, the expiry sweep, and the answers to
retained publishes and `retained_request` records.

Writes: every retained publish and every delete (a delete is a write of an empty payload) is
queued in the order its record was read, and every write waiting when the writer is free goes
into one `store_many` call (one synced RocksDB batch, one fsync for the lot), with the log
position of each write's record (`relay_streams.marks`: an online export's exact cut). A
call refused as a whole (one write's bad input, or more new topics than `max_retained` leaves
room for) is applied again one write at a time, in order, so only the offending writes are
refused.

Invariants:
- readiness condition `retained` is true only while the store is open;
- each request id runs once (a copy of a record read again gets the first run's answer and
  changes nothing), and a publish or delete for a topic another partition owns is refused;
- a publish or delete is answered only by the outcome of the write that contained it, after
  that write is durable; one past its deadline when the writer takes it is dropped unapplied
  (its asker has answered 503, "nothing was stored");
- writes are applied in the order of their records on each partition (a topic lives on one
  partition), so reading a partition again after a restart replays its writes in order and
  ends in the same state;
- `match` answers stop at `limit` messages or `max_reply_bytes` of topics and payloads (at
  least one message), and say whether more follow, so the asker can merge the answers of
  every retainer in the store's topic order and know up to where the merge is exact.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import structlog

from relay_bus import routing, schemas
from relay_bus.bus import Bus
from relay_bus.once import OncePerId
from relay_durable import codec
from relay_durable.outcome import Outcome
from relay_retainer import answers
from relay_retainer.replication import ReplicationFailed, RetainedReplication
from relay_retainer.rounds import Rounds, Watch
from relay_retainer.settings import RetainedServiceSettings
from relay_runtime import exits
from relay_runtime.readiness import Readiness
from relay_streams.errors import BadInput, Closed, StreamsError
from relay_streams.marks import Mark
from relay_streams.partition_watch import Watches
from relay_streams.retained import Retained, RetainedFull, RetainedSettings, RetainedStore, Write
from relay_topics import rules as topic_rules

log = structlog.get_logger(__name__)
T = TypeVar("T")

READS_REMEMBERED = 64
"""Reads (`match`, `size`, `read`) whose outcome is kept: for the partitions that ask later, and
for a copy of the record read again."""
WRITES_REMEMBERED = 4096
"""Publishes and deletes whose outcome is kept, so that a copy of a record read again (consumer
retry, an ingress that sent twice) is answered without being applied twice: applied again after
a newer write to its topic, it would restore the older payload. Their outcomes are small."""


def answer_of(message: Retained) -> schemas.RetainedMessage:
    return schemas.RetainedMessage(
        topic=message.topic,
        payload=codec.b64u(message.payload),
        ts=message.ts,
        expires_at=message.expires_at,
    )


class RetainedHost:
    def __init__(
        self,
        root: Path,
        settings: RetainedServiceSettings,
        readiness: Readiness,
        replication: RetainedReplication | None = None,
        owns: Callable[[str], bool] = lambda _: True,
    ) -> None:
        self.root = root
        self.settings = settings
        self.readiness = readiness
        self.replication = replication
        self.owns = owns
        """Whether a topic belongs to a partition this retainer owns (for the rebuild)."""
        self._store: RetainedStore | None = None
        split_on = (BadInput, RetainedFull, topic_rules.TopicError)
        self._rounds: Rounds[tuple[Write, Mark]] = Rounds(self._apply, split_on, "retained-writer")
        self._sweeper: asyncio.Task[None] | None = None
        self.watches: Watches | None = None
        """Told of every topic written or expired (the hand-off's, `relay_retainer.handoff`)."""
        readiness.register("retained")

    @property
    def store(self) -> RetainedStore:
        if self._store is None:
            raise Closed("retained store not open")
        return self._store

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        limits = RetainedSettings(
            max_payload_bytes=self.settings.max_payload_bytes,
            max_retained=self.settings.max_retained,
        )
        try:
            self._store = await asyncio.to_thread(RetainedStore, self.root, limits)
        except StreamsError as error:
            raise exits.StartupError(f"retained store: {error}", exits.EXIT_CONFIG) from None
        except OSError as error:
            raise exits.StartupError(
                f"retained store {self.root} is not usable: {error}", exits.EXIT_OSERR
            ) from None
        self._rounds.start()
        if self.replication is not None and self._store.size() == 0:
            await self._rebuild(self.replication)
        if self.settings.clear_interval_s:
            self._sweeper = asyncio.create_task(self._sweep(), name="retained-expiry")
        self.readiness.set("retained", True)
        log.info("retained_open", root=str(self.root), size=self._store.size())

    async def _rebuild(self, replication: RetainedReplication) -> None:
        """An empty store (a new or lost volume): take this retainer's topics from the
        replicators."""
        found = await replication.scan_all(self.owns)
        if found:
            writes = [
                Write(topic, payload, 0, expiry_s, ts) for topic, payload, ts, expiry_s in found
            ]
            await asyncio.to_thread(self.store.store_many, writes)
        log.info("retained_rebuilt_from_replicators", messages=len(found))

    async def settled(self) -> None:
        """Return once every write handed over so far is settled (`Rounds.settled`)."""
        await self._rounds.settled()

    def watch(self) -> Watch:
        """`Rounds.watch`: how long the writes settled from now on waited."""
        return self._rounds.watch()

    def unwatch(self, watch: Watch) -> None:
        self._rounds.unwatch(watch)

    def recent_waits(self) -> list[tuple[float, float]]:
        """`Rounds.recent`."""
        return self._rounds.recent()

    async def stop_writing(self) -> None:
        """Finish the writes already handed over, then take no more (a drain hook)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        await self._rounds.stop()

    async def close(self) -> None:
        await self.stop_writing()
        self.readiness.set("retained", False)
        if self._store is not None:
            store, self._store = self._store, None
            await asyncio.to_thread(store.close)
            log.info("retained_closed")

    # -- writes ----------------------------------------------------------------------------

    def submit(self, write: Write, mark: Mark, expired: Callable[[], bool]) -> asyncio.Future[None]:
        """Queue a write (in the caller's order) with its record's log position; the future
        settles once it is durable, or with the store's refusal, or `Expired`."""
        return self._rounds.submit((write, mark), expired)

    def held(self) -> AbstractAsyncContextManager[None]:
        """Nothing written within: no write round, no expiry sweep (`Rounds.held`)."""
        return self._rounds.held()

    async def _apply(self, writes: list[tuple[Write, Mark]]) -> None:
        stored = [write for write, _ in writes]
        marks = [mark for _, mark in writes]
        await asyncio.to_thread(self.store.store_many, stored, None, marks)
        if self.watches is not None:
            self.watches.touched(write.topic for write in stored)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.settings.clear_interval_s)
            topics: list[str] = []
            try:
                async with self.held():
                    removed = await asyncio.to_thread(self.store.clear_expired, None, 1000, topics)
            except StreamsError as error:
                log.warning("retained_sweep_failed", error=str(error))
                continue
            finally:
                if self.watches is not None:
                    self.watches.touched(topics)
            if removed:
                log.info("retained_expired", removed=removed)

    # -- reads -----------------------------------------------------------------------------

    async def read(self, topic: str) -> Retained | None:
        return await asyncio.to_thread(self.store.read, topic)

    async def size(self) -> int:
        return self.store.size()

    async def match(
        self, topic_filter: str, after: str | None, limit: int
    ) -> schemas.RetainedMatch:
        messages, more = await asyncio.to_thread(self._match, topic_filter, after, limit, _whole)
        return schemas.RetainedMatch(messages=messages, more=more)

    async def topics(
        self, topic_filter: str, after: str | None, limit: int
    ) -> schemas.RetainedTopics:
        """`match`, topics only (no payloads)."""
        topics, more = await asyncio.to_thread(self._match, topic_filter, after, limit, _topic)
        return schemas.RetainedTopics(messages=topics, more=more)

    def _match(
        self,
        topic_filter: str,
        after: str | None,
        limit: int,
        take: Callable[[Retained], tuple[T, int]],
    ) -> tuple[list[T], bool]:
        """Up to `limit` answers (`take`: a message's answer and its size), fewer once their
        size reaches `max_reply_bytes`, and whether more follow."""
        out: list[T] = []
        size = 0
        for message in self.store.match(topic_filter, after):
            if len(out) >= limit or size >= self.settings.max_reply_bytes:
                return out, True
            answer, bytes_ = take(message)
            out.append(answer)
            size += bytes_
        return out, False


def _whole(message: Retained) -> tuple[schemas.RetainedMessage, int]:
    return answer_of(message), len(message.topic) + len(message.payload)


def _topic(message: Retained) -> tuple[schemas.RetainedTopic, int]:
    return schemas.RetainedTopic(topic=message.topic), len(message.topic)


async def _raise(error: Exception) -> Outcome:
    raise error


class RetainedRequests:
    """Retained publishes and `retained_request` records read by the retainer's consumer."""

    def __init__(
        self, bus: Bus, host: RetainedHost, instance: str, owned: Sequence[int], partitions: int
    ) -> None:
        self.bus = bus
        self.host = host
        self.instance = instance
        self.owned = list(owned)
        self.partitions = partitions
        self._reads: OncePerId[Outcome] = OncePerId(READS_REMEMBERED, "retained-read")
        self._writes: OncePerId[Outcome] = OncePerId(WRITES_REMEMBERED, "retained-write")

    def handle(
        self, record: schemas.Publication | schemas.RetainedRequest, partition: int, offset: int
    ) -> None:
        """Called by the consumer in record order (`offset`: the record's); never waits for
        the operation."""
        if record.expired() or (isinstance(record, schemas.Publication) and not record.retain):
            return
        reply = functools.partial(self._answer, record, partition)
        if isinstance(record, schemas.Publication):
            self._writes.handle(
                record.id,
                lambda: self._write(
                    record, partition, offset, record.payload, record.expiry_s, 202
                ),
                reply,
            )
        elif record.op == "delete":
            self._writes.handle(
                record.id, lambda: self._write(record, partition, offset, "", None, 204), reply
            )
        elif record.op in ("match", "size"):
            self._reads.handle(
                record.id, lambda: answers.guarded(self._every(record), "retained match"), reply
            )
        else:
            self._reads.handle(
                record.id, lambda: answers.guarded(self._read(record), "retained read"), reply
            )

    def _write(
        self,
        record: schemas.Publication | schemas.RetainedRequest,
        partition: int,
        offset: int,
        payload: str,
        expiry_s: int | None,
        status: int,
    ) -> Coroutine[Any, Any, Outcome]:
        """Queue the write now (record order is write order); its outcome once durable. A topic
        that another partition owns is refused: written here, it would be a second copy that
        the owner's reads never see and a restart's replay would not order."""
        ts = record.ts if isinstance(record, schemas.Publication) else None
        try:
            owner = routing.partition_of_topic(record.topic, self.partitions)
            if owner != partition:
                raise BadInput(f"topic belongs to partition {owner}, not {partition}")
            write = Write(record.topic, answers.payload(payload), 0, expiry_s, ts)
        except BadInput as error:
            return answers.guarded(_raise(error), "retained write")
        mark = Mark(partition, self.bus.epoch or "", offset + 1)
        done = self.host.submit(write, mark, record.expired)
        return answers.guarded(self._durable(done, status, write), "retained write")

    async def _durable(self, done: asyncio.Future[None], status: int, write: Write) -> Outcome:
        await done
        replication = self.host.replication
        if replication is not None:
            ts = write.ts if write.ts is not None else int(schemas.now_ms_())
            try:
                await replication.replicate(write.topic, write.payload, ts, write.expiry_interval_s)
            except ReplicationFailed as error:
                return Outcome.refused(
                    503, "UNAVAILABLE", f"retained here but not on a quorum of replicators: {error}"
                )
        return Outcome(status)

    async def _read(self, record: schemas.RetainedRequest) -> Outcome:
        message = await self.host.read(record.topic)
        if message is None:
            return Outcome(404, code="NOT_FOUND", detail=f"no retained message on {record.topic!r}")
        return Outcome(200, answer_of(message).model_dump())

    async def _every(self, record: schemas.RetainedRequest) -> Outcome:
        if record.op == "size":
            return Outcome(200, schemas.RetainedSize(size=await self.host.size()).model_dump())
        if record.limit < 1:
            raise BadInput("limit must be at least 1")
        host, after = self.host, record.after
        if record.keys_only:
            return Outcome(
                200, (await host.topics(record.filter, after, record.limit)).model_dump()
            )
        return Outcome(200, (await host.match(record.filter, after, record.limit)).model_dump())

    async def _answer(
        self,
        record: schemas.Publication | schemas.RetainedRequest,
        partition: int,
        outcome: Outcome,
    ) -> None:
        if record.expired():
            return
        data = outcome.data
        every = isinstance(record, schemas.RetainedRequest) and record.op in ("match", "size")
        if every and partition != self.owned[0]:
            data = None  # this retainer's data travels once, with its lowest partition
        await answers.reply(self.bus, record, partition, self.instance, "", outcome, data)

    async def drain(self, budget_s: float = 2.0) -> None:
        """Let answers already under way go out (within `budget_s`), then cancel the rest."""
        await asyncio.gather(self._reads.drain(budget_s), self._writes.drain(budget_s))
