"""The retainer's write rounds as an online export uses them (`Rounds.settled`,
`Rounds.hold`): `settled` waits for every write handed over before it and for none after;
while held, writes are still handed over but no round starts writing until released."""

from __future__ import annotations

import asyncio

from relay_retainer.rounds import Rounds


async def test_settled_and_hold_give_the_export_its_barrier() -> None:
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

    rounds.hold()
    third = rounds.submit(3, lambda: False)  # handed over while held
    await asyncio.sleep(0.05)
    assert not third.done()
    assert applied == [[1], [2]]  # no round started writing
    rounds.release()
    await asyncio.wait_for(third, 5)
    assert applied == [[1], [2], [3]]
    await rounds.settled()  # nothing left: returns at once
    await rounds.stop()
