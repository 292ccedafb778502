"""The checkpoint's tail table (`relay_journal.tail`): a checkpoint writes no queue's state line
or buffered appends, the table carries them, and a crash after the checkpoint (the log before
it deleted) loses nothing; a table entry older than queue.log loses to it; the budget of
buffered appends a table carries is kept; `stats` reads a carried queue from the table."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from relay_journal import tail
from relay_journal.journal import QueueJournal
from relay_journal.queue import read_state_file
from relay_journal.settings import JournalSettings
from relay_journal.wal import list_segments
from tests.journal.conftest import drain, logged_warnings, mid, qid, small


def _settings(root: Path, **overrides: object) -> JournalSettings:
    """Every queue stays open (closing one writes its line) and none reaches its quota."""
    values: dict[str, object] = {"max_open_queues": 100, "max_queue_messages": 10}
    return small(root, max_file_messages=20, **{**values, **overrides})


def _crash(journal: QueueJournal) -> None:
    """As a SIGKILL leaves it: the log is durable and closed, no queue is closed."""
    journal.sync()
    journal.wal.close()


def test_a_checkpoint_tables_what_queue_log_lacks_and_a_crash_restores_it(root: Path) -> None:
    queues = [qid() for _ in range(5)]
    journal = QueueJournal(_settings(root))
    for n, queue in enumerate(queues):
        for k in range(3):
            journal.write(queue, mid(10 * n + k), f"{n}-{k}".encode(), ts_ms=1)
    journal.ack(queues[0], mid(0))
    journal.checkpoint()  # the log of the writes above is deleted
    folders = {q: journal.layout.paths(root, q)[0] for q in queues}
    # No state line was written for the checkpoint: each queue.log still says what the folder's
    # creation said, and the table holds the rest, buffered appends included.
    for queue in queues:
        state, _ = read_state_file(queue, folders[queue])
        assert state is not None
        assert state.size == 0
    table = tail.load(root)
    assert sorted(table) == sorted(queues)
    # Appends after a queue's first are buffered (an ack reads, which writes them first).
    assert all(tail.entry(table[q]).unwritten for q in queues[1:])
    journal.write(queues[1], mid(99), b"after", ts_ms=2)
    _crash(journal)

    reopened = QueueJournal(_settings(root))
    assert dict((q, n) for q, n, _ in reopened.stats()) == {
        queues[0]: 2,
        queues[1]: 4,
        **{q: 3 for q in queues[2:]},
    }
    assert drain(reopened, queues[0]) == [b"0-1", b"0-2"]
    assert drain(reopened, queues[1]) == [b"1-0", b"1-1", b"1-2", b"after"]
    for n, queue in enumerate(queues[2:], start=2):
        assert drain(reopened, queue) == [f"{n}-{k}".encode() for k in range(3)]
    reopened.close()


def test_a_carried_queue_is_carried_again_until_it_is_loaded(root: Path) -> None:
    """A queue the replay did not touch keeps its entry through the next checkpoints."""
    queue, other = qid(), qid()
    journal = QueueJournal(_settings(root))
    journal.write(queue, mid(1), b"kept", ts_ms=1)
    journal.checkpoint()
    _crash(journal)
    for _ in range(2):
        again = QueueJournal(_settings(root))
        again.write(other, mid(2), b"other", ts_ms=1)
        again.checkpoint()
        _crash(again)
    assert queue in tail.load(root)
    last = QueueJournal(_settings(root))
    assert drain(last, queue) == [b"kept"]
    last.close()
    # Closing wrote the line of every queue it had loaded; the one it never loaded is carried.
    assert sorted(tail.load(root)) == [other]


def test_a_line_newer_than_the_table_wins(root: Path) -> None:
    queue = qid()
    journal = QueueJournal(_settings(root))
    journal.write(queue, mid(1), b"a", ts_ms=1)
    journal.checkpoint()
    stale = tail.load(root)[queue]
    journal.write(queue, mid(2), b"b", ts_ms=1)
    journal.close_idle(0)  # queue.log now newer than the table's entry
    journal.checkpoint()
    _crash(journal)
    (root / tail.TAIL_FILE).write_bytes(b"RTT1" + (1).to_bytes(4, "little") + stale)
    reopened = QueueJournal(_settings(root))
    assert drain(reopened, queue) == [b"a", b"b"]
    reopened.close()


def test_buffered_appends_past_the_budget_are_written_at_the_checkpoint(root: Path) -> None:
    small_queue, big_queue = qid(), qid()
    journal = QueueJournal(_settings(root, tail_unwritten_bytes=200))
    journal.write(small_queue, mid(1), b"s", ts_ms=1)  # a first append is written at once
    journal.write(small_queue, mid(4), b"t", ts_ms=1)
    journal.write(big_queue, mid(2), b"x" * 150, ts_ms=1)
    journal.write(big_queue, mid(3), b"y" * 150, ts_ms=1)
    journal.checkpoint()
    table = {q: tail.entry(r) for q, r in tail.load(root).items()}
    assert table[small_queue].unwritten  # within the budget: carried
    assert table[big_queue].unwritten == b""  # past it: written to its file
    _crash(journal)
    reopened = QueueJournal(_settings(root))
    assert drain(reopened, big_queue) == [b"x" * 150, b"y" * 150]
    assert drain(reopened, small_queue) == [b"s", b"t"]
    reopened.close()


def test_a_damaged_table_record_is_reported_and_left_out(root: Path) -> None:
    queue = qid()
    journal = QueueJournal(_settings(root))
    journal.write(queue, mid(1), b"a", ts_ms=1)
    journal.checkpoint()
    _crash(journal)
    path = root / tail.TAIL_FILE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with logged_warnings() as found:
        reopened = QueueJournal(_settings(root))
    assert any("tail_table_damaged" in line for line in found), found
    reopened.close()


def test_a_full_segments_table_is_written_on_a_thread_and_a_failed_one_keeps_the_log(
    root: Path,
) -> None:
    """A full segment begins a checkpoint whose table is written on the checkpoint thread; the
    segments before it are deleted only once the table is in force, with a later change. A
    table that cannot be written (its temporary name taken by a folder: EISDIR) is logged,
    the older segments are kept, and a crash then loses nothing; once it can be written, the
    checkpoints retire them all (a checkpoint at open or close raises such an error)."""
    settings = small(
        root, wal_segment_bytes=4096, max_queue_messages=10**6 - 1, max_file_messages=10**6
    )
    journal = QueueJournal(settings)
    queue = qid()
    blocker = root / (tail.TAIL_FILE + ".next")
    blocker.mkdir()
    written = 0

    def write_until(done: Callable[[], bool]) -> None:
        nonlocal written
        while not done():
            written += 1
            journal.write(queue, mid(written), b"x" * 100, ts_ms=1)
            while journal.checkpointing:
                time.sleep(0.001)
            assert written < 2000, "never happened"

    with logged_warnings() as warnings:
        write_until(lambda: len(list_segments(root)) >= 4)
    assert "checkpoint_failed" in warnings  # each full segment tried, none retired
    _crash(journal)
    blocker.rmdir()  # else the opening checkpoint fails too (and the open with it)
    reopened = QueueJournal(settings)
    assert reopened.size(queue) == written  # every segment replayed
    journal, written_before = reopened, written
    write_until(lambda: written > written_before + 200 and len(list_segments(root)) == 1)
    _crash(journal)
    again = QueueJournal(settings)
    assert drain(again, queue) == [b"x" * 100] * written
    again.close()
