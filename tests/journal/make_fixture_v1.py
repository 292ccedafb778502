"""Writes `fixtures/v1`, the store the first journal format produced. Run once, by the build
that introduced format 1; the files are kept so that every later build must read them:

    .venv/bin/python -m tests.journal.make_fixture_v1

`fixtures/v1-wal` was added later by a build still writing format 1 (message, state line and
log record versions all 1): a store killed with every kind of log record still to replay
(write, quota marker, ack, expiry, suspend, drop). Written once, the same way:

    .venv/bin/python -m tests.journal.make_fixture_v1 wal
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

from relay_journal import errors
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings

ROOT = Path(__file__).parent / "fixtures" / "v1"
SETTINGS = {"max_queue_messages": 3, "max_file_messages": 4}
A, B, C, D = (f"fixture{letter * 25}" for letter in "ABCD")
T0 = 1_700_000_000_000
WAL_ROOT = Path(__file__).parent / "fixtures" / "v1-wal"
E, F, G, H, K = (f"fixture{letter * 25}" for letter in "EFGHK")


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


def main_wal() -> None:
    shutil.rmtree(WAL_ROOT, ignore_errors=True)
    journal = QueueJournal(JournalSettings(root=WAL_ROOT, **SETTINGS))
    for n in range(3):
        journal.write(E, mid(50 + n), b"e%d" % n, ts_ms=T0 + n)
    for n in range(2):
        journal.ack(E, mid(50 + n))
    journal.write(E, mid(53), b"e3", ts_ms=T0 + 3)  # the file's 4th message
    journal.write(E, mid(54), b"e4", ts_ms=T0 + 4)  # rotates
    journal.ack(E, mid(52))
    journal.ack(E, mid(53))  # the end of the read file: switch, delete it
    journal.write(F, mid(60), b"f0", ts_ms=T0, expires_ms=T0 + 50)
    journal.write(F, mid(61), b"f1", ts_ms=T0)
    assert journal.expire(F, T0 + 100) == 1
    journal.suspend(F)
    journal.write(G, mid(70), b"g0", ts_ms=T0)
    journal.delete(G)
    journal.write(H, mid(80), b"h0", ts_ms=T0)
    journal.ack(H, mid(80))  # empty, still open: dropped when the replay closes it
    for n in range(4):  # three messages, then the marker
        with contextlib.suppress(errors.QuotaExceeded):
            journal.write(K, mid(90 + n), b"k%d" % n, ts_ms=T0 + n)
    journal.wal.close()  # killed: everything since the opening checkpoint is in the log


if __name__ == "__main__":
    if sys.argv[1:] == ["wal"]:
        main_wal()
    else:
        main()
