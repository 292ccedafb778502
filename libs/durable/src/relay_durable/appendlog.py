"""An append-only file written through an in-memory buffer.

Invariants:
- every append carries a sequence number larger than the previous one (the caller's lsn);
  `written`, `flushed` and `synced` are the sequence numbers of the last appended, handed to
  the OS, and fdatasync'ed record, and `synced <= flushed <= written` always holds;
- `flush()` (`os.write` of the buffer) runs only on the owner's thread, so the file keeps the
  append order; `fdatasync_to()` may run on any thread and concurrent callers share one
  fdatasync;
- `switch_to()` makes the current file durable before appends go to the next one;
- a file `prepared` ahead (`relay_durable.prealloc`) is written from its start, over what it
  holds, so its fdatasyncs change no file size (its readers find the end of the records);
- a held tail (`append(hold=True)`) reaches the file only with a later record, or by a flush
  without `keep_held` (a sync, a switch, a close).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

FLUSH_BYTES = 1 << 20  # buffered bytes that force an os.write even without a sync


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AppendLog:
    def __init__(self, path: Path, *, prepared: bool = False) -> None:
        self.written = 0
        self.flushed = 0
        self.synced = 0
        self.file_bytes = 0
        """Bytes appended to the current file (buffered ones included)."""
        self._buffer = bytearray()
        self._held_at = -1
        """Where the held tail starts in the buffer (-1: none; see `append`)."""
        self._before_held = 0
        """`written` before the held tail."""
        self._lock = threading.Lock()
        self._fd = -1
        self.path = path
        self._open(path, prepared)

    def _open(self, path: Path, prepared: bool) -> None:
        self.path = path
        self.prepared = prepared
        """The current file was prepared ahead (see `switch_to`)."""
        if prepared:
            self._fd = os.open(path, os.O_WRONLY)  # written from offset 0, over what it holds
            self.file_bytes = 0
        else:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self.file_bytes = os.fstat(self._fd).st_size
        fsync_dir(path.parent)

    def append(self, seq: int, data: bytes, *, hold: bool = False) -> None:
        """`hold`: a record to reach the file only with a later one (or by an explicit sync):
        `flush(keep_held=True)`, and the flush at `FLUSH_BYTES`, leave it and any held record
        after it in the buffer, until a record is appended without `hold`."""
        if not hold:
            self._held_at = -1
        elif self._held_at < 0:
            self._held_at, self._before_held = len(self._buffer), self.written
        self._buffer += data
        self.file_bytes += len(data)
        self.written = seq
        if len(self._buffer) >= FLUSH_BYTES:
            self.flush(keep_held=True)

    def flush(self, *, keep_held: bool = False) -> None:
        """Hand the buffer to the OS; with `keep_held`, all but the held tail. Owner's thread
        only."""
        buffer = self._buffer
        held = keep_held and self._held_at >= 0
        end = self._held_at if held else len(buffer)
        done = 0
        try:
            while done < end:  # a short write (a full disk) keeps the rest for the next flush
                whole = done == 0 and end == len(buffer)
                done += os.write(self._fd, buffer if whole else buffer[done:end])
        finally:
            del buffer[:done]
            if self._held_at >= 0:
                self._held_at = self._held_at - done if held else -1
        self.flushed = self._before_held if held else self.written

    def fdatasync_to(self, seq: int) -> None:
        """Block until everything flushed up to `seq` is durable. Any thread."""
        if self.synced >= seq:
            return
        with self._lock:
            if self.synced >= seq:
                return
            target = self.flushed
            os.fdatasync(self._fd)
            self.synced = max(self.synced, target)

    @property
    def fd(self) -> int:
        """The current file's descriptor, for an fdatasync run outside `fdatasync_to`."""
        return self._fd

    def synced_through(self, seq: int) -> None:
        """Record that an fdatasync of `fd`, started once `flushed` was `seq`, has finished."""
        self.synced = max(self.synced, seq)

    def sync_to(self, seq: int) -> None:
        """Flush and fdatasync up to `seq`. Owner's thread only."""
        if self.synced >= seq:
            return
        self.flush()
        self.fdatasync_to(self.flushed)

    def switch_to(self, path: Path, *, prepared: bool = False) -> None:
        """Make the current file durable and close it; later appends go to `path` (a
        file prepared ahead, written from its start over what it holds, if `prepared`)."""
        self.flush()
        with self._lock:
            os.fdatasync(self._fd)
            self.synced = self.written
            os.close(self._fd)
            self._open(path, prepared)

    def close(self) -> None:
        if self._fd < 0:
            return
        self.flush()
        with self._lock:
            os.fdatasync(self._fd)
            self.synced = self.written
            os.close(self._fd)
            self._fd = -1
