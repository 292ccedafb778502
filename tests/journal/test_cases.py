"""The SMP-style recovery cases, resource bounds, layouts and migration, fsync policies."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import time
from pathlib import Path

import pytest

from relay_journal import errors, layout, records
from relay_journal.aio import AsyncJournal
from relay_journal.journal import HANDLES_KEPT_FREE, QueueJournal
from relay_journal.queue import message_file
from relay_journal.records import Message, Pos
from relay_journal.settings import FsyncPolicy, JournalSettings
from tests.journal.conftest import (
    drain,
    logged_warnings,
    mid,
    open_files_under,
    qid,
    small,
)

Q = "smpcasequeueaaaaaaaaaaaaaaaaaaaa"


def _folder(journal: QueueJournal, queue: str = Q) -> Path:
    return journal.layout.paths(journal.root, queue)[0]


def test_restores_from_the_last_valid_line_when_the_last_is_torn(root: Path) -> None:
    settings = small(root, state_compact_lines=10)
    journal = QueueJournal(settings)
    journal.write(Q, mid(1), b"a", ts_ms=1)
    journal.close()  # closing writes the queue's state line (a checkpoint tables it instead)
    journal = QueueJournal(settings)
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


def test_a_whole_message_without_state_line_is_truncated_away(root: Path) -> None:
    """Seed 000's order (message, then state line) cut between the two: the message file holds
    a complete, valid record that no state line (and no log record) counts."""
    settings = small(root)
    journal = QueueJournal(settings)
    journal.write(Q, mid(1), b"a", ts_ms=1)
    info = journal.info(Q)
    path = message_file(_folder(journal), info.write.file)
    journal.close()
    with path.open("ab") as f:
        f.write(records.encode_message(Message(mid(2), 2, 0, b"never acknowledged")))
    reopened = QueueJournal(settings)
    assert reopened.info(Q).size == 1  # loading the queue truncates its write file
    assert path.stat().st_size == info.write.byte
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


MISSING_WARNINGS = {
    "read": {"read_file_missing"},
    "write": {"write_file_missing"},
    "both": {"read_file_missing", "write_file_missing"},
    "state": {"state_file_missing", "state_rebuilt_from_messages"},
}


@pytest.mark.parametrize("missing", ["read", "write", "both", "state"])
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
    if missing == "state":
        (folder / "queue.log").unlink()
    with logged_warnings() as found:
        reopened = QueueJournal(settings)
        # `check` walks the folders: a folder that lost queue.log is still found as a queue.
        assert reopened.check() == []
    assert MISSING_WARNINGS[missing] <= set(found), found
    # Nothing left in "both": the empty queue's folder is gone after `check` closed it.
    assert (folder / "queue.log").exists() == (missing != "both")
    got = drain(reopened, Q)
    # Without queue.log the read position is lost: acked messages come again, none is lost.
    assert (
        got
        == {
            "read": [b"E"],
            "write": [b"C", b"D"],
            "both": [],
            "state": [b"A", b"B", b"C", b"D", b"E"],
        }[missing]
    )
    reopened.write(Q, mid(9), b"after", ts_ms=9)  # and the queue works again
    assert drain(reopened, Q) == [b"after"]
    reopened.close()


def test_missing_single_message_file_is_recovered(root: Path) -> None:
    """Read and write file are one file, and it is gone."""
    settings = small(root)
    journal = QueueJournal(settings)
    journal.write(Q, mid(1), b"a", ts_ms=1)
    journal.write(Q, mid(2), b"b", ts_ms=2)
    info = journal.info(Q)
    assert info.read.file == info.write.file
    folder = _folder(journal)
    journal.close()
    message_file(folder, info.write.file).unlink()
    with logged_warnings() as found:
        reopened = QueueJournal(settings)
        assert reopened.info(Q).size == 0
    assert "write_file_missing" in found
    reopened.write(Q, mid(3), b"c", ts_ms=3)
    assert drain(reopened, Q) == [b"c"]
    reopened.close()


def test_drain_across_a_rotation_and_reopen(root: Path) -> None:
    """Reading continues from the read file into the write file, across a close and reopen."""
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


def _two_files(journal: QueueJournal) -> None:
    """Q with C, D in a full read file (A, B acked) and E in the write file."""
    for n in range(3):
        journal.write(Q, mid(n), bytes([65 + n]), ts_ms=n)
    for _ in range(2):
        head = journal.peek(Q)
        assert head is not None
        journal.ack(Q, head.msg_id)
    journal.write(Q, mid(3), b"D", ts_ms=3)
    journal.write(Q, mid(4), b"E", ts_ms=4)


def test_eof_while_switching_read_file(root: Path) -> None:
    """Seed 000's crash between the ack of the read file's last message and the switch: the
    last state line has the read position at the end of the read file, which still exists."""
    settings = small(root)
    journal = QueueJournal(settings)
    _two_files(journal)
    info = journal.info(Q)
    folder = _folder(journal)
    journal.close()
    read_path = message_file(folder, info.read.file)
    at_eof = records.QueueState(
        read=Pos(info.read.file, 4, read_path.stat().st_size),
        write=info.write,
        size=1,
        lsn=records.decode_state((folder / "queue.log").read_bytes().splitlines(True)[-1]).lsn,
    )
    with (folder / "queue.log").open("ab") as f:
        f.write(records.encode_state(at_eof))
    reopened = QueueJournal(settings)
    assert reopened.info(Q).size == 1
    assert drain(reopened, Q) == [b"E"]
    assert not read_path.exists()  # the consumed file is deleted at the switch
    assert reopened.info(Q).read.file == info.write.file
    reopened.close()


def test_rotation_and_ack_switch_delete_the_consumed_file(root: Path) -> None:
    settings = small(root)  # quota 3, 4 messages per file
    journal = QueueJournal(settings)
    _two_files(journal)
    info = journal.info(Q)
    folder = _folder(journal)
    # The read file rotated at exactly max_file_messages; the write file took the next one.
    assert info.read == Pos(info.read.file, 2, info.read.byte)
    assert info.write == Pos(info.write.file, 1, info.write.byte)
    assert info.read.file != info.write.file
    assert [m.body for m in journal.messages(Q)] == [b"C", b"D", b"E"]
    read_path = message_file(folder, info.read.file)
    for body in (b"C", b"D"):
        head = journal.peek(Q)
        assert head is not None
        assert head.body == body
        assert read_path.exists()  # not consumed until its last message is acked
        journal.ack(Q, head.msg_id)
    after = journal.info(Q)
    assert after.read == Pos(info.write.file, 0, 0)  # switched to the write file...
    assert not read_path.exists()  # ...and the consumed file is gone
    assert all(info.read.file not in path for path in open_files_under(root))
    assert drain(journal, Q) == [b"E"]
    journal.close()


def test_peek_is_cached_not_read_again(root: Path) -> None:
    journal = QueueJournal(small(root))
    journal.write(Q, mid(1), b"first", ts_ms=1)
    journal.write(Q, mid(2), b"second", ts_ms=2)
    first = journal.peek(Q)
    assert first is not None
    path = message_file(_folder(journal), journal.info(Q).read.file)
    # Overwrite the head's bytes on disk: a second read of them would fail its checksum.
    length = len(records.encode_message(first))
    with path.open("r+b") as f:
        f.write(b"\x00" * length)
    with logged_warnings() as found:
        assert journal.peek(Q) == first
        assert journal.peek(Q) == first
    assert found == []
    journal.ack(Q, first.msg_id)  # the cache moves on: the next head is read from disk
    second = journal.peek(Q)
    assert second is not None
    assert second.body == b"second"
    journal.close()


def test_running_out_of_file_handles_drops_nothing(root: Path) -> None:
    """The process at its file-handle limit (a real RLIMIT_NOFILE): reading the head fails with
    EMFILE and the queue keeps every message. It used to take that for an unreadable file and
    drop the queue's messages."""
    journal = QueueJournal(small(root))
    for n in range(1, 4):
        journal.write(Q, mid(n), b"m%d" % n, ts_ms=n)
    for _ in range(2):
        head = journal.peek(Q)
        assert head is not None
        journal.ack(Q, head.msg_id)
    journal.write(Q, mid(4), b"m4", ts_ms=4)
    journal.write(Q, mid(5), b"m5", ts_ms=5)  # rotation (4 per file): m3 and m4 in the older
    # The queue holds its new write file only; reading the older one takes a second handle.
    probe = os.open(os.devnull, os.O_RDONLY)
    os.close(probe)  # the lowest free descriptor: a limit there refuses every open
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (probe, hard))
    try:
        with (
            logged_warnings() as found,
            pytest.raises(OSError, match="Too many open files") as raised,
        ):
            journal.peek(Q)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert raised.value.errno == errno.EMFILE
    assert found == []
    assert drain(journal, Q) == [b"m3", b"m4", b"m5"]
    journal.close()


def test_open_queues_outnumber_the_file_handle_limit(root: Path) -> None:
    """Handles are bounded by what RLIMIT_NOFILE allows, not open queues: with room for five
    handles, 150 queues written and read stay open (none is reloaded), the least recently
    used handles are closed instead, and nothing meets EMFILE or loses a message."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (HANDLES_KEPT_FREE + 5, hard))
    try:
        with logged_warnings() as found:
            journal = QueueJournal(small(root, max_open_queues=1000, max_open_files=100))
        assert found == ["max_open_files_lowered"]
        assert journal.handles.limit == 5
        queues = [qid() for _ in range(150)]
        for n, queue in enumerate(queues):
            journal.write(queue, mid(n), b"m", ts_ms=1)
            assert journal.peek(queue) is not None  # read and write: one handle, same file
            journal.write(queue, mid(1000 + n), b"n", ts_ms=1)  # buffered, handle or not
            assert journal.handles.held <= 5
            assert len(open_files_under(root / "queues")) <= 5
        assert journal.open_queues == 150
        assert journal.handles.released >= 145
        assert [drain(journal, q) for q in queues] == [[b"m", b"n"]] * 150
        assert journal.handles.held == 0  # empty queues hold no handle
        journal.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_bytes_past_the_recorded_position_are_never_read(root: Path) -> None:
    """Seed 000 truncates the write file to the recorded position before each append: bytes
    past it (here two whole, valid records no state counts) must never be delivered, also after
    the file was rotated away and is read to its end."""
    journal = QueueJournal(small(root))
    for n in range(3):
        journal.write(Q, mid(n), b"%d" % n, ts_ms=n)
    for _ in range(2):
        head = journal.peek(Q)
        assert head is not None
        journal.ack(Q, head.msg_id)
    path = message_file(_folder(journal), journal.info(Q).write.file)
    stray = [Message(mid(90), 1, 0, b"3"), Message(mid(91), 1, 0, b"stray")]
    with path.open("ab") as f:
        f.write(b"".join(records.encode_message(m) for m in stray))
    journal.write(Q, mid(3), b"3", ts_ms=3)  # as long as the first stray record: overwrites it
    journal.write(Q, mid(4), b"4", ts_ms=4)  # rotates: the full file becomes the read file
    assert path.stat().st_size == journal.info(Q).read.byte + 2 * len(
        records.encode_message(stray[0])
    )
    with logged_warnings() as found:
        assert drain(journal, Q) == [b"2", b"3", b"4"]
    assert found == []
    journal.close()


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
    settings = small(root)
    journal = QueueJournal(settings)
    for n in range(3):
        journal.write(Q, mid(n), b"m", ts_ms=n)
    for n in range(3, 6):
        with pytest.raises(errors.QuotaExceeded):
            journal.write(Q, mid(n), b"m", ts_ms=n)
    assert journal.size(Q) == 4  # three messages and one marker
    journal.close()
    journal = QueueJournal(settings)  # the refusal is on disk: still refused after a reopen
    with pytest.raises(errors.QuotaExceeded):
        journal.write(Q, mid(6), b"m", ts_ms=6)
    head = journal.peek(Q)
    assert head is not None
    journal.ack(Q, head.msg_id)  # partly drained is not drained: still refused, no 2nd marker
    with pytest.raises(errors.QuotaExceeded):
        journal.write(Q, mid(7), b"m", ts_ms=7)
    assert journal.size(Q) == 3
    assert drain(journal, Q) == [b"m", b"m", b"<quota>"]
    journal.write(Q, mid(9), b"ok", ts_ms=9)
    assert [m.body for m in journal.messages(Q)] == [b"ok"]
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


def test_lru_closes_the_least_recently_used_and_bounds_open_files(root: Path) -> None:
    journal = QueueJournal(small(root, max_open_queues=2))
    a, b, c = (qid() for _ in range(3))
    journal.write(a, mid(1), b"a", ts_ms=1)
    journal.write(b, mid(2), b"b", ts_ms=1)
    assert journal.peek(a) is not None  # a is now more recently used than b
    journal.write(c, mid(3), b"c", ts_ms=1)  # so b is closed, not a
    assert journal.info(b).open is False  # (loading b closes a, the least recent now)
    assert journal.info(c).open is True
    assert journal.info(a).open is False
    many = [qid() for _ in range(20)]
    for n, queue in enumerate(many):
        journal.write(queue, mid(n), b"x", ts_ms=1)
        assert journal.peek(queue) is not None  # read and write handles both open
        assert len(open_files_under(root / "queues")) <= 2 * 2  # two queues, two files each
    for queue in [a, b, c, *many]:
        drain(journal, queue)
    assert open_files_under(root / "queues") == []  # empty queues hold no open file
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


def test_state_backups_retention_rule(root: Path) -> None:
    """Backups (`queue.<timestamp>.log`, one per compaction) are kept while younger than the
    maximum age; older ones go, except the newest `state_backups_keep`."""
    settings = small(
        root,
        max_queue_messages=100,
        max_file_messages=200,
        state_compact_lines=2,
        state_backups_keep=2,
        state_backups_max_age_s=3600,
    )
    journal = QueueJournal(settings)
    folder = _folder(journal)
    n = 0

    def backups() -> list[Path]:
        return sorted(folder.glob("queue.*.log"))

    def compact_once() -> None:
        nonlocal n
        before = set(backups())
        while set(backups()) == before:
            n += 1
            journal.write(Q, mid(n), b"x", ts_ms=n)
            journal.close_idle(0)  # one state line per close; compaction past 2 lines

    for _ in range(5):
        compact_once()
    assert len(backups()) == 5  # all younger than the maximum age
    assert all(len(p.read_bytes().splitlines()) == 2 for p in backups())  # the full old file
    old = time.time() - 7200
    for path in backups():
        os.utime(path, (old, old))
    newest_old = backups()[-1]
    compact_once()
    kept = backups()
    assert len(kept) == 2
    assert newest_old in kept  # among the newest two: kept although old
    assert len((folder / "queue.log").read_bytes().splitlines()) <= 2
    journal.close()


def test_sync_journal_fsync_policies(root: Path) -> None:
    journal = QueueJournal(small(root, fsync=FsyncPolicy.ALWAYS))
    for n in range(3):
        lsn = journal.write(qid(), mid(n), b"x", ts_ms=1)
        assert journal.wal.synced_lsn >= lsn  # durable when the call returns
    journal.close()

    journal = QueueJournal(small(root, fsync=FsyncPolicy.NEVER))
    lsn = journal.write(qid(), mid(1), b"x", ts_ms=1)
    time.sleep(0.02)
    journal.write(qid(), mid(2), b"x", ts_ms=1)
    assert journal.wal.synced_lsn < lsn  # only checkpoints and close sync
    journal.close()

    journal = QueueJournal(small(root, fsync=FsyncPolicy.BATCH, batch_interval_ms=200))
    first = journal.write(qid(), mid(1), b"x", ts_ms=1)
    assert journal.wal.synced_lsn >= first  # the first change after an interval syncs
    second = journal.write(qid(), mid(2), b"x", ts_ms=1)
    assert journal.wal.synced_lsn < second  # within the interval: not yet
    time.sleep(0.25)
    third = journal.write(qid(), mid(3), b"x", ts_ms=1)
    assert journal.wal.synced_lsn >= third
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
        wal = journal.journal.wal
        if policy is FsyncPolicy.ALWAYS:
            assert wal.synced_lsn >= wal.written_lsn
        else:
            assert wal.synced_lsn < wal.written_lsn  # the writes returned before any fsync
            await asyncio.sleep(0.1)
            if policy is FsyncPolicy.BATCH:
                assert wal.synced_lsn >= wal.written_lsn  # the background round came
            else:
                assert wal.synced_lsn < wal.written_lsn  # NEVER: only close syncs
        await journal.close()
        reopened = QueueJournal(JournalSettings(root=root))
        assert [reopened.size(q) for q in ids] == [1] * 20
        reopened.close()

    asyncio.run(run())


@pytest.mark.parametrize("backends", [("uring",), ("aio",), ()], ids=["uring", "aio", "thread"])
def test_group_commit_shares_fsyncs(root: Path, backends: tuple[str, ...]) -> None:
    async def run() -> tuple[int, str]:
        journal = AsyncJournal(JournalSettings(root=root, fsync_backends=backends))
        await journal.start()
        await asyncio.gather(*(journal.write(qid(), mid(n), b"x", ts_ms=n) for n in range(200)))
        assert journal.journal.wal.synced_lsn == journal.journal.wal.written_lsn
        rounds, backend = journal.commit.rounds, journal.commit.backend
        await journal.close()
        return rounds, backend

    rounds, backend = asyncio.run(run())
    assert backend == (backends[0] if backends else "thread")
    assert 0 < rounds < 50


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
    too_long = subprocess.run(  # longer than the queue ids: refused, one line, nothing moved
        [*run, "migrate", "--root", str(root), "--to", "20,20"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert too_long.returncode == 1
    assert too_long.stderr.startswith("relayctl: journal: ")
    assert "Traceback" not in too_long.stderr
    assert (root / "queues" / Q[:4] / Q[4:8] / Q[8:]).is_dir()
