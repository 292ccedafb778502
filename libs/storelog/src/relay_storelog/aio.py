"""The store log for asyncio callers: changes under `FsyncPolicy.ALWAYS` wait for durability in
shared fsync rounds (`relay_durable.GroupCommit`), as the journal's writes do.

Invariant: the store itself is only touched from the event loop thread; the fsync runs on a
worker thread, and so does a dump's writing (see `relay_storelog.store`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relay_durable.group_commit import GroupCommit
from relay_durable.policy import FsyncPolicy
from relay_storelog.records import QueueRecord
from relay_storelog.store import StoreLog, StoreLogSettings


class AsyncStoreLog:
    def __init__(
        self,
        settings: StoreLogSettings,
        *,
        repair: bool = False,
        on_failed: Callable[[OSError], None] | None = None,
    ) -> None:
        """`on_failed`: told once when the log can no longer be made durable (fail-stop,
        `relay_durable.group_commit`)."""
        self.store = StoreLog(settings, repair=repair)
        self.store.auto_sync = False
        self.settings = settings
        self.commit = GroupCommit(self.store.file, on_failed=on_failed)

    async def durable(self, seq: int) -> None:
        if self.settings.fsync is FsyncPolicy.ALWAYS:
            await self.commit.durable(seq)

    async def new(self, record: QueueRecord) -> None:
        await self.durable(self.store.new(record))

    async def set_status(self, recipient_id: str, status: str, updated_at: int) -> None:
        await self.durable(self.store.set_status(recipient_id, status, updated_at))

    async def delete(self, recipient_id: str) -> None:
        await self.durable(self.store.delete(recipient_id))

    async def set_offsets(self, offsets: dict[str, Any]) -> None:
        await self.durable(self.store.set_offsets(offsets))

    def dump(self) -> int:
        return self.store.dump()

    async def close(self) -> None:
        await self.commit.close()
        self.store.close()
