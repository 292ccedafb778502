"""Run once per request id, answer per partition.

A request that every owner must answer (an admin dump, a `GET streams`, a retained `match`) is
sent to every partition of a topic; an owner of several partitions reads it several times, and
a record read again (a consumer retry, a broker that lost its log) comes back with the same id.
The owner runs the operation once per id and answers once per copy, so the asker knows every
partition's owner has answered when every partition has.

Invariants:
- `run(id, operation)` starts `operation()` the first time it sees `id`, and gives that same
  task to every later call with `id` while `id` is among the `remembered` latest ids started
  (an id older than those runs again: keep `remembered` above the copies in flight);
- `answer(outcome, reply)` never waits: a task of its own awaits `outcome`, then `reply(result)`.
  An outcome or reply that raises is logged (`what`) and not answered: the asker times out;
- every task is kept until it ends (none is garbage-collected while running); `drain(budget_s)`
  lets them end within the budget and cancels the rest, `cancel()` cancels them all.

Free of the Kafka client (only `relay_bus.clients` imports it): plain asyncio, usable by any
consumer's handler.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

import structlog

T = TypeVar("T")

log = structlog.get_logger(__name__)


class OncePerId(Generic[T]):
    def __init__(self, remembered: int, what: str) -> None:
        self.remembered = remembered
        self.what = what
        """Names the operations in logs and task names."""
        self._runs: OrderedDict[str, asyncio.Task[T]] = OrderedDict()
        self._answers: set[asyncio.Task[None]] = set()

    def run(
        self, request_id: str, operation: Callable[[], Coroutine[Any, Any, T]]
    ) -> asyncio.Task[T]:
        """The task running `request_id`'s operation: the remembered one, or `operation()` now."""
        run = self._runs.get(request_id)
        if run is None:
            run = asyncio.create_task(operation(), name=self.what)
            self._runs[request_id] = run
            while len(self._runs) > self.remembered:
                self._runs.popitem(last=False)
        return run

    def answer(self, outcome: Awaitable[T], reply: Callable[[T], Awaitable[object]]) -> None:
        """Call `reply` with `outcome`'s result once it has one, without waiting here."""
        task = asyncio.create_task(self._answer(outcome, reply), name=f"{self.what}-answer")
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    def handle(
        self,
        request_id: str,
        operation: Callable[[], Coroutine[Any, Any, T]],
        reply: Callable[[T], Awaitable[object]],
    ) -> None:
        """`answer` this copy of the request with the outcome of its id's one `run`."""
        self.answer(self.run(request_id, operation), reply)

    async def _answer(self, outcome: Awaitable[T], reply: Callable[[T], Awaitable[object]]) -> None:
        try:
            await reply(await outcome)
        except Exception:
            log.exception("request_not_answered", what=self.what)

    def _tasks(self) -> list[asyncio.Future[Any]]:
        return [*self._runs.values(), *self._answers]

    async def drain(self, budget_s: float) -> None:
        """Let running operations and answers end (within `budget_s`), then cancel the rest."""
        pending = [task for task in self._tasks() if not task.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=budget_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every operation and answer, and wait until they have ended."""
        tasks = self._tasks()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
