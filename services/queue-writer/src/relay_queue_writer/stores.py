"""The queue-writer's stores on its volume: the queue journal and the store log, opened before
the service reports ready and closed after its consumers have stopped, plus the dump timer.

Invariant: readiness condition `stores` is true only while both stores are open, and a store
whose log can no longer be made durable stops the process (`exits.fail_stop`); a dump runs
every `dump_interval_s` (0 switches the timer off, for when the operator drives dumps).
Opening loads no queue: the journal replays only its log since the last checkpoint, and the
store log checks its latest dump and reads records from it when a command asks (decision
0018), so readiness comes as fast over a million queues as over ten, and a queue not read
yet is served like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import structlog

from relay_journal.aio import AsyncJournal
from relay_journal.settings import JournalSettings
from relay_queues import idempotency
from relay_runtime import exits
from relay_runtime.readiness import Readiness
from relay_storelog.aio import AsyncStoreLog
from relay_storelog.store import StoreLogCorrupt, StoreLogSettings

log = structlog.get_logger(__name__)


class Stores:
    def __init__(
        self,
        data_dir: Path,
        readiness: Readiness,
        dump_interval_s: float,
        *,
        repair: bool,
        idempotency_window_s: int = idempotency.DEFAULT_WINDOW_S,
    ) -> None:
        self.data_dir = data_dir
        self.idempotency_window_s = idempotency_window_s
        self.repair = repair
        self.readiness = readiness
        self.dump_interval_s = dump_interval_s
        self.journal: AsyncJournal | None = None
        self.store: AsyncStoreLog | None = None
        self._timer: asyncio.Task[None] | None = None
        readiness.register("stores")

    async def open(self) -> None:
        try:
            self.journal = AsyncJournal(
                JournalSettings(
                    root=self.data_dir / "journal", send_key_window_s=self.idempotency_window_s
                ),
                on_failed=exits.fail_stop,
            )
            await self.journal.start()
            self.store = AsyncStoreLog(
                StoreLogSettings(root=self.data_dir / "store"),
                repair=self.repair,
                on_failed=exits.fail_stop,
            )
        except StoreLogCorrupt as error:
            raise exits.StartupError(
                f"store log: {error}; RELAY_STORE_REPAIR=true starts anyway, skipping it",
                exits.EXIT_CONFIG,
            ) from None
        if self.dump_interval_s > 0:
            self._timer = asyncio.create_task(self._dump_every(), name="store-dump-timer")
        self.readiness.set("stores", True)

    async def _dump_every(self) -> None:
        while True:
            await asyncio.sleep(self.dump_interval_s)
            assert self.store is not None
            self.store.dump()

    async def close(self) -> None:
        self.readiness.set("stores", False)
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        if self.store is not None:
            await self.store.close()
        if self.journal is not None:
            await self.journal.close()
