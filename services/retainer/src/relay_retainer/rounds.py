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
- `settled` waits for the writes handed over before it, and `hold` keeps rounds not yet
  started from writing until `release` (an online export's barrier and checkpoint).

The loop itself (a round is every write handed over while the previous one was written) is
`relay_durable.batching.BatchLoop`, shared with the queue-writer's outbox; this module adds what
is the retainer's own: deadlines, grouping and splitting a refused round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from relay_durable.batching import BatchLoop

W = TypeVar("W")


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
        self._open = asyncio.Event()
        self._open.set()

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
        return pending.done

    async def settled(self) -> None:
        """Return once every write handed over before this call is settled (whatever its
        outcome); writes handed over meanwhile are not waited for."""
        waiting = list(self._unsettled)
        if waiting:
            await asyncio.wait(waiting)

    async def stop(self) -> None:
        await self._loop.close()

    def hold(self) -> None:
        """Rounds that have not started wait until `release` (one already writing goes on);
        writes are still handed over meanwhile, and go into the next round."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def _round(self, batch: list[Pending[W]]) -> None:
        await self._open.wait()
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
