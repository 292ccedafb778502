"""Spares prepared ahead for a segmented log (`relay_durable.prealloc`), and an `AppendLog`
written over one."""

from __future__ import annotations

import time
from pathlib import Path

from relay_durable.appendlog import AppendLog
from relay_durable.prealloc import CLEARED_BYTES, PREPARING, READY, Preallocator

SIZE = 256 * 1024


def wait_ready(spares: Preallocator) -> None:
    deadline = time.monotonic() + 30
    while spares.preparing and time.monotonic() < deadline:
        time.sleep(0.005)
    assert spares.ready


def test_a_zero_filled_spare_is_handed_over_once(tmp_path: Path) -> None:
    spares = Preallocator(tmp_path, SIZE)
    assert not spares.ready
    assert not spares.take(tmp_path / "seg-1")  # nothing ready: the caller writes a plain file
    spares.prepare()
    wait_ready(spares)
    spares.prepare()  # one is ready: nothing more is prepared
    assert not spares.preparing
    assert (tmp_path / READY).read_bytes() == bytes(SIZE)
    assert spares.take(tmp_path / "seg-1")
    assert not spares.ready
    assert not spares.take(tmp_path / "seg-2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seg-1"]
    assert (tmp_path / "seg-1").read_bytes() == bytes(SIZE)
    spares.close()


def test_a_retired_segment_is_recycled_with_its_head_cleared(tmp_path: Path) -> None:
    spares = Preallocator(tmp_path, SIZE)
    old = tmp_path / "old"
    old.write_bytes(b"r" * (SIZE + 10))
    assert spares.recycle(old)
    wait_ready(spares)
    data = (tmp_path / READY).read_bytes()
    assert data == bytes(CLEARED_BYTES) + b"r" * (SIZE + 10 - CLEARED_BYTES)
    assert not old.exists()
    other = tmp_path / "other"
    other.write_bytes(b"r" * SIZE)
    assert not spares.recycle(other)  # one is ready: the caller deletes the other
    assert spares.take(tmp_path / "seg")
    small = tmp_path / "small"
    small.write_bytes(b"r" * (SIZE - 1))
    assert not spares.recycle(small)  # too small to hold a segment
    assert small.exists()
    spares.close()


def test_close_stops_a_zero_fill_and_leaves_no_spare(tmp_path: Path) -> None:
    spares = Preallocator(tmp_path, 8 << 30)  # far more than is written before close stops it
    spares.prepare()
    spares.close()
    assert not spares.ready
    assert list(tmp_path.iterdir()) == []


def test_a_restart_keeps_a_ready_spare_and_drops_a_partial_or_small_one(tmp_path: Path) -> None:
    (tmp_path / READY).write_bytes(bytes(SIZE))
    (tmp_path / PREPARING).write_bytes(bytes(100))  # a preparation cut by a crash
    assert Preallocator(tmp_path, SIZE).ready
    assert not (tmp_path / PREPARING).exists()
    bigger = Preallocator(tmp_path, SIZE * 2)  # the segment size grew since
    assert not bigger.ready
    assert list(tmp_path.iterdir()) == []


def test_an_append_log_writes_a_prepared_file_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "seg"
    path.write_bytes(b"\0" * 64)
    log = AppendLog(path, prepared=True)
    assert (log.prepared, log.file_bytes) == (True, 0)
    log.append(1, b"one,")
    log.append(2, b"two,")
    log.sync_to(2)
    assert log.file_bytes == 8
    log.switch_to(tmp_path / "plain")
    assert not log.prepared
    log.append(3, b"three")
    log.close()
    assert path.read_bytes() == b"one,two," + b"\0" * 56  # written over, size unchanged
    assert (tmp_path / "plain").read_bytes() == b"three"
