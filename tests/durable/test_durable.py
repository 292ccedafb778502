from __future__ import annotations

import asyncio
from pathlib import Path

from relay_durable.appendlog import AppendLog
from relay_durable.group_commit import GroupCommit


def test_append_log_keeps_order_and_counters(tmp_path: Path) -> None:
    log = AppendLog(tmp_path / "a.log")
    for n in range(1, 6):
        log.append(n, b"%d," % n)
    assert (log.written, log.flushed, log.synced) == (5, 0, 0)
    assert (tmp_path / "a.log").read_bytes() == b""  # still buffered
    log.sync_to(3)
    assert (log.flushed, log.synced) == (5, 5)
    log.append(6, b"6,")
    log.switch_to(tmp_path / "b.log")
    assert log.synced == 6
    log.append(7, b"7,")
    log.close()
    assert (tmp_path / "a.log").read_bytes() == b"1,2,3,4,5,6,"
    assert (tmp_path / "b.log").read_bytes() == b"7,"


def test_group_commit_shares_rounds_and_survives_a_cancelled_waiter(tmp_path: Path) -> None:
    async def run() -> None:
        log = AppendLog(tmp_path / "g.log")
        commit = GroupCommit(log)

        async def writer(n: int) -> int:
            log.append(n, b"x" * 10)
            await commit.durable(n)
            return n

        tasks = [asyncio.create_task(writer(n)) for n in range(1, 51)]
        await asyncio.sleep(0)
        tasks[10].cancel()  # one waiter goes away; the others must still complete
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[10], asyncio.CancelledError)
        assert [r for i, r in enumerate(results) if i != 10] == [n for n in range(1, 51) if n != 11]
        assert log.synced == 50
        await commit.close()
        log.close()

    asyncio.run(run())
