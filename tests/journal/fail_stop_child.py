"""Child for the fail-stop test: the queue-writer's stores opened as its service opens them
(`relay_queue_writer.stores.Stores`), one durable write, then the journal log's descriptor
made a pipe's (the kernel cannot fdatasync a pipe: EINVAL) and a second write. It prints each
write once it is durable; the second never is: the process stops first.

    python -m tests.journal.fail_stop_child ROOT
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from relay_queue_writer.stores import Stores
from relay_runtime.readiness import Readiness

QUEUE = "f" * 32


async def main(root: Path) -> None:
    stores = Stores(root, Readiness(), 0, repair=False)
    await stores.open()
    journal = stores.journal
    assert journal is not None
    await journal.write(QUEUE, b"1" * 24, b"one", ts_ms=1)
    print("durable one", flush=True)
    read_end, _ = os.pipe()
    os.dup2(read_end, journal.journal.wal.file.fd)
    await journal.write(QUEUE, b"2" * 24, b"two", ts_ms=2)
    print("durable two", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
