"""A write file missing when its queue is loaded by the replay after a SIGKILL (issue 18): the
report counts only what is lost after the replay. A state line written before the file's
messages were acknowledged and the file deleted (a whole-suite SIGKILL) used to be reported as
every message the file had held being lost, at warning level, although the log acknowledged
them all."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from relay_journal.journal import QueueJournal
from relay_journal.queue import message_file
from tests import helpers
from tests.journal.conftest import drain, qid, small


def _killed_child(root: Path, queue: str, case: str) -> tuple[str, Path]:
    """Run the child to its SIGKILL; the write file its checkpoint recorded, and the folder."""
    child = subprocess.run(
        [sys.executable, "-m", "tests.journal.missing_write_file_child", str(root), queue, case],
        cwd=helpers.ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    lines = child.stdout.splitlines()
    assert lines[-1] == "synced", child.stdout
    _, file, folder = next(line for line in lines if line.startswith("recorded ")).split(" ", 2)
    return file, Path(folder)


@pytest.mark.parametrize(
    ("case", "lost", "acked", "left"),
    [("consumed", 0, 3, [b"m6", b"m7"]), ("unread", 3, 0, [b"m4"])],
)
def test_a_missing_write_file_reports_what_the_replay_did_not_acknowledge(
    tmp_path: Path, case: str, lost: int, acked: int, left: list[bytes]
) -> None:
    root, queue = tmp_path / "journal", qid()
    first_file, folder = _killed_child(root, queue, case)
    if case == "unread":  # the file the state line counts three unread messages in is lost
        message_file(folder, first_file).unlink()
    assert not message_file(folder, first_file).exists()
    with capture_logs() as entries:
        journal = QueueJournal(small(root, max_queue_messages=4, max_file_messages=5))
    reports = [e for e in entries if e["event"] == "write_file_missing"]
    assert [(r["file"], r["unread_at_load"]) for r in reports] == [(first_file, 3)], entries
    (report,) = reports
    assert (report["messages_lost"], report["acked_in_replay"]) == (lost, acked)
    assert report["log_level"] == ("warning" if lost else "info")
    replayed = next(i for i, e in enumerate(entries) if e["event"] == "journal_replayed")
    assert entries.index(report) > replayed  # reported once the replay's records are applied
    assert drain(journal, queue) == left
    journal.close()
