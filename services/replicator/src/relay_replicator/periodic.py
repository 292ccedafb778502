"""A background round run every `interval_s` until stopped (hint handoff, anti-entropy).

Invariant: a round that raises is logged and the next one still runs; `stop()` cancels the
round under way and returns once it has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger(__name__)


class Periodic:
    def __init__(self, name: str, interval_s: float, job: Callable[[], Awaitable[object]]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.job = job
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.job()
            except Exception:
                log.exception("round_failed", what=self.name)
