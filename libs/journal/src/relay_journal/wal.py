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
- segments before the last checkpoint are deleted (or recycled) only after the checkpoint is
  durable;
- with `spare_bytes`, segments are written over spares prepared ahead (`relay_durable.prealloc`:
  zero-filled in the background, or recycled from the segment a checkpoint retired), so their
  fdatasyncs change no file size. lsns only grow, so a reader stops at the first record that
  is not newer than the one before it, or at zeros where a record should start.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Generator, Iterator
from pathlib import Path

import structlog

from relay_durable.appendlog import AppendLog
from relay_durable.prealloc import Preallocator
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
    """Every valid record in order, with its segment and offset. A segment's records end at its
    first torn or corrupt record (the tail of the last segment may be torn by a crash; anything
    after it was never acknowledged), at zeros where a record should start, or at a record no
    newer than the one before it: the unwritten rest of a segment written over a prepared spare
    (zeros, or a retired segment's older records). The files are mapped, not read: an
    unwritten rest costs nothing."""
    segments = MappedSegments(paths)
    found = segments.read()
    try:
        for record, position in found:
            yield record, segments.path_of(position), segments.offset_of(position)
    finally:
        found.close()  # releases its view of the mapping before the mapping is closed
        segments.close()


_ZERO_FRAME = bytes(8)
_OFFSET_BITS = 40
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1


class MappedSegments:
    """Segments mapped read-only, read once in order (`read`) and kept mapped until `close`
    so that a record can be decoded again from its position (`record_at`): the journal's
    replay reads every record at open and applies each queue's when the queue is first used
    (issue 18). A position is the segment's index << 40 | the record's offset."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self._maps: list[mmap.mmap | None] = []

    def read(self) -> Generator[tuple[records.LogRecord, int], None, None]:
        """Every valid record in order (as `read_segments` says), with its position."""
        last = -1
        for index, path in enumerate(self.paths):
            with path.open("rb") as file:
                size = os.fstat(file.fileno()).st_size
                mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else None
            self._maps.append(mapped)
            if mapped is not None:
                last = yield from _read_mapped(path, mapped, size, last, index << _OFFSET_BITS)

    def path_of(self, position: int) -> Path:
        return self.paths[position >> _OFFSET_BITS]

    @staticmethod
    def offset_of(position: int) -> int:
        return position & _OFFSET_MASK

    def record_at(self, position: int) -> records.LogRecord:
        mapped = self._maps[position >> _OFFSET_BITS]
        assert mapped is not None
        with memoryview(mapped) as data:
            return records.decode_log(data, position & _OFFSET_MASK)[0]

    def close(self) -> None:
        for mapped in self._maps:
            if mapped is not None:
                mapped.close()
        self._maps = []


def _read_mapped(
    path: Path, mapped: mmap.mmap, size: int, last: int, base: int
) -> Generator[tuple[records.LogRecord, int], None, int]:
    """The segment's records newer than `last`, with their positions (`base` | offset);
    returns the lsn of the last one read."""
    with memoryview(mapped) as data:
        at = 0
        while at < size:
            try:
                record, end = records.decode_log(data, at)
            except records.RecordError as error:
                if data[at : at + 8] == _ZERO_FRAME:
                    log.info("wal_segment_end", segment=path.name, offset=at, bytes=size - at)
                else:
                    log.warning(
                        "wal_tail_ignored",
                        segment=path.name,
                        offset=at,
                        bytes=size - at,
                        error=str(error),
                    )
                break
            if record.lsn <= last:
                log.info(
                    "wal_segment_end", segment=path.name, offset=at, stale_lsn=record.lsn, last=last
                )
                break
            yield record, base | at
            last = record.lsn
            at = end
    return last


class Wal:
    """The journal's segmented log: lsn generation and segment files over one `AppendLog`."""

    def __init__(self, root: Path, generation: int, *, spare_bytes: int = 0) -> None:
        """`spare_bytes`: the size of the spares segments are written over (0: none, every
        segment is a plain appended file)."""
        self.folder = root / WAL_DIR
        self.folder.mkdir(parents=True, exist_ok=True)
        self.generation = generation
        self._segment_number = 1
        self._sequence = 0
        self.spares = Preallocator(self.folder, spare_bytes) if spare_bytes else None
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

    def prepare_next(self) -> None:
        """Between checkpoints (the journal calls it every so many bytes): have the next
        segment's spare zero-filled in the background if none is ready or on its way, and move
        a plain segment onto a ready spare at once (a fresh store's first segment, or one begun
        when no spare was ready) rather than at the next checkpoint. A segment may end without
        a checkpoint: replay reads every segment since the last one."""
        spares = self.spares
        if spares is None:
            return
        if not self.file.prepared and spares.ready:
            self._next_segment(prepared=True)
        spares.prepare()

    def rotate(self, *, last: bool = False) -> list[Path]:
        """Start a new segment (after a checkpoint); returns the older segments to delete once
        the checkpoint record in the new one is durable. The new segment is the ready spare,
        if any, unless it is the `last` (closing) one, which holds only the checkpoint: the
        spare is kept for the next open."""
        old = list_segments(self.folder.parent)
        self._next_segment(prepared=not last)
        return old

    def retire(self, old: list[Path]) -> None:
        """Remove segments a durable checkpoint made useless. The newest becomes the next
        spare when it is a full one and no spare is ready (recycling costs no disk writes;
        zero-filling costs a segment's)."""
        for path in old:
            recycled = path == old[-1] and self.spares is not None and self.spares.recycle(path)
            if not recycled:
                path.unlink(missing_ok=True)

    def _next_segment(self, *, prepared: bool) -> None:
        """Switch to a new segment: the spare, if `prepared` and one is ready."""
        self._segment_number += 1
        path = self.folder / _segment_name(self.generation, self._segment_number)
        spare = prepared and self.spares is not None and self.spares.take(path)
        self.file.switch_to(path, prepared=spare)

    def close(self) -> None:
        self.file.close()
        if self.spares is not None:
            self.spares.close()


def next_generation(root: Path) -> int:
    segments = list_segments(root)
    if not segments:
        return 1
    match = _SEGMENT.match(segments[-1].name)
    assert match is not None
    return int(match.group(1)) + 1
