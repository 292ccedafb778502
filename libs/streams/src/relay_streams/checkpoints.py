"""RocksDB checkpoints that keep the process responsive: `rocksdict` holds the GIL for the
whole of `create_checkpoint`, whose default first flushes every memtable (tens of ms for a
few MiB, and every Python thread waits, the event loop and the writers' threads included).

So the memtables are first flushed in RocksDB's background (`flush(wait=False)`, which only
switches memtables), while this thread polls the immutable memtables with sleeps that release
the GIL; the checkpoint then flushes only what was written meanwhile.

Invariant: the copy is RocksDB's checkpoint (hard links, same filesystem), a consistent point
in time holding each write batch wholly or not at all; the early flush changes how long the GIL
is held, never what the copy holds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from rocksdict import Checkpoint, Rdict

FLUSH_WAIT_S = 5.0
"""At most this long for the background flush; past it the checkpoint flushes what is left."""
_POLL_S = 0.002


def _flushing(families: Sequence[Rdict]) -> bool:
    return any(f.property_int_value("rocksdb.num-immutable-mem-table") for f in families)


def flush_early(families: Sequence[Rdict]) -> None:
    """Flush the memtables of `families` (column families; a database itself for its default
    one) in RocksDB's background, and return once done (or after `FLUSH_WAIT_S`)."""
    for family in families:
        family.flush(False)
    deadline = time.monotonic() + FLUSH_WAIT_S
    while _flushing(families) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def create(db: Rdict, target: Path) -> None:
    """RocksDB's checkpoint of `db` at `target` (after `flush_early`: brief)."""
    Checkpoint(db).create_checkpoint(str(target))


def take(db: Rdict, families: Sequence[Rdict], target: Path) -> None:
    """`flush_early`, then `create`."""
    flush_early(families)
    create(db, target)
