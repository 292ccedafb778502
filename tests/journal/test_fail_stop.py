"""A queue-writer whose journal log can no longer be made durable stops at once (fail-stop,
`relay_runtime.exits.fail_stop`): a real process, a real fdatasync error (its log's
descriptor made a pipe's), exit code 74 (EX_IOERR), the failed write never reported durable,
and the log reopened afterwards holds what was acknowledged."""

from __future__ import annotations

import subprocess
from pathlib import Path

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_runtime import exits
from tests.helpers import child_command
from tests.journal import fail_stop_child


def test_a_failed_fdatasync_stops_the_queue_writers_stores_process(tmp_path: Path) -> None:
    done = subprocess.run(
        child_command("tests.journal.fail_stop_child", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr  # the child's log goes to stdout
    assert done.returncode == exits.EXIT_IOERR, output[-2000:]
    assert [line for line in done.stdout.splitlines() if line.startswith("durable")] == [
        "durable one"
    ]
    assert "fail_stop" in output
    journal = QueueJournal(JournalSettings(root=tmp_path / "journal"))
    try:
        assert [m.body for m in journal.messages(fail_stop_child.QUEUE)] == [b"one"]
    finally:
        journal.close()
