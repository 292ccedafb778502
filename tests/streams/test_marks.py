"""Log positions kept in the stores' write batches (`relay_streams.marks`): a checkpoint taken
while writes go on, on another thread, holds exactly the writes its marks name, in the
retained store and in every stream shard; a store made before marks opens with an incomplete
record whose unknown partitions stay unknown."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from relay_streams import marks
from relay_streams.errors import BadInput
from relay_streams.marks import Mark, Marks
from relay_streams.model import Message, shard_of
from relay_streams.retained import MARKS, RetainedStore, Write
from relay_streams.settings import DbSettings
from relay_streams.store import StreamStore


def test_merging_and_cutting_marks() -> None:
    record = marks.NEW.after([Mark(0, "e", 5), Mark(1, "e", 3), Mark(0, "e", 4)])
    assert record == Marks(True, {0: ("e", 5), 1: ("e", 3)})  # never back within an epoch
    assert record.cut("e", [0, 1, 2]) == {0: 5, 1: 3, 2: 0}  # 2 sent nothing: 0, exactly
    assert record.cut("f", [0, 1]) == {0: 0, 1: 0}  # a new log: nothing of it yet
    wiped = record.after([Mark(0, "f", 2)])
    assert wiped.positions[0] == ("f", 2)
    unknown = record.after([None])  # a write of unknown position
    assert not unknown.complete
    assert unknown.cut("e", [0, 1, 2]) == {0: 5, 1: 3}  # 2 is unknown now
    assert unknown.cut("f", [0]) == {}
    assert Marks.from_bytes(unknown.to_bytes(), "x") == unknown
    assert Marks.from_bytes(None, "x") == Marks(False)


def _copy_mid_writes(write: Callable[[int], None], copy: Callable[[], None]) -> int:
    """Run `write(0)`, `write(1)`, ... on a thread; take `copy()` after 50 writes, stop 50
    writes after it returned (so some surely follow the copy, however long it took on a loaded
    machine); the number of writes made."""
    stop, count = threading.Event(), [0]

    def run() -> None:
        offset = 0
        while not stop.is_set():
            write(offset)
            offset += 1
            count[0] = offset

    writer = threading.Thread(target=run)
    writer.start()
    while count[0] < 50:
        time.sleep(0.001)
    copy()
    after = count[0]
    while count[0] < after + 50:
        time.sleep(0.001)
    stop.set()
    writer.join()
    return count[0]


def test_a_retained_checkpoint_holds_exactly_the_writes_its_marks_name(tmp_path: Path) -> None:
    with RetainedStore(tmp_path / "live") as live:
        assert live.marks == marks.NEW

        def write(offset: int) -> None:
            # Partition 0 and 1 alternate; each write replaces its topic's message.
            partition = offset % 2
            topic = f"p{partition}/t{offset % 5}"
            live.store_many(
                [Write(topic, b"%d" % offset, 0, None, offset)],
                0,
                [Mark(partition, "e", offset + 1)],
            )

        written = _copy_mid_writes(write, lambda: live.checkpoint(tmp_path / "copy"))
        with pytest.raises(BadInput):
            live.store_many([Write("x", b"y")], 0, [])
    with RetainedStore(tmp_path / "copy") as copy:
        cut = copy.marks.cut("e", [0, 1])
        held = {m.topic: m.payload for m in copy.match("#", now=0)}
    assert 50 <= max(cut.values()) < written  # a copy taken mid-writes
    expected: dict[str, bytes] = {}
    for offset in range(written):
        partition = offset % 2
        if offset < cut[partition]:
            expected[f"p{partition}/t{offset % 5}"] = b"%d" % offset
    assert held == expected


def test_a_stream_checkpoint_holds_exactly_the_writes_each_shards_marks_name(
    tmp_path: Path,
) -> None:
    shards = 3
    live = StreamStore(tmp_path / "live", node="n")
    try:
        live.open_db("messages", DbSettings(shards=shards))

        def write(offset: int) -> None:
            # One request of partition offset % 2 with messages for two topics (two shards).
            partition = offset % 2
            batch = [
                Message(f"t/{(offset + k) % 7}", b"%d" % offset, 1_000 + offset) for k in (0, 3)
            ]
            mark = Mark(partition, "e", offset + 1)
            live.store_batch("messages", batch, True, [mark, mark])

        written = _copy_mid_writes(write, lambda: live.checkpoint(tmp_path / "copy"))
    finally:
        live.close()
    copy = StreamStore(tmp_path / "copy", node="n")
    try:
        db = copy.open_db("messages")
        cuts = [m.cut("e", [0, 1]) for m in db.marks()]
        held = sorted(m for page in copy.every_message("messages") for m in page)
    finally:
        copy.close()
    expected = []
    for offset in range(written):
        for k in (0, 3):
            topic = f"t/{(offset + k) % 7}"
            if offset < cuts[shard_of(topic, shards)][offset % 2]:
                expected.append(Message(topic, b"%d" % offset, 1_000 + offset))
    assert held == sorted(expected)
    assert 0 < len(held) < 2 * written


def test_stores_from_before_marks_open_with_incomplete_marks(tmp_path: Path) -> None:
    with RetainedStore(tmp_path / "retained") as store:
        store.store_many([Write("a", b"1")], 0, [Mark(0, "e", 1)])
    old = Rdict(str(tmp_path / "retained"), Options(raw_mode=True))
    old.delete(MARKS)  # as a store written by a build without marks
    old.close()
    with RetainedStore(tmp_path / "retained") as store:
        assert store.marks == Marks(False)
        assert store.marks.cut("e", [0, 1]) == {}
        store.store_many([Write("b", b"2")], 0, [Mark(1, "e", 7)])
        assert store.marks.cut("e", [0, 1]) == {1: 7}  # 0 stays unknown
        store.store("c", b"3")  # a write of unknown position
    with RetainedStore(tmp_path / "retained") as store:
        assert store.marks == Marks(False, {1: ("e", 7)})
        assert {m.topic for m in store.match("#")} == {"a", "b", "c"}


def _files(root: Path) -> dict[str, object]:
    """The records of a store's folder (what the owner writes on its own is left out: WAL,
    tables, MANIFEST); rocksdict rewrites its `rocksdict-config.json` with the same bytes on
    every open, so that one is compared by content."""
    return {
        str(p.relative_to(root)): (
            p.read_bytes()
            if p.name == "rocksdict-config.json"
            else None
            if p.name == "LOG"  # the owner's info log: not moved aside (no LOG.old.*)
            else (p.stat().st_size, p.stat().st_mtime_ns)
        )
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix not in (".log", ".sst") and "MANIFEST" not in p.name
    }


def test_read_only_opens_of_live_stores_hold_exactly_what_their_marks_name(
    tmp_path: Path,
) -> None:
    """What an online export reads (`relay_streams.reading`): the stores opened read-only
    while their owner writes, each a point in time its marks describe; the owner's folder
    is left alone (no new or changed record, no info log moved)."""
    shards = 2
    live = StreamStore(tmp_path / "streams", node="n")
    retained = RetainedStore(tmp_path / "retained")
    try:
        live.open_db("messages", DbSettings(shards=shards))

        def write(offset: int) -> None:
            mark = Mark(0, "e", offset + 1)
            topic = f"t/{offset % 7}"
            live.store_batch("messages", [Message(topic, b"%d" % offset, offset)], True, [mark])
            retained.store_many([Write(topic, b"%d" % offset, 0, None, offset)], 0, [mark])

        for offset in range(20):
            write(offset)
        before = _files(tmp_path)
        stop, count = threading.Event(), [20]

        def run() -> None:
            while not stop.is_set():
                write(count[0])
                count[0] += 1

        writer = threading.Thread(target=run)
        writer.start()
        try:
            time.sleep(0.05)
            with RetainedStore(tmp_path / "retained", read_only=True) as view:
                retained_cut = view.marks.cut("e", [0])[0]
                held = {m.topic: m.payload for m in view.match("#", now=0)}
            reader = StreamStore(tmp_path / "streams", read_only=True)
            try:
                db = reader.open_db("messages")
                cuts = [m.cut("e", [0])[0] for m in db.marks()]
                messages = sorted(m for page in reader.every_message("messages") for m in page)
                with pytest.raises(BadInput):
                    reader.open_db("other", DbSettings())
            finally:
                reader.close()
        finally:
            stop.set()
            writer.join()
        assert 20 <= retained_cut <= count[0]
        last = {f"t/{o % 7}": b"%d" % o for o in range(retained_cut)}
        assert held == last
        expected = [
            Message(f"t/{o % 7}", b"%d" % o, o)
            for o in range(count[0])
            if o < cuts[shard_of(f"t/{o % 7}", shards)]
        ]
        assert messages == sorted(expected)
        after = _files(tmp_path)
        assert {k: v for k, v in after.items() if k in before} == before
        assert set(after) == set(before)
    finally:
        live.close()
        retained.close()
