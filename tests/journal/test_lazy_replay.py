"""A lazy open (issue 18): ready once the log is read; a queue applies its replayed records at
its first use, `catch_up` applies the rest, and a crash at any point between loses nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from relay_journal.aio import AsyncJournal
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_journal.wal import list_segments
from tests.journal.conftest import mid, small

QUEUES = [f"{n:02d}" + "q" * 30 for n in range(12)]


def crashed_journal(root: Path) -> tuple[JournalSettings, dict[str, list[bytes]]]:
    """Twelve queues written since the last checkpoint, one of them emptied, then abandoned as
    a SIGKILL leaves it (under `always` every returned call is durable)."""
    settings = small(root, max_queue_messages=5, max_file_messages=6)
    journal = QueueJournal(settings)
    expected: dict[str, list[bytes]] = {}
    n = 0
    for i, queue in enumerate(QUEUES):
        for _ in range(1 + i % 4):
            n += 1
            journal.write(queue, mid(n), b"m", ts_ms=n)
            expected.setdefault(queue, []).append(mid(n))
        if i % 3 == 0:
            journal.ack(queue, expected[queue].pop(0))
    journal.wal.close()
    return settings, expected


def stored(journal: QueueJournal, queue: str) -> list[bytes]:
    return [m.msg_id for m in journal.messages(queue)]


def test_a_lazy_open_applies_nothing_until_a_queue_is_used(tmp_path: Path) -> None:
    settings, expected = crashed_journal(tmp_path)
    emptied = QUEUES[0]
    assert expected[emptied] == []
    before = list_segments(tmp_path)
    journal = QueueJournal(settings, lazy=True)
    assert (journal.pending_queues, journal.open_queues) == (len(QUEUES), 0)
    assert set(before) <= set(list_segments(tmp_path))  # kept until every queue caught up
    assert stored(journal, QUEUES[4]) == expected[QUEUES[4]]
    journal.write(QUEUES[5], mid(100), b"new", ts_ms=100)  # after its replayed records
    assert stored(journal, QUEUES[5]) == [*expected[QUEUES[5]], mid(100)]
    assert journal.pending_queues == len(QUEUES) - 2
    assert journal.catch_up(3) == len(QUEUES) - 5
    assert journal.catch_up() == 0
    assert not set(before) & set(list_segments(tmp_path))  # the opening checkpoint retired them
    assert not any(p.exists() for p in journal.layout.paths(tmp_path, emptied))
    for queue in QUEUES[6:]:
        assert stored(journal, queue) == expected[queue]
    journal.close()


def test_crashes_before_the_catch_up_ends_lose_nothing(tmp_path: Path) -> None:
    settings, expected = crashed_journal(tmp_path)
    journal = QueueJournal(settings, lazy=True)
    journal.write(QUEUES[1], mid(200), b"x", ts_ms=200)
    expected[QUEUES[1]].append(mid(200))
    journal.catch_up(4)
    journal.ack(QUEUES[7], expected[QUEUES[7]].pop(0))  # still pending until this use
    journal.wal.close()  # killed with most queues still pending
    again = QueueJournal(settings, lazy=True)
    assert again.pending_queues > 0
    again.catch_up(2)
    again.wal.close()  # killed again
    final = QueueJournal(settings)
    assert final.pending_queues == 0
    for queue in QUEUES:
        assert stored(final, queue) == expected[queue], queue
    final.close()


def test_the_async_journal_catches_up_in_the_background(tmp_path: Path) -> None:
    settings, expected = crashed_journal(tmp_path)
    before = list_segments(tmp_path)

    async def run() -> None:
        journal = AsyncJournal(settings)
        assert journal.journal.pending_queues == len(QUEUES)
        await journal.start()
        await journal.write(QUEUES[2], mid(300), b"y", ts_ms=300)  # served at once
        await journal.caught_up()
        assert journal.journal.pending_queues == 0
        assert not set(before) & set(list_segments(tmp_path))
        assert [m.msg_id for m in journal.journal.messages(QUEUES[2])] == [
            *expected[QUEUES[2]],
            mid(300),
        ]
        await journal.close()

    asyncio.run(run())


def test_closing_before_the_catch_up_ends_leaves_the_rest_to_the_next_open(
    tmp_path: Path,
) -> None:
    settings, expected = crashed_journal(tmp_path)
    before = list_segments(tmp_path)
    journal = QueueJournal(settings, lazy=True)
    journal.write(QUEUES[3], mid(400), b"z", ts_ms=400)
    expected[QUEUES[3]].append(mid(400))
    journal.catch_up(2)
    left = journal.pending_queues
    journal.close()  # no catch-up of the rest, no checkpoint
    assert set(before) <= set(list_segments(tmp_path))
    again = QueueJournal(settings, lazy=True)
    assert again.pending_queues >= left  # replayed again
    for queue in QUEUES:
        assert stored(again, queue) == expected[queue], queue
    again.close()  # every queue caught up by those reads: this one checkpoints
    assert not set(list_segments(tmp_path)) & set(before)
    final = QueueJournal(settings)
    assert final.pending_queues == 0
    assert all(stored(final, queue) == expected[queue] for queue in QUEUES)
    final.close()


def test_stats_of_a_lazy_open_apply_one_queue_per_item(tmp_path: Path) -> None:
    settings, expected = crashed_journal(tmp_path)
    journal = QueueJournal(settings, lazy=True)
    walk = journal.stats()
    first = next(walk)
    # Not the whole catch-up at once: the first queue (emptied, not reported) and this one.
    assert journal.pending_queues == len(QUEUES) - 2
    found = {first[0]: first[1], **{queue: count for queue, count, _ in walk}}
    assert found == {queue: len(ids) for queue, ids in expected.items() if ids}
    assert (journal.pending_queues, journal.open_queues) == (0, 0)
    journal.close()
