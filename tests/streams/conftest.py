from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from relay_ds.tokens import Stream
from relay_streams.database import Database
from relay_streams.model import Message
from relay_streams.store import StreamStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StreamStore]:
    s = StreamStore(tmp_path / "streams", node="test-node")
    yield s
    s.close()


def replay(db: Database, topic_filter: str, start: int = 0, n: int = 1000) -> list[Message]:
    """Every message the filter's streams return from `start`, stream by stream in rank order."""
    out: list[Message] = []
    for ranked in db.get_streams(topic_filter, start):
        iterator = db.make_iterator(ranked.stream, topic_filter, start)
        while True:
            result = db.next(iterator, n)
            out += result.messages
            iterator = result.iterator
            if result.end_of_stream or not result.messages:
                break
    return out


def stream_of(db: Database, topic: str) -> Stream:
    (ranked,) = [r for r in db.get_streams(topic) if replay_stream(db, r.stream, topic)]
    return ranked.stream


def replay_stream(db: Database, stream: Stream, topic_filter: str) -> list[Message]:
    return db.next(db.make_iterator(stream, topic_filter), 10_000).messages


@contextmanager
def raw_shard(db_dir: Path, shard: int = 0) -> Iterator[Rdict]:
    """A closed database's shard opened straight through RocksDB (to damage it on purpose)."""
    rdict = Rdict(str(db_dir / f"shard-{shard}"), Options(raw_mode=True))
    try:
        yield rdict
    finally:
        rdict.close()
