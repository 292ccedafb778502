"""Child process for the send-key crash test: from `START` on, writes message n with send key
`k<n>` (msg id `n`) on one of a few queues, acking some, and prints n once the write is
durable. Small WAL segments make checkpoints, and so key-file appends, frequent; a kill lands
anywhere among them. Before the first new write it retries keys `START - RETRIES .. START - 1`
as a client whose answers were lost would: a key the journal knows is not written again, and
the child prints `R <n> <msg id n the journal answered, or ->`.

    python -m tests.journal.send_key_child ROOT START
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from relay_journal.aio import AsyncJournal
from relay_journal.settings import JournalSettings

QUEUES = [f"{chr(97 + i) * 31}{i}" for i in range(3)]
RETRIES = 20


def settings(root: Path) -> JournalSettings:
    return JournalSettings(
        root=root, max_queue_messages=200, max_file_messages=256, wal_segment_bytes=16 * 1024
    )


def key(n: int) -> bytes:
    return b"k%d" % n


def msg_id(n: int) -> bytes:
    return n.to_bytes(24, "big")


async def send(journal: AsyncJournal, n: int) -> bool:
    """Write message n unless its key is known; True if it was written."""
    if journal.journal.sent(key(n), int(time.time() * 1000)) is not None:
        return False
    queue = QUEUES[n % len(QUEUES)]
    if journal.journal.size(queue) >= 150:
        head = journal.peek(queue)
        assert head is not None
        await journal.ack(queue, head.msg_id)
    ts = int(time.time() * 1000)
    await journal.write(queue, msg_id(n), b"x" * 100, ts_ms=ts, key=key(n))
    return True


async def main(root: Path, start: int) -> None:
    journal = AsyncJournal(settings(root))
    await journal.start()
    out = sys.stdout
    now = int(time.time() * 1000)
    for n in range(max(0, start - RETRIES), start):
        known = journal.journal.sent(key(n), now)
        out.write(f"R {n} {int.from_bytes(known.msg_id, 'big') if known else '-'}\n")
    out.flush()
    n = start
    while True:
        await send(journal, n)
        out.write(f"{n}\n")
        out.flush()
        n += 1


if __name__ == "__main__":
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
