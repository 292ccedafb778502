"""Writes `fixtures/v1`, the store the first journal format produced. Run once, by the build
that introduced format 1; the files are kept so that every later build must read them:

    .venv/bin/python -m tests.journal.make_fixture_v1
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from relay_journal import errors
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings

ROOT = Path(__file__).parent / "fixtures" / "v1"
SETTINGS = {"max_queue_messages": 3, "max_file_messages": 4}
A, B, C, D = (f"fixture{letter * 25}" for letter in "ABCD")
T0 = 1_700_000_000_000


def mid(n: int) -> bytes:
    return n.to_bytes(24, "big")


def main() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    journal = QueueJournal(JournalSettings(root=ROOT, **SETTINGS))
    for n in range(3):
        journal.write(A, mid(n), b"a%d" % n, ts_ms=T0 + n)
    head = journal.peek(A)
    assert head is not None
    journal.ack(A, head.msg_id)
    journal.write(A, mid(10), b"a10", ts_ms=T0 + 10)  # the read file's 4th message
    for n in range(20, 24):  # quota: three messages, then the marker
        with contextlib.suppress(errors.QuotaExceeded):
            journal.write(B, mid(n), b"b%d" % n, ts_ms=T0 + n)
    journal.write(C, mid(30), b"c30", ts_ms=T0 + 30, expires_ms=T0 + 31)
    journal.suspend(C)
    journal.checkpoint()
    journal.write(D, mid(40), b"d40", ts_ms=T0 + 40)  # only in the log, as after a crash
    journal.wal.close()


if __name__ == "__main__":
    main()
