"""Group commit for asyncio callers of an `AppendLog`.

Invariants:
- `durable(seq)` returns once the log is fdatasync'ed up to `seq`; while one fdatasync runs on
  a worker thread the event loop keeps appending, and the next round covers all of it, so N
  concurrent callers cost about one fdatasync per round, not N;
- every waiter of a round shares one future (no future per caller); a caller's cancellation
  does not fail the other waiters of its round;
- flushes happen on the event loop thread, so the log keeps its append order.
"""

from __future__ import annotations

import asyncio
import contextlib

from relay_durable.appendlog import AppendLog


class GroupCommit:
    def __init__(self, log: AppendLog) -> None:
        self.log = log
        self._round: asyncio.Future[None] | None = None
        self._syncer: asyncio.Task[None] | None = None
        self._batcher: asyncio.Task[None] | None = None

    async def durable(self, seq: int) -> None:
        log = self.log
        while log.synced < seq:
            if self._round is None:
                self._round = asyncio.get_running_loop().create_future()
                if self._syncer is None or self._syncer.done():
                    self._syncer = asyncio.create_task(self._sync_loop(), name="group-commit")
            current = self._round
            try:
                await current
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # Another waiter's cancellation cancelled the shared round: wait again.

    async def _sync_loop(self) -> None:
        log = self.log
        while self._round is not None:
            current, self._round = self._round, None
            log.flush()
            try:
                await asyncio.to_thread(log.fdatasync_to, log.flushed)
            except OSError as error:
                if not current.done():
                    current.set_exception(error)
                continue
            if not current.done():
                current.set_result(None)

    def start_batching(self, interval_s: float) -> None:
        """Fsync every `interval_s` in the background (FsyncPolicy.BATCH)."""
        self._batcher = asyncio.create_task(self._batch_loop(interval_s), name="batch-sync")

    async def _batch_loop(self, interval_s: float) -> None:
        log = self.log
        while True:
            await asyncio.sleep(interval_s)
            if log.written > log.synced:
                log.flush()
                await asyncio.to_thread(log.fdatasync_to, log.flushed)

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher
        if self._syncer is not None:
            await asyncio.gather(self._syncer, return_exceptions=True)
