"""What every layout implements, and the record formats layouts share.

Message value, format 1 (shared by `reference/1` and `lts/1`; a layout that needs another
format is a new layout version): `0x01 | topic length (u16 BE) | topic UTF-8 | payload`.
The timestamp and sequence number live in the key. RocksDB checksums every block and WAL
record; `decode_value` adds the structural checks, so a damaged value is a `CorruptRecord`,
never a wrong message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from rocksdict import ColumnFamily, Rdict, ReadOptions, WriteBatch

from relay_ds.tokens import Position, StaticIndex
from relay_streams import lts
from relay_streams.errors import CorruptRecord
from relay_streams.model import Message
from relay_topics import rules
from relay_topics.rules import Levels

VALUE_FORMAT = 1
MESSAGES = b"\x02"
"""Key prefix of message records in every layout (`\x00` is the generation's own meta)."""


def encode_value(topic: str, payload: bytes) -> bytes:
    encoded = topic.encode()
    return b"\x01" + len(encoded).to_bytes(2, "big") + encoded + payload


def _topic_end(raw: bytes, where: str, key: bytes) -> int:
    if len(raw) < 3 or raw[0] != VALUE_FORMAT:
        raise CorruptRecord(f"{where} key {key.hex()}: unknown or damaged message record (format)")
    end = 3 + int.from_bytes(raw[1:3], "big")
    if end > len(raw):
        raise CorruptRecord(f"{where} key {key.hex()}: damaged message record (topic too long)")
    return end


def _topic(raw: bytes, end: int, where: str, key: bytes) -> str:
    try:
        return raw[3:end].decode()
    except UnicodeDecodeError:
        raise CorruptRecord(f"{where} key {key.hex()}: damaged message record (topic)") from None


def decode_value(raw: bytes, ts: int, where: str, key: bytes) -> Message:
    """The message in a value; `where` and `key` only name it in a `CorruptRecord`."""
    end = _topic_end(raw, where, key)
    return Message(_topic(raw, end, where, key), raw[end:], ts)


def scan(cf: Rdict, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Records with lower <= key < upper, in key order."""
    options = ReadOptions()
    options.set_iterate_upper_bound(upper)
    yield from cf.items(from_key=lower, read_opt=options)


@dataclass
class Census:
    """What `Layout.check` found in one generation of one shard."""

    problems: list[str] = field(default_factory=list)
    count: int = 0
    min_ts: int | None = None
    max_ts: int | None = None
    max_seq: int = -1

    def saw(self, position: Position) -> None:
        self.count += 1
        ts = position.ts
        self.min_ts = ts if self.min_ts is None else min(self.min_ts, ts)
        self.max_ts = ts if self.max_ts is None else max(self.max_ts, ts)
        self.max_seq = max(self.max_seq, position.seq)


class ReadResult(NamedTuple):
    found: list[tuple[Position, Message]]
    """Matching messages in (ts, seq) order."""
    scanned: Position | None
    """The last record looked at (matching or not): where the next read may start after."""
    exhausted: bool
    """The scan reached the end of the stream."""


def read_range(
    cf: Rdict,
    lower: bytes,
    upper: bytes,
    topic_filter: Levels | None,
    limit: int,
    where: str,
) -> ReadResult:
    """Messages with keys in [lower, upper) whose keys end in ts (u64) | seq (u64); those whose
    topic does not match `topic_filter` are skipped (None: all match)."""
    found: list[tuple[Position, Message]] = []
    key_length = len(lower)
    matches, levels = rules.matches, rules.levels
    last = None
    for key, value in scan(cf, lower, upper):
        last = key
        if len(key) != key_length:
            raise CorruptRecord(f"{where}: message key {key.hex()} has the wrong length")
        end = _topic_end(value, where, key)
        topic = _topic(value, end, where, key)
        # Topics were validated when written (and by `check`): splitting is enough here.
        if topic_filter is not None and not matches(topic_filter, levels(topic)):
            continue
        ts = int.from_bytes(key[-16:-8], "big")
        found.append(
            (Position(ts, int.from_bytes(key[-8:], "big")), Message(topic, value[end:], ts))
        )
        if len(found) >= limit:
            return ReadResult(found, found[-1][0], False)
    return ReadResult(found, None if last is None else _position(last), True)


def _position(key: bytes) -> Position:
    return Position(int.from_bytes(key[-16:-8], "big"), int.from_bytes(key[-8:], "big"))


def position_bytes(start: int, after: Position | None) -> bytes:
    """The key suffix to start a read from: the first (ts, seq) after `after`, at or after
    `start`."""
    if after is not None and after.ts >= start:
        return after.ts.to_bytes(8, "big") + (after.seq + 1).to_bytes(8, "big")
    return start.to_bytes(8, "big") + bytes(8)


class Layout(Protocol):
    """One generation of one shard, as seen through its layout."""

    layout_id: str

    def prepare(self, batch: WriteBatch, items: Sequence[tuple[Levels, Message, int]]) -> None:
        """Put the records for `(parsed topic, message, seq)` items (and any structure they
        add) into `batch`. The caller writes the batch; if that fails it calls `reload`."""

    def reload(self) -> None:
        """Forget in-memory state not on disk (after a failed write)."""

    def closed(self) -> None:
        """The generation takes no more writes: drop what only writes need (caches)."""

    def streams(self, topic_filter: Levels) -> list[StaticIndex]:
        """Static indexes of the streams that may hold topics matching the filter."""

    def every_stream(self) -> list[StaticIndex]:
        """Static indexes of every stream, `$` topics' included (no filter, so no MQTT rule:
        for exports and checks, never for subscriptions)."""

    def has_stream(self, static: StaticIndex) -> bool: ...

    def read(
        self,
        static: StaticIndex,
        topic_filter: Levels | None,
        start: int,
        after: Position | None,
        limit: int,
    ) -> ReadResult:
        """Up to `limit` matching messages of the stream with ts >= start, after `after`
        (`topic_filter` None: every message of the stream)."""

    def key(self, static: StaticIndex, position: Position) -> bytes:
        """The record key of a message (for deletes)."""

    def check(self, belongs: Callable[[str], bool]) -> Census:
        """Read every record; `belongs(topic)` says whether a topic belongs in this shard."""

    def learned(self) -> lts.Trie | None:
        """The learned topic structure a next generation inherits (None: nothing)."""

    def describe(self, static: StaticIndex) -> str:
        """A stream's topic pattern (`a/+/c`), for `info`."""

    def stream_count(self) -> int: ...


class LayoutModule(Protocol):
    LAYOUT_ID: str

    def create(self, options: dict[str, Any], previous: Layout | None) -> list[tuple[bytes, bytes]]:
        """The initial records of a new generation (e.g. an inherited trie). Raises
        `BadInput` for options it cannot use."""

    def open(
        self, cf: Rdict, handle: ColumnFamily, options: dict[str, Any], where: str
    ) -> Layout: ...
