"""Marks: a caller's position in its source, logged in order with the changes (what the
queue-writer uses so that a command consumed twice has no second effect)."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from relay_journal import records
from relay_journal.journal import QueueJournal
from relay_journal.settings import FsyncPolicy
from relay_journal.wal import list_segments
from tests.helpers import ROOT, child_command
from tests.journal import mark_child
from tests.journal.conftest import mid, qid, small


def test_mark_records_round_trip() -> None:
    mark = records.LogRecord(records.Op.MARK, 7, "p3", marks={"p3": "epoch:1200"})
    assert records.decode_log(records.encode_log(mark), 0)[0] == mark
    checkpoint = records.LogRecord(records.Op.CHECKPOINT, 9, "", marks={"p0": "e:1", "p1": "e:2"})
    assert records.decode_log(records.encode_log(checkpoint), 0)[0] == checkpoint
    bare = records.LogRecord(records.Op.CHECKPOINT, 9, "")  # as v1 files before marks
    assert records.decode_log(records.encode_log(bare), 0)[0].marks is None


def test_marks_survive_checkpoints_and_reopen(tmp_path: Path) -> None:
    journal = QueueJournal(small(tmp_path, wal_segment_bytes=2048))
    queue = qid()
    for n in range(200):
        journal.mark(f"p{n % 3}", f"e:{n}")
        journal.write(queue, mid(n), b"m" * 40, ts_ms=n)
        journal.ack(queue, mid(n))
    assert journal.marks == {"p0": "e:198", "p1": "e:199", "p2": "e:197"}
    journal.close()
    again = QueueJournal(small(tmp_path))
    assert again.marks == {"p0": "e:198", "p1": "e:199", "p2": "e:197"}
    again.mark("p1", "f:1")  # no change follows it: not trusted after a crash
    again.mark("p0", "f:0", alone=True)  # a position with no change to follow: trusted alone
    del again  # abandoned, not closed: under `always` both are durable
    third = QueueJournal(small(tmp_path))
    assert third.marks == {"p0": "f:0", "p1": "f:1", "p2": "e:197"}  # the alone one carries p1
    third.mark("p2", "g:2")
    del third
    fourth = QueueJournal(small(tmp_path))
    assert fourth.marks == {"p0": "f:0", "p1": "f:1", "p2": "e:197"}  # the log ended on g:2
    fourth.close()


def test_bad_mark_keys_are_refused(tmp_path: Path) -> None:
    journal = QueueJournal(small(tmp_path))
    for key in ["", "k" * 256]:
        with pytest.raises(ValueError, match="mark keys"):
            journal.mark(key, "v")
    assert journal.marks == {}
    journal.close()


@pytest.mark.parametrize("seed", range(2))
def test_a_change_is_never_durable_without_its_mark(tmp_path: Path, seed: int) -> None:
    """SIGKILL at random moments: every message that survived was marked, so a caller that
    resumes after its mark never applies a message twice; and the marks never run ahead of the
    messages by more than the one about to be written."""
    rng = random.Random(seed)
    for _ in range(10):
        child = subprocess.Popen(
            child_command("tests.journal.mark_child", str(tmp_path)),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline() == "writing\n"
        time.sleep(rng.uniform(0.01, 0.3))
        child.kill()
        child.wait()
        journal = QueueJournal(mark_child.settings(tmp_path))
        marked = int(journal.marks.get("p0", "0"))
        present = [int.from_bytes(m.msg_id, "big") for m in journal.messages(mark_child.QUEUE)]
        assert present == list(range(present[0], present[-1] + 1))  # in order, none twice
        window = mark_child.WINDOW  # none lost: the head is acked only beyond the window
        assert len(present) in (min(present[-1], window), window + 1)
        assert present[-1] <= marked <= present[-1] + 1
        folder = journal.layout.paths(tmp_path, mark_child.QUEUE)[0]
        assert len(list(folder.glob("messages.*.log"))) <= 2  # no file the log never named
        journal.close()


def test_a_mark_reaches_the_log_only_with_the_change_it_covers(tmp_path: Path) -> None:
    """Neither a full segment nor a state line's flush puts a mark on disk ahead of the change
    logged after it (a caller killed in between would resume after the mark and skip it)."""
    journal = QueueJournal(small(tmp_path, fsync=FsyncPolicy.NEVER, wal_segment_bytes=2048))
    queue = qid()
    journal.write(queue, mid(1), b"a", ts_ms=1)
    segments = list_segments(tmp_path)
    for n in range(100):  # far past a segment's worth: no checkpoint until a change
        journal.mark("p0", f"e:{n}")
    assert list_segments(tmp_path) == segments

    def on_disk() -> bytes:
        return b"".join(path.read_bytes() for path in list_segments(tmp_path))

    assert journal.close_idle(0) == 1  # its state line: the log is flushed, the marks stay
    assert b"e:99" not in on_disk()
    journal.write(queue, mid(2), b"b", ts_ms=2)
    journal.wal.flush()
    assert b"e:99" in on_disk()
    journal.close()


def test_a_mark_whose_change_was_torn_off_is_not_trusted(tmp_path: Path) -> None:
    """A SIGKILL during a write of several pages keeps a prefix cut at a page boundary (Linux
    stops copying at a fatal signal): a MARK on disk with its change torn off. A mark the log
    ends on is not trusted, so the caller resumes before it and writes the change again (the
    marks crash test lost message 52,043 this way: mark 52,043 kept, its write torn)."""
    settings = small(tmp_path, fsync=FsyncPolicy.NEVER, max_queue_messages=10, max_file_messages=11)
    journal = QueueJournal(settings)
    queue = qid()
    for n in (1, 2):
        journal.mark("p0", str(n))
        journal.write(queue, mid(n), b"x" * 100, ts_ms=n)
    journal.sync()
    journal.wal.close()  # killed: the log ends with write 2
    segment = list_segments(tmp_path)[-1]
    end = len(segment.read_bytes().rstrip(b"\0"))
    with segment.open("r+b") as file:
        file.truncate(end - 10)  # write 2's record torn: MARK 2 is the last whole record
    with capture_logs() as logs:
        reopened = QueueJournal(settings)
    assert reopened.marks["p0"] == "1"
    assert [m.msg_id for m in reopened.messages(queue)] == [mid(1)]
    assert "trailing_marks_dropped" in [entry["event"] for entry in logs]
    reopened.close()
