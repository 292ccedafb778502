"""Point-in-time copies of the retainer's stores (`StreamStore.checkpoint`,
`RetainedStore.checkpoint`), as the online export takes them while writes go on: the copy
opens through the engines and holds exactly what was written before it; writes after it reach
the live store only."""

from __future__ import annotations

from pathlib import Path

from relay_streams.model import Message
from relay_streams.retained import RetainedStore, Write
from relay_streams.settings import DbSettings
from relay_streams.store import StreamStore


def _all(store: StreamStore, db: str) -> list[Message]:
    return sorted(m for page in store.every_message(db) for m in page)


def test_a_stream_checkpoint_holds_what_was_written_before_it(tmp_path: Path) -> None:
    live = StreamStore(tmp_path / "live", node="n")
    try:
        live.open_db("messages", DbSettings(shards=3))
        live.open_db("other", DbSettings(shards=1, layout="reference/1"))
        before = [Message(f"t/{i % 4}", b"%d" % i, 1_000 + i) for i in range(50)]
        before.append(Message("$sys/x", b"dollar", 2_000))
        live.store_batch("messages", before)
        live.store_batch("other", [Message("o", b"o", 5)])
        live.checkpoint(tmp_path / "copy")
        live.store_batch("messages", [Message("t/1", b"after", 3_000)])
        site = live.this_site()
        assert len(_all(live, "messages")) == 52
    finally:
        live.close()
    copy = StreamStore(tmp_path / "copy", node="n")
    try:
        assert copy.list_dbs() == ["messages", "other"]
        assert copy.this_site() == site
        copy.open_db("messages")
        copy.open_db("other")
        assert _all(copy, "messages") == sorted(before)
        assert _all(copy, "other") == [Message("o", b"o", 5)]
    finally:
        copy.close()


def test_a_retained_checkpoint_holds_what_was_written_before_it(tmp_path: Path) -> None:
    with RetainedStore(tmp_path / "live") as live:
        live.store_many([Write(f"a/{i}", b"v%d" % i, 0, None, 1_000 + i) for i in range(20)])
        live.checkpoint(tmp_path / "copy")
        live.store_many([Write("a/1", b"changed", 0, None, 5_000), Write("b", b"new", 0, None, 5)])
        assert {m.topic: m.payload for m in live.match("#", now=0)}["a/1"] == b"changed"
    with RetainedStore(tmp_path / "copy") as copy:
        held = {m.topic: m.payload for m in copy.match("#", now=0)}
    assert held == {f"a/{i}": b"v%d" % i for i in range(20)}
