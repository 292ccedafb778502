"""Group commit for asyncio callers of an `AppendLog`.

Invariants:
- `durable(seq)` returns once the log is fdatasync'ed up to `seq`, or raises the error of the
  fdatasync (or flush) that was to cover it;
- a round is the records flushed when it starts; its fdatasync runs in the kernel
  (`relay_durable.kernel_sync`: io_uring, else native AIO) or, where the kernel refuses both,
  on a worker thread. N concurrent callers cost about one fdatasync per round, not N;
- at most `depth` rounds are in flight (1 by default; more only with io_uring). An
  fdatasync that finishes makes durable every record flushed before it started, so it
  releases every round started before it too, whatever order the kernel finishes them in;
- the event loop's work overlaps the disk's: callers settle into two halves, one appending
  while the other's fdatasync runs. When a round finishes, the next one starts at once if it
  already holds half of the callers; otherwise it starts when enough woken callers have
  joined it, or once the event loop has run everything that was ready (so nobody waits on a
  round that nobody starts). Starting each round only once the loop was idle left the disk
  idle while the loop ran and the loop idle while the disk synced. A worker thread keeps that
  rule all the same: it needs the GIL to start its fdatasync, which it gets only when the
  loop is idle;
- a failed fdatasync, or a failed flush before it, fails its round and every later one
  (fail-stop): after an fdatasync error the kernel may have dropped the dirty pages it could
  not write, so a later success would not prove the records before it durable. Reopening the
  log (a restart) recovers, so the owner is told once (`on_failed`: a service stops its
  process there rather than stay up answering every write with an error);
- every waiter of a round shares one future (no future or coroutine per caller); a caller's
  cancellation takes effect when its round ends and does not touch the other waiters;
- flushes happen on the event loop thread, so the log keeps its append order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Callable

import structlog

from relay_durable.appendlog import AppendLog
from relay_durable.kernel_sync import KernelSync, open_kernel_sync

logger = structlog.get_logger(__name__)


class _Round:
    __slots__ = ("count", "target", "waiters")

    def __init__(self, waiters: asyncio.Future[None], target: int, count: int) -> None:
        self.waiters = waiters
        self.target = target
        """The log is durable up to here once this round's fdatasync finishes."""
        self.count = count
        """Callers that joined it (a share of the callers, for the next round's quorum)."""


class _Shared(asyncio.Future[None]):
    """A round's future: awaited by many callers, so one caller's cancellation must not cancel
    it for the others (a Task cancels the future it awaits)."""

    def cancel(self, msg: object = None) -> bool:
        return False


class GroupCommit:
    def __init__(
        self,
        log: AppendLog,
        *,
        kernel_sync: tuple[str, ...] = ("uring", "aio"),
        depth: int = 1,
        on_failed: Callable[[OSError], None] | None = None,
    ) -> None:
        """`kernel_sync`: the `relay_durable.kernel_sync` backends to try, in order; none (or
        none accepted) means a worker thread. `depth`: rounds in flight at most, where the
        backend runs fdatasyncs beside each other (io_uring). 1 by default: on these 2-core
        machines a second fdatasync in flight took CPU from the event loop, and writers that
        each await their own write lost 10-15% (batches that wait once gained nothing)."""
        self.log = log
        self._backends = kernel_sync
        self._depth = depth
        self._limit = depth if kernel_sync else 1
        """Rounds that may be in flight with the backend in use (a worker thread: 1)."""
        self._kernel: KernelSync | None = None  # opened with the first round
        self._watching = False
        self._flying: list[_Round] = []
        """Rounds whose fdatasync has not yet made them durable, in start order."""
        self._ops: dict[int, asyncio.Future[None]] = {}
        """fdatasyncs in flight (a round released early by a later one may still have one)."""
        self._tags = 0
        self._next: asyncio.Future[None] | None = None
        """Waiters whose records no running fdatasync covers."""
        self._next_count = 0
        self._quorum = 1
        """Waiters the next round needs before it starts without waiting for the loop."""
        self._kick_pending = False
        self._failed: OSError | None = None
        self._on_failed = on_failed
        self._batcher: asyncio.Task[None] | None = None
        self.rounds = 0
        """fdatasync rounds started."""

    @property
    def backend(self) -> str:
        """Where fdatasyncs run: a `relay_durable.kernel_sync` backend's name, or "thread"."""
        return self._kernel.name if self._kernel is not None else "thread"

    @property
    def in_flight(self) -> int:
        """fdatasyncs running now."""
        return len(self._ops)

    def durable(self, seq: int) -> asyncio.Future[None]:
        """A future that resolves once the log is durable up to `seq`. It is shared by the
        round's waiters and ignores `cancel()`: a cancelled waiter's task is cancelled when
        the round ends, and the other waiters are not disturbed."""
        waiting = self._next
        if waiting is not None and seq > self.log.flushed:
            # The write path's case: a record no round covers yet joins the next one (which
            # exists only while nothing failed). If that round may start, a kick is pending
            # already (`_kick_later`): only the quorum is left to check.
            self._next_count += 1
            if self._next_count >= self._quorum and self._may_start():
                self._start()
            return waiting
        for flying in self._flying:
            if seq <= flying.target:
                return flying.waiters
        loop = asyncio.get_running_loop()
        if self._failed is not None or self.log.synced >= seq:
            done: asyncio.Future[None] = loop.create_future()
            if self._failed is not None:  # a new exception each time: no growing traceback
                failed = self._failed
                done.set_exception(OSError(failed.errno, f"an earlier fdatasync failed: {failed}"))
            else:
                done.set_result(None)
            return done
        if self._next is None:
            self._next = _Shared(loop=loop)
        waiting = self._next
        self._next_count += 1
        if self._may_start():
            if self._next_count >= self._quorum:
                self._start()
            else:
                self._kick_later()
        return waiting

    def _may_start(self) -> bool:
        return len(self._ops) < self._limit and self._failed is None

    def _kick_later(self) -> None:
        """Start the next round once the loop has run what is ready now."""
        if not self._kick_pending:
            self._kick_pending = True
            asyncio.get_running_loop().call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_pending = False
        if self._next is not None and self._may_start():
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
            self._fail(error, "flush_failed")
            return
        started = _Round(waiters, log.flushed, count)
        self._flying.append(started)
        self.rounds += 1
        loop = asyncio.get_running_loop()
        self._tags += 1
        tag = self._tags
        op = self._kernel_sync(loop, tag) or loop.run_in_executor(
            None, log.fdatasync_to, started.target
        )
        self._ops[tag] = op
        op.add_done_callback(functools.partial(self._synced, started, tag))

    def _kernel_sync(
        self, loop: asyncio.AbstractEventLoop, tag: int
    ) -> asyncio.Future[None] | None:
        """Submit the fdatasync to the kernel; None if refused (then it runs on a thread)."""
        if self._backends and self._kernel is None:
            self._kernel = open_kernel_sync(self._backends, depth=self._depth)
            self._backends = ()
            self._limit = min(self._depth, self._kernel.depth) if self._kernel else 1
        kernel = self._kernel
        if kernel is None:
            return None
        try:
            kernel.submit(self.log.fd, tag)
        except OSError as error:
            logger.warning("kernel_sync_refused", error=str(error))
            if not kernel.in_flight:
                self._close_kernel(loop)  # threads from now on
            return None  # this one on a thread
        if not self._watching:
            loop.add_reader(kernel.eventfd, self._kernel_synced)
            self._watching = True
        return loop.create_future()

    def _fail(self, error: OSError, event: str) -> None:
        """Fail this round and every later one; tell the owner at the first failure."""
        first = self._failed is None
        self._failed = error
        logger.error(event, path=str(self.log.path), error=str(error))
        if first and self._on_failed is not None:
            self._on_failed(error)

    def _kernel_synced(self) -> None:
        assert self._kernel is not None
        for tag, result in self._kernel.reap():
            op = self._ops.get(tag)
            if op is None or op.done():
                continue
            if result < 0:
                op.set_exception(OSError(-result, f"fdatasync: {os.strerror(-result)}"))
            else:
                op.set_result(None)

    def _close_kernel(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._kernel is None:
            return
        if self._watching:
            loop.remove_reader(self._kernel.eventfd)
            self._watching = False
        self._kernel.close()
        self._kernel = None
        self._limit = 1

    def _synced(self, finished: _Round, tag: int, op: asyncio.Future[None]) -> None:
        del self._ops[tag]
        error: BaseException | None = asyncio.CancelledError() if op.cancelled() else None
        if error is None and isinstance(error := op.exception(), OSError):
            self._fail(error, "fdatasync_failed")
        if error is None:
            self.log.synced_through(finished.target)
            released = [r for r in self._flying if r.target <= finished.target]
        else:
            released = [finished] if finished in self._flying else []
        if self._failed is not None:
            released = self._flying
        self._flying = [r for r in self._flying if r not in released]
        callers = self._next_count + sum(r.count for r in (*released, *self._flying))
        # A worker thread cannot start its fdatasync before the loop lets go of the GIL: there
        # a round starts only once the loop has run what was ready (the halves would not form).
        self._quorum = max(1, callers // 2) if self._kernel is not None else callers + 1
        pending = self._next is not None
        if pending and self._may_start() and self._next_count >= self._quorum:
            self._start()  # its disk work overlaps the woken waiters' next changes
        failed = []
        if self._failed is not None and self._next is not None:
            failed, self._next = [self._next], None
        for waiters in [r.waiters for r in released] + failed:
            if not waiters.done():
                if error is None:
                    waiters.set_result(None)
                else:
                    waiters.set_exception(error)
        if pending and self._may_start():
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
        while self._ops:  # `_synced` runs before `wait` returns
            await asyncio.wait(list(self._ops.values()))
        self._close_kernel(asyncio.get_running_loop())
