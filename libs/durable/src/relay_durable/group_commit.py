"""Group commit for asyncio callers of an `AppendLog`.

Invariants:
- `durable(seq)` returns once the log is fdatasync'ed up to `seq`, or raises the error of the
  fdatasync (or flush) that was to cover it;
- at most one fdatasync runs at a time: in the kernel (`relay_durable.kernel_sync`, io_uring
  or native AIO), or on a worker thread where the kernel refuses both; records appended while
  it runs wait in the next round. N concurrent callers cost about one fdatasync per round, not N;
- the event loop's work overlaps the disk's: callers settle into two halves, one appending
  while the other's fdatasync runs. When a round ends, the next one starts at once if it holds
  half of the callers of the two; otherwise it starts when enough woken callers have joined it,
  or once the event loop has run everything that was ready (so nobody waits on a round that
  nobody starts). Without the halves, the round that ends while the loop is busy is seen only
  when the loop is idle, and rounds keep a lopsided 1 : N-1 split that leaves the disk and the
  loop taking turns;
- a failed fdatasync fails its round and every later one (fail-stop): after an fdatasync
  error the kernel may have dropped the dirty pages it could not write, so a later success
  would not prove the records before it durable. Reopening the log (a restart) recovers;
- every waiter of a round shares one future (no future per caller); a caller's cancellation
  does not fail the other waiters of its round;
- flushes happen on the event loop thread, so the log keeps its append order.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import structlog

from relay_durable.appendlog import AppendLog
from relay_durable.kernel_sync import KernelSync, open_kernel_sync

logger = structlog.get_logger(__name__)


class GroupCommit:
    def __init__(self, log: AppendLog, *, kernel_sync: tuple[str, ...] = ("uring", "aio")) -> None:
        """`kernel_sync`: the `relay_durable.kernel_sync` backends to try, in order; none (or
        none accepted) means a worker thread."""
        self.log = log
        self._backends = kernel_sync
        self._kernel: KernelSync | None = None  # opened with the first round
        self._watching = False
        self._failed: OSError | None = None
        self._next: asyncio.Future[None] | None = None
        """Waiters whose records no running fdatasync covers."""
        self._running: asyncio.Future[None] | None = None
        """Waiters of the running fdatasync, which covers the log up to `_target`."""
        self._target = 0
        self._next_count = 0
        self._running_count = 0
        self._quorum = 1
        """Waiters the next round needs before it starts without waiting for the loop."""
        self._kick_pending = False
        self._syncing: asyncio.Future[None] | None = None
        self._batcher: asyncio.Task[None] | None = None
        self.rounds = 0
        """fdatasync rounds started."""

    async def durable(self, seq: int) -> None:
        while self.log.synced < seq:
            if self._failed is not None:
                raise self._failed
            waiting = self._round_for(seq)
            try:
                await waiting
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # Another waiter's cancellation cancelled the shared round: wait again.

    def _round_for(self, seq: int) -> asyncio.Future[None]:
        """The future that resolves once `seq` is durable, starting an fdatasync if none runs."""
        if self._running is not None and seq <= self._target:
            if self._running.done():  # cancelled by a waiter that went away
                self._running = asyncio.get_running_loop().create_future()
            return self._running
        if self._next is None or self._next.done():
            self._next = asyncio.get_running_loop().create_future()
        waiting = self._next
        self._next_count += 1
        if self._syncing is None:
            if self._next_count >= self._quorum:
                self._start()
            else:
                self._kick_later()
        return waiting

    def _kick_later(self) -> None:
        """Start the next round once the loop has run what is ready now."""
        if not self._kick_pending:
            self._kick_pending = True
            asyncio.get_running_loop().call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_pending = False
        pending = self._next is not None and not self._next.done()
        if self._syncing is None and pending and self._failed is None:
            self._start()

    def _start(self) -> None:
        """Flush and hand the next round to the kernel or a worker thread."""
        waiters, self._next = self._next, None
        assert waiters is not None
        count, self._next_count = self._next_count, 0
        log = self.log
        try:
            log.flush()
        except OSError as error:
            if not waiters.done():
                waiters.set_exception(error)
            return
        self._running, self._target, self._running_count = waiters, log.flushed, count
        self.rounds += 1
        loop = asyncio.get_running_loop()
        self._syncing = self._kernel_sync(loop) or loop.run_in_executor(
            None, log.fdatasync_to, self._target
        )
        self._syncing.add_done_callback(self._synced)

    def _kernel_sync(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None] | None:
        """Submit the fdatasync to the kernel; None (and threads from now on) if refused."""
        if self._backends and self._kernel is None:
            self._kernel = open_kernel_sync(self._backends)
            self._backends = ()
        kernel = self._kernel
        if kernel is None:
            return None
        try:
            kernel.submit(self.log.fd)
        except OSError as error:
            logger.warning("kernel_sync_refused", error=str(error))
            self._close_kernel(loop)
            return None
        if not self._watching:
            loop.add_reader(kernel.eventfd, self._kernel_synced)
            self._watching = True
        return loop.create_future()

    def _kernel_synced(self) -> None:
        assert self._kernel is not None
        result = self._kernel.reap()
        syncing = self._syncing
        if result is None or syncing is None or syncing.done():
            return
        if result < 0:
            syncing.set_exception(OSError(-result, f"fdatasync: {os.strerror(-result)}"))
        else:
            self.log.synced_through(self._target)
            syncing.set_result(None)

    def _close_kernel(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._kernel is None:
            return
        if self._watching:
            loop.remove_reader(self._kernel.eventfd)
            self._watching = False
        self._kernel.close()
        self._kernel = None

    def _synced(self, syncing: asyncio.Future[None]) -> None:
        finished, self._running, self._syncing = self._running, None, None
        error: BaseException | None = asyncio.CancelledError() if syncing.cancelled() else None
        if error is None and isinstance(error := syncing.exception(), OSError):
            self._failed = error
            logger.error("fdatasync_failed", path=str(self.log.path), error=str(error))
        pending = self._next is not None and not self._next.done()
        self._quorum = max(1, (self._running_count + self._next_count) // 2)
        if pending and self._failed is None and self._next_count >= self._quorum:
            self._start()  # its disk work overlaps the woken waiters' next changes
        for waiters in (finished, self._next if self._failed else None):
            if waiters is not None and not waiters.done():
                if error is None:
                    waiters.set_result(None)
                else:
                    waiters.set_exception(error)
        if pending and self._syncing is None and self._failed is None:
            self._kick_later()  # queued after the waiters just woken

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
        while self._syncing is not None:  # `_synced` runs before `wait` returns
            await asyncio.wait([self._syncing])
        self._close_kernel(asyncio.get_running_loop())
