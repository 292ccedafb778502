"""What callers hand in and get back: messages, ranked streams and the result of a read.

Streams and iterators, their opaque strings and the ids inside them are `relay_ds.tokens`
(the ingress reads them too); this module adds what only the store hands out.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from relay_ds.tokens import Stream, StreamIterator


class Message(NamedTuple):
    topic: str
    payload: bytes
    ts: int
    """Unix ms."""


class RankedStream(NamedTuple):
    rank: tuple[int, int]
    """(X, Y) = (shard, generation). Streams with different X may be replayed in parallel; with
    the same X, replay in order of Y (older generation first); same X and Y: in parallel."""
    stream: Stream


class NextResult(NamedTuple):
    messages: list[Message]
    iterator: StreamIterator
    """Where the next call continues (the same one if nothing was returned)."""
    end_of_stream: bool
    """True once the stream's generation is closed (or dropped) and nothing is left in it.
    While False, an empty `messages` means new messages may still arrive."""


def shard_of(topic: str, shards: int) -> int:
    """Sharding by topic: every message of a topic is in one shard, so per-topic order holds
    (pure: the rebuild places archived messages with it too)."""
    return zlib.crc32(topic.encode()) % shards
