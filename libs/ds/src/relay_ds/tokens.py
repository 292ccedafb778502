"""The durable-stream names clients hold: database names and the opaque stream and iterator
strings, without the store that made them.

Streams and iterators travel through clients as opaque strings (API.md: `stream`, `iterator`):
base64url without padding of `version byte | JSON array | crc32`. They name only persistent
things (database, shard, generation number, static index, a key position), so a string stays
valid across restarts. The ingress reads them to route a request to the partition that owns the
stream; the store reads them to serve it.

Invariant: `from_token` either returns exactly what `token()` encoded or raises `BadToken`; a
stream string is never accepted as an iterator or the other way round, and each value has one
spelling (`relay_durable.codec` is strict).
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple, NewType

from relay_ds.errors import BadToken, Refused
from relay_durable import codec

ShardId = NewType("ShardId", int)
GenerationId = NewType("GenerationId", int)
StaticIndex = NewType("StaticIndex", int)
"""A stream inside one shard's generation (an LTS leaf; 0 for the reference layout)."""

TOKEN_VERSION = 1
MAX_TS = (1 << 63) - 1  # ms

NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
"""A database (or durable storage) name; also the ingress's path pattern."""
_NAME = re.compile(NAME_PATTERN)


def parse_name(name: object) -> str:
    """A database name, or `Refused`."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise Refused(f"a database name is 1-64 letters, digits, '_' or '-', got {name!r}")
    return name


class Position(NamedTuple):
    """A message's place in its stream: streams are ordered by (ts, seq)."""

    ts: int
    seq: int
    """Per shard and generation, in write order: breaks ties between equal timestamps."""


def _pack(kind: str, fields: list[Any]) -> str:
    raw = bytes([TOKEN_VERSION]) + json.dumps([kind, *fields], separators=(",", ":")).encode()
    raw += zlib.crc32(raw).to_bytes(4, "big")
    return codec.b64u(raw)


def _unpack(token: object, kind: str, count: int) -> list[Any]:
    what = "stream" if kind == "s" else "iterator"
    if not isinstance(token, str) or not token or len(token) > 100_000:
        raise BadToken(f"{what} must be a non-empty string")
    try:
        raw = codec.unb64u(token)
    except ValueError:
        raise BadToken(f"{what} is not base64url") from None
    if len(raw) < 6 or zlib.crc32(raw[:-4]).to_bytes(4, "big") != raw[-4:]:
        raise BadToken(f"{what} is damaged (checksum mismatch)")
    if raw[0] != TOKEN_VERSION:
        raise BadToken(f"{what} has unknown version {raw[0]}")
    try:
        fields = json.loads(raw[1:-4])
    except ValueError:
        raise BadToken(f"{what} is damaged (not JSON)") from None
    if not isinstance(fields, list) or len(fields) != count + 1 or fields[0] != kind:
        raise BadToken(f"not a {what}")
    return fields[1:]


def _int(value: Any, what: str, upper: int = MAX_TS) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= upper:
        raise BadToken(f"{what} out of range")
    return value


@dataclass(frozen=True)
class Stream:
    db: str
    shard: ShardId
    generation: GenerationId
    static: StaticIndex

    def token(self) -> str:
        return _pack("s", [self.db, self.shard, self.generation, self.static])

    @classmethod
    def from_token(cls, token: object) -> Stream:
        db, shard, generation, static = _unpack(token, "s", 4)
        return cls._checked(db, shard, generation, static)

    @classmethod
    def _checked(cls, db: Any, shard: Any, generation: Any, static: Any) -> Stream:
        if not isinstance(db, str):
            raise BadToken("stream names no database")
        return cls(
            db,
            ShardId(_int(shard, "shard")),
            GenerationId(_int(generation, "generation")),
            StaticIndex(_int(static, "static index")),
        )


@dataclass(frozen=True)
class StreamIterator:
    stream: Stream
    topic_filter: str
    start: int
    """Messages with ts >= start (Unix ms)."""
    after: Position | None
    """The last message returned so far; None before the first."""

    def token(self) -> str:
        s = self.stream
        after = None if self.after is None else list(self.after)
        fields = [s.db, s.shard, s.generation, s.static, self.topic_filter, self.start, after]
        return _pack("i", fields)

    @classmethod
    def from_token(cls, token: object) -> StreamIterator:
        db, shard, generation, static, topic_filter, start, after = _unpack(token, "i", 7)
        stream = Stream._checked(db, shard, generation, static)
        if not isinstance(topic_filter, str):
            raise BadToken("iterator has no filter")
        position = None
        if after is not None:
            if not isinstance(after, list) or len(after) != 2:
                raise BadToken("iterator position is damaged")
            position = Position(_int(after[0], "position"), _int(after[1], "position", 2**64 - 1))
        return cls(stream, topic_filter, _int(start, "start"), position)
