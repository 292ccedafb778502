"""The journal for asyncio callers: concurrent writers share fsyncs (group commit).

Invariants:
- with `FsyncPolicy.ALWAYS`, each mutating call returns only after the WAL is durable up to its
  record; while one fdatasync runs (on a worker thread), later records accumulate and the next
  fdatasync covers them all, so N concurrent writers cost about one fsync per round, not N;
- with `BATCH`, a background task fsyncs every `batch_interval_ms` and calls return at once;
- the journal itself is only touched from the event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib

from relay_journal.journal import QueueInfo, QueueJournal
from relay_journal.records import Message
from relay_journal.settings import FsyncPolicy, JournalSettings


class AsyncJournal:
    def __init__(self, settings: JournalSettings) -> None:
        self.journal = QueueJournal(settings)
        self.journal.auto_sync = False
        self.settings = settings
        self._round: asyncio.Future[None] | None = None
        self._syncer: asyncio.Task[None] | None = None
        self._batcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.settings.fsync is FsyncPolicy.BATCH:
            self._batcher = asyncio.create_task(self._batch_loop(), name="journal-batch-sync")

    async def _batch_loop(self) -> None:
        wal = self.journal.wal
        while True:
            await asyncio.sleep(self.settings.batch_interval_ms / 1000)
            if wal.written_lsn > wal.synced_lsn:
                wal.flush()
                await asyncio.to_thread(wal.fdatasync_to, wal.flushed_lsn)

    async def durable(self, lsn: int) -> None:
        """Wait until the log is durable up to `lsn`. For callers that apply a batch of changes
        through `self.journal` (as the queue-writer applies a batch of Kafka commands) and wait
        once: the batch shares the fsync rounds without one await per change."""
        await self._durable(lsn)

    async def _durable(self, lsn: int) -> None:
        wal = self.journal.wal
        if self.settings.fsync is not FsyncPolicy.ALWAYS:
            return
        while wal.synced_lsn < lsn:
            # Join the next sync round; one round's fdatasync covers every record flushed
            # before it starts, so all writers waiting on it are released together.
            if self._round is None:
                self._round = asyncio.get_running_loop().create_future()
                if self._syncer is None or self._syncer.done():
                    self._syncer = asyncio.create_task(
                        self._sync_loop(), name="journal-group-commit"
                    )
            current = self._round
            try:
                await current  # shared by every writer of this round (no per-writer future)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # Another writer's cancellation cancelled the shared round: wait again.

    async def _sync_loop(self) -> None:
        wal = self.journal.wal
        while self._round is not None:
            current, self._round = self._round, None
            wal.flush()  # on the loop thread: the log stays in lsn order
            try:
                await asyncio.to_thread(wal.fdatasync_to, wal.flushed_lsn)
            except OSError as error:
                if not current.done():
                    current.set_exception(error)
                continue
            if not current.done():
                current.set_result(None)

    async def write(
        self, queue_id: str, msg_id: bytes, body: bytes, *, ts_ms: int, expires_ms: int = 0
    ) -> int:
        try:
            lsn = self.journal.write(queue_id, msg_id, body, ts_ms=ts_ms, expires_ms=expires_ms)
        except Exception:
            # A quota refusal may have logged the marker: it must be durable before the
            # refusal is reported, like any other change.
            await self._durable(self.journal.wal.written_lsn)
            raise
        await self._durable(lsn)
        return lsn

    async def ack(self, queue_id: str, msg_id: bytes) -> int:
        lsn = self.journal.ack(queue_id, msg_id)
        await self._durable(lsn)
        return lsn

    async def suspend(self, queue_id: str) -> int:
        lsn = self.journal.suspend(queue_id)
        await self._durable(lsn)
        return lsn

    async def delete(self, queue_id: str) -> int:
        lsn = self.journal.delete(queue_id)
        await self._durable(lsn)
        return lsn

    async def expire(self, queue_id: str, now_ms: int) -> int:
        dropped = self.journal.expire(queue_id, now_ms)
        await self._durable(self.journal.wal.written_lsn)
        return dropped

    def peek(self, queue_id: str, *, now_ms: int | None = None) -> Message | None:
        """Expired heads dropped here are made durable by the next mutating call or fsync."""
        return self.journal.peek(queue_id, now_ms=now_ms)

    def info(self, queue_id: str) -> QueueInfo:
        return self.journal.info(queue_id)

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher
        if self._syncer is not None:
            await asyncio.gather(self._syncer, return_exceptions=True)
        self.journal.close()
