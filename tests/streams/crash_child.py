"""Writes synchronous batches forever, printing the last acknowledged message number after each
`store_batch` returns, and adds a generation every 4 batches (so that kills often land in one);
the test SIGKILLs it."""

from __future__ import annotations

import sys
from pathlib import Path

from relay_streams.model import Message
from relay_streams.settings import DbSettings
from relay_streams.store import StreamStore


def main(root: str) -> None:
    store = StreamStore(Path(root), node="crash")
    db = store.open_db("m", DbSettings(shards=3, lts_thresholds=(4, 2)))
    n = 0
    batch_number = 0
    while True:
        batch = []
        for _ in range(7):
            n += 1
            batch.append(Message(f"t/{n % 13}/{n % 5}", b"%d" % n, n))
        db.store_batch(batch)
        print(n, flush=True)
        batch_number += 1
        if batch_number % 4 == 0:
            db.add_generation()


if __name__ == "__main__":
    main(sys.argv[1])
