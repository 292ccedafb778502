"""The SMP-style recovery cases, resource bounds, layouts and migration, fsync policies."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from relay_journal import errors, layout
from relay_journal.aio import AsyncJournal
from relay_journal.journal import QueueJournal
from relay_journal.queue import message_file
from relay_journal.settings import FsyncPolicy, JournalSettings
from tests.journal.conftest import drain, mid, qid, small

Q = "smpcasequeueaaaaaaaaaaaaaaaaaaaa"


def _folder(journal: QueueJournal, queue: str = Q) -> Path:
    return journal.layout.paths(journal.root, queue)[0]


def test_restores_from_the_last_valid_line_when_the_last_is_torn(root: Path) -> None:
    settings = small(root, state_compact_lines=10)
    journal = QueueJournal(settings)
    journal.write(Q, mid(1), b"a", ts_ms=1)
    journal.checkpoint()
    journal.write(Q, mid(2), b"b", ts_ms=2)
    journal.close()
    state = _folder(journal) / "queue.log"
    lines = state.read_bytes().splitlines(keepends=True)
    assert len(lines) >= 2
    state.write_bytes(b"".join(lines[:-1]) + lines[-1][:-7])  # tear the last line
    reopened = QueueJournal(settings)
    # The torn line is ignored; the message file is truncated to the previous line's position.
    assert drain(reopened, Q) == [b"a"]
    reopened.close()


def test_write_without_state_line_is_truncated_away(root: Path) -> None:
    settings = small(root)
    journal = QueueJournal(settings)
    journal.write(Q, mid(1), b"a", ts_ms=1)
    journal.close()
    folder = QueueJournal(settings)
    info = folder.info(Q)
    path = message_file(_folder(folder), info.write.file)
    folder.close()
    with path.open("ab") as f:  # a message appended, its state line never written
        f.write(b"\x01\x00garbage that is not a full record")
    reopened = QueueJournal(settings)
    assert reopened.info(Q).size == 1
    assert drain(reopened, Q) == [b"a"]
    reopened.close()


@pytest.mark.parametrize("missing", ["read", "write", "both"])
def test_missing_files_are_recovered(root: Path, missing: str) -> None:
    settings = small(root)
    journal = QueueJournal(settings)
    for n in range(3):  # quota 3, 4 per file: fill, drain two, write two more -> two files
        journal.write(Q, mid(n), bytes([65 + n]), ts_ms=n)
    for _ in range(2):
        head = journal.peek(Q)
        assert head is not None
        journal.ack(Q, head.msg_id)
    journal.write(Q, mid(3), b"D", ts_ms=3)
    journal.write(Q, mid(4), b"E", ts_ms=4)
    info = journal.info(Q)
    assert info.read.file != info.write.file
    folder = _folder(journal)
    journal.close()
    if missing in ("read", "both"):
        message_file(folder, info.read.file).unlink()
    if missing in ("write", "both"):
        message_file(folder, info.write.file).unlink()
    reopened = QueueJournal(settings)
    got = drain(reopened, Q)
    assert got == {"read": [b"E"], "write": [b"C", b"D"], "both": []}[missing]
    reopened.write(Q, mid(9), b"after", ts_ms=9)  # and the queue works again
    assert drain(reopened, Q) == [b"after"]
    reopened.close()


def test_eof_while_switching_read_file(root: Path) -> None:
    """A crash after the last message of the read file was acked, before the switch."""
    settings = small(root)
    journal = QueueJournal(settings)
    for n in range(3):
        journal.write(Q, mid(n), bytes([65 + n]), ts_ms=n)
    for _ in range(2):
        head = journal.peek(Q)
        assert head is not None
        journal.ack(Q, head.msg_id)
    journal.write(Q, mid(3), b"D", ts_ms=3)  # 4th message of the read file... file is full now
    journal.write(Q, mid(4), b"E", ts_ms=4)  # rotates: E goes to a new write file
    journal.close()
    reopened = QueueJournal(settings)
    assert drain(reopened, Q) == [b"C", b"D", b"E"]
    reopened.close()
    again = QueueJournal(settings)
    assert again.size(Q) == 0
    again.close()


def test_empty_queues_leave_no_files(root: Path) -> None:
    settings = small(root)
    journal = QueueJournal(settings)
    journal.write(Q, mid(1), b"a", ts_ms=1)
    assert _folder(journal).exists()
    drain(journal, Q)
    assert journal.open_files == 0  # an empty queue holds no open file
    journal.close()
    assert not _folder(journal).exists()
    assert not [p for p in (root / layout.QUEUES_DIR).rglob("*") if p.is_file()]


def test_quota_marker_then_refusals_until_drained(root: Path) -> None:
    journal = QueueJournal(small(root))
    for n in range(3):
        journal.write(Q, mid(n), b"m", ts_ms=n)
    for n in range(3, 6):
        with pytest.raises(errors.QuotaExceeded):
            journal.write(Q, mid(n), b"m", ts_ms=n)
    assert journal.size(Q) == 4  # three messages and one marker
    assert drain(journal, Q) == [b"m", b"m", b"m", b"<quota>"]
    journal.write(Q, mid(9), b"ok", ts_ms=9)
    journal.close()


def test_refusals_change_nothing(root: Path) -> None:
    journal = QueueJournal(small(root))
    journal.write(Q, mid(1), b"a", ts_ms=1)
    before = sorted(
        (p, p.stat().st_size) for p in root.rglob("*") if p.is_file() and "wal" not in p.parts
    )
    with pytest.raises(errors.NoMessage):
        journal.ack(Q, mid(2))
    with pytest.raises(errors.InvalidQueueId):
        journal.write("../../etc", mid(3), b"x", ts_ms=1)
    with pytest.raises(errors.QueueExists):
        journal.create(Q)
    journal.suspend(Q)
    with pytest.raises(errors.QueueSuspended):
        journal.write(Q, mid(4), b"x", ts_ms=1)
    assert [m.body for m in journal.messages(Q)] == [b"a"]
    after = sorted(
        (p, p.stat().st_size) for p in root.rglob("*") if p.is_file() and "wal" not in p.parts
    )
    assert [p for p, _ in after] == [p for p, _ in before]
    journal.close()


def test_lru_bounds_open_queues_and_expiry_reaches_closed_queues(root: Path) -> None:
    journal = QueueJournal(small(root, max_open_queues=2))
    ids = [qid() for _ in range(6)]
    for n, queue in enumerate(ids):
        journal.write(queue, mid(n), b"x", ts_ms=1, expires_ms=100 if n % 2 else 0)
        assert journal.open_queues <= 2
    assert dict(journal.expire_all(now_ms=200)) == {q: 1 for n, q in enumerate(ids) if n % 2}
    assert journal.open_queues <= 2
    assert [journal.size(q) for q in ids] == [1, 0, 1, 0, 1, 0]
    journal.close()


def test_opening_does_not_read_queue_folders(root: Path) -> None:
    settings = small(root, max_open_queues=100)
    journal = QueueJournal(settings)
    ids = [qid() for _ in range(50)]
    for n, queue in enumerate(ids):
        journal.write(queue, mid(n), b"x", ts_ms=1)
    journal.close()
    for path in root.rglob("queue.log"):
        path.write_bytes(b"this is not a state line\n")  # any read of it would warn and rebuild
    reopened = QueueJournal(settings)
    assert reopened.open_queues == 0
    assert all(b"not a state line" in p.read_bytes() for p in root.rglob("queue.log"))
    assert drain(reopened, ids[0]) == [b"x"]  # a queue is read when first used, and recovers
    reopened.close()


def test_path_layout_and_resumable_migration(root: Path) -> None:
    settings = small(root, max_open_queues=100)
    journal = QueueJournal(settings)
    ids = [qid() for _ in range(12)]
    for n, queue in enumerate(ids):
        journal.write(queue, mid(n), bytes([n]), ts_ms=1)
    assert (
        root / "queues" / ids[0][:2] / ids[0][2:4] / ids[0][4:6] / ids[0][6:8] / ids[0][8:]
    ).is_dir()
    journal.close()

    moved, finished = layout.migrate(root, (3, 3), limit=5)
    assert (moved, finished) == (5, False)
    during = QueueJournal(settings)  # lookups find queues under both layouts mid-migration
    assert [bytes(drain(during, q)[0]) for q in ids[:2]] == [bytes([0]), bytes([1])]
    during.close()
    moved, finished = layout.migrate(root, (3, 3))
    assert finished
    assert layout.load_layout(root, (2, 2, 2, 2)).current == (3, 3)
    after = QueueJournal(settings)
    for n, queue in enumerate(ids[2:], start=2):
        assert drain(after, queue) == [bytes([n])]
        assert not (root / "queues" / queue[:2] / queue[2:4]).exists()
    after.close()


def test_state_file_compaction_keeps_bounded_backups(root: Path) -> None:
    settings = small(root, state_compact_lines=3, state_backups_keep=2, state_backups_max_age_s=0)
    journal = QueueJournal(settings)
    for n in range(12):
        journal.write(Q, mid(n), b"x", ts_ms=n) if n % 2 == 0 else drain(journal, Q)
        journal.checkpoint()
    folder = _folder(journal)
    assert len((folder / "queue.log").read_bytes().splitlines()) <= 3
    time.sleep(0.01)
    assert len(list(folder.glob("queue.*.log"))) <= 2
    journal.close()


@pytest.mark.parametrize("policy", list(FsyncPolicy))
def test_async_journal_under_each_fsync_policy(root: Path, policy: FsyncPolicy) -> None:
    async def run() -> None:
        journal = AsyncJournal(JournalSettings(root=root, fsync=policy, batch_interval_ms=5))
        await journal.start()
        ids = [qid() for _ in range(20)]
        await asyncio.gather(
            *(journal.write(q, mid(n), b"x" * n, ts_ms=n) for n, q in enumerate(ids))
        )
        if policy is FsyncPolicy.ALWAYS:
            assert journal.journal.wal.synced_lsn >= journal.journal.wal.written_lsn
        await journal.close()
        reopened = QueueJournal(JournalSettings(root=root))
        assert [reopened.size(q) for q in ids] == [1] * 20
        reopened.close()

    asyncio.run(run())


def test_group_commit_shares_fsyncs(root: Path) -> None:
    async def run() -> int:
        journal = AsyncJournal(JournalSettings(root=root))
        await journal.start()
        calls = 0
        original = os.fdatasync

        def counting(fd: int) -> None:
            nonlocal calls
            calls += 1
            original(fd)

        os.fdatasync = counting  # counts real fdatasyncs, does not replace them
        try:
            await asyncio.gather(*(journal.write(qid(), mid(n), b"x", ts_ms=n) for n in range(200)))
        finally:
            os.fdatasync = original
        await journal.close()
        return calls

    assert asyncio.run(run()) < 50


def test_relayctl_journal_migrate_and_check(root: Path) -> None:
    import subprocess

    from tests.helpers import BIN

    journal = QueueJournal(small(root))
    journal.write(Q, mid(1), b"a", ts_ms=1)
    journal.close()
    run = [str(BIN / "relayctl"), "journal"]
    out = subprocess.run(
        [*run, "migrate", "--root", str(root), "--to", "4,4"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "moved 1 queues; finished" in out.stdout
    assert (root / "queues" / Q[:4] / Q[4:8] / Q[8:]).is_dir()
    out = subprocess.run(
        [*run, "check", "--root", str(root)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0
    assert "0 problems" in out.stdout
    bad = subprocess.run(
        [*run, "migrate", "--root", str(root), "--to", "x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
