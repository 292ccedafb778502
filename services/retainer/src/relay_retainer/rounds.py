"""Group commit for the retainer's stores: writes handed over while a round is being written
wait together and go into the next round, one store call (and one fsync) for all of them.

Invariants:
- each write is settled exactly once: by the outcome of the round that contained it, or with
  `Expired` when its asker's deadline passed before a round took it (it was not applied), or
  when the writer has stopped;
- writes are applied in the order they were handed over;
- a round refused as a whole for one write's sake (`split_on`) is applied again one write at a
  time, in order, so only the offending writes are refused;
- `stop` finishes the writes already handed over, then takes no more;
- `settled` waits for the writes handed over before it; only `held` holds the rounds back (a
  hand-off settling its copy of a partition, for the time of reading again what was written
  while it collected; an online export reads the stores' marks from read-only opens instead:
  `relay_streams.marks`);
- a `Watch` sees how long each write settled while it is on waited from hand-over to its
  outcome (an export reports the longest), and `recent` keeps the same of the last `RECENT`
  writes settled (the export's baseline, taken before it starts).

The loop itself (a round is every write handed over while the previous one was written) is
`relay_durable.batching.BatchLoop`, shared with the queue-writer's outbox; this module adds what
is the retainer's own: deadlines, grouping and splitting a refused round.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from relay_durable.batching import BatchLoop

W = TypeVar("W")

RECENT = 4096
"""Writes whose settle time and wait are kept for `recent`."""


class Expired(Exception):
    """A write whose asker gave up before the writer reached it, or one handed over after the
    writer stopped; nothing stored."""


@dataclass
class Pending(Generic[W]):
    write: W
    expired: Callable[[], bool]
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    handed: float = field(default_factory=time.perf_counter)


@dataclass(eq=False)  # each watch is itself: `unwatch` removes this one
class Watch:
    """Writes settled while watched: how many, and the longest wait from hand-over."""

    writes: int = 0
    longest_ms: float = 0.0


class Rounds(Generic[W]):
    """`apply(writes)` writes a round (raising settles every write of it with the error);
    `group(writes)` splits a round into calls (by database, say), applied one after another."""

    def __init__(
        self,
        apply: Callable[[list[W]], Awaitable[object]],
        split_on: tuple[type[BaseException], ...],
        name: str,
        group: Callable[[list[Pending[W]]], Sequence[list[Pending[W]]]] = lambda ws: [ws],
    ) -> None:
        self._apply = apply
        self._split_on = split_on
        self._group = group
        self._loop: BatchLoop[Pending[W]] = BatchLoop(self._round, name)
        self._unsettled: set[asyncio.Future[None]] = set()
        self._watches: list[Watch] = []
        self._recent: deque[tuple[float, float]] = deque(maxlen=RECENT)
        self._writing = asyncio.Lock()

    def start(self) -> None:
        self._loop.start()

    def submit(self, write: W, expired: Callable[[], bool]) -> asyncio.Future[None]:
        """Hand a write over; the future settles once it is durable, or with its refusal."""
        pending = Pending(write, expired)
        if not self._loop.put(pending):
            pending.done.set_exception(Expired("the retainer is stopping"))
        else:
            self._unsettled.add(pending.done)
            pending.done.add_done_callback(self._unsettled.discard)
            pending.done.add_done_callback(lambda _: self._waited(pending))
        return pending.done

    def watch(self) -> Watch:
        """Start watching the writes handed over from now on, until `unwatch`."""
        watch = Watch()
        self._watches.append(watch)
        return watch

    def unwatch(self, watch: Watch) -> None:
        self._watches.remove(watch)

    def recent(self) -> list[tuple[float, float]]:
        """The last `RECENT` writes settled: (when, `time.perf_counter`; ms waited)."""
        return list(self._recent)

    def _waited(self, pending: Pending[W]) -> None:
        now = time.perf_counter()
        waited_ms = (now - pending.handed) * 1000
        self._recent.append((now, waited_ms))
        for watch in self._watches:
            watch.writes += 1
            watch.longest_ms = max(watch.longest_ms, waited_ms)

    async def settled(self) -> None:
        """Return once every write handed over before this call is settled (whatever its
        outcome); writes handed over meanwhile are not waited for."""
        waiting = list(self._unsettled)
        if waiting:
            await asyncio.wait(waiting)

    async def stop(self) -> None:
        await self._loop.close()

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """No round is written within (the one in progress, and what it runs after its store
        call, finish first); writes handed over meanwhile wait for the next."""
        async with self._writing:
            yield

    async def _round(self, batch: list[Pending[W]]) -> None:
        async with self._writing:
            await self._written(batch)

    async def _written(self, batch: list[Pending[W]]) -> None:
        live = []
        for pending in batch:
            if pending.expired():
                pending.done.set_exception(Expired("deadline passed before the write"))
            else:
                live.append(pending)
        for part in self._group(live) if live else []:
            await self._write(part)

    async def _write(self, writes: list[Pending[W]]) -> None:
        try:
            await self._apply([w.write for w in writes])
        except self._split_on as error:
            if len(writes) == 1:
                _settle(writes, error)
                return
            for write in writes:
                await self._write([write])
        except Exception as error:
            _settle(writes, error)
        else:
            _settle(writes, None)


def _settle(writes: list[Pending[W]], error: BaseException | None) -> None:
    for write in writes:
        if write.done.done():
            continue
        if error is None:
            write.done.set_result(None)
        else:
            write.done.set_exception(error)
