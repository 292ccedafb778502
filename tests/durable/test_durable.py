from __future__ import annotations

import asyncio
import errno
import os
import select
from pathlib import Path

import pytest

from relay_durable.appendlog import AppendLog
from relay_durable.group_commit import GroupCommit
from relay_durable.kernel_sync import KernelSync, open_kernel_sync


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


def test_a_held_record_goes_out_only_with_a_later_one(tmp_path: Path) -> None:
    log = AppendLog(tmp_path / "h.log")
    log.append(1, b"1,")
    log.append(2, b"m2,", hold=True)
    log.append(3, b"m3,", hold=True)
    log.flush(keep_held=True)
    assert (tmp_path / "h.log").read_bytes() == b"1,"
    assert log.flushed == 1
    log.append(4, b"4,")  # not held: the marks go out with it
    log.flush(keep_held=True)
    assert (tmp_path / "h.log").read_bytes() == b"1,m2,m3,4,"
    assert log.flushed == 4
    log.append(5, b"m5,", hold=True)
    log.sync_to(5)  # an explicit sync writes a held tail too
    assert (log.flushed, log.synced) == (5, 5)
    log.close()
    assert (tmp_path / "h.log").read_bytes() == b"1,m2,m3,4,m5,"


BACKENDS = [(("uring",), 1), (("uring",), 2), (("aio",), 1), ((), 1)]
BACKEND_IDS = ["uring", "uring-depth-2", "aio", "thread"]
"""The fdatasync paths of `GroupCommit`: io_uring, native AIO, and a worker thread (no kernel
backend). Each is checked to be the one in use: a host refusing one would otherwise make a
test of it pass on another."""


@pytest.mark.parametrize(("backends", "depth"), BACKENDS, ids=BACKEND_IDS)
def test_group_commit_shares_rounds_and_survives_a_cancelled_waiter(
    tmp_path: Path, backends: tuple[str, ...], depth: int
) -> None:
    async def run() -> None:
        log = AppendLog(tmp_path / "g.log")
        commit = GroupCommit(log, kernel_sync=backends, depth=depth)

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
        assert commit.backend == (backends[0] if backends else "thread")
        await commit.close()
        log.close()

    asyncio.run(run())


@pytest.mark.parametrize(("backends", "depth"), BACKENDS[:3], ids=BACKEND_IDS[:3])
def test_group_commit_overlaps_the_disk_with_the_woken_writers(
    tmp_path: Path, backends: tuple[str, ...], depth: int
) -> None:
    """Writers that each wait for their own change settle into two halves: when a round ends,
    the next one's fdatasync is already running as its writers wake. (Starting each round only
    once the woken writers had all appended left the disk idle while they ran, and the loop
    idle while it synced.) Kernel backends only: a worker thread cannot start an fdatasync
    while the loop holds the GIL, so there rounds wait for the loop to be idle."""

    async def run() -> tuple[int, int, int, int]:
        log = AppendLog(tmp_path / "o.log")
        commit = GroupCommit(log, kernel_sync=backends, depth=depth)
        seq = 0
        overlapped = woken = peak = 0

        async def writer() -> None:
            nonlocal seq, overlapped, woken, peak
            for _ in range(20):
                seq += 1
                log.append(seq, b"x" * 256)
                peak = max(peak, commit.in_flight)
                await commit.durable(seq)
                woken += 1
                overlapped += commit.in_flight > 0

        await asyncio.gather(*(writer() for _ in range(100)))
        rounds = commit.rounds
        await commit.close()
        log.close()
        assert log.synced == seq == 2000
        return overlapped, woken, rounds, peak

    overlapped, woken, rounds, peak = asyncio.run(run())
    assert peak == depth
    assert overlapped > woken * 0.7, (overlapped, woken)
    assert rounds <= 2000 / 25, rounds  # shared: 100 writers in two halves


@pytest.mark.parametrize(("backends", "depth"), BACKENDS, ids=BACKEND_IDS)
def test_a_failed_fdatasync_fails_its_waiters_and_every_later_one(
    tmp_path: Path, backends: tuple[str, ...], depth: int
) -> None:
    """A real fdatasync error: the log's descriptor is made a pipe's, which the kernel cannot
    fdatasync (EINVAL). After it, nothing is reported durable, even once the file is back."""

    told: list[OSError] = []

    async def run() -> None:
        log = AppendLog(tmp_path / "f.log")
        commit = GroupCommit(log, kernel_sync=backends, depth=depth, on_failed=told.append)
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
    assert [e.errno for e in told] == [errno.EINVAL]  # the owner is told once (fail-stop)


def _reap_all(sync: KernelSync, count: int) -> dict[int, int]:
    finished: dict[int, int] = {}
    while len(finished) < count:
        assert select.select([sync.eventfd], [], [], 5)[0]  # the eventfd tells one finished
        for tag, result in sync.reap():
            assert tag not in finished  # reported once
            finished[tag] = result
    return finished


@pytest.mark.parametrize("name", ["uring", "aio"])
def test_kernel_sync_reports_each_fdatasync_once_with_its_tag_and_result(
    tmp_path: Path, name: str
) -> None:
    sync = open_kernel_sync((name,), depth=2)
    assert sync is not None
    assert sync.name == name
    assert sync.depth == (2 if name == "uring" else 1)  # AIO: one at a time
    fd = os.open(tmp_path / "k.log", os.O_WRONLY | os.O_CREAT, 0o600)
    read_end, write_end = os.pipe()
    try:
        assert sync.reap() == []  # nothing in flight
        tags = list(range(7, 7 + sync.depth))
        for tag in tags:
            os.write(fd, b"x" * 4096)
            sync.submit(fd, tag)
        with pytest.raises(RuntimeError):
            sync.submit(fd, 99)  # no more than `depth`
        assert _reap_all(sync, len(tags)) == dict.fromkeys(tags, 0)
        assert sync.in_flight == 0
        assert sync.reap() == []
        try:  # a pipe cannot be fdatasync'ed: io_uring says so in the result, AIO at once
            sync.submit(read_end, 5)
            result = _reap_all(sync, 1)[5]
        except OSError as error:
            result = -(error.errno or 0)
        assert result == -errno.EINVAL
        sync.submit(fd, 6)
    finally:
        sync.close()  # waits for the one in flight
        for each in (fd, read_end, write_end):
            os.close(each)
    assert sync.eventfd == -1
