from __future__ import annotations

import asyncio
import errno
import os
import select
from pathlib import Path

import pytest

from relay_durable.appendlog import AppendLog
from relay_durable.group_commit import GroupCommit
from relay_durable.kernel_sync import open_kernel_sync


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


BACKENDS = [("uring",), ("aio",), ()]
"""The fdatasync paths of `GroupCommit`: io_uring, native AIO, and a worker thread (no kernel
backend). Each is checked to be the one in use: a host refusing one would otherwise make a
test of it pass on another."""


def _backend(commit: GroupCommit) -> str:
    kernel = commit._kernel  # which path ran is the point of the check
    return kernel.name if kernel is not None else "thread"


@pytest.mark.parametrize("backends", BACKENDS, ids=["uring", "aio", "thread"])
def test_group_commit_shares_rounds_and_survives_a_cancelled_waiter(
    tmp_path: Path, backends: tuple[str, ...]
) -> None:
    async def run() -> None:
        log = AppendLog(tmp_path / "g.log")
        commit = GroupCommit(log, kernel_sync=backends)

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
        assert _backend(commit) == (backends[0] if backends else "thread")
        await commit.close()
        log.close()

    asyncio.run(run())


@pytest.mark.parametrize("backends", BACKENDS, ids=["uring", "aio", "thread"])
def test_group_commit_overlaps_the_disk_with_the_woken_writers(
    tmp_path: Path, backends: tuple[str, ...]
) -> None:
    """Writers that each wait for their own change settle into two halves: when a round ends,
    the next one's fdatasync is already running as its writers wake. (Starting each round only
    once the woken writers had all appended left the disk idle while they ran, and the loop
    idle while it synced.)"""

    async def run() -> tuple[int, int, int]:
        log = AppendLog(tmp_path / "o.log")
        commit = GroupCommit(log, kernel_sync=backends)
        seq = 0
        overlapped = woken = 0

        async def writer() -> None:
            nonlocal seq, overlapped, woken
            for _ in range(20):
                seq += 1
                log.append(seq, b"x" * 256)
                await commit.durable(seq)
                woken += 1
                overlapped += commit._syncing is not None

        await asyncio.gather(*(writer() for _ in range(100)))
        rounds = commit.rounds
        await commit.close()
        log.close()
        assert log.synced == seq == 2000
        return overlapped, woken, rounds

    overlapped, woken, rounds = asyncio.run(run())
    assert overlapped > woken * 0.7, (overlapped, woken)
    assert rounds <= 2000 / 40, rounds  # shared: about two rounds per 100 writes


@pytest.mark.parametrize("backends", BACKENDS, ids=["uring", "aio", "thread"])
def test_a_failed_fdatasync_fails_its_waiters_and_every_later_one(
    tmp_path: Path, backends: tuple[str, ...]
) -> None:
    """A real fdatasync error: the log's descriptor is made a pipe's, which the kernel cannot
    fdatasync (EINVAL). After it, nothing is reported durable, even once the file is back."""

    async def run() -> None:
        log = AppendLog(tmp_path / "f.log")
        commit = GroupCommit(log, kernel_sync=backends)
        log.append(1, b"a")
        await commit.durable(1)
        log.append(2, b"b")
        log.flush()  # written to the file; only its fdatasync is left
        saved = os.dup(log.fd)
        read_end, write_end = os.pipe()
        os.dup2(read_end, log.fd)
        results = await asyncio.gather(
            *(commit.durable(2) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, OSError) and r.errno == errno.EINVAL for r in results), results
        os.dup2(saved, log.fd)
        log.append(3, b"c")
        with pytest.raises(OSError, match="Invalid argument"):
            await commit.durable(3)
        assert log.synced == 1
        await commit.close()
        for fd in (saved, read_end, write_end):
            os.close(fd)
        log.close()

    asyncio.run(run())


@pytest.mark.parametrize("name", ["uring", "aio"])
def test_kernel_sync_reports_each_fdatasync_once_with_its_result(tmp_path: Path, name: str) -> None:
    sync = open_kernel_sync((name,))
    assert sync is not None
    assert sync.name == name
    fd = os.open(tmp_path / "k.log", os.O_WRONLY | os.O_CREAT, 0o600)
    read_end, write_end = os.pipe()
    try:
        assert sync.reap() is None  # nothing in flight
        os.write(fd, b"x" * 4096)
        sync.submit(fd)
        with pytest.raises(RuntimeError):
            sync.submit(fd)  # one at a time
        assert select.select([sync.eventfd], [], [], 5)[0]  # the eventfd tells it finished
        assert sync.reap() == 0
        assert sync.reap() is None  # reported once
        try:  # a pipe cannot be fdatasync'ed: io_uring says so in the result, AIO at once
            sync.submit(read_end)
            result = sync.reap(wait=True)
        except OSError as error:
            result = -(error.errno or 0)
        assert result == -errno.EINVAL
        sync.submit(fd)
    finally:
        sync.close()  # waits for the one in flight
        for each in (fd, read_end, write_end):
            os.close(each)
    assert sync.eventfd == -1
