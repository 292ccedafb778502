"""One batching loop: what is put while a batch is being handled waits, and all of it becomes
the next batch, so N concurrent puts cost about one handling (one fsync, one store call), not N.

Invariants:
- `put` never waits; items are handed to `handle` in the order they were put, each exactly once,
  one batch at a time (the next batch starts when `handle` of the previous one has returned);
- a batch is everything put while the previous one was handled (or, when the loop was idle, what
  was put before it woke up);
- `handle` settles its items itself (answers, futures): an exception escaping it is logged with
  the batch's size and the loop goes on with the next batch, so one failure never leaves later
  items unhandled and unreported behind a dead task;
- `close()` hands over everything put before it, then stops; a put after `close()` (or before
  `start()`) is refused: `put` returns False and the item is never handed over. Cancelling
  `close()` (a shutdown past its budget) cancels the batch being handled and drops the rest.

Users: the retainer's group commit (`relay_retainer.rounds`) and the queue-writer's outbox
(`relay_queue_writer.outbox`). `GroupCommit` does not use it: its rounds run on callbacks,
without a task per batch, start on a quorum of waiters so that the event loop's work and the
disk's overlap, and may be several in flight; a loop that handles one batch at a time would
lose that (see its docstring and `bench/journal_bench.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import structlog

T = TypeVar("T")

log = structlog.get_logger(__name__)


class BatchLoop(Generic[T]):
    """`handle(batch)` is awaited for each batch, in a task named `name`."""

    def __init__(self, handle: Callable[[list[T]], Awaitable[object]], name: str) -> None:
        self._handle = handle
        self.name = name
        self._items: list[T] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.batches = 0
        """Batches handed to `handle` so far."""

    @property
    def running(self) -> bool:
        """Started and not closing: `put` takes items."""
        return self._task is not None and not self._closing

    def start(self) -> None:
        if self._task is None and not self._closing:
            self._task = asyncio.create_task(self._run(), name=self.name)

    def put(self, item: T) -> bool:
        """Queue `item` for the next batch; False (and nothing queued) unless running."""
        if self._task is None or self._closing:  # `running`, without a property call per put
            return False
        self._items.append(item)
        self._wake.set()
        return True

    async def close(self) -> None:
        """Handle everything put so far, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            if not self._items:
                if self._closing:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            batch, self._items = self._items, []
            self.batches += 1
            try:
                await self._handle(batch)
            except Exception:
                log.exception("batch_failed", loop=self.name, items=len(batch))
