"""The archiver's work: every record of the archived topics into a slot buffer, each buffer
rolled into an archive file at a size or an age, lag measured against Kafka's end offsets.

Invariants:
- reading starts, on every assignment and after a broker log loss, at each partition's resume
  point in the archive of the current epoch (`relay_archive.reader.resume_points`), never at a
  committed offset: the archive is the position, so a SIGKILL at any point loses nothing
  (unwritten buffers are read again) and repeats no range;
- one slot's files are written one at a time, in offset order (a lock per slot), so a file
  never becomes durable before an earlier one of its slot;
- a partition taken away (rebalance) or a stop writes what its buffer holds before letting go;
- every record read is noted, the ones the bus cannot decode too (`unreadable`): a record of
  a newer build's kind or version is kept on a topic archived whole, never dropped while the
  file's name claims its offset;
- a new broker epoch (the keeper saw a wiped log) writes the old epoch's buffers, then archives
  the new log under its own epoch: offsets of two logs are never mixed in one folder. Before
  the keeper sees it, a read below a slot's buffer start (the consumer reset to the new log's
  start) fails and is retried, never skipped as read. Not told apart: a new log read while a
  slot's buffer still starts at 0 (its first file not written yet) looks like a seek back.
  Caveat: records of the old log still in the consumer's hand when the keeper notices the new
  epoch (a batch fetched before the wipe, handled after the keeper's check) are filed under the
  new one at their old offsets, and the new log below them is then never read: the new
  epoch's archive starts above 0, which verify reports as a gap (exit 2).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from prometheus_client import Counter, Gauge

from relay_archive import layout, reader, rows, selection, writer
from relay_archive.store import ArchiveStore
from relay_bus.bus import Bus
from relay_bus.consumers import Received, Unreadable

log = structlog.get_logger(__name__)

_RECORDS = Counter("relay_archiver_records_total", "Records written to archive files", ["topic"])
_SKIPPED = Counter(
    "relay_archiver_records_not_kept_total", "Records read and covered but not kept", ["topic"]
)
_FILES = Counter("relay_archiver_files_total", "Archive files written", ["topic"])
_BYTES = Counter("relay_archiver_bytes_total", "Bytes of archive files written", ["topic"])
_LAG = Gauge(
    "relay_archiver_lag_records",
    "Records on Kafka not yet in an archive file (end offset - resume point)",
    ["topic", "partition"],
)
_ARCHIVED_TO = Gauge(
    "relay_archiver_resume_offset",
    "First offset not yet in an archive file",
    ["topic", "partition"],
)


@dataclass(frozen=True)
class Timing:
    roll_check_s: float = 1.0
    """How often buffers are checked against the roll policy."""
    lag_interval_s: float = 5.0
    """How often lag is measured against Kafka's end offsets."""


class Archiver:
    def __init__(
        self, bus: Bus, store: ArchiveStore, policy: writer.RollPolicy, timing: Timing
    ) -> None:
        self.bus = bus
        self.store = store
        self.policy = policy
        self.timing = timing
        self.buffers: dict[layout.Slot, writer.SlotBuffer] = {}
        self._locks: dict[layout.Slot, asyncio.Lock] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        removed = await asyncio.to_thread(self.store.clean_temporary)
        if removed:
            log.warning("archive_temporary_files_removed", count=removed)
        self._tasks = [
            asyncio.create_task(self._roll_every(), name="archive-roll"),
            asyncio.create_task(self._measure_lag_every(), name="archive-lag"),
        ]

    async def close(self) -> None:
        """After the consumers stopped: write every buffer."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self.flush(list(self.buffers))

    # -- consuming -------------------------------------------------------------------------

    def handler(self, topic: str) -> Callable[[Received], Awaitable[None]]:
        async def handle(received: Received) -> None:
            await self.add(topic, received)

        return handle

    def start_offsets(self, topic: str) -> Callable[[list[int]], Awaitable[dict[int, int]]]:
        async def start(partitions: list[int]) -> dict[int, int]:
            return await self.resume(topic, partitions)

        return start

    def revoked(self, topic: str) -> Callable[[list[int]], Awaitable[None]]:
        async def revoked(partitions: list[int]) -> None:
            await self.flush(
                [s for s in self.buffers if s.topic == topic and s.partition in partitions]
            )
            for slot in [s for s in self.buffers if s.topic == topic and s.partition in partitions]:
                self.buffers.pop(slot, None)

        return revoked

    async def resume(self, topic: str, partitions: list[int]) -> dict[int, int]:
        """Where to read `partitions` of `topic`: write what is buffered (of any epoch), then
        start each at its resume point in the current epoch's archive (0 for none yet)."""
        epoch = self._epoch()
        await self.flush([s for s in self.buffers if s.topic == topic])
        for slot in [s for s in self.buffers if s.topic == topic]:
            del self.buffers[slot]
        points = await asyncio.to_thread(reader.resume_points, self.store, epoch, topic)
        for partition in partitions:
            slot = layout.Slot(epoch, topic, partition)
            self.buffers[slot] = writer.SlotBuffer(slot, points.get(partition))
        offsets = {p: points.get(p, 0) for p in partitions}
        log.info("archive_resumed", topic=topic, epoch=epoch, offsets=offsets)
        return offsets

    def unreadable(self, topic: str) -> Callable[[Unreadable], Awaitable[None]]:
        """For records the bus cannot decode (a newer build's kind or version, foreign bytes):
        kept like any other (`relay_archive.selection`), so the archive stays the log."""

        async def handle(record: Unreadable) -> None:
            row = rows.row_of(record.offset, record.timestamp_ms, record.key, record.value)
            await self.note(topic, record.partition, record.offset, row.kind, lambda: row)

        return handle

    async def add(self, topic: str, received: Received) -> None:
        def row() -> rows.Row:
            r = received
            return rows.row_of(r.offset, r.timestamp_ms, r.key, r.value)

        await self.note(topic, received.partition, received.offset, received.record.kind, row)

    async def note(
        self, topic: str, partition: int, offset: int, kind: str, row: Callable[[], rows.Row]
    ) -> None:
        """`offset` of `partition` read; its row (made only then) kept if the topic keeps
        `kind`."""
        slot = layout.Slot(self._epoch(), topic, partition)
        buffer = self.buffers.get(slot)
        if buffer is None:
            # A new epoch seen before the consumer was told to read again: the old epoch's
            # buffers are written first (see the module's caveat).
            await self.flush([s for s in self.buffers if s.topic == topic])
            for old in [s for s in self.buffers if s.topic == topic and s.epoch != slot.epoch]:
                del self.buffers[old]
            buffer = self.buffers.setdefault(slot, writer.SlotBuffer(slot, None))
        if buffer.pending and buffer.first is not None and buffer.first <= offset <= buffer.last:
            # Read again: a seek back after a handler retry, or a batch in hand when a
            # rebalance's resume seeked to this buffer's start. Already buffered.
            return
        # Below the buffer's start nothing of this process seeks: the log was replaced under
        # the partition (a wipe the keeper has not noticed yet, the consumer reset to the new
        # log's start). `SlotBuffer.add` refuses it (`OutOfOrder`), retried until the bus
        # resets to the new epoch, instead of skipping it as read and filing the new log's
        # later records under the old epoch.
        kept = row() if selection.keeps(topic, kind) else None
        if kept is None:
            _SKIPPED.labels(topic).inc()
        buffer.add(offset, kept, time.monotonic())
        if buffer.bytes >= self.policy.max_bytes:
            await self.flush([slot])

    # -- writing ---------------------------------------------------------------------------

    def _epoch(self) -> str:
        assert self.bus.epoch is not None, "bus not started"
        return self.bus.epoch

    async def flush(self, slots: list[layout.Slot]) -> None:
        for slot in slots:
            lock = self._locks.setdefault(slot, asyncio.Lock())
            async with lock:
                buffer = self.buffers.get(slot)
                taken = buffer.take() if buffer is not None else None
                if taken is None:
                    continue
                f, kept = taken
                size = await asyncio.to_thread(writer.write, self.store, f, kept)
                _RECORDS.labels(slot.topic).inc(len(kept))
                _FILES.labels(slot.topic).inc()
                _BYTES.labels(slot.topic).inc(size)
                _ARCHIVED_TO.labels(slot.topic, str(slot.partition)).set(f.last + 1)
                log.debug("archive_file_written", path=f.path, records=len(kept), bytes=size)

    async def _roll_every(self) -> None:
        while True:
            await asyncio.sleep(self.timing.roll_check_s)
            now = time.monotonic()
            due = [s for s, b in self.buffers.items() if b.due(self.policy, now)]
            try:
                await self.flush(due)
            except OSError as error:
                # Kept in the buffer: retried at the next check (the disk may come back).
                log.error("archive_write_failed", error=str(error))

    async def _measure_lag_every(self) -> None:
        while True:
            await asyncio.sleep(self.timing.lag_interval_s)
            try:
                await self.measure_lag()
            except Exception as error:  # a metric must not stop the archiver
                log.warning("archive_lag_unmeasured", error=str(error) or type(error).__name__)

    async def measure_lag(self) -> dict[tuple[str, int], int]:
        lags: dict[tuple[str, int], int] = {}
        epoch = self.bus.epoch
        for topic in selection.ARCHIVED:
            slots = [s for s in self.buffers if s.topic == topic and s.epoch == epoch]
            if not slots:
                continue
            ends = await self.bus.end_offsets(topic, [s.partition for s in slots])
            for slot in slots:
                buffer = self.buffers[slot]
                archived_to = buffer.first if buffer.first is not None else ends[slot.partition]
                lag = max(0, ends[slot.partition] - archived_to)
                lags[(topic, slot.partition)] = lag
                _LAG.labels(topic, str(slot.partition)).set(lag)
        return lags
