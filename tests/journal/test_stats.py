"""`QueueJournal.stats`: messages and bytes per queue, open or closed, without opening any."""

from __future__ import annotations

from pathlib import Path

from relay_journal import records
from relay_journal.journal import QueueJournal
from tests.journal.conftest import mid, qid, small


def test_stats_count_open_and_closed_queues_without_opening_them(tmp_path: Path) -> None:
    journal = QueueJournal(small(tmp_path, max_open_queues=10))
    queues = [qid() for _ in range(4)]
    sizes = {queues[0]: 1, queues[1]: 2, queues[2]: 3}  # queues[3] stays empty
    for queue, n in sizes.items():
        for i in range(n):
            journal.write(queue, mid(i), b"b" * (10 * (i + 1)), ts_ms=1)
    record = len(records.encode_message(records.Message(mid(0), 1, 0, b"")))
    expected = {q: (n, sum(record + 10 * (i + 1) for i in range(n))) for q, n in sizes.items()}
    assert {q: (m, b) for q, m, b in journal.stats()} == expected
    journal.close_idle(0)  # all closed: read from their state lines
    assert journal.open_queues == 0
    assert {q: (m, b) for q, m, b in journal.stats()} == expected
    assert journal.open_queues == 0
    journal.ack(queues[2], mid(0))
    expected[queues[2]] = (2, expected[queues[2]][1] - record - 10)
    assert {q: (m, b) for q, m, b in journal.stats()} == expected
    journal.close()
    again = QueueJournal(small(tmp_path))
    assert {q: (m, b) for q, m, b in again.stats()} == expected
    again.close()


def test_stats_span_a_rotation(tmp_path: Path) -> None:
    journal = QueueJournal(small(tmp_path, max_queue_messages=3, max_file_messages=4))
    queue = qid()
    for i in range(3):
        journal.write(queue, mid(i), b"x", ts_ms=1)
    for i in range(2):
        journal.ack(queue, mid(i))
    for i in range(3, 5):  # the 5th message goes to a new file
        journal.write(queue, mid(i), b"x", ts_ms=1)
    record = len(records.encode_message(records.Message(mid(0), 1, 0, b"x")))
    assert list(journal.stats()) == [(queue, 3, 3 * record)]
    journal.close()
