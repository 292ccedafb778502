"""Log positions kept inside a store, in the same write batch as the data they describe, so
that any point-in-time copy (a RocksDB checkpoint) says exactly which records it holds.

A `Mark` is what one write came from: the partition of the log, the broker epoch, and the
offset after the record (the first one not applied). `Marks` is one RocksDB instance's record
of them (the retained store, or one stream shard): per partition, the epoch and offset after
the last record whose write reached this instance. A store's writes of one partition arrive in
the order of their records, so a copy holding `Marks` m holds every write of a record before
m[p] and none of a record at or after it.

`complete` says the record covers every write the instance ever took: true for an instance
created with marks, false for one that existed before marks did, or that took a write without
a mark (a restore, a rebuild from the replicators). For a complete record, a partition it does
not name sent this instance no write; for an incomplete one, nothing is known of it.

Invariants: merging never moves a partition's offset back within an epoch; a mark of another
epoch replaces the partition's (the log was wiped); a write without a mark makes the record
incomplete for good. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from relay_streams.errors import CorruptRecord


@dataclass(frozen=True)
class Mark:
    partition: int
    epoch: str
    offset: int
    """The first offset not applied: the record's offset + 1."""


@dataclass(frozen=True)
class Marks:
    complete: bool
    positions: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Partition → (epoch, first offset not applied)."""

    def after(self, marks: Iterable[Mark | None]) -> Marks:
        """The record once writes with these marks are applied (None: a write without one)."""
        positions = dict(self.positions)
        complete = self.complete
        for mark in marks:
            if mark is None:
                complete = False
                continue
            epoch, offset = positions.get(mark.partition, (mark.epoch, -1))
            if epoch != mark.epoch or mark.offset > offset:
                positions[mark.partition] = (mark.epoch, mark.offset)
        return Marks(complete, positions)

    def cut(self, epoch: str, partitions: Iterable[int]) -> dict[int, int]:
        """Per partition of `partitions`, the first offset of log `epoch` whose write this
        instance does not hold, where that is known: its mark's offset; 0 for a partition that
        sent no write in this epoch (no mark, or one of an older log) when the record is
        complete. A partition left out is unknown (an incomplete record without a mark of this
        epoch)."""
        known = {}
        for partition in partitions:
            found = self.positions.get(partition)
            if found is not None and found[0] == epoch:
                known[partition] = found[1]
            elif self.complete:
                known[partition] = 0
        return known

    def to_bytes(self) -> bytes:
        positions = {str(p): f"{e}:{o}" for p, (e, o) in sorted(self.positions.items())}
        return json.dumps({"complete": self.complete, "p": positions}).encode()

    @staticmethod
    def from_bytes(raw: bytes | None, where: str) -> Marks:
        """A stored record; None (an instance from before marks) is an empty incomplete one."""
        if raw is None:
            return Marks(False)
        try:
            data = json.loads(raw)
            positions = {}
            for key, value in data["p"].items():
                epoch, _, offset = value.rpartition(":")
                positions[int(key)] = (epoch, int(offset))
            return Marks(bool(data["complete"]), positions)
        except (ValueError, TypeError, KeyError, AttributeError):
            raise CorruptRecord(f"{where}: marks record is damaged") from None


NEW = Marks(True)
"""The record of an instance created with marks: complete, no write yet."""
