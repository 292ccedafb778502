"""The retainer's durable stream store (`relay_streams`) on its volume: opened before the
service reports ready, closed after its consumers have stopped, written in batches.

Writes: every `store` request waiting when the writer is free goes into one `store_batch` call
per database (sync: it returns once the WAL is fdatasync'ed), so requests arriving together
share one write and one fsync per shard. Requests past their deadline by the time the writer
takes them are dropped unapplied: their asker has answered 503 ("nothing was stored").

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
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from pydantic import BaseModel, Field

from relay_runtime import exits
from relay_runtime.readiness import Readiness
from relay_streams.errors import BadInput, StreamsError
from relay_streams.model import Message, NextResult, RankedStream, StreamIterator
from relay_streams.settings import MAX_SHARDS, DbSettings
from relay_streams.store import StreamStore

log = structlog.get_logger(__name__)


class StreamSettings(BaseModel):
    """The retainer's stream store (`RELAY_STREAMS__*`)."""

    databases: list[str] = ["messages"]
    """Databases opened (created if needed) at start; those already on disk open as well."""
    shards: int = Field(4, ge=1, le=MAX_SHARDS)
    """Shards of a database this retainer creates; fixed once the database exists."""
    max_reply_bytes: int = Field(393_216, ge=1024, le=700_000)  # bytes of topics and payloads
    """A `next` answer stops after the message that reaches this size, so that the reply
    (base64 payloads, JSON) stays under Kafka's 1 MiB record limit."""


class Expired(Exception):
    """A write request whose asker gave up before the writer reached it; nothing stored."""


@dataclass
class _Write:
    db: str
    messages: list[Message | tuple[str, bytes]]
    expired: Callable[[], bool]
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class StreamHost:
    def __init__(
        self, root: Path, node: str, settings: StreamSettings, readiness: Readiness
    ) -> None:
        self.root = root
        self.node = node
        self.settings = settings
        self.readiness = readiness
        self._store: StreamStore | None = None
        self._pending: list[_Write] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._stopping = False
        readiness.register("streams")

    @property
    def store(self) -> StreamStore:
        assert self._store is not None, "stream store not open"
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
        self._writer = asyncio.create_task(self._write_rounds(), name="streams-writer")
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

    async def stop_writing(self) -> None:
        """Finish the writes already handed over, then take no more (a drain hook)."""
        self._stopping = True
        self._wake.set()
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
            self._writer = None

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
        expired: Callable[[], bool],
    ) -> None:
        """Return once `messages` are durable (raises the store's error otherwise, or `Expired`
        when the request's deadline passed before the writer took it)."""
        self.store.db(db)  # NotFound before queueing
        if self._stopping:
            raise Expired("the retainer is stopping")
        write = _Write(db, list(messages), expired)
        self._pending.append(write)
        self._wake.set()
        await write.done

    async def _write_rounds(self) -> None:
        while True:
            if not self._pending:
                if self._stopping:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            batch, self._pending = self._pending, []
            by_db: dict[str, list[_Write]] = {}
            for write in batch:
                if write.expired():
                    write.done.set_exception(Expired("deadline passed before the write"))
                else:
                    by_db.setdefault(write.db, []).append(write)
            for db, writes in by_db.items():
                await self._write(db, writes)

    async def _write(self, db: str, writes: list[_Write]) -> None:
        messages = [m for write in writes for m in write.messages]
        try:
            await asyncio.to_thread(self.store.store_batch, db, messages, True)
        except BadInput as error:
            if len(writes) > 1:  # one request's messages refused: blame only that one
                for write in writes:
                    await self._write(db, [write])
                return
            _settle(writes, error)
        except Exception as error:
            _settle(writes, error)
        else:
            _settle(writes, None)

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


def _settle(writes: list[_Write], error: BaseException | None) -> None:
    for write in writes:
        if write.done.done():
            continue
        if error is None:
            write.done.set_result(None)
        else:
            write.done.set_exception(error)
