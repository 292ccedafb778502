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
from collections.abc import Iterator
from pathlib import Path

import structlog

from relay_durable.appendlog import AppendLog
from relay_journal import records

log = structlog.get_logger(__name__)

WAL_DIR = "wal"
_SEGMENT = re.compile(r"^wal-(\d{8})-(\d{8})\.log$")
_SEQUENCE_BITS = 40


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
    """The journal's segmented log: lsn generation and segment files over one `AppendLog`."""

    def __init__(self, root: Path, generation: int) -> None:
        self.folder = root / WAL_DIR
        self.folder.mkdir(parents=True, exist_ok=True)
        self.generation = generation
        self._segment_number = 1
        self._sequence = 0
        self.file = AppendLog(self.folder / _segment_name(generation, 1))

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def written_lsn(self) -> int:
        return self.file.written

    @property
    def synced_lsn(self) -> int:
        return self.file.synced

    @property
    def segment_bytes(self) -> int:
        return self.file.file_bytes

    def next_lsn(self) -> int:
        self._sequence += 1
        return (self.generation << _SEQUENCE_BITS) | self._sequence

    def append(self, record: records.LogRecord, *, hold: bool = False) -> None:
        """`hold`: see `AppendLog.append`."""
        self.file.append(record.lsn, records.encode_log(record), hold=hold)

    def flush(self) -> None:
        """Hand buffered records to the OS, in lsn order; must run before any queue's state
        line is written or its folder removed. A held MARK at the tail stays buffered: it
        changes no queue, and goes out with the change it covers (`QueueJournal.mark`)."""
        self.file.flush(keep_held=True)

    def sync_to(self, lsn: int) -> None:
        self.file.sync_to(lsn)

    def rotate(self) -> list[Path]:
        """Start a new segment (after a checkpoint); returns the older segments to delete once
        the checkpoint record in the new one is durable."""
        old = list_segments(self.folder.parent)
        self._segment_number += 1
        self.file.switch_to(self.folder / _segment_name(self.generation, self._segment_number))
        return old

    def close(self) -> None:
        self.file.close()


def next_generation(root: Path) -> int:
    segments = list_segments(root)
    if not segments:
        return 1
    match = _SEGMENT.match(segments[-1].name)
    assert match is not None
    return int(match.group(1)) + 1
