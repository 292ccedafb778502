"""Buffers of records per slot, rolled into archive files at a size or an age.

Invariants:
- a slot's files are contiguous by construction: each buffer starts at the offset after the
  last one archived for its slot (`reader.resume_points`) and a file covers from there to the
  last offset read, whatever records in between were not kept; so a file never overlaps an
  earlier one of the same writer, and a restarted writer goes on where the archive ends;
- nothing is acknowledged to Kafka as archived: the archive itself is the position. A record
  read but not yet in a file is read again after a crash (the resume point has not moved);
- rows are kept in offset order; an offset at or below the buffer's last is refused
  (`OutOfOrder`), since it would break the name's promise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay_archive import layout, rows
from relay_archive.store import ArchiveStore


@dataclass(frozen=True)
class RollPolicy:
    max_bytes: int = 64 * 1024 * 1024
    """A buffer is written once its records reach this many bytes (uncompressed)."""
    max_age_s: float = 60.0
    """… or once its oldest record was read this many seconds ago."""


class OutOfOrder(ValueError):
    pass


@dataclass
class SlotBuffer:
    slot: layout.Slot
    first: int | None
    """The first offset the next file covers; None for a slot with no file yet, whose first
    file starts at the first offset read (Kafka may have deleted older ones)."""
    kept: list[rows.Row] = field(default_factory=list)
    last: int = -1
    """The last offset read (kept or not); -1 before any."""
    bytes: int = 0
    opened_s: float | None = None
    """When the first record of the pending file was read (monotonic seconds)."""

    def add(self, offset: int, row: rows.Row | None, now_s: float) -> None:
        """Note `offset` as read, keeping `row` if given (None: read, not kept)."""
        if self.first is None:
            self.first = offset
        if offset <= self.last or offset < self.first:
            raise OutOfOrder(f"{self.slot}: offset {offset} after {max(self.last, self.first - 1)}")
        self.last = offset
        if self.opened_s is None:
            self.opened_s = now_s
        if row is not None:
            self.kept.append(row)
            self.bytes += row.size

    @property
    def pending(self) -> bool:
        return self.first is not None and self.last >= self.first

    def due(self, policy: RollPolicy, now_s: float) -> bool:
        if not self.pending or self.opened_s is None:
            return False
        return self.bytes >= policy.max_bytes or now_s - self.opened_s >= policy.max_age_s

    def take(self) -> tuple[layout.ArchiveFile, list[rows.Row]] | None:
        """The file to write and its rows, and start the next file after it."""
        if not self.pending or self.first is None:
            return None
        f = layout.ArchiveFile(self.slot, self.first, self.last)
        taken = self.kept
        self.first, self.kept, self.bytes, self.opened_s = self.last + 1, [], 0, None
        return f, taken


def write(store: ArchiveStore, f: layout.ArchiveFile, taken: list[rows.Row]) -> int:
    """Write one file; returns its size in bytes."""
    return store.put(f, rows.table_of(taken))
