"""Reading an archive back: what it covers, where a writer resumes, and each slot's records
once each.

Invariants:
- a record is returned once per (epoch, topic, partition, offset) however many files hold it
  (overlaps come from two archivers writing the same partition during a hand-over, or from a
  restore of files); the copy from the file listed first is kept, all copies being the same
  Kafka record;
- a slot's resume point is the offset after the highest one any of its files covers, so a
  restarted archiver neither loses nor repeats a range;
- a file that cannot be read raises `CorruptArchiveFile` naming it, unless the caller asks to
  skip damaged files, in which case it is reported in `Scan.corrupt` and its range counts as a
  gap: a damaged file never turns into missing rows silently.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from relay_archive import layout, rows
from relay_archive.store import ArchiveStore, CorruptArchiveFile


def by_slot(files: Iterable[layout.ArchiveFile]) -> dict[layout.Slot, list[layout.ArchiveFile]]:
    grouped: dict[layout.Slot, list[layout.ArchiveFile]] = defaultdict(list)
    for f in files:
        grouped[f.slot].append(f)
    return dict(grouped)


def epochs(store: ArchiveStore) -> list[str]:
    return sorted({f.slot.epoch for f in store.list_files()})


def resume_points(store: ArchiveStore, epoch: str, topic: str) -> dict[int, int]:
    """Partition → the first offset not archived yet (partitions with no file are absent)."""
    folder = f"{layout.LAYOUT}/epoch={epoch}/topic={topic}"
    points: dict[int, int] = {}
    for f in store.list_files(folder):
        points[f.slot.partition] = max(points.get(f.slot.partition, 0), f.last + 1)
    return points


@dataclass
class Scan:
    """One topic of one epoch, read back."""

    table: pa.Table
    """Every archived record once, with a `partition` column, ordered by partition and offset."""
    coverage: dict[int, layout.Coverage] = field(default_factory=dict)
    corrupt: list[CorruptArchiveFile] = field(default_factory=list)

    @property
    def gaps(self) -> dict[int, tuple[tuple[int, int], ...]]:
        return {p: c.gaps for p, c in self.coverage.items() if c.gaps}


def scan(
    store: ArchiveStore,
    epoch: str,
    topic: str,
    *,
    kinds: Iterable[str] | None = None,
    skip_corrupt: bool = False,
) -> Scan:
    """Every record of `topic` in `epoch`, deduplicated by offset (optionally only `kinds`)."""
    folder = f"{layout.LAYOUT}/epoch={epoch}/topic={topic}"
    wanted = pa.array(sorted(kinds), pa.string()) if kinds is not None else None
    tables: list[pa.Table] = []
    result = Scan(pa.table({}))
    schema = rows.SCHEMA.append(pa.field("partition", pa.int32(), nullable=False))
    for slot, files in sorted(by_slot(store.list_files(folder)).items()):
        readable = []
        partition: list[pa.Table] = []
        for f in files:
            try:
                table = store.read(f)
            except CorruptArchiveFile as error:
                if not skip_corrupt:
                    raise
                result.corrupt.append(error)
                continue
            readable.append(f)
            if wanted is not None:
                table = table.filter(pc.is_in(table["kind"], value_set=wanted))
            partition.append(
                table.append_column(
                    "partition", pa.array([slot.partition] * table.num_rows, pa.int32())
                )
            )
        if partition:
            tables.append(dedupe(pa.concat_tables(partition)))
        found = layout.coverage(readable)
        if found is not None:
            result.coverage[slot.partition] = found
    # Deduplicated a partition at a time and kept as chunks: a take or sort over the whole
    # topic would join every chunk of a column into one array, and binary arrays hold at most
    # 2 GiB (the 20M-record rebuild benchmark failed there).
    result.table = pa.concat_tables(tables) if tables else schema.empty_table()
    return result


LARGE_FROM_BYTES = 2**31 - 1
"""A binary column holding this many bytes or more is cast to `large_binary` (64-bit offsets)
before rows are taken from it: a take joins its chunks into one array."""


def dedupe(table: pa.Table) -> pa.Table:
    """One row per (partition, offset), the first seen, sorted by partition and offset."""
    if table.num_rows == 0:
        return table
    table = _with_large_binaries(table)
    indexed = table.append_column("_row", pa.array(range(table.num_rows), pa.int64()))
    firsts = indexed.group_by(["partition", "offset"], use_threads=False).aggregate(
        [("_row", "min")]
    )
    kept = pc.take(table, firsts["_row_min"])
    return kept.sort_by([("partition", "ascending"), ("offset", "ascending")])


def _with_large_binaries(table: pa.Table) -> pa.Table:
    large = [
        i
        for i, field in enumerate(table.schema)
        if pa.types.is_binary(field.type) and table.column(i).nbytes >= LARGE_FROM_BYTES
    ]
    for i in large:
        table = table.set_column(
            i,
            table.schema.field(i).with_type(pa.large_binary()),
            table.column(i).cast(pa.large_binary()),
        )
    return table


def per_minute(
    store: ArchiveStore, epoch: str, topic: str, kinds: Iterable[str]
) -> list[tuple[int, int]]:
    """Archived records of `kinds` per minute of their Kafka timestamp (Unix minutes, each
    record once, only minutes that hold one), read from three columns; a damaged file is left
    out (verify reports it apart). Verify's chart of archive coverage over time."""
    folder = f"{layout.LAYOUT}/epoch={epoch}/topic={topic}"
    wanted = pa.array(sorted(kinds), pa.string())
    tables: list[pa.Table] = []
    for f in store.list_files(folder):
        try:
            table = store.read(f, columns=["offset", "timestamp_ms", "kind"])
        except CorruptArchiveFile:
            continue
        table = table.filter(pc.is_in(table["kind"], value_set=wanted))
        partition = pa.array([f.slot.partition] * table.num_rows, pa.int32())
        tables.append(table.append_column("partition", partition))
    if not tables:
        return []
    records = dedupe(pa.concat_tables(tables))
    minutes = pc.divide(records["timestamp_ms"], pa.scalar(60_000, pa.int64()))
    counted = pa.table({"minute": minutes}).group_by("minute").aggregate([("minute", "count")])
    pairs = zip(counted["minute"].to_pylist(), counted["minute_count"].to_pylist(), strict=True)
    return sorted((int(m), int(n)) for m, n in pairs)
