"""Egress batching: messages from many `store_batch` calls become one write per shard.

After EMQX's egress buffer (`egress_batch_size`, `egress_flush_interval`). A `store_batch` adds
its messages to the buffer and:
- with `sync=True`, writes the buffer itself (or waits for the write in progress to finish and
  then writes what is left), and returns once its messages are durable: concurrent callers share
  one write and one fsync per shard (group commit);
- with `sync=False`, returns at once; the flusher thread writes the buffer when it holds
  `egress_batch_size` messages or its oldest message has waited `egress_flush_interval_ms`.

Invariants:
- messages are written in the order they were added, and writes never overlap (`_write_lock`);
- a caller's messages are acknowledged only by the write that contained them: if that write
  fails, every `sync=True` caller whose messages were in it gets `WriteFailed`; messages of
  `sync=False` callers in a failed write are lost and logged (they were never acknowledged);
- lock order: `_write_lock` before the database lock, never the other way round.

`rocksdict` keeps the GIL during a write and its fsync, so other threads cannot even add to the
buffer while a write runs; they queue right after it, and the next writer takes them all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

import structlog

from relay_streams.errors import Closed, WriteFailed

log = structlog.get_logger(__name__)

T = TypeVar("T")
_KEEP_FAILURES = 64


class Egress(Generic[T]):
    def __init__(
        self,
        write: Callable[[list[T]], None],
        batch_size: int,
        flush_interval_s: float,
        name: str,
    ) -> None:
        self._write = write
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._pending: list[T] = []
        self._oldest = 0.0
        self._added = 0
        """Messages ever added; a message's ticket is its index + 1."""
        self._done = 0
        """Tickets up to this one were in a finished write (succeeded or failed)."""
        self._failures: list[tuple[int, int, BaseException]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"egress-{name}", daemon=True)
        self._thread.start()

    def submit(self, items: Sequence[T], sync: bool) -> None:
        """Add items; with `sync`, return once a write containing them succeeded."""
        last = self.enqueue(items, sync)
        if sync and items:
            self.wait(last - len(items) + 1, last)

    def enqueue(self, items: Sequence[T], sync: bool) -> int:
        """Add items to the buffer; returns the ticket of the last one (for `wait`)."""
        with self._cond:
            if self._closed:
                raise Closed("the database is closed")
            if not items:
                return self._added
            if not self._pending:
                self._oldest = time.monotonic()
                self._cond.notify_all()  # the flusher starts timing the interval
            self._pending.extend(items)
            self._added += len(items)
            if not sync and len(self._pending) >= self.batch_size:
                self._cond.notify_all()
            return self._added

    def wait(self, first: int, last: int) -> None:
        """Write the buffer up to ticket `last` (or wait for the write that has it); raise
        `WriteFailed` if the write holding any ticket in first..last failed."""
        self._flush_to(last)
        self._raise_if_failed(first, last)

    def _flush_to(self, ticket: int) -> None:
        with self._write_lock:
            if self._done >= ticket:
                return
            self._write_pending()

    def _write_pending(self) -> None:
        """Write everything buffered (the caller holds `_write_lock`)."""
        with self._cond:
            batch, self._pending = self._pending, []
            last = self._added
        if not batch:
            return
        first = last - len(batch) + 1
        try:
            self._write(batch)
        except Exception as e:
            with self._cond:
                self._failures = [*self._failures[-_KEEP_FAILURES:], (first, last, e)]
            log.error("streams_write_failed", messages=len(batch), error=repr(e))
        finally:
            with self._cond:
                self._done = last
                self._cond.notify_all()

    def _raise_if_failed(self, first: int, last: int) -> None:
        with self._cond:
            for low, high, error in self._failures:
                if low <= last and first <= high:
                    raise WriteFailed(f"write failed, nothing acknowledged: {error}") from error

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Write what is buffered, then hold off every write until the block ends (for changes
        that must not interleave with writes: a new generation, deletes)."""
        with self._write_lock:
            self._write_pending()
            yield

    def flush(self) -> None:
        with self._cond:
            last = self._added
        self._flush_to(last)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._pending:
                        if len(self._pending) >= self.batch_size:
                            break
                        wait = self._oldest + self.flush_interval_s - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if self._closed:
                    return
            with self._write_lock:
                self._write_pending()

    def close(self) -> None:
        """Write what is buffered and stop the flusher. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        with self._write_lock:
            self._write_pending()
