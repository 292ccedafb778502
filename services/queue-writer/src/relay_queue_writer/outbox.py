"""Answers and events leave only once what they report is durable, in the order they were made.

Invariants:
- a record put here is sent after the journal is durable up to its `lsn` and the store log up
  to its `seq` (BRIEF §4: a 2xx means fsynced);
- records are handed to the producer in the order they were put (`Bus.post`), so the events
  of one queue reach its partition in the order the queue-writer applied its commands; a
  record the broker does not take is lost: its asker gets 503, delivery resyncs from its
  subscriptions;
- putting never waits: concurrent commands share fsync rounds (one round covers everything put
  while the previous round ran) and produce round trips.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from relay_bus import schemas
from relay_bus.bus import Bus
from relay_journal.aio import AsyncJournal
from relay_storelog.aio import AsyncStoreLog


@dataclass(frozen=True)
class Send:
    topic: str
    record: schemas.Record
    partition: int


class Outbox:
    def __init__(self, bus: Bus, journal: AsyncJournal, store: AsyncStoreLog) -> None:
        self.bus = bus
        self.journal = journal
        self.store = store
        self._pending: deque[tuple[int | None, int | None, list[Send]]] = deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._task = asyncio.create_task(self._run(), name="outbox")

    def put(self, lsn: int | None, seq: int | None, sends: list[Send]) -> None:
        if sends:
            self._pending.append((lsn, seq, sends))
            self._wake.set()

    async def _run(self) -> None:
        while True:
            if not self._pending:
                if self._closing:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            batch = list(self._pending)
            self._pending.clear()
            lsns = [lsn for lsn, _, _ in batch if lsn is not None]
            seqs = [seq for _, seq, _ in batch if seq is not None]
            await asyncio.gather(
                self.journal.durable(max(lsns)) if lsns else asyncio.sleep(0),
                self.store.durable(max(seqs)) if seqs else asyncio.sleep(0),
            )
            for _, _, sends in batch:
                for send in sends:
                    self.bus.post(send.topic, send.record, partition=send.partition)

    async def close(self) -> None:
        """Send everything put so far (once durable), then stop."""
        self._closing = True
        self._wake.set()
        await self._task
