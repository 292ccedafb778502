"""The journal for asyncio callers: concurrent writers share fsyncs (group commit).

Invariants:
- with `FsyncPolicy.ALWAYS`, each mutating call returns only after the WAL is durable up to its
  record (`relay_durable.group_commit`: one fdatasync per round, shared by every waiter);
- with `BATCH`, a background task fsyncs every `batch_interval_ms` and calls return at once;
- the journal itself is only touched from the event loop thread;
- it opens lazily (`QueueJournal(lazy=True)`): ready once the log is read, whatever the number
  of queues the replay touches; a background task applies the rest `CATCH_UP_STEP` queues at a
  time, and a queue used before its turn applies its own records first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from relay_durable.group_commit import GroupCommit
from relay_journal.journal import QueueInfo, QueueJournal
from relay_journal.records import Message
from relay_journal.settings import FsyncPolicy, JournalSettings

log = structlog.get_logger(__name__)
CATCH_UP_STEP = 32
"""Queues the background catch-up applies between two yields to the event loop (a few ms)."""


async def _at_once(_lsn: int) -> None:
    """Durability to wait for under `BATCH` and `NEVER`: none."""


class AsyncJournal:
    def __init__(
        self, settings: JournalSettings, *, on_failed: Callable[[OSError], None] | None = None
    ) -> None:
        """`on_failed`: told once when the log can no longer be made durable (fail-stop,
        `relay_durable.group_commit`)."""
        self.journal = QueueJournal(settings, lazy=True)
        self.journal.auto_sync = False
        self.settings = settings
        self.commit = GroupCommit(
            self.journal.wal.file, kernel_sync=settings.fsync_backends, on_failed=on_failed
        )
        self._wait: Callable[[int], Awaitable[None]] = (
            self.commit.durable if settings.fsync is FsyncPolicy.ALWAYS else _at_once
        )
        self._catching_up: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.settings.fsync is FsyncPolicy.BATCH:
            self.commit.start_batching(self.settings.batch_interval_ms / 1000)
        if self.journal.pending_queues:
            self._catching_up = asyncio.create_task(self._catch_up(), name="journal-catch-up")

    async def _catch_up(self) -> None:
        """Apply the replay's records to the queues not used yet, a step at a time; then the
        opening checkpoint begins (its table written on the checkpoint thread). A record that
        cannot apply is logged and stops it: that queue's uses and the next checkpoint raise."""
        queues = self.journal.pending_queues
        started = asyncio.get_running_loop().time()
        try:
            while True:
                if not self.journal.catch_up(CATCH_UP_STEP, background=True):
                    break
                await asyncio.sleep(0)
            table = self.journal.checkpoint_table
            if table is not None:
                await asyncio.wait([asyncio.wrap_future(table)])
            self.journal.end_checkpoint()  # the replayed segments go now, not a segment later
        except Exception as error:
            log.error("journal_catch_up_failed", error=str(error))
            return
        elapsed = asyncio.get_running_loop().time() - started
        log.info("journal_caught_up", queues=queues, seconds=round(elapsed, 3))

    async def caught_up(self) -> None:
        """Wait for the background catch-up (for tests and benchmarks)."""
        if self._catching_up is not None:
            await asyncio.shield(self._catching_up)

    def durable(self, lsn: int) -> Awaitable[None]:
        """Wait until the log is durable up to `lsn` (under `ALWAYS`). For callers that apply a
        batch of changes through `self.journal` (as the queue-writer applies a batch of Kafka
        commands) and wait once: the batch shares fsync rounds without an await per change.

        Under `ALWAYS`, the group commit's shared future (the write path calls that directly:
        no frame of its own)."""
        return self._wait(lsn)

    async def write(
        self,
        queue_id: str,
        msg_id: bytes,
        body: bytes,
        *,
        ts_ms: int,
        expires_ms: int = 0,
        key: bytes = b"",
    ) -> int:
        try:
            lsn = self.journal.write(
                queue_id, msg_id, body, ts_ms=ts_ms, expires_ms=expires_ms, key=key
            )
        except Exception:
            # A quota refusal may have logged the marker: it must be durable before the
            # refusal is reported, like any other change.
            await self._wait(self.journal.wal.written_lsn)
            raise
        await self._wait(lsn)
        return lsn

    async def ack(self, queue_id: str, msg_id: bytes) -> int:
        lsn = self.journal.ack(queue_id, msg_id)
        await self._wait(lsn)
        return lsn

    async def suspend(self, queue_id: str) -> int:
        lsn = self.journal.suspend(queue_id)
        await self._wait(lsn)
        return lsn

    async def delete(self, queue_id: str) -> int:
        lsn = self.journal.delete(queue_id)
        await self._wait(lsn)
        return lsn

    async def expire(self, queue_id: str, now_ms: int) -> int:
        dropped = self.journal.expire(queue_id, now_ms)
        await self._wait(self.journal.wal.written_lsn)
        return dropped

    def peek(self, queue_id: str, *, now_ms: int | None = None) -> Message | None:
        """Expired heads dropped here are made durable by the next mutating call or fsync."""
        return self.journal.peek(queue_id, now_ms=now_ms)

    def info(self, queue_id: str) -> QueueInfo:
        return self.journal.info(queue_id)

    async def close(self) -> None:
        if self._catching_up is not None:
            self._catching_up.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._catching_up
        await self.commit.close()
        self.journal.close()
