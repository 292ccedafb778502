"""Admin requests at the queue-writer: store-log dumps, online exports and queue stats on
demand.

Invariants:
- the ingress sends one copy of a request to every command partition; this instance runs the
  operation once per request id and answers once per partition it received it on, so the asker
  knows every owner has answered (`relay_bus.once.OncePerId`);
- the command consumer never waits for an operation: answers are sent by background tasks, and
  a request past its deadline is dropped (its asker has already given up);
- a dump triggered while one runs reports the running one (`StoreLog.dump`);
- stats walk the queues on disk in slices, letting commands run in between;
- an export captures the state at one command boundary (`relay_archive.capture`: the cut is
  the assigned partitions' positions at that boundary, exact), reads it in slices while
  commands go on (each command reads the queue it changes first, if not read yet), holds
  expiry sweeps off meanwhile, and writes the Parquet part on a thread.
"""

from __future__ import annotations

import asyncio
import functools
import time

import structlog

from relay_archive import capture, export, tables
from relay_bus import admin_replies, schemas
from relay_bus.bus import Bus
from relay_bus.consumers import Received
from relay_bus.once import OncePerId
from relay_queue_writer.commands import Commands
from relay_queue_writer.stores import Stores
from relay_queues import ids

log = structlog.get_logger(__name__)

STATS_SLICE = 256
"""Queues counted between two yields to the event loop."""
EXPORT_SLICE = 64
"""Queues an export reads between two yields to the event loop."""
REMEMBERED = 64
"""Request ids whose operation is kept for partitions that ask later."""


class AdminRequests:
    def __init__(self, bus: Bus, stores: Stores, instance: str, commands: Commands) -> None:
        self.bus = bus
        self.stores = stores
        self.instance = instance
        self.commands = commands
        self._requests: OncePerId[schemas.AdminAnswer] = OncePerId(REMEMBERED, "admin")

    async def handle(self, received: Received, request: schemas.AdminRequest) -> None:
        if request.expired():
            return
        self._requests.handle(
            request.id,
            functools.partial(self._run, request),
            functools.partial(self._answer, request, received.partition),
        )

    async def _run(self, request: schemas.AdminRequest) -> schemas.AdminAnswer:
        if request.op == "dump":
            return await self._dump(request.wait)
        if request.op == "stats":
            return await self._stats()
        if request.op == "export":
            return await self._export(request)
        raise ValueError(f"unknown admin operation {request.op!r}")

    async def _stats(self) -> schemas.QueueWriterStats:
        journal, store = self.stores.journal, self.stores.store
        assert journal is not None
        assert store is not None
        messages = size = 0
        for n, (_, count, span) in enumerate(journal.journal.stats(), 1):
            messages += count
            size += span
            if n % STATS_SLICE == 0:
                await asyncio.sleep(0)
        return schemas.QueueWriterStats(
            queues=len(store.store.queues),
            messages=messages,
            bytes=size,
            open_queues=journal.journal.open_queues,
        )

    async def _export(self, request: schemas.AdminRequest) -> schemas.QueuePart:
        journal, store = self.stores.journal, self.stores.store
        assert journal is not None
        assert store is not None
        folder = self.stores.data_dir / "exports" / request.id
        started = time.perf_counter()
        async with self.commands.sweep_lock:
            # One command boundary: no await between the view, the positions and the hook.
            cut = tables.Cut(
                self.bus.epoch or "", int(schemas.now_ms_()), self.commands.positions()
            )
            serving = set(cut.offsets or {})
            partitions = self.commands.partitions
            taking = capture.QueueCapture(
                journal.journal,
                store.store.queues,
                cut,
                served=lambda queue: ids.partition_of(queue, partitions) in serving,
            )
            self.commands.before_change = taking.before_change
            try:
                finished = taking.step(EXPORT_SLICE)
                while not finished:
                    await asyncio.sleep(0)  # commands run between slices
                    finished = taking.step(EXPORT_SLICE)
            finally:
                self.commands.before_change = None
        read_s = time.perf_counter() - started
        got = taking.captured
        await asyncio.to_thread(
            export.write_queue_part, folder, self.instance, got.queues, got.messages, cut
        )
        log.info(
            "export_written",
            folder=str(folder),
            queues=len(got.queues),
            messages=len(got.messages),
            longest_ms=round(got.longest_ms, 3),
        )
        return schemas.QueuePart(
            folder=str(folder),
            epoch=cut.epoch,
            at_ms=cut.at_ms,
            offsets={str(p): o for p, o in sorted((cut.offsets or {}).items())},
            queues=len(got.queues),
            messages=len(got.messages),
            early=got.early,
            longest_ms=round(got.longest_ms, 3),
            read_s=round(read_s, 3),
            total_s=round(time.perf_counter() - started, 3),
        )

    async def _dump(self, wait: bool) -> schemas.DumpStarted | schemas.DumpFinished:
        store = self.stores.store
        assert store is not None
        number = store.dump()
        if not wait:
            return schemas.DumpStarted(dump=number)
        done = await asyncio.to_thread(store.store.wait_dump)
        assert done is not None
        return schemas.DumpFinished(
            dump=number,
            records=done.records,
            bytes=done.bytes,
            pause_ms=round(done.pause_ms, 3),
            total_s=round(done.total_s, 3),
        )

    async def _answer(
        self, request: schemas.AdminRequest, partition: int, result: schemas.AdminAnswer
    ) -> None:
        await admin_replies.answer(self.bus, request, partition, self.instance, result)

    async def close(self) -> None:
        await self._requests.cancel()
