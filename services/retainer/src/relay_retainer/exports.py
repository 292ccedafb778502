"""Online exports at the retainer (`POST /admin/export`, an `admin` request with op `export`
on every partition of `relay.publications`): the retained messages and durable streams as of
a bounded cut of the publications, written as Parquet in the layout of `relayctl export`.

How (`relay_archive.tables.Cut.publications*`):
1. once the request has arrived on every partition this retainer owns (so each has a
   position), note `lower`: per partition, the offset after the last record received;
2. yield once, so that the operations started for records before `lower` hand their writes
   over (a stream write is handed over in its task's first step, a retained one at once), then
   wait until every write handed over so far is settled (`Rounds.settled`);
3. in one step of the event loop (no await), note `upper` the same way and hold the write
   rounds not started yet (`Rounds.hold`; writes are still handed over, the event loop runs
   on: reads, answers, the consumer), then take RocksDB checkpoints of the retained store and
   of every stream shard on a thread (hard links and a memtable flush), and release the
   rounds: writes wait for the checkpoints only, reported as `pause_ms`;
4. on a thread, export the checkpoint through the engines (`relay_archive.export`), write the
   cut, remove the checkpoint.

Invariants: everything received before `lower` is in the export; nothing received at or after
`upper` is (its write was handed over after `upper`, so into a round held until the
checkpoints were taken); what lies between may or may not be, and
the rebuild counts it as unanswered (uncertain). The consumer never waits for an export;
writes go on while it runs; each request id runs once and is answered once per partition.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import structlog

from relay_archive import export, tables
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
    ) -> None:
        self.bus = bus
        self.streams = streams
        self.retained = retained
        self.instance = instance
        self.data_dir = data_dir
        self.owned = set(owned)
        self.positions: dict[int, int] = {}
        """Partition → the offset after the last record the consumer handed over."""
        self._arrived: OrderedDict[str, tuple[set[int], asyncio.Event]] = OrderedDict()
        self._requests: OncePerId[dict[str, Any]] = OncePerId(REMEMBERED, "export")

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
    ) -> dict[str, Any]:
        left_s = max(0.0, (request.deadline_ms - schemas.now_ms_()) / 1000)
        await asyncio.wait_for(complete.wait(), left_s)
        return await self._requests.run(request.id, functools.partial(self._export, request))

    async def _export(self, request: schemas.AdminRequest) -> dict[str, Any]:
        started = time.perf_counter()
        lower = {p: self.positions[p] for p in sorted(self.owned)}
        await asyncio.sleep(0)  # operations started before `lower` hand their writes over
        await asyncio.gather(self.streams.settled(), self.retained.settled())
        folder = self.data_dir / "exports" / request.id
        copy = folder / f".checkpoint-{self.instance}"
        # One step of the event loop: `upper`, and no round starts writing from here until the
        # checkpoints are taken (a round already writing holds only writes before `upper`).
        upper = {p: self.positions[p] for p in sorted(self.owned)}
        at_ms = int(schemas.now_ms_())
        paused = time.perf_counter()
        self.streams.hold_writes()
        self.retained.hold_writes()
        try:
            await asyncio.to_thread(self._checkpoint, copy)
        finally:
            self.streams.release_writes()
            self.retained.release_writes()
        pause_ms = (time.perf_counter() - paused) * 1000
        cut = tables.Cut(self.bus.epoch or "", at_ms, None, lower, upper)
        counts = await asyncio.to_thread(self._write, copy, folder, cut)
        log.info("export_written", folder=str(folder), pause_ms=round(pause_ms, 3), **counts)
        return {
            "folder": str(folder),
            "epoch": cut.epoch,
            "at_ms": at_ms,
            "publications": {str(p): o for p, o in lower.items()},
            "publications_upto": {str(p): o for p, o in upper.items()},
            **counts,
            "pause_ms": round(pause_ms, 3),
            "total_s": round(time.perf_counter() - started, 3),
        }

    def _checkpoint(self, copy: Path) -> None:
        copy.mkdir(parents=True)
        self.streams.store.checkpoint(copy / "streams")
        self.retained.store.checkpoint(copy / "retained")

    def _write(self, copy: Path, folder: Path, cut: tables.Cut) -> dict[str, int]:
        try:
            retained = export.export_retainer(copy, folder, self.instance)
            export.write_retainer_cut(folder, self.instance, cut)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        part = folder / "streams" / f"{self.instance}.parquet"
        streams = pq.read_metadata(part).num_rows if part.exists() else 0
        return {"retained": retained, "streams": streams}

    async def _answer(
        self, request: schemas.AdminRequest, partition: int, result: dict[str, Any]
    ) -> None:
        await admin_replies.answer(self.bus, request, partition, self.instance, result)

    async def close(self) -> None:
        await self._requests.cancel()
