"""Online exports at the retainer (`POST /admin/export`, an `admin` request with op `export`
on every partition of `relay.publications`): the retained messages and durable streams as of
an exact cut of the publications per store, written as Parquet in the layout of `relayctl
export`, without holding a write back.

How: every write carries its record's log position into its store's write batch (the marks
of the retained store and of each stream shard, `relay_streams.marks`), so any consistent view
of a store says exactly which records it holds.
1. once the request has arrived on every partition this retainer owns (so each has a
   position), note `lower` (per partition, the offset after the last record received), yield
   once (operations started for earlier records hand their writes over in their first step)
   and wait until the writes handed over so far are settled (`Rounds.settled`: a wait of the
   export, not of the writers);
2. in a child process (forked from a fork server: nothing of the running retainer is copied),
   open the retained store and every stream shard read-only as they stand
   (`relay_streams.reading`: RocksDB's read-only mode, no lock, nothing changed), and from
   each open read its marks and its data (`relay_archive.export.export_retainer_part`),
   written as the part's Parquet;
3. note `upper` and write the cut: exact per store from the marks (`tables.Cut.stores`).

Why a child and no checkpoint: `rocksdict` holds the GIL through every call, so a checkpoint
taken in the retainer's process (its final flush, links and fsyncs) and the reading of a copy
on a thread stalled every thread of the process, the writers' included, by tens of ms; the
child shares no GIL with the writers (decision 0012, "The retainer's exact cut").

Invariants: where a store's marks are known (every store made with marks) the cut is exact
for it; where not (a store from a build before marks, for a partition it holds no mark of),
everything received before `lower` is in the export and nothing received from `upper` on, and
the rebuild counts the window as unanswered. Nothing holds a write round: the longest time a
write waited from hand-over to its outcome while the export ran is reported (`pause_ms`),
with the same figure for as long a time right before it (`before_ms`), to compare. The
consumer never waits for an export; each request id runs once and is answered once per
partition.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import forkserver
from pathlib import Path
from typing import Literal

import structlog

from relay_archive import export, standing, tables
from relay_bus import admin_replies, schemas
from relay_bus.bus import Bus
from relay_bus.consumers import Received
from relay_bus.once import OncePerId
from relay_retainer.retained import RetainedHost
from relay_retainer.streams import StreamHost

log = structlog.get_logger(__name__)

REMEMBERED = 64
"""Export ids whose arrivals and outcome are kept for partitions that ask later."""


class RetainerExports:
    def __init__(
        self,
        bus: Bus,
        streams: StreamHost,
        retained: RetainedHost,
        instance: str,
        data_dir: Path,
        owned: Sequence[int],
        reader: Literal["process", "thread"] = "process",
    ) -> None:
        """`reader`: where the stores are read and written out (a thread only to compare,
        `bench/retainer_export_bench.py`)."""
        self.bus = bus
        self.streams = streams
        self.retained = retained
        self.instance = instance
        self.data_dir = data_dir
        self.owned = set(owned)
        self.reader = reader
        self.positions: dict[int, int] = {}
        """Partition → the offset after the last record the consumer handed over."""
        self._arrived: OrderedDict[str, tuple[set[int], asyncio.Event]] = OrderedDict()
        self._requests: OncePerId[schemas.RetainerPart] = OncePerId(REMEMBERED, "export")
        self._warming: asyncio.Task[None] | None = None

    def seen(self, received: Received) -> None:
        """Called by the consumer for every record, before it is handled."""
        self.positions[received.partition] = received.offset + 1

    def handle(self, received: Received, request: schemas.AdminRequest) -> None:
        if request.expired() or request.op != "export":
            return  # dumps and stats are the queue-writers'
        partitions, complete = self._arrived.get(request.id, (set(), asyncio.Event()))
        self._arrived[request.id] = (partitions, complete)
        while len(self._arrived) > REMEMBERED:
            self._arrived.popitem(last=False)
        partitions.add(received.partition)
        if partitions >= self.owned:
            complete.set()
        self._requests.answer(
            self._once_complete(request, complete),
            functools.partial(self._answer, request, received.partition),
        )

    async def _once_complete(
        self, request: schemas.AdminRequest, complete: asyncio.Event
    ) -> schemas.RetainerPart:
        left_s = max(0.0, (request.deadline_ms - schemas.now_ms_()) / 1000)
        await asyncio.wait_for(complete.wait(), left_s)
        return await self._requests.run(request.id, functools.partial(self._export, request))

    async def _export(self, request: schemas.AdminRequest) -> schemas.RetainerPart:
        started = time.perf_counter()
        recent = self.streams.recent_waits() + self.retained.recent_waits()
        watches = (self.streams.watch(), self.retained.watch())
        try:
            lower = {p: self.positions[p] for p in sorted(self.owned)}
            await asyncio.sleep(0)  # operations started before `lower` hand their writes over
            await asyncio.gather(self.streams.settled(), self.retained.settled())
            folder = self.data_dir / "exports" / request.id
            epoch = self.bus.epoch or ""
            partitions = sorted(self.owned)
            pool: Executor
            if self.reader == "process":
                pool = ProcessPoolExecutor(1, mp_context=_children())
            else:
                pool = ThreadPoolExecutor(1)
            try:
                # Submitted from a thread: starting a child waits for the fork server (the
                # first time, for it to start and import), which must not hold the event loop.
                future = await asyncio.to_thread(
                    pool.submit, read_part, self.data_dir, folder, self.instance, epoch, partitions
                )
                at_ms, part = await asyncio.wrap_future(future)
            finally:
                await asyncio.to_thread(pool.shutdown)  # the child's exit, off the event loop
            upper = {p: self.positions[p] for p in partitions}
            cut = tables.Cut(epoch, at_ms, None, lower, upper, part.stores, part.shards)
            await asyncio.to_thread(export.write_retainer_cut, folder, self.instance, cut)
            counts = {"retained": part.retained, "streams": part.streams}
            await asyncio.gather(self.streams.settled(), self.retained.settled())
        finally:
            self.streams.unwatch(watches[0])
            self.retained.unwatch(watches[1])
        pause_ms = max(watch.longest_ms for watch in watches)
        writes = sum(watch.writes for watch in watches)
        took = time.perf_counter() - started
        before_ms = max((ms for at, ms in recent if at >= started - took), default=0.0)
        exact = all(wanted <= set(cut.stores[p]) for p, wanted in _every_store(cut).items())
        log.info(
            "export_written",
            folder=str(folder),
            pause_ms=round(pause_ms, 3),
            before_ms=round(before_ms, 3),
            writes=writes,
            exact=exact,
            **counts,
        )
        return schemas.RetainerPart(
            folder=str(folder),
            epoch=cut.epoch,
            at_ms=at_ms,
            publications={str(p): o for p, o in (cut.publications or {}).items()},
            publications_upto={str(p): o for p, o in (cut.publications_upto or {}).items()},
            stores={str(p): by for p, by in cut.stores.items()},
            exact=exact,
            retained=part.retained,
            streams=part.streams,
            pause_ms=round(pause_ms, 3),
            writes_during=writes,
            before_ms=round(before_ms, 3),
            total_s=round(time.perf_counter() - started, 3),
        )

    async def _answer(
        self, request: schemas.AdminRequest, partition: int, result: schemas.AdminAnswer
    ) -> None:
        await admin_replies.answer(self.bus, request, partition, self.instance, result)

    async def warm(self) -> None:
        """Start the fork server now, off the event loop, so that the first export neither
        waits for a fresh interpreter to import its code nor has its writers compete with that
        start (an export with a short `timeout_s` right after the start timed out on it)."""
        if self.reader == "process":
            self._warming = asyncio.create_task(asyncio.to_thread(_start_children))

    async def close(self) -> None:
        await self._requests.cancel()


def _children() -> multiprocessing.context.BaseContext:
    """Where export children come from: a fork server (started once the retainer runs, itself a
    fresh interpreter, not a fork of the retainer) that has imported the export's code, so each
    child is a cheap fork of it rather than a new interpreter importing pyarrow and the rest
    while the writers compete with it for the CPU."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def _start_children() -> None:
    _children()
    forkserver.ensure_running()


def read_part(
    data_dir: Path, folder: Path, instance: str, epoch: str, partitions: list[int]
) -> tuple[int, export.RetainerPart]:
    """In the child: the wall-clock time, then the part read from the live stores opened
    read-only (`relay_archive.export.export_retainer_part`)."""
    at_ms = int(schemas.now_ms_())
    part = export.export_retainer_part(data_dir, folder, instance, epoch, partitions, True)
    return at_ms, part


def _every_store(cut: tables.Cut) -> dict[int, set[str]]:
    """Per partition, every store the cut should place: the retained store and each shard of
    each stream database."""
    return {
        p: {standing.RETAINED}
        | {
            standing.stream_store(db, s)
            for db, n in cut.shards.get(p, {}).items()
            for s in range(n)
        }
        for p in (cut.publications or {})
    }
