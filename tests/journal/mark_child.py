"""Child for the marks crash test: for n = 1, 2, ... marks `p0 = n` and then writes message n
(the queue-writer's order: mark what is about to be applied, then apply it), with fsync policy
`never` so the order rests on the log alone, until it is killed. It acknowledges the head beyond
the newest `WINDOW` messages, so the queue stays far below its quota however fast the machine.

    python -m tests.journal.mark_child ROOT
"""

from __future__ import annotations

import sys
from pathlib import Path

import structlog

from relay_journal.journal import QueueJournal
from relay_journal.settings import FsyncPolicy, JournalSettings

QUEUE = "m" * 32
WINDOW = 1000


def settings(root: Path) -> JournalSettings:
    return JournalSettings(
        root=root,
        fsync=FsyncPolicy.NEVER,
        max_queue_messages=2 * WINDOW,
        max_file_messages=4 * WINDOW,  # files rotate and are removed as their messages are acked
        wal_segment_bytes=16 * 1024,  # checkpoints every ~40 writes: marks cross segments
    )


def main(root: Path) -> None:
    journal = QueueJournal(settings(root))
    start = int(journal.marks.get("p0", "0"))
    present = journal.messages(QUEUE)
    head = int.from_bytes(present[0].msg_id, "big") if present else start + 1
    n = start
    while True:
        n += 1
        journal.mark("p0", str(n))
        journal.write(QUEUE, n.to_bytes(24, "big"), b"x" * 200, ts_ms=n)
        while n - head >= WINDOW:
            journal.ack(QUEUE, head.to_bytes(24, "big"))
            head += 1
        if n == start + 1:
            print("writing", flush=True)


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    main(Path(sys.argv[1]))
