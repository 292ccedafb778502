"""Recovery edge cases: a kill while the journal opens, layouts that lose queue.log."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from relay_journal import errors, layout
from relay_journal.journal import QueueJournal
from relay_journal.settings import FsyncPolicy
from tests.journal.conftest import drain, mid, qid, small

X, Y, Z = ("x" * 32, "y" * 32, "z" * 32)


class Killed(Exception):
    pass


class KilledBeforeTheOpeningCheckpoint(QueueJournal):
    """Stops where a SIGKILL after the replay, before the opening checkpoint, would: whatever
    the replay handed to the OS is on disk, nothing after it happens."""

    def checkpoint(self, *, last: bool = False) -> None:
        raise Killed


def test_a_kill_while_opening_keeps_what_the_replay_rewrote(root: Path) -> None:
    """The replay empties X (write, ack) and closes it to make room (LRU), then replays a later
    write to X. Dropping X's folder at that close would log a DROP newer than that write, and
    the next replay would apply the DROP over it."""
    live = QueueJournal(small(root, max_open_queues=3))
    live.write(X, mid(1), b"x1", ts_ms=1)
    live.ack(X, mid(1))
    live.write(Y, mid(2), b"y", ts_ms=1)
    live.write(Z, mid(3), b"z", ts_ms=1)
    live.write(X, mid(4), b"x2", ts_ms=1)  # acknowledged: the log is fsynced
    live.wal.close()  # killed
    with pytest.raises(Killed):
        KilledBeforeTheOpeningCheckpoint(small(root, max_open_queues=2))
    reopened = QueueJournal(small(root, max_open_queues=2))
    assert [m.body for m in reopened.messages(X)] == [b"x2"]
    assert [drain(reopened, q) for q in (X, Y, Z)] == [[b"x2"], [b"y"], [b"z"]]
    reopened.close()


def test_queues_emptied_by_the_replay_leave_no_folder(root: Path) -> None:
    live = QueueJournal(small(root, max_open_queues=3))
    ids = [qid() for _ in range(4)]
    for n, queue in enumerate(ids):
        live.write(queue, mid(n), b"m", ts_ms=1)
        live.ack(queue, mid(n))
    live.write(ids[0], mid(9), b"kept", ts_ms=1)
    live.wal.close()  # killed with every queue open (or closed and dropped)
    reopened = QueueJournal(small(root, max_open_queues=1))  # the replay closes queues early
    folders = [reopened.layout.paths(root, q)[0] for q in ids]
    assert [f.exists() for f in folders] == [True, False, False, False]
    assert drain(reopened, ids[0]) == [b"kept"]
    reopened.close()


def test_migration_moves_a_folder_that_lost_its_state_file(root: Path) -> None:
    settings = small(root)
    journal = QueueJournal(settings)
    journal.write(X, mid(1), b"x", ts_ms=1)
    journal.write(Y, mid(2), b"y", ts_ms=1)
    folder = journal.layout.paths(root, X)[0]
    journal.close()
    (folder / "queue.log").unlink()
    assert layout.migrate(root, (3, 3)) == (2, True)
    assert not folder.exists()
    reopened = QueueJournal(settings)
    assert drain(reopened, X) == [b"x"]
    assert drain(reopened, Y) == [b"y"]
    reopened.close()


def test_layouts_longer_than_the_queue_ids_are_refused(root: Path) -> None:
    journal = QueueJournal(small(root))
    journal.write(X, mid(1), b"x", ts_ms=1)
    journal.close()
    with pytest.raises(errors.InvalidQueueId):
        layout.migrate(root, (8, 8, 8, 8))  # would leave nothing for the last folder
    assert layout.load_layout(root, (2, 2, 2, 2)) == layout.Layout((2, 2, 2, 2))  # unchanged
    assert layout.migrate(root, (10, 10)) == (1, True)
    reopened = QueueJournal(small(root))  # settings say 2,2,2,2; the recorded layout wins
    with pytest.raises(errors.InvalidQueueId):
        reopened.write("a" * 20, mid(2), b"short", ts_ms=1)  # too short for 10,10
    assert drain(reopened, X) == [b"x"]
    reopened.close()


def test_unknown_layout_version_is_refused_by_name(root: Path) -> None:
    QueueJournal(small(root)).close()
    (root / "layout.json").write_text('{"v": 2, "fragments": [2, 2]}\n')
    with pytest.raises(errors.CorruptJournal, match="unknown layout version 2"):
        QueueJournal(small(root))


def test_a_folder_that_lost_its_state_file_is_still_a_queue(root: Path) -> None:
    settings = small(root)
    journal = QueueJournal(settings)
    journal.write(X, mid(1), b"x", ts_ms=1)
    folder = journal.layout.paths(root, X)[0]
    journal.close()
    (folder / "queue.log").unlink()
    reopened = QueueJournal(settings)
    with pytest.raises(errors.QueueExists):
        reopened.create(X)
    assert drain(reopened, X) == [b"x"]
    reopened.close()


def test_a_message_file_is_removed_only_after_the_acks_that_emptied_it(root: Path) -> None:
    """Acking the last message of a read file removes the file; the acks reach the log first, so
    a process killed right after (its buffered log lost) reopens with the head in the next file,
    not into a removed one (the marks crash test lost a window of messages this way)."""
    settings = small(root, fsync=FsyncPolicy.NEVER)
    journal = QueueJournal(settings)
    queue = qid()
    folder = journal.layout.paths(root, queue)[0]
    for n in range(1, 5):  # 1-4 in the first file
        journal.write(queue, mid(n), b"m", ts_ms=n)
        if n in (1, 2):
            journal.ack(queue, mid(n))
    [first] = folder.glob("messages.*.log")
    journal.write(queue, mid(5), b"m", ts_ms=5)  # in the second
    for n in (3, 4):
        journal.ack(queue, mid(n))
    assert not first.exists()
    del journal  # killed: what the log buffers is lost
    with capture_logs() as logs:
        reopened = QueueJournal(settings)
    assert [m.msg_id for m in reopened.messages(queue)] == [mid(5)]
    assert "read_file_missing" not in [entry["event"] for entry in logs]
    reopened.close()
