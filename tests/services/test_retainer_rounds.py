"""The retainer's write rounds as an online export uses them (`Rounds.settled`,
`Rounds.watch`): `settled` waits for every write handed over before it and for none after; a
watch sees how long the writes settled while it was on waited, and no others;
`recent` keeps the same of the last writes."""

from __future__ import annotations

import asyncio
import time

from relay_retainer.rounds import Rounds


async def test_settled_gives_the_export_its_barrier_and_a_watch_its_waits() -> None:
    applied: list[list[int]] = []
    gate = asyncio.Event()

    async def apply(writes: list[int]) -> None:
        await gate.wait()
        applied.append(writes)

    rounds: Rounds[int] = Rounds(apply, (), "test-rounds")
    rounds.start()
    first = rounds.submit(1, lambda: False)
    await asyncio.sleep(0.01)  # round [1] is writing (waits for the gate)
    second = rounds.submit(2, lambda: False)
    settled = asyncio.ensure_future(rounds.settled())
    await asyncio.sleep(0.01)
    assert not settled.done()
    gate.set()
    await asyncio.wait_for(settled, 5)
    assert first.done()
    assert second.done()
    assert applied == [[1], [2]]

    watch = rounds.watch()
    since = time.perf_counter()
    gate.clear()
    third = rounds.submit(3, lambda: False)
    await asyncio.sleep(0.05)  # round [3] waits 50 ms for the gate
    gate.set()
    await asyncio.wait_for(third, 5)
    rounds.unwatch(watch)
    assert watch.writes == 1
    assert 50 <= watch.longest_ms < 5000
    assert max(ms for at, ms in rounds.recent() if at >= since) == watch.longest_ms
    await asyncio.wait_for(rounds.submit(4, lambda: False), 5)  # not watched
    assert watch.writes == 1
    assert applied == [[1], [2], [3], [4]]
    await rounds.settled()  # nothing left: returns at once
    await rounds.stop()
