"""`relay_bus.once.OncePerId`: one run per request id, one answer per copy, drain and cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from structlog.testing import capture_logs

from relay_bus.once import OncePerId


class Operation:
    """Counts its runs; each run sets `started`, waits for `gate`, then returns its run number."""

    def __init__(self) -> None:
        self.runs = 0
        self.started = asyncio.Event()
        self.gate = asyncio.Event()

    async def __call__(self) -> int:
        self.runs += 1
        run = self.runs
        self.started.set()
        await self.gate.wait()
        return run


class Replies:
    def __init__(self) -> None:
        self.got: list[tuple[str, int]] = []

    def to(self, partition: str) -> Callable[[int], Awaitable[None]]:
        async def reply(result: int) -> None:
            self.got.append((partition, result))

        return reply


async def test_each_id_runs_once_and_every_copy_is_answered() -> None:
    once: OncePerId[int] = OncePerId(8, "test")
    operation, replies = Operation(), Replies()
    for partition in ("p0", "p1", "p2"):
        once.handle("request-1", operation, replies.to(partition))
    await asyncio.wait_for(operation.started.wait(), 1)  # the copies' tasks ran before this
    assert (operation.runs, replies.got) == (1, [])  # handle does not wait for the operation
    operation.gate.set()
    await once.drain(1)
    assert operation.runs == 1
    assert sorted(replies.got) == [("p0", 1), ("p1", 1), ("p2", 1)]
    once.handle("request-1", operation, replies.to("p0"))  # read again: the first run's answer
    await once.drain(1)
    assert operation.runs == 1
    assert replies.got[-1] == ("p0", 1)


async def test_only_the_latest_ids_are_remembered() -> None:
    once: OncePerId[int] = OncePerId(2, "test")
    operation, replies = Operation(), Replies()
    operation.gate.set()
    for request_id in ("a", "b", "c", "b", "a"):
        once.handle(request_id, operation, replies.to(request_id))
        await once.drain(1)
    # a, b, c run; b is among the two latest and answered from memory; a was forgotten.
    assert replies.got == [("a", 1), ("b", 2), ("c", 3), ("b", 2), ("a", 4)]


async def test_a_failing_operation_is_logged_and_not_answered() -> None:
    once: OncePerId[int] = OncePerId(8, "test")
    replies = Replies()

    async def failing() -> int:
        raise ValueError("unknown admin operation")

    async def fine() -> int:
        return 7

    with capture_logs() as logs:
        once.handle("bad", failing, replies.to("p0"))
        once.handle("good", fine, replies.to("p0"))
        await once.drain(1)
    assert replies.got == [("p0", 7)]
    assert [(e["event"], e["what"]) for e in logs] == [("request_not_answered", "test")]


async def test_answer_of_an_outcome_that_is_not_run_per_id() -> None:
    once: OncePerId[int] = OncePerId(8, "test")
    replies = Replies()
    outcome: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    once.answer(outcome, replies.to("p3"))
    await asyncio.sleep(0)
    assert replies.got == []
    outcome.set_result(5)
    await once.drain(1)
    assert replies.got == [("p3", 5)]


async def test_drain_cancels_what_does_not_end_within_the_budget() -> None:
    once: OncePerId[int] = OncePerId(8, "test")
    slow, quick, replies = Operation(), Operation(), Replies()
    quick.gate.set()
    once.handle("slow", slow, replies.to("p0"))
    once.handle("quick", quick, replies.to("p1"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await once.drain(0.2)
    assert 0.15 <= loop.time() - started < 2
    assert replies.got == [("p1", 1)]
    slow.gate.set()
    await asyncio.sleep(0.01)
    assert replies.got == [("p1", 1)]  # the slow one was cancelled, never answered
    assert once.run("slow", slow).cancelled()


async def test_cancel_ends_everything() -> None:
    once: OncePerId[int] = OncePerId(8, "test")
    operation, replies = Operation(), Replies()
    once.handle("r", operation, replies.to("p0"))
    await asyncio.wait_for(operation.started.wait(), 1)
    await asyncio.wait_for(once.cancel(), 1)
    operation.gate.set()
    await asyncio.sleep(0.01)
    assert replies.got == []
    assert once.run("r", operation).cancelled()
