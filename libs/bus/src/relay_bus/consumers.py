"""Typed consumers: decode each record, hand it to a handler, commit only what was handled.

Invariants:
- at-least-once: an offset is committed only after the handler returned for that record and
  every earlier one of its partition, or the consumer was sought past it (`start_offsets`);
  a handler that raises is retried from the same record after a back-off, so a record is
  never skipped because its handler failed;
- a consumer on fixed partitions with `start_offsets` (the queue-writer's commands) keeps its
  own resume point, so its commits only show lag: they leave the record path, at most one
  under way, in the background, at most every `commit_interval_ms` (an OffsetCommit per batch
  cost a broker round trip and a write to `__consumer_offsets` on every hop). Every other
  consumer commits after every batch, in line: its committed offset is where it (or the group
  member that takes its partitions over) may start reading, whatever `start_offsets` later
  says, so it is kept as close as the handler allows. Stop and revocation commit in line;
- a record this build cannot decode is counted, logged once and skipped (it would fail forever),
  after `on_unreadable` (when given: the archiver, which keeps every record's bytes) returned
  for it; an `on_unreadable` that raises is retried like a handler;
- nothing fetched before a seek to a start or a revocation is handed on after it: a group's
  rebalance runs in aiokafka's coordinator task, so the listener waits for the record in hand
  and drops the rest of the batch (a reader keeping its own resume point, the archiver, would
  otherwise file records after a resume computed before them, or skip the ones between);
- `stop()` lets the batch in hand finish, commits, and leaves the group before returning;
- `reassign()` (fixed partitions only) returns once no record of a dropped partition is being
  handled or will be handed on (fetched ones are discarded), after committing what was handled;
- with `start_offsets`, reading starts where it says, on every assignment (fixed partitions at
  start, a group's partitions at each rebalance) and again after the broker lost its log; the
  first record read is checked against it, and a client that began elsewhere (its committed
  offset, fetched after the seek) is sought again before anything is handed on, until it
  holds or the broker's log starts past it (retention);
  without it, from the committed offset (then the earliest), and from offset 0 after a loss.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from prometheus_client import Counter, Histogram

from relay_bus import clients, schemas
from relay_bus.config import KafkaSettings

log = structlog.get_logger(__name__)

_CONSUMED = Counter("relay_bus_records_consumed_total", "Records handled", ["topic"])
_REJECTED = Counter("relay_bus_records_rejected_total", "Records skipped as unreadable", ["topic"])
_FAILED = Counter("relay_bus_handler_failures_total", "Handler errors (retried)", ["topic"])
_HANDLE_SECONDS = Histogram(
    "relay_bus_handler_seconds", "Time in the handler per record", ["topic"]
)

RETRY_BACKOFF_S = 1.0
IDLE_POLL_S = 0.2


@dataclass(frozen=True)
class Received:
    """One decoded record and where it came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    record: schemas.Record
    value: bytes = b""
    """The record's exact bytes as Kafka holds them (the archiver keeps these)."""
    timestamp_ms: int = 0
    """Kafka's timestamp of the record (the producer's create time)."""


@dataclass(frozen=True)
class Unreadable:
    """A record this build cannot decode, as Kafka holds it, and why."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int
    error: str


Handler = Callable[[Received], Awaitable[None]]
UnreadableHandler = Callable[[Unreadable], Awaitable[None]]
StartOffsets = Callable[[list[int]], Awaitable[dict[int, int]]]
"""Given the partitions just assigned, the offset to start each at (missing ones: as usual)."""
Revoked = Callable[[list[int]], Awaitable[None]]


class _GroupListener(clients.ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: Consumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[clients.TopicPartition]) -> None:
        # aiokafka calls this from its coordinator task, while the loop may be handing on a
        # batch: `_handling` waits for the record in hand, the fence drops the rest.
        async with self.owner._handling:
            self.owner._fence += 1
            await self.owner._commit()
            for tp in revoked:  # its new reader commits it (kept, every commit would fail)
                self.owner._handled.pop(tp, None)
                self.owner._sought.pop(tp, None)
            if self.owner.on_revoked is not None and revoked:
                await self.owner.on_revoked(sorted(tp.partition for tp in revoked))

    async def on_partitions_assigned(self, assigned: set[clients.TopicPartition]) -> None:
        async with self.owner._handling:
            await self.owner._seek_start(sorted(tp.partition for tp in assigned))
        self.owner.assigned = True
        log.info(
            "partitions_assigned",
            topic=self.owner.topic,
            partitions=sorted(tp.partition for tp in assigned),
        )


class Consumer:
    """Consumes one topic, either as a member of a consumer group (`partitions=None`: Kafka
    balances the partitions) or on a fixed set of partitions (stateful owners, BRIEF §3), with
    `group_id` then used only to keep committed offsets."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        topic: str,
        physical_topic: str | None = None,
        handler: Handler,
        client_id: str,
        group_id: str | None,
        partitions: Sequence[int] | None = None,
        start_offsets: StartOffsets | None = None,
        on_revoked: Revoked | None = None,
        member: str | None = None,
        on_unreadable: UnreadableHandler | None = None,
        fetch_min_bytes: int = 1,
    ) -> None:
        if partitions is None and group_id is None:
            raise ValueError("a group consumer needs a group_id")
        self.settings = settings
        self.topic = topic
        """The logical name (what handlers see)."""
        self.physical_topic = physical_topic or topic
        """The name on the cluster (`KafkaSettings.topic_prefix` + `topic`)."""
        self.handler = handler
        self.client_id = client_id
        self.group_id = group_id
        self.partitions = list(partitions) if partitions is not None else None
        self.start_offsets = start_offsets
        self.on_revoked = on_revoked
        self.on_unreadable = on_unreadable
        """Given each record the handler never sees because it cannot be decoded."""
        self.fetch_min_bytes = fetch_min_bytes
        """The least a fetch returns unless `fetch_max_wait_ms` passes first: 1 on every
        request's path; more for a reader no request waits for (the archiver), which then
        wakes once per batch, not once per record."""
        self.member = member
        """A static group member's name (`group.instance.id`, KIP-345): a member that restarts
        under the same name within the session timeout gets its partitions back without a
        rebalance (a killed one is not waited for until its session expires); the cost, a
        stopped member's partitions wait for that timeout (a static member does not leave)."""
        self.on_assigned: Callable[[bool], None] | None = None
        """Told each change of `assigned` as it happens (the bus's readiness: a group member
        is ready the moment its partitions are, not at the next periodic check)."""
        self._assigned = False
        self._consumer: clients.AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._reset_requested = False
        self._handled: dict[clients.TopicPartition, int] = {}
        self._sought: dict[clients.TopicPartition, tuple[int, bool]] = {}
        """Partitions sought to a start offset whose first record is not checked yet: the
        offset, and whether it was sought again once already."""
        self._committing: asyncio.Task[None] | None = None
        self._next_commit = 0.0
        self._handling = asyncio.Lock()
        """Held while a record is handed to the handler; `reassign` and the group listener
        take it to fence."""
        self._fence = 0
        """Raised at every seek to a start and every revocation: a batch returned under an
        older value is not handed on (its records are fetched again from the new position)."""

    @property
    def name(self) -> str:
        return f"consumer:{self.topic}"

    @property
    def assigned(self) -> bool:
        """True once this consumer has partitions to read (or, on fixed partitions, none are
        wanted yet); false before and after a crash of its loop."""
        return self._assigned

    @assigned.setter
    def assigned(self, value: bool) -> None:
        self._assigned = value
        if self.on_assigned is not None:
            self.on_assigned(value)

    def held(self) -> list[int]:
        """The partitions this consumer reads now (a group's current assignment)."""
        if self._consumer is None:
            return []
        return sorted(tp.partition for tp in self._consumer.assignment())

    async def start(self) -> None:
        if self.partitions == []:
            # Nothing to read yet (`reassign` gives it partitions): no Kafka client until then.
            # Assigning a started client while its group coordinator is still being found
            # kills aiokafka's coordination task (an assertion), so the client is created with
            # its first partitions, as below.
            self.assigned = True
        else:
            await self._open()
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def _open(self) -> None:
        consumer = clients.consumer(
            self.settings, self.client_id, self.group_id, self.member, self.fetch_min_bytes
        )
        await consumer.start()
        self._consumer = consumer
        if self.partitions is None:
            self._consumer.subscribe([self.physical_topic], listener=_GroupListener(self))
        else:
            await self._assign()

    async def _assign(self) -> None:
        assert self._consumer is not None
        assert self.partitions is not None
        tps = [clients.TopicPartition(self.physical_topic, p) for p in self.partitions]
        self._consumer.assign(tps)
        await self._seek_start(self.partitions)
        self.assigned = True

    async def _seek_start(self, partitions: list[int]) -> None:
        self._fence += 1
        if self.start_offsets is None or self._consumer is None or not partitions:
            return
        for partition, offset in (await self.start_offsets(partitions)).items():
            tp = clients.TopicPartition(self.physical_topic, partition)
            self._consumer.seek(tp, offset)
            self._sought[tp] = (offset, False)
            # Committed as if handled up to there: what lies before was skipped on purpose,
            # and the group's committed offset (its lag) says so.
            self._handled[tp] = offset

    async def reassign(self, partitions: Sequence[int]) -> None:
        """Read `partitions` from now on (a consumer on fixed partitions). A dropped partition is
        fenced when this returns: the handler call in progress has returned, no fetched record of
        it is handed on, and what was handled is committed. Partitions kept or added start as at
        `start` (`start_offsets`, else the committed offset)."""
        if self.partitions is None:
            raise ValueError("a group consumer's partitions are Kafka's to balance")
        wanted = sorted(set(partitions))
        if self._task is None:  # not started: `start` reads these
            self.partitions = wanted
            return
        async with self._handling:
            self.partitions = wanted
            self._fence += 1  # a batch in hand is not handed on: dropped or sought anew
            if self._consumer is None:
                if wanted:
                    await self._open()
            else:
                await self._commit()
                self._handled.clear()
                if wanted:
                    await self._assign()
                else:
                    self._consumer.unsubscribe()
        log.info("partitions_reassigned", topic=self.topic, partitions=wanted)

    def reset_to_beginning(self) -> None:
        """The broker lost its log (a new epoch): read every partition again from offset 0."""
        self._reset_requested = True

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception:
            log.exception("consumer_crashed", topic=self.topic)
            self.assigned = False
            raise

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            if self._consumer is None or self.partitions == [] or self._handling.locked():
                # Fixed partitions, none at the moment, or `reassign` under way.
                await asyncio.sleep(IDLE_POLL_S)
                continue
            if self._reset_requested:
                self._reset_requested = False
                self._handled.clear()
                assignment = self._consumer.assignment()
                if assignment and self.start_offsets is not None:
                    await self._seek_start(sorted(tp.partition for tp in assignment))
                elif assignment:
                    await self._consumer.seek_to_beginning(*assignment)
            try:
                batches = await self._consumer.getmany(timeout_ms=200, max_records=500)
            except clients.KafkaError as error:
                log.warning("consume_failed", topic=self.topic, error=str(error))
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            # aiokafka returns only records valid for the positions it holds now; a seek or a
            # revocation from here on (the listener runs in its own task) makes them stale.
            fence = self._fence
            for tp, records in batches.items():
                await self._handle_records(tp, records, fence)
            if self.start_offsets is not None and self.partitions is not None:
                self._commit_when_due()
            else:
                await self._commit()

    async def _handle_records(
        self, tp: clients.TopicPartition, records: list[object], fence: int
    ) -> None:
        """Hand `records` of one partition, fetched under `fence`, on in order, up to a failed
        one (read again after a back-off) or until a seek or a revocation raises the fence."""
        async with self._handling:
            if not records or fence != self._fence:
                return
            if not await self._at_start(tp, getattr(records[0], "offset")):  # noqa: B009
                return
        for message in records:
            async with self._handling:
                if fence != self._fence:
                    return  # sought or revoked while this batch was in hand
                handled = await self._handle(tp, message)
                if not handled and self._consumer is not None:
                    self._consumer.seek(tp, getattr(message, "offset"))  # noqa: B009
            if not handled:
                await asyncio.sleep(RETRY_BACKOFF_S)
                return

    async def _at_start(self, tp: clients.TopicPartition, first: int) -> bool:
        """Whether the first record read since `tp` was sought is where it was sought: a group
        client may start at its committed offset instead, when that fetch completes after the
        seek (aiokafka), and a reader that keeps its own resume point (the archiver) must not
        skip what lies between. Sought again until it holds; a record read past the sought
        offset is accepted only when the broker's log starts past it too (retention removed
        the records between)."""
        sought = self._sought.pop(tp, None)
        if sought is None or first == sought[0] or self._consumer is None:
            return True
        offset, again = sought
        log.warning(
            "consumer_start_missed",
            topic=self.topic,
            partition=tp.partition,
            sought=offset,
            read=first,
            again=again,
        )
        target = offset
        if first > offset:
            try:
                start = (await self._consumer.beginning_offsets([tp]))[tp]
            except clients.KafkaError as error:
                log.warning("beginning_offset_unknown", topic=self.topic, error=str(error))
                start = offset  # not known: sought again, asked again at the next miss
            if start > offset:  # retention removed the records from `offset` on
                if first == start:
                    return True
                target = start
        self._consumer.seek(tp, target)
        self._sought[tp] = (target, True)
        return False

    def _commit_when_due(self) -> None:
        """Start a background commit if the interval has passed and none is under way."""
        now = time.monotonic()
        if now < self._next_commit or (self._committing and not self._committing.done()):
            return
        self._next_commit = now + self.settings.commit_interval_ms / 1000
        self._committing = asyncio.create_task(self._commit(), name=f"{self.name}:commit")

    async def _handle(self, tp: clients.TopicPartition, message: object) -> bool:
        value: bytes | None = getattr(message, "value", None)
        offset: int = getattr(message, "offset")  # noqa: B009 - aiokafka's record is untyped
        try:
            record = schemas.decode(value)
        except schemas.SchemaError as error:
            _REJECTED.labels(self.topic).inc()
            log.warning(
                "record_rejected",
                topic=self.topic,
                partition=tp.partition,
                offset=offset,
                error=str(error),
            )
            if self.on_unreadable is not None:
                unreadable = Unreadable(
                    self.topic,
                    tp.partition,
                    offset,
                    getattr(message, "key", None),
                    value or b"",
                    getattr(message, "timestamp", 0),
                    str(error),
                )
                try:
                    await self.on_unreadable(unreadable)
                except Exception:
                    _FAILED.labels(self.topic).inc()
                    log.exception("unreadable_handler_failed", topic=self.topic, offset=offset)
                    return False
            self._handled[tp] = offset + 1
            return True
        received = Received(
            self.topic,
            tp.partition,
            offset,
            getattr(message, "key", None),
            record,
            value or b"",
            getattr(message, "timestamp", 0),
        )
        try:
            with _HANDLE_SECONDS.labels(self.topic).time():
                await self.handler(received)
        except Exception:
            _FAILED.labels(self.topic).inc()
            log.exception("handler_failed", topic=self.topic, partition=tp.partition, offset=offset)
            return False
        _CONSUMED.labels(self.topic).inc()
        self._handled[tp] = offset + 1
        return True

    async def _commit(self) -> None:
        if self._consumer is None or self.group_id is None or not self._handled:
            return
        handled = dict(self._handled)
        offsets = {tp: clients.OffsetAndMetadata(offset, "") for tp, offset in handled.items()}
        try:
            await self._consumer.commit(offsets)
        except clients.KafkaError as error:
            # Not fatal: the records are handled again after a restart, and handlers are
            # idempotent (BRIEF §4).
            log.warning("commit_failed", topic=self.topic, error=str(error))
            return
        for tp, offset in handled.items():  # records handled meanwhile wait for the next one
            if self._handled.get(tp) == offset:
                del self._handled[tp]

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._committing is not None:
            await asyncio.gather(self._committing, return_exceptions=True)
        if self._consumer is not None:
            await self._commit()
            await self._consumer.stop()
            self._consumer = None
