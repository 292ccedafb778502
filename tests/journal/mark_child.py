"""Child for the marks crash test: for n = 1, 2, ... marks `p0 = n` and then writes message n
(the queue-writer's order: mark what is about to be applied, then apply it), with fsync policy
`never` so the order rests on the log alone, until it is killed.

    python -m tests.journal.mark_child ROOT
"""

from __future__ import annotations

import sys
from pathlib import Path

import structlog

from relay_journal.journal import QueueJournal
from relay_journal.settings import FsyncPolicy, JournalSettings

QUEUE = "m" * 32


def settings(root: Path) -> JournalSettings:
    return JournalSettings(
        root=root,
        fsync=FsyncPolicy.NEVER,
        max_queue_messages=100_000,
        max_file_messages=100_001,
        wal_segment_bytes=16 * 1024,  # checkpoints every ~40 writes: marks cross segments
    )


def main(root: Path) -> None:
    journal = QueueJournal(settings(root))
    start = int(journal.marks.get("p0", "0"))
    n = start
    while True:
        n += 1
        journal.mark("p0", str(n))
        journal.write(QUEUE, n.to_bytes(24, "big"), b"x" * 200, ts_ms=n)
        if n == start + 1:
            print("writing", flush=True)


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    main(Path(sys.argv[1]))
