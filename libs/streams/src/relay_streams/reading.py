"""Opening a store's RocksDB instances read-only while their owner keeps writing (an online
export read from a child process: `relay_retainer.exports`).

RocksDB's read-only mode takes no lock and changes nothing: it reads the MANIFEST, opens the
table files and replays the WAL into memory, so it sees the instance as a crash would have left
it at that moment: every write batch wholly or not at all, the marks kept in the batches
(`relay_streams.marks`) included. Its own info log goes to a folder of its own, never over the
owner's `LOG`. The owner may delete a file the open is about to read (a flush or compaction
retires it); the open is then tried again.

Invariant: nothing under the store's folder is created, changed or removed by a read-only open,
except that `rocksdict` rewrites its own `rocksdict-config.json` on every open (the same bytes:
its options, which the owner read when it opened).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rocksdict import AccessType, Options

from relay_streams.errors import StreamsError

T = TypeVar("T")

ATTEMPTS = 10
_PAUSE_S = 0.02
LOG_DIR = Path(tempfile.gettempdir()) / "relay-rocksdb-read-only"
"""Info logs of read-only opens (RocksDB names each after its database's path)."""


def access() -> AccessType:
    return AccessType.read_only(False)


def options(base: Options) -> Options:
    """`base` with the info log kept out of the store's folder."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    base.set_db_log_dir(str(LOG_DIR))
    return base


def retried(open_: Callable[[], T], where: str) -> T:
    """`open_()`, tried again while the owner retires files under it."""
    for attempt in range(ATTEMPTS):
        try:
            return open_()
        except StreamsError:
            raise
        except Exception as error:  # rocksdict raises plain exceptions for engine errors
            if attempt == ATTEMPTS - 1:
                raise StreamsError(f"{where}: read-only open failed: {error}") from error
            time.sleep(_PAUSE_S)
    raise AssertionError("unreachable")
