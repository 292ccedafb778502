"""What callers hand in and get back: messages, ranked streams and the result of a read.

Streams and iterators, their opaque strings and the ids inside them are `relay_ds.tokens`
(the ingress reads them too); this module adds what only the store hands out.
"""

from __future__ import annotations

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
