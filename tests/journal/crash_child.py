"""Child process for the crash tests: writes and acks on several queues concurrently until
killed, printing `opening` before it opens the journal (replay and checkpoint), `ready` once it
is open, `w q n` before and `W q n` after each durable write, `a q n` / `A q n` for acks,
and `table 1` / `table 0` when the checkpoint thread starts or stops writing a tail table.

    python -m tests.journal.crash_child ROOT SEED [HANDLES]

HANDLES (default 0: what the process may hold) bounds the queue-file handles: with 2, six
queues share two handles, so nearly every operation closes another queue's handle (its
buffered appends written first) and reopens its own.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from relay_journal.aio import AsyncJournal
from relay_journal.settings import JournalSettings

QUEUES = [f"{chr(97 + i) * 31}{i}" for i in range(6)]


def settings(root: Path, handles: int = 0) -> JournalSettings:
    # Small files and log segments, so rotations, read-file switches and checkpoints all happen.
    return JournalSettings(
        root=root,
        max_queue_messages=40,
        max_file_messages=48,
        max_open_queues=4,
        max_open_files=handles,
        wal_segment_bytes=64 * 1024,
    )


def msg_id(seed: int, n: int) -> bytes:
    return seed.to_bytes(8, "big") + n.to_bytes(16, "big")


async def main(root: Path, seed: int, handles: int) -> None:
    rng = random.Random(seed)
    out = sys.stdout
    out.write("opening\n")  # a kill from here on lands in recovery (replay, checkpoint)
    out.flush()
    journal = AsyncJournal(settings(root, handles))
    await journal.start()
    counter = 0
    writing_table = False

    async def worker(queue: str) -> None:
        nonlocal counter, writing_table
        while True:
            head = journal.peek(queue)
            if head is not None and (rng.random() < 0.45 or journal.info(queue).size >= 35):
                n = int.from_bytes(head.msg_id, "big")
                out.write(f"a {queue} {n}\n")
                await journal.ack(queue, head.msg_id)
                out.write(f"A {queue} {n}\n")
            else:
                counter += 1
                mid = msg_id(seed, counter)
                n = int.from_bytes(mid, "big")
                out.write(f"w {queue} {n}\n")
                await journal.write(queue, mid, b"b" * rng.randint(0, 300), ts_ms=1)
                out.write(f"W {queue} {n}\n")
            if journal.journal.checkpointing != writing_table:
                writing_table = not writing_table
                out.write(f"table {int(writing_table)}\n")
            out.flush()
            if rng.random() < 0.02:
                journal.journal.close_idle(0)
            await asyncio.sleep(0)

    out.write("ready\n")
    out.flush()
    await asyncio.gather(*(worker(q) for q in QUEUES))


if __name__ == "__main__":
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), int((sys.argv[3:] or ["0"])[0])))
