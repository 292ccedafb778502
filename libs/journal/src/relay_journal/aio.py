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
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._syncer: asyncio.Task[None] | None = None
        self._batcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.settings.fsync is FsyncPolicy.BATCH:
            self._batcher = asyncio.create_task(self._batch_loop(), name="journal-batch-sync")

    async def _batch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.batch_interval_ms / 1000)
            wal = self.journal.wal
            if wal.written_lsn > wal.synced_lsn:
                await asyncio.to_thread(wal.sync_to, wal.written_lsn)

    async def _durable(self, lsn: int) -> None:
        if self.settings.fsync is not FsyncPolicy.ALWAYS or self.journal.wal.synced_lsn >= lsn:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((lsn, future))
        if self._syncer is None or self._syncer.done():
            self._syncer = asyncio.create_task(self._sync_loop(), name="journal-group-commit")
        await future

    async def _sync_loop(self) -> None:
        wal = self.journal.wal
        while self._waiters:
            target = wal.written_lsn
            try:
                await asyncio.to_thread(wal.sync_to, target)
            except OSError as error:
                waiters, self._waiters = self._waiters, []
                for _, future in waiters:
                    if not future.done():
                        future.set_exception(error)
                return
            still: list[tuple[int, asyncio.Future[None]]] = []
            for lsn, future in self._waiters:
                if lsn <= wal.synced_lsn:
                    if not future.done():
                        future.set_result(None)
                else:
                    still.append((lsn, future))
            self._waiters = still

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
