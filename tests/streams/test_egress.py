"""Egress batching on its own, with a write function standing in for the shards: group commit,
failure reporting to exactly the callers whose messages were lost, interval and size flushes."""

from __future__ import annotations

import threading
import time

import pytest

from relay_streams.egress import Egress
from relay_streams.errors import Closed, WriteFailed


def wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_callers_that_arrive_during_a_write_share_the_next_one() -> None:
    writes: list[list[str]] = []
    release = threading.Event()

    def write(items: list[str]) -> None:
        if not writes:
            release.wait(5)
        writes.append(items)

    egress: Egress[str] = Egress(write, batch_size=1000, flush_interval_s=60, name="t")
    first = threading.Thread(target=egress.submit, args=(["a"], True))
    first.start()
    wait_for(egress._write_lock.locked)
    others = [threading.Thread(target=egress.submit, args=([x], True)) for x in "bcd"]
    for t in others:
        t.start()
    wait_for(lambda: len(egress._pending) == 3)
    release.set()
    for t in [first, *others]:
        t.join(5)
    assert writes[0] == ["a"]
    assert sorted(writes[1]) == ["b", "c", "d"]
    assert len(writes) == 2
    egress.close()


def test_a_failed_write_fails_only_the_callers_it_held() -> None:
    def write(items: list[str]) -> None:
        if "bad" in items:
            raise OSError("disk full")

    egress: Egress[str] = Egress(write, batch_size=1000, flush_interval_s=60, name="t")
    egress.submit(["ok"], sync=True)
    with pytest.raises(WriteFailed, match="disk full"):
        egress.submit(["x", "bad"], sync=True)
    egress.submit(["fine"], sync=True)  # the next write is not blamed
    egress.close()


def test_buffered_items_wait_for_the_interval_or_a_full_batch() -> None:
    writes: list[list[int]] = []
    egress: Egress[int] = Egress(writes.append, batch_size=3, flush_interval_s=0.05, name="t")
    egress.submit([1], sync=False)
    assert writes == []
    wait_for(lambda: writes == [[1]])  # the interval
    slow: Egress[int] = Egress(writes.append, batch_size=3, flush_interval_s=60, name="t")
    slow.submit([2, 3], sync=False)
    time.sleep(0.05)
    assert writes == [[1]]
    slow.submit([4], sync=False)
    wait_for(lambda: writes == [[1], [2, 3, 4]])  # the batch size
    slow.submit([5], sync=False)
    slow.close()  # writes what is left
    assert writes[-1] == [5]
    with pytest.raises(Closed):
        slow.submit([6], sync=False)
    egress.close()
