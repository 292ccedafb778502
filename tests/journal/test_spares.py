"""WAL segments written over spares prepared ahead (zero-filled, or recycled from retired
segments): the reader finds where the new records end, and nothing old is replayed."""

from __future__ import annotations

import random
import time
from pathlib import Path

from relay_durable import prealloc
from relay_journal.journal import QueueJournal
from relay_journal.records import LogRecord, Op, encode_log
from relay_journal.settings import FsyncPolicy
from relay_journal.wal import read_segments
from tests.journal.conftest import logged_warnings, mid, qid, small


def suspend(lsn: int) -> bytes:
    return encode_log(LogRecord(Op.SUSPEND, lsn, "q" * 32))


def lsns(paths: list[Path]) -> list[int]:
    return [record.lsn for record, _, _ in read_segments(paths)]


def test_the_reader_stops_at_zeros_and_at_records_older_than_the_last(tmp_path: Path) -> None:
    stale = suspend(3) + suspend(4)  # a retired segment's records, met where new ones end
    first = tmp_path / "1.log"
    first.write_bytes(suspend(10) + suspend(11) + stale + bytes(4096))
    zeroed = tmp_path / "2.log"
    zeroed.write_bytes(suspend(12) + bytes(4096) + suspend(13))  # after zeros: never read
    recycled = tmp_path / "3.log"
    recycled.write_bytes(bytes(8) + stale)  # a spare switched to, nothing written yet
    older = tmp_path / "4.log"
    older.write_bytes(suspend(5) + suspend(20))  # begins older than the segment before
    newer = tmp_path / "5.log"
    newer.write_bytes(suspend(14) + suspend(15))
    with logged_warnings() as warnings:
        assert lsns([first, zeroed, recycled, older, newer]) == [10, 11, 12, 14, 15]
    assert warnings == []  # each is how a segment written over a spare ends
    torn = tmp_path / "6.log"
    torn.write_bytes(suspend(16) + suspend(17)[:-1])
    with logged_warnings() as warnings:
        assert lsns([torn]) == [16]
    assert warnings == ["wal_tail_ignored"]


def test_segments_go_over_spares_and_reopen_with_exactly_what_was_written(root: Path) -> None:
    """Small segments, so that a fresh store zero-fills spares, moves onto one before its first
    checkpoint, then recycles retired segments; a reopen without close (a kill after the last
    fsync) finds every queue as the model says."""
    settings = small(root, max_queue_messages=50, max_file_messages=64, wal_segment_bytes=16 * 1024)
    journal = QueueJournal(settings)
    rng = random.Random(4)
    queues = [qid() for _ in range(5)]
    model: dict[str, list[bytes]] = {q: [] for q in queues}
    prepared = recycled = 0
    spares = journal.wal.spares
    assert spares is not None
    n = 0
    while n < 3000 or not recycled or not spares.ready or journal.checkpointing:
        n += 1
        queue = rng.choice(queues)
        if model[queue] and (rng.random() < 0.45 or len(model[queue]) > 40):
            head = journal.peek(queue)
            assert head is not None
            journal.ack(queue, head.msg_id)
            model[queue].pop(0)
        else:
            body = rng.randbytes(rng.randint(0, 400))
            journal.write(queue, mid(n), body, ts_ms=1)
            model[queue].append(body)
        prepared += journal.wal.file.prepared
        recycled += _recycled(root / "wal" / prealloc.READY)
        if spares.preparing or journal.checkpointing:
            time.sleep(0.001)  # let the background threads finish before the next segment
        assert n < 20_000, "segments never went over a recycled spare"
    assert prepared > 0
    journal.wal.close()  # killed: no closing checkpoint
    reopened = QueueJournal(settings)
    for queue in queues:
        assert [m.body for m in reopened.messages(queue)] == model[queue]
    assert reopened.check() == []
    reopened.close()
    assert (root / "wal" / prealloc.READY).exists()  # kept for the next open
    again = QueueJournal(settings)
    assert again.wal.file.prepared  # the opening checkpoint's segment took it
    for queue in queues:
        assert [m.body for m in again.messages(queue)] == model[queue]
    again.close()


def test_a_recycled_segment_never_brings_back_a_deleted_queue(root: Path) -> None:
    """Every record the same size, so a recycled segment's old records line up with the new
    ones: past the last new record, an old write to a queue deleted before the last checkpoint
    decodes whole. Replaying it would bring the queue back (no DROP is replayed for it)."""
    settings = small(
        root,
        max_queue_messages=10**6 - 1,
        max_file_messages=10**6,
        wal_segment_bytes=16 * 1024,
        fsync=FsyncPolicy.NEVER,
    )
    journal = QueueJournal(settings)
    spares = journal.wal.spares
    assert spares is not None
    deleted, kept = qid(), qid()
    written = {deleted: 0, kept: 0}
    segments: list[str] = []

    def write(queue: str) -> None:
        written[queue] += 1
        journal.write(queue, mid(sum(written.values())), b"b" * 100, ts_ms=1)
        while spares.preparing or journal.checkpointing:
            time.sleep(0.001)
        if journal.wal.path.name not in segments:
            segments.append(journal.wal.path.name)

    while len(segments) < 12:  # steady state: each checkpoint recycles the retired segment
        write(deleted)
    journal.delete(deleted)
    before = len(segments)
    while len(segments) == before:
        write(kept)
    assert journal.wal.file.prepared  # written over a segment that held `deleted`'s writes
    while journal.wal.segment_bytes < 2 * prealloc.CLEARED_BYTES:  # past the cleared head
        write(kept)
    journal.wal.close()  # killed
    reopened = QueueJournal(settings)
    assert not any(folder.exists() for folder in reopened.layout.paths(root, deleted))
    assert reopened.size(deleted) == 0
    assert reopened.size(kept) == written[kept]
    reopened.close()


def _recycled(spare: Path) -> bool:
    """A ready spare that was a segment: its head cleared, old records after it."""
    if not spare.exists():
        return False
    data = spare.read_bytes()
    return data[: prealloc.CLEARED_BYTES] == bytes(prealloc.CLEARED_BYTES) and any(data)


def test_without_spares_every_segment_is_a_plain_file(root: Path) -> None:
    settings = small(
        root,
        max_queue_messages=3000,
        max_file_messages=3001,
        wal_segment_bytes=16 * 1024,
        wal_spares=False,
        fsync=FsyncPolicy.NEVER,
    )
    journal = QueueJournal(settings)
    assert journal.wal.spares is None
    queue = qid()
    for n in range(2000):
        journal.write(queue, mid(n), b"m" * 100, ts_ms=1)
        assert not journal.wal.file.prepared
    journal.close()
    assert not (root / "wal" / prealloc.READY).exists()
