"""The retainer's durable stream store (`relay_streams`) on its volume: opened before the
service reports ready, closed after its consumers have stopped, written in batches.

Writes: every `store` request waiting when the writer is free goes into one `store_batch` call
per database (sync: it returns once the WAL is fdatasync'ed), so requests arriving together
share one write and one fsync per shard; each message carries its request's log position into
its shard's write batch (`relay_streams.marks`: an online export's exact cut). Requests past
their deadline by the time the writer takes them are dropped unapplied: their asker has
answered 503 ("nothing was stored").

Why a single writer task rather than one `store_batch` per request: `rocksdict` keeps the GIL
during a write and its fsync (decision 0006), so each call stalls this process's event loop for
one fsync per touched shard, even from a worker thread. One call per round bounds the stalls to
one per round instead of one per request, and requests that come in meanwhile wait for the next
round instead of queueing behind each other. Rejected for now: hosting the store in a child
process (no stall at all, but a second process to supervise and every read and write copied
across a pipe); worth it if the stall ever shows in the consumer's latency.

Reads (`get_streams`, `make_iterator`, `next`) and replica bookkeeping run in worker threads:
they hold the GIL only in short stretches, so the event loop keeps consuming meanwhile.

Invariants: readiness condition `streams` is true only while the store is open; a write request
is answered only by the outcome of the write that contained its messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import structlog

from relay_ds.tokens import StreamIterator
from relay_retainer.rounds import Pending, Rounds, Watch
from relay_retainer.settings import StreamSettings
from relay_runtime import exits
from relay_runtime.readiness import Readiness
from relay_streams.errors import BadInput, Closed, StreamsError
from relay_streams.marks import Mark
from relay_streams.model import Message, NextResult, RankedStream
from relay_streams.partition_watch import Watches
from relay_streams.settings import DbSettings
from relay_streams.store import StreamStore

log = structlog.get_logger(__name__)


StreamWrite = tuple[str, list[Message | tuple[str, bytes]], Mark]
"""One request's write: its database, messages and its record's log position."""


def _by_db(writes: list[Pending[StreamWrite]]) -> list[list[Pending[StreamWrite]]]:
    by_db: dict[str, list[Pending[StreamWrite]]] = {}
    for write in writes:
        by_db.setdefault(write.write[0], []).append(write)
    return list(by_db.values())


class StreamHost:
    def __init__(
        self, root: Path, node: str, settings: StreamSettings, readiness: Readiness
    ) -> None:
        self.root = root
        self.node = node
        self.settings = settings
        self.readiness = readiness
        self._store: StreamStore | None = None
        self._rounds = Rounds(self._apply, (BadInput,), "streams-writer", group=_by_db)
        self.watches: Watches | None = None
        """Told of every message stored (the hand-off's, `relay_retainer.handoff`)."""
        readiness.register("streams")

    @property
    def store(self) -> StreamStore:
        if self._store is None:
            raise Closed("stream store not open")
        return self._store

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        try:
            self._store = await asyncio.to_thread(self._open)
        except StreamsError as error:
            raise exits.StartupError(f"stream store: {error}", exits.EXIT_CONFIG) from None
        except OSError as error:
            raise exits.StartupError(
                f"stream store {self.root} is not usable: {error}", exits.EXIT_OSERR
            ) from None
        self._rounds.start()
        self.readiness.set("streams", True)
        log.info("streams_open", root=str(self.root), dbs=self._store.storages())

    def _open(self) -> StreamStore:
        store = StreamStore(self.root, node=self.node)
        try:
            on_disk = set(store.list_dbs())
            for name in sorted(on_disk | set(self.settings.databases)):
                new = None if name in on_disk else DbSettings(shards=self.settings.shards)
                store.open_db(name, new)
        except BaseException:
            store.close()
            raise
        return store

    async def settled(self) -> None:
        """Return once every write handed over so far is settled (`Rounds.settled`)."""
        await self._rounds.settled()

    def watch(self) -> Watch:
        """`Rounds.watch`: how long the writes settled from now on waited."""
        return self._rounds.watch()

    def unwatch(self, watch: Watch) -> None:
        self._rounds.unwatch(watch)

    def recent_waits(self) -> list[tuple[float, float]]:
        """`Rounds.recent`."""
        return self._rounds.recent()

    async def stop_writing(self) -> None:
        """Finish the writes already handed over, then take no more (a drain hook)."""
        await self._rounds.stop()

    async def close(self) -> None:
        await self.stop_writing()
        self.readiness.set("streams", False)
        if self._store is not None:
            store, self._store = self._store, None
            await asyncio.to_thread(store.close)
            log.info("streams_closed")

    # -- writes ----------------------------------------------------------------------------

    async def store_batch(
        self,
        db: str,
        messages: Sequence[Message | tuple[str, bytes]],
        mark: Mark,
        expired: Callable[[], bool],
    ) -> None:
        """Return once `messages` are durable (raises the store's error otherwise, or `Expired`
        when the request's deadline passed before the writer took it); `mark`: the log
        position of their request."""
        self.store.db(db)  # NotFound before queueing
        await self._rounds.submit((db, list(messages), mark), expired)

    async def _apply(self, writes: list[StreamWrite]) -> None:
        """One round's writes to one database: one `store_batch`, synced."""
        messages = [m for _db, part, _mark in writes for m in part]
        marks = [mark for _db, part, mark in writes for _ in part]
        db = writes[0][0]
        stored = await asyncio.to_thread(self.store.store_batch, db, messages, True, marks)
        if self.watches is not None:
            self.watches.appended(db, stored)

    def held(self) -> AbstractAsyncContextManager[None]:
        """No write round within (`Rounds.held`)."""
        return self._rounds.held()

    # -- reads -----------------------------------------------------------------------------

    async def get_streams(self, db: str, topic_filter: str, start: int) -> list[RankedStream]:
        return await asyncio.to_thread(self.store.get_streams, db, topic_filter, start)

    async def make_iterator(
        self, db: str, stream: str, topic_filter: str, start: int
    ) -> StreamIterator:
        return await asyncio.to_thread(self.store.make_iterator, db, stream, topic_filter, start)

    async def next(self, db: str, iterator: str, n: int) -> NextResult:
        return await asyncio.to_thread(
            self.store.next, db, iterator, n, self.settings.max_reply_bytes
        )
