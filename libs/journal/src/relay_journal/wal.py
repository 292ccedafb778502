"""The write-ahead log in front of the per-queue files, with group commit.

Invariants:
- records are appended in lsn order to an in-memory buffer and handed to the OS (`os.write`,
  always from the journal's thread, so in order) before a sync, before any state line is
  written and before a folder is removed. Message bytes a queue file holds beyond its state
  line's position are truncated on open, so a record lost from the buffer by a crash leaves no
  trace;
- `sync_to(lsn)` returns once every record up to `lsn` is fdatasync'ed; concurrent callers share
  one fdatasync (the caller that finds a sync running waits for it and for at most one more);
- lsns are `generation << 40 | sequence`; each open starts a new generation (segment file names
  carry it), so after a power loss that kept a queue file newer than the log, new records still
  sort after anything that file claims;
- segments before the last checkpoint are deleted only after the checkpoint is durable.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import structlog

from relay_journal import records
from relay_journal.layout import fsync_dir

log = structlog.get_logger(__name__)

WAL_DIR = "wal"
_SEGMENT = re.compile(r"^wal-(\d{8})-(\d{8})\.log$")
_SEQUENCE_BITS = 40
_FLUSH_BYTES = 1 << 20  # buffered log bytes that force an os.write even without a sync


def _segment_name(generation: int, number: int) -> str:
    return f"wal-{generation:08d}-{number:08d}.log"


def list_segments(root: Path) -> list[Path]:
    folder = root / WAL_DIR
    if not folder.exists():
        return []
    found = [
        (tuple(map(int, m.groups())), folder / name)
        for name in os.listdir(folder)
        if (m := _SEGMENT.match(name))
    ]
    return [path for _, path in sorted(found)]


def read_segments(paths: list[Path]) -> Iterator[tuple[records.LogRecord, Path, int]]:
    """Every valid record in order; stops a segment at its first torn or corrupt record (the
    tail of the last segment may be torn by a crash; anything after it was never acknowledged)."""
    for path in paths:
        data = path.read_bytes()
        at = 0
        while at < len(data):
            try:
                record, end = records.decode_log(data, at)
            except records.RecordError as error:
                log.warning(
                    "wal_tail_ignored",
                    segment=path.name,
                    offset=at,
                    bytes=len(data) - at,
                    error=str(error),
                )
                break
            yield record, path, at
            at = end


class Wal:
    def __init__(self, root: Path, generation: int) -> None:
        self.folder = root / WAL_DIR
        self.folder.mkdir(parents=True, exist_ok=True)
        self.generation = generation
        self._segment_number = 0
        self._sequence = 0
        self._fd = -1
        self._path: Path | None = None
        self.segment_bytes = 0
        self.written_lsn = 0
        self.flushed_lsn = 0
        self.synced_lsn = 0
        self._buffer = bytearray()
        self._sync_lock = threading.Lock()
        self._open_segment()

    @property
    def path(self) -> Path:
        assert self._path is not None
        return self._path

    def _open_segment(self) -> None:
        self._segment_number += 1
        self._path = self.folder / _segment_name(self.generation, self._segment_number)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.segment_bytes = 0
        fsync_dir(self.folder)

    def next_lsn(self) -> int:
        self._sequence += 1
        return (self.generation << _SEQUENCE_BITS) | self._sequence

    def append(self, record: records.LogRecord) -> None:
        """Buffer the record; `flush()` hands buffered records to the OS in order."""
        data = records.encode_log(record)
        self._buffer += data
        self.segment_bytes += len(data)
        self.written_lsn = record.lsn
        if len(self._buffer) >= _FLUSH_BYTES:
            self.flush()

    def append_bytes(self, lsn: int, data: bytes) -> None:
        """`append` of an already-encoded record (see `records.encode_write_log`)."""
        self._buffer += data
        self.segment_bytes += len(data)
        self.written_lsn = lsn
        if len(self._buffer) >= _FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """`os.write` the buffer. Only ever called from the journal's thread, so the log keeps
        lsn order; must run before any queue's state line or folder removal reaches disk."""
        if self._buffer:
            os.write(self._fd, self._buffer)
            self._buffer.clear()
        self.flushed_lsn = self.written_lsn

    def fdatasync_to(self, lsn: int) -> None:
        """Block until records up to `lsn` (already flushed) are durable. Thread-safe: concurrent
        callers share one fdatasync."""
        if self.synced_lsn >= lsn:
            return
        with self._sync_lock:
            if self.synced_lsn >= lsn:
                return
            target = self.flushed_lsn
            os.fdatasync(self._fd)
            self.synced_lsn = max(self.synced_lsn, target)

    def sync_to(self, lsn: int) -> None:
        """Flush and fdatasync up to `lsn`; from the journal's thread only."""
        if self.synced_lsn >= lsn:
            return
        self.flush()
        self.fdatasync_to(self.flushed_lsn)

    def rotate(self) -> list[Path]:
        """Start a new segment (after a checkpoint); returns the older segments to delete once
        the checkpoint record in the new one is durable."""
        self.flush()
        with self._sync_lock:
            os.fdatasync(self._fd)
            self.synced_lsn = self.written_lsn
            os.close(self._fd)
            old = list_segments(self.folder.parent)
            self._open_segment()
        return old

    def close(self) -> None:
        if self._fd >= 0:
            self.flush()
            with self._sync_lock:
                os.fdatasync(self._fd)
                self.synced_lsn = self.written_lsn
                os.close(self._fd)
                self._fd = -1


def next_generation(root: Path) -> int:
    segments = list_segments(root)
    if not segments:
        return 1
    match = _SEGMENT.match(segments[-1].name)
    assert match is not None
    return int(match.group(1)) + 1
