"""The archive's files on a real folder: names, atomic writes, resume points, overlaps removed
on read, damaged files reported."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relay_archive import layout, reader, rows, writer
from relay_archive.store import CorruptArchiveFile, LocalStore, ObjectStore

SLOT = layout.Slot("e1", "relay.queue.commands", 3)


def _row(offset: int, kind: str = "queue_cmd") -> rows.Row:
    value = json.dumps({"kind": kind, "v": 2, "id": f"c{offset}"}).encode()
    return rows.row_of(offset, 1_700_000_000_000 + offset, b"k", value)


def _write(
    store: LocalStore, first: int, last: int, slot: layout.Slot = SLOT
) -> layout.ArchiveFile:
    f = layout.ArchiveFile(slot, first, last)
    writer.write(store, f, [_row(o) for o in range(first, last + 1)])
    return f


def test_names_round_trip_and_bad_names_are_refused() -> None:
    f = layout.ArchiveFile(SLOT, 10, 19)
    assert f.path == (
        "v1/epoch=e1/topic=relay.queue.commands/partition=3/relay.queue.commands+3+10+19.parquet"
    )
    assert layout.parse(f.path) == f
    for bad in [
        "v2/epoch=e1/topic=t/partition=0/t+0+0+1.parquet",
        "v1/epoch=e1/topic=t/partition=0/.tmp-abc-t+0+0+1.parquet",
        "v1/epoch=e1/topic=t/partition=0/t+0+5+1.parquet",
        "v1/epoch=e1/topic=t/partition=1/t+0+0+1.parquet",
        "v1/epoch=e1/topic=u/partition=0/t+0+0+1.parquet",
        "v1/epoch=e/1/topic=t/partition=0/t+0+0+1.parquet",
        "v1/epoch=e1/topic=t/partition=0/t+0+0+1.json",
    ]:
        with pytest.raises(layout.BadArchiveName):
            layout.parse(bad)
    with pytest.raises(layout.BadArchiveName):
        layout.Slot("e/1", "t", 0)


def test_row_of_keeps_any_bytes() -> None:
    row = rows.row_of(5, 1, None, b"\xff not json")
    assert (row.kind, row.v, row.id, row.value) == ("", 0, "", b"\xff not json")
    row = rows.row_of(6, 1, None, b'{"kind": "queue_reply", "v": 1, "id": "x"}')
    assert (row.kind, row.v, row.id) == ("queue_reply", 1, "x")


def test_a_file_is_fsynced_renamed_then_its_folders_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash-safe order, on a real folder (the calls go through, only recorded): the
    temporary file fsynced, renamed to its name, then its folder and every folder above it up
    to the root fsynced, and the root's parent too for a root this write made."""
    done: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        done.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        done.append(("replace", f"{source} -> {target}"))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    root = tmp_path.resolve() / "archive"
    store = LocalStore(root)
    f = _write(store, 0, 4)
    folder = root / f.slot.folder
    (kind, synced), (_, renamed), *folders = done
    assert kind == "fsync"
    assert Path(synced).parent == folder
    assert Path(synced).name.startswith(layout.TEMP_PREFIX)
    assert renamed == f"{synced} -> {folder / f.name}"
    above = [folder, *[root / p for p in folder.relative_to(root).parents], root.parent]
    assert folders == [("fsync", str(d)) for d in above]
    assert store.read(f)["offset"].to_pylist() == [0, 1, 2, 3, 4]
    # a later file of the slot: the same order, the root existing already
    done.clear()
    _write(store, 5, 9)
    assert [k for k, _ in done] == ["fsync", "replace", *["fsync"] * (len(above) - 1)]
    assert done[2] == ("fsync", str(folder))


def test_written_file_is_zstd_parquet_with_the_schema(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    f = _write(store, 0, 4)
    path = tmp_path / f.path
    meta = pq.ParquetFile(path).metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"
    table = store.read(f)
    assert table.schema.equals(rows.SCHEMA)
    assert table["offset"].to_pylist() == [0, 1, 2, 3, 4]
    assert table["id"].to_pylist() == [f"c{o}" for o in range(5)]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(layout.TEMP_PREFIX)]


def test_resume_points_follow_the_highest_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert reader.resume_points(store, "e1", SLOT.topic) == {}
    _write(store, 0, 9)
    _write(store, 10, 14)
    _write(store, 0, 2, layout.Slot("e1", SLOT.topic, 0))
    _write(store, 0, 99, layout.Slot("e2", SLOT.topic, 3))
    assert reader.resume_points(store, "e1", SLOT.topic) == {3: 15, 0: 3}


def test_overlap_is_read_once_and_gaps_are_reported(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    _write(store, 0, 9)
    _write(store, 5, 14)  # a second writer during a hand-over
    _write(store, 20, 24)
    scan = reader.scan(store, "e1", SLOT.topic)
    offsets = scan.table["offset"].to_pylist()
    assert offsets == [*range(15), *range(20, 25)]
    assert scan.coverage[3] == layout.Coverage(0, 24, ((15, 19),), 5)
    assert scan.gaps == {3: ((15, 19),)}


def test_partitions_are_deduplicated_apart_and_big_binaries_get_64_bit_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan deduplicates each partition on its own and keeps the topic as chunks, and a
    binary column at `LARGE_FROM_BYTES` is cast to `large_binary` before rows are taken (a
    20M-record archive overflowed a binary array's 32-bit offsets: the threshold is lowered
    here, where the real one would need 2 GiB of records)."""
    store = LocalStore(tmp_path)
    other = layout.Slot(SLOT.epoch, SLOT.topic, 5)
    _write(store, 0, 9)
    _write(store, 5, 14)
    _write(store, 0, 3, other)
    _write(store, 2, 6, other)
    monkeypatch.setattr(reader, "LARGE_FROM_BYTES", 200)
    scan = reader.scan(store, "e1", SLOT.topic)
    by = scan.table.select(["partition", "offset"]).to_pylist()
    assert [(row["partition"], row["offset"]) for row in by] == [
        *((3, o) for o in range(15)),
        *((5, o) for o in range(7)),
    ]
    assert scan.table.column("offset").num_chunks >= 2  # one chunk a partition, at least
    assert scan.table.schema.field("value").type == pa.large_binary()
    assert scan.table["value"].to_pylist()[7] == _row(7).value


def test_slot_buffer_is_contiguous_and_refuses_going_back(tmp_path: Path) -> None:
    buffer = writer.SlotBuffer(SLOT, first=7)
    policy = writer.RollPolicy(max_bytes=10**9, max_age_s=5)
    buffer.add(7, _row(7), now_s=100.0)
    buffer.add(8, None, now_s=101.0)  # read, not kept (an inbox delivery)
    assert not buffer.due(policy, now_s=104.9)
    assert buffer.due(policy, now_s=105.0)
    with pytest.raises(writer.OutOfOrder):
        buffer.add(8, _row(8), now_s=102.0)
    taken = buffer.take()
    assert taken is not None
    f, kept = taken
    assert (f.first, f.last, [r.offset for r in kept]) == (7, 8, [7])
    assert buffer.take() is None
    # … or at its size, whatever its age
    sized = writer.RollPolicy(max_bytes=2 * _row(0).size, max_age_s=10**6)
    buffer.add(9, _row(9), now_s=110.0)
    assert not buffer.due(sized, now_s=110.0)
    buffer.add(10, None, now_s=110.0)  # read, not kept: adds no bytes
    assert not buffer.due(sized, now_s=110.0)
    buffer.add(11, _row(11), now_s=110.0)
    assert buffer.due(sized, now_s=110.0)
    taken = buffer.take()
    assert taken is not None
    assert (taken[0].first, taken[0].last, len(taken[1])) == (9, 11, 2)
    buffer.add(12, _row(12), now_s=110.0)
    taken = buffer.take()
    assert taken is not None
    assert (taken[0].first, taken[0].last) == (12, 12)


def test_records_per_minute_count_each_record_once_by_its_kafka_minute(tmp_path: Path) -> None:
    """Verify's coverage chart: each record of the kinds asked once (overlaps removed) in the
    minute of its Kafka timestamp; a damaged file's records are left out, not misread."""
    store = LocalStore(tmp_path)
    minute = 60_000
    start = 28_000_000 * minute  # a whole minute

    def put(slot: layout.Slot, first: int, stamps: list[int], kind: str = "queue_cmd") -> None:
        f = layout.ArchiveFile(slot, first, first + len(stamps) - 1)
        value = json.dumps({"kind": kind, "v": 2, "id": "c"}).encode()
        made = [rows.row_of(first + i, t, None, value) for i, t in enumerate(stamps)]
        writer.write(store, f, made)

    put(SLOT, 0, [start, start + 1, start + minute - 1, start + minute])
    put(SLOT, 2, [start + minute - 1, start + minute])  # a hand-over's overlap: read once
    other = layout.Slot("e1", SLOT.topic, 0)
    put(other, 0, [start + 3 * minute, start + 3 * minute + 5])
    put(other, 2, [start + 3 * minute], kind="ping")  # another kind: not counted
    put(other, 3, [start + 9 * minute] * 300)
    damaged = tmp_path / layout.ArchiveFile(other, 3, 302).path
    damaged.write_bytes(damaged.read_bytes()[:100])
    assert reader.per_minute(store, "e1", SLOT.topic, ["queue_cmd"]) == [
        (start // minute, 3),
        (start // minute + 1, 1),
        (start // minute + 3, 2),
    ]
    assert reader.per_minute(store, "e2", SLOT.topic, ["queue_cmd"]) == []


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_file_is_reported_not_misread(tmp_path: Path, damage: str) -> None:
    store = LocalStore(tmp_path)
    good = _write(store, 0, 199)
    bad = _write(store, 200, 399)
    path = tmp_path / bad.path
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 3] ^= 0xFF  # inside the data pages
        path.write_bytes(bytes(data))
    with pytest.raises(CorruptArchiveFile) as caught:
        reader.scan(store, "e1", SLOT.topic)
    assert caught.value.path.endswith(bad.name)
    scan = reader.scan(store, "e1", SLOT.topic, skip_corrupt=True)
    assert [c.path for c in scan.corrupt] == [str(path)]
    assert scan.table["offset"].to_pylist() == list(range(200))
    assert scan.coverage[3].last == good.last


def test_temporary_files_are_never_listed_and_are_cleaned(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    f = _write(store, 0, 1)
    stray = tmp_path / f.slot.folder / f"{layout.TEMP_PREFIX}x-{SLOT.topic}+3+2+5.parquet"
    stray.write_bytes(b"half")
    assert store.list_files() == [f]
    assert store.clean_temporary() == 1
    assert not stray.exists()


def test_object_store_path_through_pyarrow_fs(tmp_path: Path) -> None:
    """The object-storage code path (one PUT per file) on pyarrow's local filesystem: the same
    listing, reading and resume rules (over an S3 server: `tests/archive/test_s3.py`)."""
    store = ObjectStore(f"file://{tmp_path}/bucket")
    f = layout.ArchiveFile(SLOT, 0, 2)
    writer.write(store, f, [_row(o) for o in range(3)])
    (tmp_path / "bucket" / "v1" / "stray.txt").write_text("not an archive file")
    assert store.list_files() == [f]
    assert store.read(f)["offset"].to_pylist() == [0, 1, 2]
    assert reader.resume_points(store, "e1", SLOT.topic) == {3: 3}
