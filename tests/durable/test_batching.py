"""`relay_durable.batching.BatchLoop`: batches, order, close, failures."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from relay_durable.batching import BatchLoop


class Recorder:
    """A `handle` that records each batch and, while `gate` is clear, holds the first one."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def __call__(self, batch: list[int]) -> None:
        self.batches.append(batch)
        self.entered.set()
        await self.gate.wait()


async def test_what_is_put_while_a_batch_is_handled_becomes_the_next_batch() -> None:
    handle = Recorder()
    loop: BatchLoop[int] = BatchLoop(handle, "test")
    loop.start()
    assert loop.put(1)
    await handle.entered.wait()  # the first batch is being handled, and held
    for n in range(2, 7):
        assert loop.put(n)
    await asyncio.sleep(0.01)
    assert handle.batches == [[1]]  # one batch at a time: the rest waits
    handle.gate.set()
    await loop.close()
    assert handle.batches == [[1], [2, 3, 4, 5, 6]]
    assert loop.batches == 2


async def test_close_hands_over_everything_put_before_it_and_refuses_the_rest() -> None:
    handle = Recorder()
    handle.gate.set()
    loop: BatchLoop[int] = BatchLoop(handle, "test")
    assert not loop.put(0)  # not started
    loop.start()
    for n in range(1, 4):
        loop.put(n)
    closing = asyncio.ensure_future(loop.close())
    await asyncio.sleep(0)
    assert not loop.put(4)  # closing
    await closing
    assert [n for batch in handle.batches for n in batch] == [1, 2, 3]
    assert not loop.running
    loop.start()  # a closed loop does not start again
    assert not loop.put(5)


async def test_close_of_a_loop_never_started_returns() -> None:
    loop: BatchLoop[int] = BatchLoop(Recorder(), "test")
    await asyncio.wait_for(loop.close(), 1)


async def test_a_failing_batch_is_logged_and_the_next_one_is_handled() -> None:
    handled: list[list[int]] = []

    async def handle(batch: list[int]) -> None:
        handled.append(batch)
        if 1 in batch:
            raise OSError("fdatasync failed")

    loop: BatchLoop[int] = BatchLoop(handle, "test")
    loop.start()
    with capture_logs() as logs:
        loop.put(1)
        await asyncio.sleep(0.01)
        loop.put(2)
        await loop.close()
    assert handled == [[1], [2]]
    failed = [e for e in logs if e["event"] == "batch_failed"]
    assert len(failed) == 1
    assert (failed[0]["loop"], failed[0]["items"]) == ("test", 1)


async def test_order_is_kept_across_many_batches() -> None:
    seen: list[int] = []

    async def handle(batch: list[int]) -> None:
        seen.extend(batch)
        await asyncio.sleep(0)

    loop: BatchLoop[int] = BatchLoop(handle, "test")
    loop.start()
    for n in range(1000):
        loop.put(n)
        if n % 7 == 0:
            await asyncio.sleep(0)
    await loop.close()
    assert seen == list(range(1000))
    assert 1 < loop.batches < 1000


async def test_cancelling_close_cancels_the_loop() -> None:
    """A shutdown past its budget cancels `close()`: the batch being handled is cancelled and
    what waited behind it is never handed over."""
    handle = Recorder()
    loop: BatchLoop[int] = BatchLoop(handle, "test")
    loop.start()
    loop.put(1)
    await handle.entered.wait()
    loop.put(2)
    closer = asyncio.ensure_future(loop.close())
    await asyncio.sleep(0)
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    handle.gate.set()
    await asyncio.sleep(0.01)
    assert handle.batches == [[1]]
    assert not loop.put(3)
