"""Writes the retained store forever, printing n after each acknowledged write of `k/<n>`:
single stores, `store_many` batches that also replace and delete hot topics with expiries, and
a `clear_expired` every 10 rounds (so kills land in every kind of batch); the test SIGKILLs it."""

from __future__ import annotations

import sys
from pathlib import Path

from relay_streams.retained import RetainedStore, Write


def main(root: str) -> None:
    store = RetainedStore(Path(root) / "retained")
    n = 0
    while True:
        n += 1
        if n % 2:
            store.store(f"k/{n}", b"%d" % n)
        else:
            store.store_many(
                [
                    Write(f"hot/{n % 5}", b"h", expiry_interval_s=1 + n % 3),
                    Write(f"k/{n}", b"%d" % n),
                    Write(f"hot/{(n + 1) % 5}", b""),
                ]
            )
        if n % 10 == 0:
            store.clear_expired()
        print(n, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
